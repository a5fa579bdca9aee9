//! The device plugin's kubelet side through the library API: a hand-made node served
//! by `plugin::server::serve` in a tempdir, and a fake kubelet (`crate::common::kubelet`)
//! that takes its registrations and dials it back, as kubelet does.
//!
//! The waits are bounded by what kubelet and operators need (a re-registration
//! within a second of a kubelet restart); they are limits, not measurements.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::kubelet::{FakeKubelet, dial_plugin};
use nvshim_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    ListAndWatchResponse, PreStartContainerRequest, PreferredAllocationRequest, VERSION,
};
use nvshim_device_plugin::config::{Settings, SharingStrategy};
use nvshim_device_plugin::health::{HealthBoard, UnitHealth};
use nvshim_device_plugin::resources::{Device, Resource, Unit};
use nvshim_device_plugin::server::{Control, Node, ServerError, control, forward_signals, serve};
use nvshim_device_plugin::topology::Topology;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::task::JoinHandle;
use tonic::Code;

/// How soon the plugin must react to a kubelet restart, a deleted socket or a health
/// flip.
const WITHIN: Duration = Duration::from_secs(1);

fn uuid(gpu: u32) -> String {
    format!("GPU-{gpu:08x}-1111-2222-3333-444455556666")
}

fn device(gpu: u32, replica: Option<u32>) -> Device {
    let id = match replica {
        Some(r) => format!("{}::{r}", uuid(gpu)),
        None => uuid(gpu),
    };
    Device {
        id,
        unit: Unit { gpu, mig: None },
        replica,
        uuid: uuid(gpu),
        runtime_id: uuid(gpu),
        // GPU 3 has no NUMA node (sysfs said -1).
        numa_node: (gpu < 3).then_some(i64::from(gpu / 2)),
        bus_id: format!("0000:{:02x}:00.0", 0x10 + gpu),
        memory_mib: None,
        nodes: vec![PathBuf::from(format!("/dev/nvidia{gpu}"))],
    }
}

/// `nvidia.com/gpu` with four whole GPUs.
fn gpus() -> Resource {
    Resource {
        name: "nvidia.com/gpu".into(),
        devices: (0..4).map(|g| device(g, None)).collect(),
        replicas: None,
        sharing: None,
        fail_requests_greater_than_one: false,
    }
}

/// `nvidia.com/gpu.shared`: GPUs 0 and 1, two replicas each.
fn shared() -> Resource {
    Resource {
        name: "nvidia.com/gpu.shared".into(),
        devices: (0..2)
            .flat_map(|g| (0..2).map(move |r| device(g, Some(r))))
            .collect(),
        replicas: Some(2),
        sharing: Some(SharingStrategy::TimeSlicing),
        fail_requests_greater_than_one: false,
    }
}

fn settings(dir: &Path, kubelet: bool, health_addr: Option<SocketAddr>) -> Settings {
    Settings {
        socket_dir: dir.to_path_buf(),
        kubelet_socket: kubelet.then(|| dir.join(FakeKubelet::SOCKET)),
        health_addr,
        ..Settings::default()
    }
}

fn node(settings: Settings, resources: Vec<Resource>) -> Node {
    let units: Vec<Unit> = (0..4).map(|gpu| Unit { gpu, mig: None }).collect();
    Node {
        settings: Arc::new(settings),
        resources,
        health: Arc::new(HealthBoard::new(units)),
        topology: Arc::new(Topology::default()),
    }
}

/// A served node: its tempdir, fake kubelet, control and the `serve` task.
struct Plugin {
    dir: tempfile::TempDir,
    kubelet: FakeKubelet,
    node: Node,
    control: Control,
    served: JoinHandle<Result<(), ServerError>>,
}

impl Plugin {
    fn dir(&self) -> &Path {
        self.dir.path()
    }

    fn socket(&self, endpoint: &str) -> PathBuf {
        self.dir().join(endpoint)
    }

    async fn ready(&self, want: bool) {
        let mut ready = self.control.readiness();
        let waited = tokio::time::timeout(WITHIN, ready.wait_for(|r| *r == want)).await;
        assert!(matches!(waited, Ok(Ok(_))), "readiness never became {want}");
    }

    /// Stops serving; returns the tempdir and kubelet for a look at what is left.
    async fn stop(self) -> (tempfile::TempDir, FakeKubelet) {
        assert!(self.control.stop());
        let served = tokio::time::timeout(Duration::from_secs(3), self.served)
            .await
            .expect("serve returns after stop")
            .expect("serve task");
        served.expect("serve ends cleanly");
        (self.dir, self.kubelet)
    }
}

/// Starts a fake kubelet and serves `resources` (with `health_addr` when given),
/// with a `rebuild` that serves the same node again.
async fn start(resources: Vec<Resource>, health_addr: Option<SocketAddr>) -> Plugin {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    let node = node(settings(dir.path(), true, health_addr), resources);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node.clone(),
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    Plugin {
        dir,
        kubelet,
        node,
        control,
        served,
    }
}

async fn next(
    stream: &mut tonic::Streaming<ListAndWatchResponse>,
) -> Result<Option<ListAndWatchResponse>, tonic::Status> {
    tokio::time::timeout(WITHIN, stream.message())
        .await
        .expect("a ListAndWatch message within 1 s")
}

fn health_of(list: &ListAndWatchResponse) -> Vec<(String, String)> {
    list.devices
        .iter()
        .map(|d| (d.id.clone(), d.health.clone()))
        .collect()
}

fn allocate_request(containers: &[&[String]]) -> AllocateRequest {
    AllocateRequest {
        container_requests: containers
            .iter()
            .map(|ids| ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            })
            .collect(),
    }
}

/// Sends `GET <path>` and returns the status code.
async fn http_status(addr: SocketAddr, path: &str) -> u16 {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.unwrap();
    reply
        .split(' ')
        .nth(1)
        .and_then(|code| code.parse().ok())
        .unwrap_or_else(|| panic!("no status line in {reply:?}"))
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn registers_each_resource_with_kubelets_fields() {
    let plugin = start(vec![gpus(), shared()], None).await;
    let registered = plugin.kubelet.wait_registrations(2, WITHIN).await;
    let mut seen: Vec<(String, String)> = registered
        .iter()
        .map(|r| {
            let req = &r.request;
            assert_eq!(req.version, VERSION, "{req:?}");
            let options = req.options.expect("options");
            assert!(!options.pre_start_required, "{req:?}");
            assert!(options.get_preferred_allocation_available, "{req:?}");
            (req.resource_name.clone(), req.endpoint.clone())
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("nvidia.com/gpu".into(), "nvidia-gpu.sock".into()),
            (
                "nvidia.com/gpu.shared".into(),
                "nvidia-gpu.shared.sock".into()
            ),
        ]
    );
    plugin.ready(true).await;

    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available && !options.pre_start_required);
    client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: vec![uuid(0)],
        })
        .await
        .unwrap();
    plugin.stop().await;
}

#[tokio::test]
async fn list_and_watch_streams_devices_and_health_flips() {
    let plugin = start(vec![gpus(), shared()], None).await;
    plugin.kubelet.wait_registrations(2, WITHIN).await;
    let mut gpu = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = gpu.list_and_watch(Empty {}).await.unwrap().into_inner();
    let mut replicas = plugin.kubelet.dial("nvidia-gpu.shared.sock").await;
    let mut shared_stream = replicas
        .list_and_watch(Empty {})
        .await
        .unwrap()
        .into_inner();

    let first = next(&mut stream).await.unwrap().unwrap();
    let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, (0..4).map(uuid).collect::<Vec<_>>());
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    let numa: Vec<Option<i64>> = first
        .devices
        .iter()
        .map(|d| d.topology.as_ref().map(|t| t.nodes[0].id))
        .collect();
    assert_eq!(numa, [Some(0), Some(0), Some(1), None]);
    let first_shared = next(&mut shared_stream).await.unwrap().unwrap();
    assert_eq!(first_shared.devices.len(), 4);

    let sick = UnitHealth::Unhealthy {
        reason: "XID 79".into(),
        xid: Some(79),
    };
    assert!(plugin.node.health.set(&[Unit { gpu: 1, mig: None }], &sick));
    let flipped = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(
        health_of(&flipped)
            .into_iter()
            .filter(|(_, h)| h == "Unhealthy")
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        [uuid(1)]
    );
    // Both replicas of the unit go together.
    let flipped_shared = next(&mut shared_stream).await.unwrap().unwrap();
    assert_eq!(
        health_of(&flipped_shared)
            .into_iter()
            .filter(|(_, h)| h == "Unhealthy")
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        [format!("{}::0", uuid(1)), format!("{}::1", uuid(1))]
    );

    // An unhealthy device is refused.
    let refused = gpu
        .allocate(allocate_request(&[&[uuid(1)]]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains(&uuid(1)), "{refused:?}");

    assert!(
        plugin
            .node
            .health
            .set(&[Unit { gpu: 1, mig: None }], &UnitHealth::Healthy)
    );
    let recovered = next(&mut stream).await.unwrap().unwrap();
    assert!(recovered.devices.iter().all(|d| d.health == "Healthy"));
    plugin.stop().await;
}

#[tokio::test]
async fn allocate_sets_visible_devices_per_container() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let answer = client
        .allocate(allocate_request(&[&[uuid(2), uuid(0)], &[uuid(3)]]))
        .await
        .unwrap()
        .into_inner();
    let visible: Vec<Option<&String>> = answer
        .container_responses
        .iter()
        .map(|c| c.envs.get("NVIDIA_VISIBLE_DEVICES"))
        .collect();
    let first = format!("{},{}", uuid(0), uuid(2));
    assert_eq!(visible, [Some(&first), Some(&uuid(3))]);
    assert!(
        answer
            .container_responses
            .iter()
            .all(|c| c.mounts.is_empty() && c.devices.is_empty() && c.cdi_devices.is_empty())
    );

    let none = client
        .allocate(AllocateRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(none.container_responses.is_empty());
    plugin.stop().await;
}

#[tokio::test]
async fn bad_allocate_requests_are_invalid_arguments_and_harmless() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let many_unknown: Vec<String> = (0..10_000).map(|i| format!("GPU-bogus-{i}")).collect();
    let many_same: Vec<String> = vec![uuid(0); 10_000];
    let cases: [(&str, Vec<String>, &str); 5] = [
        ("empty", vec![], "no device ids"),
        ("unknown", vec![uuid(0), "GPU-nope".into()], "GPU-nope"),
        ("duplicate", vec![uuid(1), uuid(1)], &uuid(1)),
        // Past the 8 KiB message limit: refused from the gRPC prefix, unread.
        (
            "10,000 unknown",
            many_unknown,
            "larger than the 8192-byte limit",
        ),
        (
            "10,000 duplicates",
            many_same,
            "larger than the 8192-byte limit",
        ),
    ];
    for (name, ids, names) in &cases {
        let err = client
            .allocate(allocate_request(&[&[uuid(3)], ids]))
            .await
            .expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "case {name}: {err:?}");
        assert!(err.message().contains(names), "case {name}: {err:?}");
        assert!(
            err.message().len() < 1024,
            "case {name}: the message names a few ids, not all: {} bytes",
            err.message().len()
        );
    }
    // Still serving, and still right.
    client.get_device_plugin_options(Empty {}).await.unwrap();
    let answer = client
        .allocate(allocate_request(&[&[uuid(1)]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0]
            .envs
            .get("NVIDIA_VISIBLE_DEVICES"),
        Some(&uuid(1))
    );
    plugin.stop().await;
}

#[tokio::test]
async fn preferred_allocation_honours_must_include_and_refuses_bad_input() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let all: Vec<String> = (0..4).map(uuid).collect();
    let request =
        |available: Vec<String>, must: Vec<String>, size: i32| PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must,
                allocation_size: size,
            }],
        };
    let answer = client
        .get_preferred_allocation(request(all.clone(), vec![uuid(2)], 2))
        .await
        .unwrap()
        .into_inner();
    let picked = &answer.container_responses[0].device_i_ds;
    assert_eq!(picked.len(), 2, "{picked:?}");
    assert!(picked.contains(&uuid(2)), "{picked:?}");
    assert!(picked.iter().all(|id| all.contains(id)), "{picked:?}");

    for (name, bad) in [
        ("negative size", request(all.clone(), vec![], -1)),
        ("zero size", request(all.clone(), vec![], 0)),
        ("unknown", request(vec!["GPU-nope".into()], vec![], 1)),
        ("too many", request(vec![uuid(0)], vec![], 2)),
    ] {
        let err = client.get_preferred_allocation(bad).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "case {name}: {err:?}");
    }
    client.get_device_plugin_options(Empty {}).await.unwrap();
    plugin.stop().await;
}

#[tokio::test]
async fn kubelet_restart_re_registers_and_ends_old_streams() {
    let mut plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    plugin.ready(true).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    next(&mut stream).await.unwrap().unwrap();

    plugin.kubelet.restart().await;
    let restarted = Instant::now();
    let registered = plugin.kubelet.wait_registrations(2, WITHIN).await;
    assert!(registered[1].at > restarted);
    assert_eq!(registered[1].request.resource_name, "nvidia.com/gpu");
    // The old stream ends (NVIDIA's plugin ends it with UNAVAILABLE too).
    match next(&mut stream).await {
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        Ok(None) => {}
        Ok(Some(list)) => panic!("old stream still sends: {list:?}"),
    }
    plugin.ready(true).await;
    let mut again = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = again.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next(&mut stream).await.unwrap().unwrap().devices.len(), 4);
    plugin.stop().await;
}

#[tokio::test]
async fn deleted_socket_is_served_and_registered_again() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let socket = plugin.socket("nvidia-gpu.sock");
    std::fs::remove_file(&socket).unwrap();
    let registered = plugin.kubelet.wait_registrations(2, WITHIN).await;
    assert_eq!(registered[1].request.endpoint, "nvidia-gpu.sock");
    assert!(socket.exists());
    plugin.ready(true).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    client.get_device_plugin_options(Empty {}).await.unwrap();
    plugin.stop().await;
}

#[tokio::test]
async fn stop_removes_our_sockets_only() {
    let plugin = start(vec![gpus(), shared()], None).await;
    plugin.kubelet.wait_registrations(2, WITHIN).await;
    let sockets = [
        plugin.socket("nvidia-gpu.sock"),
        plugin.socket("nvidia-gpu.shared.sock"),
    ];
    assert!(sockets.iter().all(|s| s.exists()));
    let readiness = plugin.control.readiness();
    let (_dir, kubelet) = plugin.stop().await;
    assert!(!*readiness.borrow(), "not ready once stopped");
    for socket in &sockets {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    assert!(
        kubelet.socket().exists(),
        "kubelet's socket is not ours to remove"
    );
}

#[tokio::test]
async fn probes_follow_registration_and_kubelet() {
    let addr = free_port();
    let mut plugin = start(vec![gpus()], Some(addr)).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    plugin.ready(true).await;
    assert_eq!(http_status(addr, "/healthz").await, 200);
    assert_eq!(http_status(addr, "/readyz").await, 200);
    assert_eq!(http_status(addr, "/nope").await, 404);

    // Kubelet gone: registration is lost.
    plugin.kubelet.stop().await;
    plugin.ready(false).await;
    assert_eq!(http_status(addr, "/readyz").await, 503);
    assert_eq!(http_status(addr, "/healthz").await, 200);

    // Kubelet back: registered again, ready again.
    plugin.kubelet.restart().await;
    plugin.kubelet.wait_registrations(2, WITHIN).await;
    plugin.ready(true).await;
    assert_eq!(http_status(addr, "/readyz").await, 200);

    // Our socket deleted: re-served and re-registered, ready again.
    std::fs::remove_file(plugin.socket("nvidia-gpu.sock")).unwrap();
    plugin.kubelet.wait_registrations(3, WITHIN).await;
    plugin.ready(true).await;
    assert_eq!(http_status(addr, "/readyz").await, 200);
    plugin.stop().await;
}

#[tokio::test]
async fn registration_is_retried_until_kubelet_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    kubelet.refuse_next(2);
    let node = node(settings(dir.path(), true, None), vec![gpus()]);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node,
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    // Refused twice: 100 ms, then 200 ms of backoff.
    kubelet.wait_registrations(1, Duration::from_secs(2)).await;
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn kubelet_that_starts_late_is_registered_with_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(settings(dir.path(), true, None), vec![gpus()]);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node,
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    // Long enough for the backoff to exceed a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!control.is_ready());
    let kubelet = FakeKubelet::start(dir.path());
    kubelet.wait_registrations(1, WITHIN).await;
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn without_a_kubelet_socket_it_serves_unregistered() {
    let dir = tempfile::tempdir().unwrap();
    // A leftover regular file where our socket goes is replaced.
    std::fs::write(dir.path().join("nvidia-gpu.sock"), b"stale").unwrap();
    let node = node(settings(dir.path(), false, None), vec![gpus()]);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node,
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    let mut ready = control.readiness();
    tokio::time::timeout(WITHIN, ready.wait_for(|r| *r))
        .await
        .unwrap()
        .unwrap();
    let mut client = dial_plugin(&dir.path().join("nvidia-gpu.sock")).await;
    let answer = client
        .allocate(allocate_request(&[&[uuid(0)]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0]
            .envs
            .get("NVIDIA_VISIBLE_DEVICES"),
        Some(&uuid(0))
    );
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn restart_command_rebuilds_and_a_failed_rebuild_keeps_the_old_node() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    let first = node(settings(dir.path(), true, None), vec![gpus()]);
    let second = node(settings(dir.path(), true, None), vec![gpus(), shared()]);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let rebuild = move || match counted.fetch_add(1, Ordering::SeqCst) {
        0 => Ok(second.clone()),
        _ => Err("config file: unknown key \"migStratgy\""),
    };
    let (control, commands) = control();
    let served = tokio::spawn(serve(first, rebuild, commands));
    kubelet.wait_registrations(1, WITHIN).await;

    assert!(control.restart());
    let registered = kubelet.wait_registrations(3, WITHIN).await;
    let mut names: Vec<&str> = registered[1..]
        .iter()
        .map(|r| r.request.resource_name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["nvidia.com/gpu", "nvidia.com/gpu.shared"]);

    // The next rebuild fails: the second node is served and registered again.
    assert!(control.restart());
    let registered = kubelet.wait_registrations(5, WITHIN).await;
    assert_eq!(registered.len(), 5);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(dir.path().join("nvidia-gpu.shared.sock").exists());
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_missing_socket_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("device-plugins");
    let node = node(settings(&missing, false, None), vec![gpus()]);
    let (_control, commands) = control();
    let err = serve(node, || Err::<Node, _>("not called"), commands)
        .await
        .unwrap_err();
    match err {
        ServerError::Watch { dir, .. } => assert_eq!(dir, missing),
        other => panic!("unexpected error: {other:?}"),
    }
}

#[tokio::test]
async fn sighup_rebuilds_and_sigterm_stops() {
    use nix::sys::signal::{Signal, raise};

    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    let node = node(settings(dir.path(), true, None), vec![gpus()]);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let again = node.clone();
    let rebuild = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::convert::Infallible>(again.clone())
    };
    let (control, commands) = control();
    // The handlers are in place once this returns, so raising is safe.
    let signals = tokio::spawn(forward_signals(control.clone()).unwrap());
    let served = tokio::spawn(serve(node, rebuild, commands));
    kubelet.wait_registrations(1, WITHIN).await;

    raise(Signal::SIGHUP).unwrap();
    kubelet.wait_registrations(2, WITHIN).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    raise(Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(3), served)
        .await
        .expect("SIGTERM stops serve")
        .unwrap()
        .unwrap();
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
    signals.abort();
}

#[tokio::test]
async fn a_failed_start_leaves_nothing_bound() {
    let dir = tempfile::tempdir().unwrap();
    // Something that is not a socket and cannot be removed as a file.
    let blocked = dir.path().join("nvidia-gpu.shared.sock");
    std::fs::create_dir(&blocked).unwrap();
    let node = node(settings(dir.path(), false, None), vec![gpus(), shared()]);
    let (_control, commands) = control();
    let err = serve(node, || Err::<Node, _>("not called"), commands)
        .await
        .unwrap_err();
    match err {
        ServerError::Stale { path, .. } => assert_eq!(path, blocked),
        other => panic!("unexpected error: {other:?}"),
    }
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
}

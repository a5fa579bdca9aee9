//! The device plugin's kubelet side through the library API: a hand-made node served
//! by `server::serve` in a tempdir, and a fake kubelet (`crate::common::kubelet`)
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

mod lifecycle;
mod service;

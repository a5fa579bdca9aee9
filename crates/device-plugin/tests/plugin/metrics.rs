// SPDX-License-Identifier: Apache-2.0
//! The device plugin's `/metrics` as a real process on a simulated 8-GPU node with the
//! mock NVML, against the fake kubelet (`crate::common::kubelet`) and, for pod labels, a fake
//! kubelet pod-resources server in the test.
//!
//! Each test starts the plugin with `--metrics-addr 127.0.0.1:0 --metrics-names=nvshim`
//! (our names; `metrics_dcgm` tests the default, dcgm-exporter's) and reads the bound
//! address from its log, scrapes over plain HTTP/1.1, and parses the answer with the
//! `prometheus-parse` text-format parser. The mock re-reads its readings when its config
//! file changes, so rewriting the config changes what the next scrape reports. Waits
//! poll against deadlines that are limits, not measurements (those are in
//! `benches/plugin.rs`).

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::kubelet::FakeKubelet;
use crate::common::node;
use crate::common::plugin_proc::{PluginProc, node_args};
use nvshim_device_plugin::api::{AllocateRequest, ContainerAllocateRequest};
use nvshim_device_plugin::metrics::pods::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use nvshim_device_plugin::metrics::pods::api::{
    ContainerDevices, ContainerResources, ListPodResourcesRequest, ListPodResourcesResponse,
    PodResources,
};
use nvshim_testkit::{MockConfig, NodeSpec, SimNode};
use prometheus_parse::{Sample, Scrape, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UnixListener};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

/// A limit for what has no required bound (start-up, an XID reaching the counter).
const GENEROUS: Duration = Duration::from_secs(20);
const GPU_SOCKET: &str = "nvidia-gpu.sock";
pub(crate) const GPU_RESOURCE: &str = "nvidia.com/gpu";
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The per-GPU gauges (after `nvshim_`), each of which every GPU of a plain node reports.
const GPU_GAUGES: [&str; 8] = [
    "gpu_utilization_ratio",
    "gpu_memory_utilization_ratio",
    "gpu_memory_used_bytes",
    "gpu_memory_total_bytes",
    "gpu_temperature_celsius",
    "gpu_power_watts",
    "gpu_sm_clock_hertz",
    "gpu_healthy",
];

/// A table row: case name, metric, labels the series must have, the value wanted (`None`:
/// no such series).
type Case<'a> = (&'a str, &'a str, &'a [(&'a str, &'a str)], Option<f64>);

pub(crate) fn plugin_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin"))
}

/// A plugin process with its socket directory, fake kubelet and metrics address. Fields
/// drop in order: the process is killed before its directory goes.
pub(crate) struct Running {
    pub(crate) plugin: PluginProc,
    kubelet: FakeKubelet,
    metrics: Option<SocketAddr>,
    pub(crate) dir: tempfile::TempDir,
}

impl Running {
    /// Where the test's pod-resources server (if any) listens; the plugin is told so.
    pub(crate) fn pod_resources(dir: &Path) -> PathBuf {
        dir.join("pod-resources.sock")
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.metrics.expect("metrics are on")
    }

    /// A scrape, parsed; panics with the plugin's log on a bad answer.
    async fn scrape(&self) -> Scrape {
        let (status, headers, body) = get(self.addr(), "/metrics").await;
        assert_eq!(status, 200, "{headers}\n{body}\n{}", self.plugin.log());
        assert!(
            headers
                .to_ascii_lowercase()
                .contains(&format!("content-type: {OPENMETRICS}")),
            "{headers}"
        );
        assert!(body.ends_with("# EOF\n"), "{body}");
        parse(&body)
    }

    /// Scrapes until `check` holds, at most [`GENEROUS`]; returns the scrape that did.
    async fn scrape_until(&self, what: &str, check: impl Fn(&Scrape) -> bool) -> Scrape {
        let deadline = tokio::time::Instant::now() + GENEROUS;
        loop {
            let scrape = self.scrape().await;
            if check(&scrape) {
                return scrape;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{what}: not within {GENEROUS:?}; last scrape:\n{}\nplugin log:\n{}",
                dump(&scrape),
                self.plugin.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Starts a fake kubelet and the plugin with `args` after the node's flags; with
/// `metrics`, also `--metrics-addr 127.0.0.1:0 --metrics-names=nvshim`, and waits for
/// the address it bound.
async fn launch(sim: &SimNode, args: &[&str], metrics: bool) -> Running {
    let ours = ["--metrics-names=nvshim"];
    let args: Vec<&str> = if metrics {
        ours.iter().chain(args).copied().collect()
    } else {
        args.to_vec()
    };
    launch_with_names(sim, &args, metrics).await
}

/// [`launch`] without choosing the metric names.
pub(crate) async fn launch_with_names(sim: &SimNode, args: &[&str], metrics: bool) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sockets = dir.path().join("plugins");
    fs::create_dir(&sockets).unwrap();
    let kubelet = FakeKubelet::start(&sockets);
    let mut argv = node_args(sim, &sockets);
    argv.push("--pod-resources-socket".into());
    argv.push(Running::pod_resources(dir.path()).display().to_string());
    if metrics {
        argv.extend(["--metrics-addr".into(), "127.0.0.1:0".into()]);
    }
    argv.extend(args.iter().map(|a| a.to_string()));
    let plugin = PluginProc::spawn(plugin_bin(), &argv, &sim.env());
    kubelet.wait_registrations(1, GENEROUS).await;
    // The fake kubelet records a registration before it answers; the plugin counts and
    // logs it once the answer is in.
    assert!(
        plugin.wait_log("registered with kubelet", GENEROUS).await,
        "{}",
        plugin.log()
    );
    let metrics = if metrics {
        assert!(
            plugin.wait_log("serving metrics", GENEROUS).await,
            "no metrics listener:\n{}",
            plugin.log()
        );
        Some(bound_addr(&plugin.log()))
    } else {
        None
    };
    Running {
        plugin,
        kubelet,
        metrics,
        dir,
    }
}

/// The `addr=` of the plugin's "serving metrics" log line.
fn bound_addr(log: &str) -> SocketAddr {
    let line = log
        .lines()
        .find(|l| l.contains("serving metrics"))
        .unwrap_or_else(|| panic!("no metrics line in:\n{log}"));
    let addr = line
        .split_whitespace()
        .find_map(|word| word.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in {line:?}"));
    addr.parse()
        .unwrap_or_else(|e| panic!("addr {addr:?} in {line:?}: {e}"))
}

/// `GET path` over a fresh connection: status, head and body.
pub(crate) async fn get(addr: SocketAddr, path: &str) -> (u16, String, String) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).await.unwrap();
    let reply = String::from_utf8(reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head.to_string(), body.to_string())
}

pub(crate) fn parse(body: &str) -> Scrape {
    let lines = body.lines().map(|line| Ok(line.to_owned()));
    Scrape::parse(lines).unwrap_or_else(|e| panic!("not Prometheus text: {e}\n{body}"))
}

pub(crate) fn dump(scrape: &Scrape) -> String {
    scrape
        .samples
        .iter()
        .map(|s| format!("{}{} {:?}", s.metric, s.labels, s.value))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(crate) fn number(sample: &Sample) -> Option<f64> {
    match sample.value {
        Value::Counter(v) | Value::Gauge(v) | Value::Untyped(v) => Some(v),
        Value::Histogram(_) | Value::Summary(_) => None,
    }
}

/// The samples of `nvshim_<metric>` whose labels include all of `labels`.
fn samples<'a>(scrape: &'a Scrape, metric: &str, labels: &[(&str, &str)]) -> Vec<&'a Sample> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric.strip_prefix("nvshim_") == Some(metric))
        .filter(|s| labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
        .collect()
}

/// The one value of `nvshim_<metric>` with `labels`; `None` when there is no such series.
fn value(scrape: &Scrape, metric: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let found = samples(scrape, metric, labels);
    assert!(
        found.len() <= 1,
        "{metric} {labels:?} matches {} series:\n{}",
        found.len(),
        dump(scrape)
    );
    found.first().and_then(|s| number(s))
}

/// Asserts every row of a table of [`Case`]s.
fn check(scrape: &Scrape, cases: &[Case]) {
    for (case, metric, labels, want) in cases {
        let got = value(scrape, metric, labels);
        assert_eq!(got, *want, "case {case}:\n{}", dump(scrape));
    }
}

/// The node's mock config, to change readings and write back.
pub(crate) fn mock_config(sim: &SimNode) -> MockConfig {
    MockConfig::new(&sim.spec, &sim.dev_root, &sim.dir.join("xid-events"))
}

/// Appends `line` to the node's event file in one write.
fn append_event(sim: &SimNode, line: &str) {
    let mut file = fs::OpenOptions::new()
        .append(true)
        .open(sim.dir.join("xid-events"))
        .unwrap();
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

#[tokio::test]
async fn gpu_gauges_follow_the_mock_and_parse() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let mut config = mock_config(sim);
    let busy = &mut config.gpus[2];
    busy.utilization_gpu_percent = Some(75);
    busy.utilization_memory_percent = Some(30);
    busy.temperature_celsius = Some(66);
    busy.power_milliwatts = Some(251_500);
    busy.sm_clock_mhz = Some(1980);
    busy.memory_used_bytes = 10 << 30;
    // A board without a power sensor: its power series is left out, not 0.
    config.gpus[5].power_milliwatts = None;
    config.write(&sim.mock_config).unwrap();

    let run = launch(sim, &[], true).await;
    let registered = [("resource", GPU_RESOURCE), ("result", "success")];
    // Once, in a full run on a loaded machine, the first scrape after `launch` had no
    // registration series yet: wait for it, then check every value.
    let scrape = run
        .scrape_until("the registration counted", |s| {
            value(s, "plugin_registrations_total", &registered).is_some()
        })
        .await;
    let uuid2 = sim.spec.gpus[2].uuid.as_str();
    let gpu2 = [("gpu", "2"), ("uuid", uuid2)];
    let (g0, g5, g7) = ([("gpu", "0")], [("gpu", "5")], [("gpu", "7")]);
    let gib = |n: u64| Some((n << 30) as f64);
    let cases: [Case; 12] = [
        ("utilization", "gpu_utilization_ratio", &gpu2, Some(0.75)),
        (
            "memory util",
            "gpu_memory_utilization_ratio",
            &gpu2,
            Some(0.3),
        ),
        ("temperature", "gpu_temperature_celsius", &gpu2, Some(66.0)),
        ("power", "gpu_power_watts", &gpu2, Some(251.5)),
        ("SM clock", "gpu_sm_clock_hertz", &gpu2, Some(1.98e9)),
        ("memory used", "gpu_memory_used_bytes", &gpu2, gib(10)),
        ("memory total", "gpu_memory_total_bytes", &gpu2, gib(80)),
        ("healthy", "gpu_healthy", &gpu2, Some(1.0)),
        ("idle GPU", "gpu_utilization_ratio", &g0, Some(0.0)),
        ("idle temp", "gpu_temperature_celsius", &g7, Some(35.0)),
        ("no power sensor", "gpu_power_watts", &g5, None),
        (
            "registered",
            "plugin_registrations_total",
            &registered,
            Some(1.0),
        ),
    ];
    check(&scrape, &cases);
    for metric in GPU_GAUGES {
        let gpus: BTreeSet<&str> = samples(&scrape, metric, &[])
            .iter()
            .filter_map(|s| s.labels.get("gpu"))
            .collect();
        let want = if metric == "gpu_power_watts" { 7 } else { 8 };
        assert_eq!(gpus.len(), want, "case {metric}: {gpus:?}");
        for sample in samples(&scrape, metric, &[]) {
            assert_eq!(
                sample.labels.get("model"),
                Some("NVIDIA A100-SXM4-80GB"),
                "case {metric}"
            );
            assert_eq!(
                sample.labels.get("pod"),
                Some(""),
                "case {metric}: nobody holds it"
            );
        }
    }

    // The mock re-reads its readings when the config changes; the next scrape shows it.
    config.gpus[2].temperature_celsius = Some(81);
    config.gpus[2].utilization_gpu_percent = Some(100);
    config.write(&sim.mock_config).unwrap();
    let scrape = run
        .scrape_until("the new temperature", |s| {
            value(s, "gpu_temperature_celsius", &gpu2) == Some(81.0)
        })
        .await;
    assert_eq!(value(&scrape, "gpu_utilization_ratio", &gpu2), Some(1.0));

    // Nothing but /metrics is served.
    for (path, want) in [("/", 404), ("/healthz", 404), ("/metrics/x", 404)] {
        let (status, _, _) = get(run.addr(), path).await;
        assert_eq!(status, want, "case {path}");
    }
}

#[tokio::test]
async fn xid_errors_and_health_flips_are_counted() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let run = launch(sim, &[], true).await;
    let uuid3 = sim.spec.gpus[3].uuid.clone();
    let xid = |xid: &'static str| [("gpu", "3"), ("xid", xid)];
    let before = run.scrape().await;
    assert_eq!(value(&before, "gpu_xid_errors_total", &xid("79")), None);

    // XID 13 is an application error: counted, but the GPU stays healthy.
    append_event(sim, &format!("{uuid3} 13"));
    let scrape = run
        .scrape_until("XID 13 counted", |s| {
            value(s, "gpu_xid_errors_total", &xid("13")) == Some(1.0)
        })
        .await;
    assert_eq!(value(&scrape, "gpu_healthy", &[("gpu", "3")]), Some(1.0));

    append_event(sim, &format!("{uuid3} 79"));
    append_event(sim, &format!("{uuid3} 79"));
    let (gpu2, unhealthy) = ([("gpu", "2")], [("to", "unhealthy")]);
    // The flip is counted by its own task after the board changes: wait for a count,
    // then check it is one.
    let scrape = run
        .scrape_until("two XID 79s, GPU 3 unhealthy and the flip counted", |s| {
            value(s, "gpu_xid_errors_total", &xid("79")) == Some(2.0)
                && value(s, "gpu_healthy", &[("gpu", "3")]) == Some(0.0)
                && value(s, "plugin_health_transitions_total", &unhealthy).is_some()
        })
        .await;
    let cases: [Case; 4] = [
        ("XID 13 once", "gpu_xid_errors_total", &xid("13"), Some(1.0)),
        ("other GPUs", "gpu_xid_errors_total", &gpu2, None),
        ("other GPUs healthy", "gpu_healthy", &gpu2, Some(1.0)),
        (
            "one flip",
            "plugin_health_transitions_total",
            &unhealthy,
            Some(1.0),
        ),
    ];
    check(&scrape, &cases);
    let labelled = samples(&scrape, "gpu_xid_errors_total", &xid("79"));
    assert_eq!(labelled[0].labels.get("uuid"), Some(uuid3.as_str()));
    assert_eq!(
        labelled[0].labels.get("model"),
        Some("NVIDIA A100-SXM4-80GB")
    );
}

#[tokio::test]
async fn allocations_and_their_latency_are_counted() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let run = launch(sim, &[], true).await;
    let mut client = run.kubelet.dial(GPU_SOCKET).await;
    let uuids: Vec<String> = sim.spec.gpus.iter().map(|g| g.uuid.clone()).collect();
    let request = |ids: &[&String]| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    };
    client
        .allocate(request(&[&uuids[1], &uuids[6]]))
        .await
        .unwrap();
    client.allocate(request(&[&uuids[2]])).await.unwrap();
    let unknown = "GPU-not-on-this-node".to_string();
    client.allocate(request(&[&unknown])).await.unwrap_err();

    let scrape = run.scrape().await;
    let gpu = [("resource", GPU_RESOURCE)];
    let result = |r: &'static str| [("resource", GPU_RESOURCE), ("result", r)];
    let (ok, failed) = (result("success"), result("failure"));
    let cases: [Case; 2] = [
        ("success", "plugin_allocations_total", &ok, Some(2.0)),
        ("failure", "plugin_allocations_total", &failed, Some(1.0)),
    ];
    check(&scrape, &cases);
    let count = value(&scrape, "plugin_allocate_duration_seconds_count", &gpu);
    assert_eq!(count, Some(3.0), "{}", dump(&scrape));
    let histogram = samples(&scrape, "plugin_allocate_duration_seconds", &gpu);
    let Some(Value::Histogram(buckets)) = histogram.first().map(|s| &s.value) else {
        panic!("no latency histogram:\n{}", dump(&scrape));
    };
    let last = buckets.last().map(|b| (b.less_than, b.count));
    assert_eq!(last, Some((f64::INFINITY, 3.0)), "{buckets:?}");
}

/// A fake kubelet pod-resources server answering `List` with what the test sets.
#[derive(Clone, Default)]
pub(crate) struct Lister(pub(crate) Arc<Mutex<ListPodResourcesResponse>>);

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Ok(Response::new(self.0.lock().unwrap().clone()))
    }
}

pub(crate) fn pod(
    name: &str,
    namespace: &str,
    container: &str,
    resource: &str,
    ids: &[&str],
) -> PodResources {
    PodResources {
        name: name.into(),
        namespace: namespace.into(),
        containers: vec![ContainerResources {
            name: container.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
        }],
    }
}

#[tokio::test]
async fn pod_resources_label_the_gpus_that_pods_hold() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let run = launch(sim, &[], true).await;
    // Kubelet's socket appears after the plugin started: it is looked for at each scrape.
    let lister = Lister::default();
    let listener = UnixListener::bind(Running::pod_resources(run.dir.path())).unwrap();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(lister.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let replica = format!("{}::1", uuid(4));
    *lister.0.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![
            pod("p1", "ns", "c", GPU_RESOURCE, &[&uuid(1)]),
            // A time-sliced replica id counts for its GPU.
            pod("p2", "team", "train", GPU_RESOURCE, &[&replica]),
            // Someone else's device ids are not GPUs.
            pod("p3", "ns", "nic", "example.com/nic", &["1"]),
        ],
    };
    let scrape = run
        .scrape_until("pod labels on GPU 1", |s| {
            value(s, "gpu_temperature_celsius", &[("gpu", "1"), ("pod", "p1")]).is_some()
        })
        .await;
    let held = [
        ("gpu", "1"),
        ("pod", "p1"),
        ("namespace", "ns"),
        ("container", "c"),
    ];
    let shared = [
        ("gpu", "4"),
        ("pod", "p2"),
        ("namespace", "team"),
        ("container", "train"),
    ];
    let (free, p3, gpu1) = ([("gpu", "0"), ("pod", "")], [("pod", "p3")], [("gpu", "1")]);
    for metric in GPU_GAUGES {
        // (case, labels, how many series)
        for (case, labels, want) in [("p1", &held[..], 1), ("p2", &shared, 1), ("free", &free, 1)]
            .into_iter()
            .chain([("p3", &p3[..], 0), ("one series for GPU 1", &gpu1, 1)])
        {
            let got = samples(&scrape, metric, labels).len();
            assert_eq!(got, want, "case {metric} {case}:\n{}", dump(&scrape));
        }
    }

    // When the pod is gone, so are its series: nothing accumulates.
    *lister.0.lock().unwrap() = ListPodResourcesResponse::default();
    let scrape = run
        .scrape_until("p1's series gone", |s| {
            samples(s, "gpu_temperature_celsius", &[("pod", "p1")]).is_empty()
        })
        .await;
    let free1 = [("gpu", "1"), ("pod", "")];
    assert!(value(&scrape, "gpu_temperature_celsius", &free1).is_some());

    // A kubelet that stops answering costs the labels, not the metrics.
    server.abort();
    let _ = server.await;
    let scrape = run.scrape().await;
    let healthy = samples(&scrape, "gpu_healthy", &[]);
    assert_eq!(healthy.len(), 8, "{}", dump(&scrape));
}

#[tokio::test]
async fn metrics_are_off_by_default() {
    let node = node(&NodeSpec::standard(2));
    let run = launch(&node.sim, &[], false).await;
    let log = run.plugin.log();
    assert!(!log.contains("serving metrics"), "{log}");
    let ports = listening_tcp_ports(run.plugin.pid());
    assert!(
        ports.is_empty(),
        "the plugin listens on TCP {ports:?}:\n{log}"
    );
}

/// The TCP ports process `pid` listens on: its socket descriptors matched against the
/// `LISTEN` entries of `/proc/net/tcp` and `tcp6`.
fn listening_tcp_ports(pid: u32) -> Vec<u16> {
    let inodes: BTreeSet<String> = fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|entry| fs::read_link(entry.ok()?.path()).ok())
        .filter_map(|target| {
            let target = target.to_string_lossy().into_owned();
            let inode = target.strip_prefix("socket:[")?.strip_suffix(']')?;
            Some(inode.to_owned())
        })
        .collect();
    let mut ports = Vec::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address is field 1 (`ADDR:PORT` in hex), st field 3 (0A = LISTEN),
            // inode field 9.
            if fields.len() > 9 && fields[3] == "0A" && inodes.contains(fields[9]) {
                let port = fields[1].rsplit(':').next().unwrap();
                ports.push(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

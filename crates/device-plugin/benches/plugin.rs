// SPDX-License-Identifier: Apache-2.0
//! `nvidia-device-plugin` as a real process on a simulated 8-GPU node, measured from
//! a fake kubelet's side. Prints a table; `make bench` runs it on the release binary.
//!
//! - start-up: spawn → `Register` received by the fake kubelet, over many starts (the
//!   first is a warm-up and not counted), each process stopped with SIGTERM after;
//! - peak RSS (`VmHWM`) of one more start: once registered, once kubelet's
//!   `ListAndWatch` has its first list, and after the calls below;
//! - `Allocate` (2 GPUs), `GetPreferredAllocation` (2 of 8) and the no-op
//!   `GetDevicePluginOptions`, interleaved on one connection (the order rotates every
//!   round), so machine noise and connection effects hit all three alike;
//! - on that same process, the abuse set (issue 18): the bad requests (a 1 MiB id, a
//!   1 MiB message, 10,000 ids, unknown ids, empty, duplicates) 100 times each and 3
//!   kubelet restarts, then its peak RSS again, next to what NVML alone costs a bare C
//!   process (`benches/nvml_baseline.c`, built with the system `cc`, on the same node);
//! - with `--metrics-addr` on, a third process: `GET /metrics` over one keep-alive
//!   connection, as Prometheus scrapes (every GPU sampled from the mock NVML at each
//!   scrape for dcgm-exporter's default set, about 190 NVML calls), timed per scrape, and
//!   `VmRSS` before and after 1,000
//!   scrapes. This process runs without the mock's call log, a test aid that opens and
//!   appends to a file on every NVML call and would otherwise be most of what is timed.
//!
//! `$NVSHIM_BENCH_PLUGIN` names the binary (else cargo's build of it);
//! `$NVSHIM_BENCH_STARTS`, `$NVSHIM_BENCH_CALLS` and `$NVSHIM_BENCH_SCRAPES` change the
//! counts.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../tests/plugin/common/kubelet.rs"]
mod kubelet;
#[path = "../tests/plugin/common/plugin_proc.rs"]
mod plugin_proc;

use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kubelet::FakeKubelet;
use nix::sys::signal::Signal;
use nvshim_device_plugin::api::device_plugin_client::DevicePluginClient;
use nvshim_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};
use nvshim_testkit::{Artifacts, MOCK_NVML_CALL_LOG_ENV, NodeSpec, SimNode};
use plugin_proc::{PluginProc, node_args};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// How long any one step may take before the bench gives up.
const LIMIT: Duration = Duration::from_secs(20);
const MIB: f64 = 1024.0;

fn plugin() -> PathBuf {
    std::env::var_os("NVSHIM_BENCH_PLUGIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_nvidia-device-plugin")))
}

fn count(var: &str, default: usize, least: usize) -> usize {
    std::env::var(var)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
        .max(least)
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() - 1) * p / 100]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

fn us(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn mib(kib: Option<u64>) -> String {
    kib.map_or("?".into(), |k| format!("{:.2} MiB", k as f64 / MIB))
}

struct Bench {
    binary: PathBuf,
    node: SimNode,
    args: Vec<String>,
    kubelet: FakeKubelet,
    sockets: PathBuf,
}

impl Bench {
    fn spawn(&self) -> PluginProc {
        PluginProc::spawn(&self.binary, &self.args, &self.node.env())
    }

    /// A plugin with `extra` flags and the mock's config but not its call log.
    fn spawn_quiet(&self, extra: &[&str]) -> PluginProc {
        let mut args = self.args.clone();
        args.extend(extra.iter().map(|a| a.to_string()));
        let env: Vec<(String, String)> = self
            .node
            .env()
            .into_iter()
            .filter(|(k, _)| k != MOCK_NVML_CALL_LOG_ENV)
            .collect();
        PluginProc::spawn(&self.binary, &args, &env)
    }

    /// Waits for registration number `n` (counting from 1) and returns when it came.
    async fn registered(&self, n: usize, plugin: &PluginProc) -> Instant {
        let deadline = Instant::now() + LIMIT;
        loop {
            if let Some(r) = self.kubelet.registrations().get(n - 1) {
                return r.at;
            }
            assert!(
                Instant::now() < deadline,
                "no registration {n} within {LIMIT:?}:\n{}",
                plugin.log()
            );
            // The fake kubelet stamps `at` when the call arrives, so the polling
            // interval does not show in the figure.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    async fn stop(&self, mut plugin: PluginProc) {
        plugin.signal(Signal::SIGTERM);
        let status = plugin.exit(LIMIT).await;
        assert!(
            status.is_some_and(|s| s.success()),
            "SIGTERM: {status:?}\n{}",
            plugin.log()
        );
    }
}

/// A keep-alive HTTP/1.1 connection to the plugin's `/metrics`, as Prometheus holds one.
struct Scraper {
    stream: BufReader<TcpStream>,
    request: Vec<u8>,
}

impl Scraper {
    async fn connect(addr: SocketAddr) -> Scraper {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        Scraper {
            stream: BufReader::new(stream),
            request: format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").into_bytes(),
        }
    }

    /// One scrape; returns the body's length.
    async fn scrape(&mut self) -> usize {
        self.stream
            .get_mut()
            .write_all(&self.request)
            .await
            .unwrap();
        let mut line = String::new();
        let mut length = None;
        loop {
            line.clear();
            self.stream.read_line(&mut line).await.unwrap();
            if line == "\r\n" {
                break;
            }
            if line.starts_with("HTTP/1.1") {
                assert!(line.contains(" 200 "), "{line}");
            }
            if let Some(value) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = value.trim().parse().ok();
            }
        }
        let mut body = vec![0; length.expect("content-length")];
        self.stream.read_exact(&mut body).await.unwrap();
        // dcgm-exporter's names (the default): the 0.0.4 text, with a GPU family in it.
        let text = String::from_utf8_lossy(&body);
        assert!(text.contains("# TYPE DCGM_FI_DEV_GPU_TEMP gauge"), "{text}");
        body.len()
    }
}

/// The address in the plugin's "serving metrics addr=…" log line.
fn metrics_addr(plugin: &PluginProc) -> SocketAddr {
    let log = plugin.log();
    log.lines()
        .filter(|l| l.contains("serving metrics"))
        .find_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address in the log:\n{log}"))
}

/// Times one call.
macro_rules! timed {
    ($call:expr) => {{
        let start = Instant::now();
        $call.await.unwrap();
        start.elapsed()
    }};
}

async fn run() {
    let tmp = tempfile::tempdir().unwrap();
    let artifacts = Artifacts::locate().unwrap();
    let node =
        SimNode::build(&NodeSpec::standard(8), &tmp.path().join("node"), &artifacts).unwrap();
    let sockets = tmp.path().join("plugins");
    fs::create_dir(&sockets).unwrap();
    let kubelet = FakeKubelet::start(&sockets);
    let mut bench = Bench {
        binary: plugin(),
        args: node_args(&node, &sockets),
        node,
        kubelet,
        sockets,
    };
    let starts = count("NVSHIM_BENCH_STARTS", 41, 21);
    let calls = count("NVSHIM_BENCH_CALLS", 2000, 1000);

    // Start-up to registration.
    let mut startup = Vec::with_capacity(starts);
    for n in 0..starts {
        let spawned = Instant::now();
        let plugin = bench.spawn();
        let at = bench.registered(n + 1, &plugin).await;
        // The first start warms the page cache and is not counted.
        if n > 0 {
            startup.push(at.saturating_duration_since(spawned));
        }
        bench.stop(plugin).await;
    }
    startup.sort();

    // Memory and latency, on one more process.
    let plugin = bench.spawn();
    bench.registered(starts + 1, &plugin).await;
    let hwm_registered = plugin.status_kib("VmHWM");
    let socket = bench.sockets.join("nvidia-gpu.sock");
    // As kubelet, which sends ids it got from us: our client's 4 MiB send limit
    // raised so the plugin's own limit is what refuses the 1 MiB requests below.
    let mut client: DevicePluginClient<Channel> = kubelet::dial_plugin(&socket)
        .await
        .max_encoding_message_size(8 << 20);
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().unwrap();
    assert_eq!(first.devices.len(), 8);
    let hwm_listed = plugin.status_kib("VmHWM");

    let uuids: Vec<String> = bench
        .node
        .spec
        .gpus
        .iter()
        .map(|g| g.uuid.clone())
        .collect();
    let allocate = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: vec![uuids[6].clone(), uuids[1].clone()],
        }],
    };
    let preferred = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: uuids.clone(),
            must_include_device_i_ds: vec![],
            allocation_size: 2,
        }],
    };
    let warmup = 100;
    let mut noop = Vec::with_capacity(calls);
    let mut alloc = Vec::with_capacity(calls);
    let mut pref = Vec::with_capacity(calls);
    for round in 0..warmup + calls {
        let mut took = [Duration::ZERO; 3];
        for k in 0..3 {
            let which = (round + k) % 3;
            took[which] = match which {
                0 => timed!(client.get_device_plugin_options(Empty {})),
                1 => {
                    let request = allocate.clone();
                    timed!(client.allocate(request))
                }
                _ => {
                    let request = preferred.clone();
                    timed!(client.get_preferred_allocation(request))
                }
            };
        }
        if round >= warmup {
            noop.push(took[0]);
            alloc.push(took[1]);
            pref.push(took[2]);
        }
    }
    let hwm_calls = plugin.status_kib("VmHWM");
    let abuse = abuse(&mut bench, &mut client, &uuids, starts + 1, &plugin).await;
    let hwm_abused = plugin.status_kib("VmHWM");
    let baseline = nvml_baseline(&bench.node, tmp.path());
    let details = [
        ("VmRSS", plugin.status_kib("VmRSS")),
        ("RssAnon", plugin.status_kib("RssAnon")),
        ("RssFile", plugin.status_kib("RssFile")),
        ("Pss_Anon", plugin.smaps_kib("Pss_Anon")),
        ("Pss_File", plugin.smaps_kib("Pss_File")),
    ];
    let threads = plugin.threads();
    drop(stream);
    bench.stop(plugin).await;

    // Scrapes, on a plugin with metrics on.
    let scrapes = count("NVSHIM_BENCH_SCRAPES", 1000, 1000);
    let plugin = bench.spawn_quiet(&["--metrics-addr", "127.0.0.1:0"]);
    bench.registered(starts + 2, &plugin).await;
    assert!(plugin.wait_log("serving metrics", LIMIT).await);
    let mut scraper = Scraper::connect(metrics_addr(&plugin)).await;
    let mut body = 0;
    for _ in 0..100 {
        body = scraper.scrape().await;
    }
    let rss_before = plugin.status_kib("VmRSS");
    let mut scrape = Vec::with_capacity(scrapes);
    for _ in 0..scrapes {
        let start = Instant::now();
        scraper.scrape().await;
        scrape.push(start.elapsed());
    }
    let rss_after = plugin.status_kib("VmRSS");
    let hwm_scrapes = plugin.status_kib("VmHWM");
    drop(scraper);
    bench.stop(plugin).await;
    scrape.sort();
    let growth_kib = rss_after
        .zip(rss_before)
        .map(|(after, before)| after as i64 - before as i64);

    for v in [&mut noop, &mut alloc, &mut pref] {
        v.sort();
    }
    let p50 = |v: &[Duration]| pct(v, 50);
    let alloc_vs_noop = p50(&alloc).as_secs_f64() / p50(&noop).as_secs_f64() - 1.0;
    let limit_kib = 8 * 1024;
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };

    println!("nvidia-device-plugin, simulated 8-GPU node (mock NVML), fake kubelet");
    println!("binary: {}", bench.binary.display());
    println!(
        "{} counted starts, {calls} calls of each RPC after {warmup} warm-up rounds\n",
        startup.len()
    );
    println!("| {:<52} | {:>22} | {:>30} |", "what", "figure", "target");
    println!("| {:-<52} | {:->22} | {:->30} |", "", "", "");
    let row = |what: &str, figure: String, target: String| {
        println!("| {what:<52} | {figure:>22} | {target:>30} |");
    };
    for (what, kib) in [
        ("peak RSS (VmHWM), registered", hwm_registered),
        ("peak RSS, after the first ListAndWatch list", hwm_listed),
        (
            &*format!("peak RSS, after {calls} Allocate + {calls} GetPreferred"),
            hwm_calls,
        ),
    ] {
        let ok = kib.is_some_and(|k| k <= limit_kib);
        row(what, mib(kib), format!("<= 8 MiB: {}", verdict(ok)));
    }
    let median = p50(&startup);
    row(
        "start → registered, median",
        ms(median),
        format!("<= 20 ms: {}", verdict(median <= Duration::from_millis(20))),
    );
    row(
        "start → registered, p10 / p90",
        format!("{} / {}", ms(pct(&startup, 10)), ms(pct(&startup, 90))),
        String::new(),
    );
    row(
        "GetDevicePluginOptions (no-op) p50 / p99",
        format!("{} / {}", us(p50(&noop)), us(pct(&noop, 99))),
        String::new(),
    );
    row(
        "Allocate (2 GPUs) p50 / p99",
        format!("{} / {}", us(p50(&alloc)), us(pct(&alloc, 99))),
        format!(
            "p50 <= no-op +10%: {:+.1}% {}",
            alloc_vs_noop * 100.0,
            verdict(alloc_vs_noop <= 0.10)
        ),
    );
    row(
        "GetPreferredAllocation (2 of 8) p50 / p99",
        format!("{} / {}", us(p50(&pref)), us(pct(&pref, 99))),
        format!(
            "p50 <= 0.5 ms: {}",
            verdict(p50(&pref) <= Duration::from_micros(500))
        ),
    );
    row(
        "scrape /metrics (8 GPUs, keep-alive) p50 / p99",
        format!("{} / {}", us(p50(&scrape)), us(pct(&scrape, 99))),
        format!(
            "p99 < 5 ms: {}",
            verdict(pct(&scrape, 99) < Duration::from_millis(5))
        ),
    );
    row(
        &format!("VmRSS growth over {scrapes} scrapes"),
        growth_kib.map_or("?".into(), |k| format!("{:+.3} MiB", k as f64 / MIB)),
        format!(
            "<= 1 MiB: {}",
            verdict(growth_kib.is_some_and(|k| k <= 1024))
        ),
    );
    row(
        "VmRSS before / after the scrapes",
        format!("{} / {}", mib(rss_before), mib(rss_after)),
        String::new(),
    );
    row(
        "peak RSS (VmHWM), metrics on, after the scrapes",
        mib(hwm_scrapes),
        String::new(),
    );
    let own = hwm_abused.zip(baseline).map(|(p, b)| p as i64 - b as i64);
    row(
        &format!("peak RSS after the abuse set ({abuse} bad requests, 3 kubelet restarts)"),
        mib(hwm_abused),
        String::new(),
    );
    row(
        "NVML alone in a bare C process (VmHWM)",
        mib(baseline),
        String::new(),
    );
    row(
        "the plugin's own peak (the two above, subtracted)",
        own.map_or("?".into(), |k| format!("{:.2} MiB", k as f64 / MIB)),
        format!("<= 6 MiB: {}", verdict(own.is_some_and(|k| k <= 6 * 1024))),
    );
    println!("one scrape: {body} bytes");
    println!();
    let mut line = String::from("after the calls:");
    for (name, kib) in details {
        line.push_str(&format!(" {name} {}", mib(kib)));
        line.push(',');
    }
    line.push_str(&format!(
        " threads {}",
        threads.map_or("?".into(), |t| t.to_string())
    ));
    println!("{line}");
    if let Ok(meta) = fs::metadata(&bench.binary) {
        println!("binary size: {}", mib(Some(meta.len() / 1024)));
    }
}

/// The bad-request set, 100 rounds, each refused; then 3 kubelet restarts,
/// each followed by the re-registration and kubelet's new `ListAndWatch`. Returns how
/// many bad requests were sent.
async fn abuse(
    bench: &mut Bench,
    client: &mut DevicePluginClient<Channel>,
    uuids: &[String],
    registered: usize,
    plugin: &PluginProc,
) -> usize {
    let one = |ids: Vec<String>| AllocateRequest {
        container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
    };
    let bad = [
        one(vec!["x".repeat(1 << 20)]),
        one((0..10_000).map(|i| i.to_string()).collect()),
        one((0..10_000).map(|i| format!("GPU-bogus-{i}")).collect()),
        one(vec!["GPU-nope".into(), "MIG-nope".into()]),
        one(vec![]),
        one(vec![uuids[0].clone(), uuids[0].clone()]),
    ];
    let mut sent = 0;
    for _ in 0..100 {
        for request in &bad {
            let refused = client.allocate(request.clone()).await.unwrap_err();
            assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
            sent += 1;
        }
    }
    for n in 1..=3 {
        bench.kubelet.restart().await;
        bench.registered(registered + n, plugin).await;
    }
    sent
}

/// VmHWM of `benches/nvml_baseline.c` run against `node`'s NVML, in KiB.
fn nvml_baseline(node: &SimNode, dir: &Path) -> Option<u64> {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/nvml_baseline.c");
    let binary = dir.join("nvml_baseline");
    let built = std::process::Command::new("cc")
        .args(["-O2", "-o"])
        .arg(&binary)
        .arg(source)
        .arg("-ldl")
        .status()
        .ok()?;
    assert!(built.success(), "cc {source} failed");
    let out = std::process::Command::new(&binary)
        .arg(plugin_proc::nvml_lib(node))
        .env_clear()
        .envs(node.env())
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn main() {
    if !fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        eprintln!("bench plugin: run as root (the simulated node needs mknod)");
        std::process::exit(1);
    }
    let binary = plugin();
    if !Path::new(&binary).is_file() {
        eprintln!("bench plugin: no binary at {}", binary.display());
        std::process::exit(1);
    }
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap()
        .block_on(run());
}

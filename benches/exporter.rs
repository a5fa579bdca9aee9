//! The metrics exporter's scrape: `Exporter::render` of the default set for a simulated
//! 8-GPU node whose GPUs have every reading (mock NVML), two containers holding each GPU.
//! Also what one mock NVML call costs and how many calls a render makes, to tell our own
//! work from the mock's (every mock call reads its event file and stats its config), and,
//! with `NVSHIM_BENCH_NVSHIM` set to a release `nvshim`, the resident memory of a running
//! `nvshim exporter` process at start and after 10,000 scrapes over HTTP.
//!
//! `make bench` (or `cargo bench --bench exporter` after `cargo build --workspace
//! --release`) first prints the process's resident memory before and after 10,000
//! renders (`/proc/self/statm`), then divan's table; the median column is the p50 to
//! quote. Needs root (the node's /dev entries are made with mknod).

#![allow(unsafe_code, clippy::expect_used)]

use std::path::Path;
use std::sync::Arc;

use nvshim::exporter::{ContainerDevices, Counters, Exporter, Holders};
use nvshim::nvml::Nvml;
use nvshim_testkit::{
    Artifacts, MockConfig, MockEcc, MockGpm, MockRemappedRows, MockRetiredPages, MockTelemetry,
    NodeSpec, SimNode,
};

/// How many renders the memory check runs.
const RSS_RENDERS: usize = 10_000;

struct Fixture {
    _dir: tempfile::TempDir,
    nvml: Arc<Nvml>,
    library: std::path::PathBuf,
    exporter: Exporter,
    holders: Holders,
}

static FIXTURE: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();

fn every_reading() -> MockTelemetry {
    MockTelemetry {
        memory_reserved_bytes: Some(512 << 20),
        memory_clock_mhz: Some(1593),
        total_energy_millijoules: Some(123_456_789),
        encoder_utilization_percent: Some(3),
        decoder_utilization_percent: Some(4),
        pcie_replay_count: Some(0),
        pcie_tx_kilobytes_per_second: Some(1000),
        pcie_rx_kilobytes_per_second: Some(2000),
        memory_temperature_celsius: Some(45),
        nvlink_bandwidth_total: Some(1 << 30),
        ecc: Some(MockEcc::default()),
        retired_pages: Some(MockRetiredPages::default()),
        remapped_rows: Some(MockRemappedRows::default()),
        clocks_event_reasons: Some(0),
        gpm: Some(MockGpm {
            graphics_util_percent: 50.0,
            any_tensor_util_percent: 25.0,
            dram_bw_util_percent: 40.0,
        }),
    }
}

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let artifacts = Artifacts::locate()
            .expect("mock NVML artifacts: run `cargo build --workspace --release`");
        let node = SimNode::build(&NodeSpec::standard(8), &dir.path().join("node"), &artifacts)
            .expect("build the simulated node (as root)");
        let mut config = MockConfig::new(&node.spec, &node.dev_root, &node.dir.join("xid-events"));
        for gpu in &mut config.gpus {
            gpu.telemetry = Some(every_reading());
        }
        config
            .write(&node.mock_config)
            .expect("write the mock config");
        for (key, value) in node.env() {
            // SAFETY: runs once, from `main` before divan starts any benchmark thread.
            unsafe { std::env::set_var(key, value) };
        }
        // SAFETY: as above; the call log would add a write per NVML call.
        unsafe { std::env::remove_var("MOCK_NVML_CALL_LOG") };
        let library = node
            .lib_dir()
            .join(format!("libnvidia-ml.so.{}", node.library_version()));
        let nvml = Arc::new(Nvml::load(Path::new(&library)).expect("load the mock NVML"));
        let exporter = Exporter::new(
            Arc::clone(&nvml),
            Counters::default_set(),
            "bench-node".into(),
        )
        .expect("start the exporter");
        let containers: Vec<ContainerDevices> = (0..16)
            .map(|n| ContainerDevices {
                pod: format!("pod-{n}"),
                namespace: "default".into(),
                container: "main".into(),
                resource: "nvidia.com/gpu".into(),
                device_ids: vec![format!("{}::{}", n / 2, n % 2)],
            })
            .collect();
        let holders = Holders::from_containers(&exporter, &containers);
        Fixture {
            _dir: dir,
            nvml,
            library,
            exporter,
            holders,
        }
    })
}

/// Resident set size in KiB, from `/proc/self/statm` (second field, in pages).
fn rss_kib() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").expect("read /proc/self/statm");
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .expect("statm's resident field");
    // SAFETY: sysconf has no preconditions.
    let page_size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    pages * u64::try_from(page_size).unwrap_or(4096) / 1024
}

/// One cheap mock NVML call, the unit of the mock's own cost in a render.
#[divan::bench]
fn one_mock_nvml_call(bencher: divan::Bencher) {
    let fixture = fixture();
    bencher.bench_local(|| fixture.nvml.device_count().ok());
}

/// How many NVML calls one render makes (the mock's call log, for one render).
fn calls_per_render(fixture: &Fixture) -> usize {
    let log = fixture._dir.path().join("calls.log");
    // SAFETY: runs in `main` before divan starts any benchmark thread.
    unsafe { std::env::set_var("MOCK_NVML_CALL_LOG", &log) };
    let mut out = String::new();
    fixture.exporter.render(&fixture.holders, &mut out);
    // SAFETY: as above.
    unsafe { std::env::remove_var("MOCK_NVML_CALL_LOG") };
    std::fs::read_to_string(&log).map_or(0, |text| text.lines().count())
}

/// Resident memory of process `pid` (`VmRSS`, `RssAnon`, `RssFile`), in KiB.
fn process_rss_kib(pid: u32) -> (u64, u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("RssAnon:"), field("RssFile:"))
}

/// `nvshim exporter` as a process on the fixture's node: resident memory once it serves,
/// and after `RSS_RENDERS` scrapes on one kept-alive connection.
fn exporter_process(nvshim: &Path, library: &Path) {
    use std::io::{BufRead, BufReader, Read, Write};
    let mut child = std::process::Command::new(nvshim)
        .arg("--debug")
        .arg("--nvml-lib")
        .arg(library)
        .args(["exporter", "-a", "127.0.0.1:0", "-c", "0"])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start nvshim exporter");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|line| {
            let at = line.find("addr=")?;
            line[at + 5..].split_whitespace().next().map(str::to_owned)
        })
        .expect("the exporter's address in its log");
    std::thread::spawn(move || lines.for_each(drop));
    let mut stream = std::net::TcpStream::connect(&addr).expect("connect");
    let scrape = |stream: &mut std::net::TcpStream| {
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\n\r\n")
            .expect("send");
        let mut head = Vec::new();
        let mut byte = [0u8; 1];
        while !head.ends_with(b"\r\n\r\n") {
            stream.read_exact(&mut byte).expect("head");
            head.push(byte[0]);
        }
        let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
        let length: usize = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("content-length");
        let mut body = vec![0u8; length];
        stream.read_exact(&mut body).expect("body");
    };
    scrape(&mut stream);
    let start = process_rss_kib(child.id());
    let mut stream = stream;
    for n in 1..RSS_RENDERS {
        // A fresh connection every 100 scrapes: the server closes kept-alive ones then.
        if n % 100 == 0 {
            stream = std::net::TcpStream::connect(&addr).expect("connect");
        }
        scrape(&mut stream);
    }
    let end = process_rss_kib(child.id());
    let _ = child.kill();
    let _ = child.wait();
    eprintln!(
        "| nvshim exporter process, RSS after 1 scrape (anon + file) | {} KiB ({} + {}) |",
        start.0, start.1, start.2
    );
    eprintln!(
        "| nvshim exporter process, RSS after {RSS_RENDERS} scrapes (anon + file) | {} KiB ({} + {}) |",
        end.0, end.1, end.2
    );
}

/// One scrape of the default set, 8 GPUs, 16 holders (two replicas per GPU).
#[divan::bench]
fn render_8_gpus_default_set(bencher: divan::Bencher) {
    let fixture = fixture();
    let mut out = String::with_capacity(64 << 10);
    bencher.bench_local(|| {
        out.clear();
        fixture.exporter.render(&fixture.holders, &mut out);
        out.len()
    });
}

fn main() {
    let fixture = fixture();
    let mut out = String::new();
    fixture.exporter.render(&fixture.holders, &mut out);
    let lines = out.lines().filter(|l| !l.starts_with('#')).count();
    let before = rss_kib();
    for _ in 0..RSS_RENDERS {
        out.clear();
        fixture.exporter.render(&fixture.holders, &mut out);
    }
    let after = rss_kib();
    eprintln!("| exporter, 8 GPUs, default set | value |");
    eprintln!("| --- | --- |");
    eprintln!("| series per scrape | {lines} |");
    eprintln!("| bytes per scrape | {} |", out.len());
    eprintln!("| RSS before {RSS_RENDERS} renders | {before} KiB |");
    eprintln!("| RSS after {RSS_RENDERS} renders | {after} KiB |");
    eprintln!("| NVML calls per render | {} |", calls_per_render(fixture));
    if let Some(nvshim) = std::env::var_os("NVSHIM_BENCH_NVSHIM") {
        exporter_process(Path::new(&nvshim), &fixture.library);
    }
    divan::main();
}

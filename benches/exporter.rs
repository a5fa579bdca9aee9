//! The metrics exporter's scrape: `Exporter::render` of the default set for a simulated
//! 8-GPU node whose GPUs have every reading (mock NVML), two containers holding each GPU.
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
        let exporter = Exporter::new(nvml, Counters::default_set(), "bench-node".into())
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
    divan::main();
}

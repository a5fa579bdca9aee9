//! Discovery + selection + edits on a simulated 8-GPU node, all capabilities, all GPUs:
//! the work the runtime does on every GPU container's `create`.
//!
//! `make bench` (or `cargo bench --bench pipeline` after `cargo build --workspace
//! --release`) prints divan's table; the median column is the figure to quote.
//! Needs root (the node's /dev entries are made with mknod).

#![allow(unsafe_code, clippy::expect_used)]

use nvshim::inventory::{Backend, Source};
use nvshim::pipeline::{self, Context};
use nvshim::request::{DeviceList, DriverCapabilities, Request};
use nvshim::roots::Roots;
use nvshim_testkit::{Artifacts, NodeSpec, SimNode};

struct Fixture {
    _dir: tempfile::TempDir,
    roots: Roots,
}

static FIXTURE: std::sync::OnceLock<Fixture> = std::sync::OnceLock::new();

fn fixture() -> &'static Fixture {
    FIXTURE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let artifacts = Artifacts::locate()
            .expect("mock NVML artifacts: run `cargo build --workspace --release`");
        let node = SimNode::build(&NodeSpec::standard(8), &dir.path().join("node"), &artifacts)
            .expect("build the simulated node (as root)");
        for (key, value) in node.env() {
            // SAFETY: runs once, from `main` before divan starts any benchmark thread.
            unsafe { std::env::set_var(key, value) };
        }
        // SAFETY: as above; the call log would add a write per NVML call.
        unsafe { std::env::remove_var("MOCK_NVML_CALL_LOG") };
        Fixture {
            roots: Roots {
                driver: node.driver_root.clone(),
                dev: node.dir.clone(),
                proc: node.dir.clone(),
            },
            _dir: dir,
        }
    })
}

fn run(backend: Backend) -> pipeline::Plan {
    let ctx = Context {
        roots: fixture().roots.clone(),
        source: Source {
            backend,
            nvml_library: None,
        },
        nvml: pipeline::NvmlAccess::InProcess,
        cdi: pipeline::CdiFiles::Never,
    };
    let request = Request::new(DeviceList::All, DriverCapabilities::all());
    pipeline::plan(&ctx, &request).expect("plan")
}

/// procfs inventory: no NVML library loaded.
#[divan::bench]
fn procfs_8_gpus_all_caps() -> pipeline::Plan {
    run(Backend::Procfs)
}

/// NVML inventory: dlopen + nvmlInit + enumerate + shutdown, every time (as a
/// runtime process would). The mock is cheaper than a real driver's init.
#[divan::bench]
fn nvml_8_gpus_all_caps() -> pipeline::Plan {
    run(Backend::Nvml)
}

fn main() {
    let plan = run(Backend::Procfs);
    assert_eq!(plan.selection.gpus.len(), 8);
    eprintln!(
        "plan: {} device nodes, {} mounts, {} hooks",
        plan.edits.device_nodes.len(),
        plan.edits.mounts.len(),
        plan.edits.hooks.len()
    );
    divan::main();
}

//! `nvshim doctor --in-container`, the validation Job's command, inside a container run
//! through our runtime and real runc on the simulated node (the debug `nvshim` bind-mounted
//! into the glibc rootfs): it passes in a container that asked for GPUs and fails, naming
//! each missing piece, in one that asked for none.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::Path;

use crate::runc::{ok, setup};

const NVSHIM_INSIDE: &str = "/usr/bin/nvshim";

#[test]
fn the_validation_workload_passes_with_gpus_and_names_what_is_missing_without() {
    let e = setup();
    let nvshim = Path::new(env!("CARGO_BIN_EXE_nvshim"));
    let script = format!("{NVSHIM_INSIDE} doctor --in-container");
    let mounts = [(nvshim, NVSHIM_INSIDE)];

    let run = e.run_script_with_mounts(
        &[
            "NVIDIA_VISIBLE_DEVICES=0,2",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        ],
        &script,
        &mounts,
    );
    ok(&run);
    let report = run.stdout();
    for line in [
        "[ok  ] nvml: ",
        "2 GPU(s)",
        "[ok  ] device nodes: nvidiactl, nvidia0, nvidia2 present",
        "[ok  ] nvidia-smi: ",
        "[ok  ] linker cache: libcuda.so.1 => ",
        "all checks passed",
    ] {
        assert!(report.contains(line), "{line:?} not in:\n{report}");
    }

    // No GPU asked for: the runtime injects nothing, and every check says what is missing.
    let run = e.run_script_with_mounts(&[], &script, &mounts);
    assert_eq!(
        run.out.status.code(),
        Some(1),
        "{}\n{}",
        run.stdout(),
        run.stderr()
    );
    let report = run.stdout();
    for line in [
        "[FAIL] nvml: cannot load the NVML library libnvidia-ml.so.1",
        "[FAIL] device nodes: /dev/nvidiactl is missing",
        "[FAIL] nvidia-smi: not found in PATH",
        "[FAIL] linker cache: /etc/ld.so.cache has no libcuda.so.1",
        "fix: run the pod with runtimeClassName: nvidia",
    ] {
        assert!(report.contains(line), "{line:?} not in:\n{report}");
    }
    assert!(
        run.stderr().contains("4 check(s) failed"),
        "{}",
        run.stderr()
    );
}

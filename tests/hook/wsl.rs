// SPDX-License-Identifier: Apache-2.0
//! The prestart hook on a WSL2-shaped node, as `docker --gpus all` runs it: the static hook
//! cannot list WSL's GPUs (only NVML can), hands the request to `nvshim runtime-hook`, and
//! the container gets `/dev/dxg` (made inside it, with its cgroup rule: the open probe gets
//! past the device cgroup) and the driver store with `libcuda.so.1` in its linker cache.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::process::Command;

use crate::common::Printed;
use nvshim_testkit::harness::wsl_node;
use nvshim_testkit::{GlibcRootfs, NodeSpec, WSL_STORE, runc_bundle};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[test]
fn the_prestart_hook_hands_wsl_to_nvshim_and_the_container_gets_dxg_and_libcuda() {
    let node = wsl_node(&NodeSpec::standard(1));
    let sim = &node.sim;
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    GlibcRootfs::new()
        .install(crate::prestart::probe(dir.path()), "/usr/bin/openprobe")
        .build(&rootfs)
        .unwrap();
    let log = dir.path().join("hook.log");
    let d = sim.dir.display();
    let config = dir.path().join("config.toml");
    fs::write(
        &config,
        format!(
            "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\ndebug = \"{}\"\n\n\
             [nvidia-container-runtime]\nlog-level = \"debug\"\n\n[nvshim]\nproc-root = \"{d}\"\n",
            log.display()
        ),
    )
    .unwrap();

    let script =
        "openprobe /dev/dxg; echo ---; ldconfig -p; echo ---; readlink /usr/bin/nvidia-smi";
    let bundle = dir.path().join("bundle");
    runc_bundle(
        &bundle,
        &rootfs,
        &["sh", "-c", script],
        &["NVIDIA_VISIBLE_DEVICES=all"],
    )
    .unwrap();
    // As dockerd writes it, with the mock NVML's config for the NVML helper.
    crate::common::set_prestart_hook(
        &bundle,
        &[
            format!("PATH={PATH}"),
            format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display()),
            format!("MOCK_NVML_CONFIG={}", sim.mock_config.display()),
            format!("MOCK_NVML_CALL_LOG={}", sim.call_log.display()),
        ],
    );
    let out = Command::new("runc")
        .env_clear()
        .env("PATH", PATH)
        .arg("--root")
        .arg(dir.path().join("runc-root"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(format!("nvshim-hook-wsl-{}", std::process::id()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let hook_log = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        out.status.success(),
        "container failed ({}):\nstdout:\n{stdout}\nstderr:\n{}\nhook log:\n{hook_log}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
    );
    let printed = Printed(stdout);
    // Nothing serves misc minor 63 here: ENODEV (or ENXIO) means the open got past the
    // device cgroup, which would answer EPERM; ENOENT, that the node is not there.
    let probe = printed.section(0);
    assert!(
        ["/dev/dxg No such device", "/dev/dxg ENXIO"].contains(&probe.trim()),
        "{}",
        printed.0
    );
    let store = format!("/{WSL_STORE}");
    let cache = printed.section(1);
    assert!(
        cache
            .lines()
            .any(|l| l.trim_start().starts_with("libcuda.so.1 ")
                && l.trim_end().ends_with(&format!("{store}/libcuda.so.1"))),
        "libcuda.so.1 in ldconfig -p:\n{cache}"
    );
    assert_eq!(printed.section(2).trim(), format!("{store}/nvidia-smi"));
    assert!(
        hook_log.contains("handing the request to nvshim"),
        "{hook_log}"
    );
    let calls = fs::read_to_string(&sim.call_log).unwrap_or_default();
    assert!(calls.contains("nvmlInit"), "NVML listed the GPUs: {calls}");
}

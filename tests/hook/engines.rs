//! The hook under real engines, with no nvidia runtime configured anywhere:
//! - docker with the stock runc: dockerd offers `--gpus` because our
//!   `nvidia-container-runtime-hook` is on its PATH, and adds it as a prestart hook;
//! - podman 4.3 with `--hooks-dir` holding our `hooks.d/oci-nvidia-hook.json` (its
//!   path pointed at the binary under test).
//!
//! Both run an imported glibc image on a simulated 4-GPU node (GPU 2 is
//! `/dev/nvidia3`, GPU 3 is `/dev/nvidia2`), with a small C program that `open()`s
//! device nodes: `ENXIO` means the open got past the device cgroup (no driver behind
//! the mock's major), `EPERM` that the cgroup refused it.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::PathBuf;
use std::process::{Command, Output};

use crate::common::podman::{PodmanStorage, podman, run_args};
use crate::common::{GPU_SCRIPT, Node, Printed, node};
use nvshim_testkit::{Dockerd, NodeSpec, path_with_prefix, tar_rootfs};
use serde_json::{Value, json};

const HOOKS_D: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/hooks.d/oci-nvidia-hook.json");

const PROBE_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDWR);
        const char *r = fd >= 0 ? "OPENED" : errno == ENXIO ? "ENXIO" : errno == EPERM ? "EPERM"
                      : errno == ENOENT ? "ENOENT" : strerror(errno);
        printf("%s %s\n", argv[i], r);
    }
    return 0;
}
"#;

/// [`GPU_SCRIPT`], then (section 3) the probe on the nodes of GPUs 0 and 3.
const PROBE: &str = "; echo ---; openprobe /dev/nvidia0 /dev/nvidia2 /dev/nvidiactl";

/// The node, a config.toml for the hook, and a tar of the test image.
struct Setup {
    node: Node,
    dir: tempfile::TempDir,
    config: PathBuf,
    tar: PathBuf,
}

fn setup() -> Setup {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let d = node.sim.dir.display();
    let config = dir.path().join("config.toml");
    fs::write(
        &config,
        format!(
            "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\n\
             debug = \"{}\"\n\n[nvshim]\nproc-root = \"{d}\"\n",
            dir.path().join("hook.log").display()
        ),
    )
    .unwrap();
    let src = dir.path().join("openprobe.c");
    let probe = dir.path().join("openprobe");
    fs::write(&src, PROBE_C).unwrap();
    let out = Command::new("gcc")
        .arg("-o")
        .arg(&probe)
        .arg(&src)
        .output()
        .expect("gcc (needed to build the open() probe)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rootfs = dir.path().join("rootfs");
    node.sim
        .container_rootfs()
        .install(&probe, "/usr/bin/openprobe")
        .build(&rootfs)
        .unwrap();
    let tar = dir.path().join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    Setup {
        node,
        dir,
        config,
        tar,
    }
}

impl Setup {
    fn uuid(&self, i: usize) -> &str {
        &self.node.sim.spec.gpus[i].uuid
    }
    fn mock_volume(&self) -> String {
        format!(
            "{}:/etc/mock-nvml.json:ro",
            self.node.sim.mock_config.display()
        )
    }
}

fn out(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn ok(output: &Output, what: &str) -> Printed {
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        out(output),
        String::from_utf8_lossy(&output.stderr)
    );
    Printed(out(output))
}

fn sorted(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

#[test]
fn docker_gpus_flag_with_the_stock_runc() {
    let s = setup();
    // dockerd offers --gpus only when the hook is on its PATH; it runs the hook with
    // its own environment, which carries the config path.
    let bin = s.dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    symlink(
        crate::common::hook_bin(),
        bin.join("nvidia-container-runtime-hook"),
    )
    .unwrap();
    let path = path_with_prefix(&bin);
    let daemon = Dockerd::start_with_env(
        &s.dir.path().join("docker"),
        &json!({}),
        &[
            ("PATH", path.to_str().unwrap()),
            ("NVIDIA_CTK_CONFIG_FILE_PATH", s.config.to_str().unwrap()),
        ],
    )
    .unwrap();
    daemon.import(&s.tar, "nvshim-hook-e2e:glibc").unwrap();
    let run = |flags: &[&str]| {
        daemon
            .docker()
            .args(["run", "--rm", "-v", &s.mock_volume()])
            .args(["-e", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
            .args(["-e", "MOCK_NVML_DEV_ROOT=/dev"])
            .args(flags)
            .args(["nvshim-hook-e2e:glibc", "sh", "-c"])
            .arg(format!("{GPU_SCRIPT}{PROBE}"))
            .output()
            .unwrap()
    };

    let printed = ok(
        &run(&["--gpus", "\"device=0,1,2\""]),
        "docker run --gpus device=0,1,2",
    );
    assert_eq!(
        printed.gpu_nodes(),
        sorted(&["nvidia0", "nvidia1", "nvidia3"]),
        "{}",
        printed.0
    );
    let smi = printed.smi_lines();
    assert_eq!(smi.len(), 3, "{}", printed.0);
    for (i, line) in smi.iter().enumerate() {
        assert!(line.contains(s.uuid(i)), "{smi:?}");
    }
    assert!(printed.section(2).contains("libcuda.so.1"), "{}", printed.0);
    let probe = printed.section(3);
    let probe: Vec<&str> = probe.lines().collect();
    assert_eq!(
        probe,
        [
            "/dev/nvidia0 ENXIO",
            "/dev/nvidia2 ENOENT",
            "/dev/nvidiactl ENXIO"
        ],
        "{}",
        printed.0
    );

    let printed = ok(&run(&["--gpus", "all"]), "docker run --gpus all");
    assert_eq!(printed.smi_lines().len(), 4, "{}", printed.0);

    // An unknown GPU: the hook fails the create, and docker run shows its message.
    let failed = run(&["--gpus", "\"device=7\""]);
    assert!(!failed.status.success(), "{}", out(&failed));
    let err = String::from_utf8_lossy(&failed.stderr);
    assert!(
        err.contains("nvidia-container-runtime-hook: unknown GPU"),
        "docker run should show the hook's error: {err}"
    );

    // No GPU asked for: the hook does nothing.
    let printed = ok(&run(&[]), "docker run without --gpus");
    assert!(printed.nvidia_nodes().is_empty(), "{}", printed.0);
    assert!(printed.section(1).contains("rc=127"), "{}", printed.0);
}

/// Our hooks.d file with the hook pointed at the binary under test and the config
/// path in its env.
fn hooks_dir(s: &Setup) -> PathBuf {
    let shipped: Value = serde_json::from_slice(&fs::read(HOOKS_D).unwrap()).unwrap();
    let mut hook = shipped.clone();
    hook["hook"]["path"] = json!(crate::common::hook_bin());
    hook["hook"]["env"]
        .as_array_mut()
        .unwrap()
        .push(json!(format!(
            "NVIDIA_CTK_CONFIG_FILE_PATH={}",
            s.config.display()
        )));
    let dir = s.dir.path().join("hooks.d");
    fs::create_dir_all(&dir).unwrap();
    fs::write(
        dir.join("oci-nvidia-hook.json"),
        serde_json::to_vec_pretty(&hook).unwrap(),
    )
    .unwrap();
    dir
}

#[test]
fn the_shipped_hooks_d_file_is_an_oci_hook_for_prestart() {
    let hook: Value = serde_json::from_slice(&fs::read(HOOKS_D).unwrap()).unwrap();
    assert_eq!(hook["version"], "1.0.0");
    assert_eq!(
        hook["hook"]["path"],
        "/usr/bin/nvidia-container-runtime-hook"
    );
    assert_eq!(
        hook["hook"]["args"],
        json!(["nvidia-container-runtime-hook", "prestart"])
    );
    assert_eq!(hook["stages"], json!(["prestart"]));
    assert_eq!(hook["when"], json!({"always": true}));
}

#[test]
fn podman_with_our_hooks_dir() {
    let s = setup();
    let hooks = hooks_dir(&s);
    let storage = PodmanStorage(s.dir.path().join("podman"));
    let image = "localhost/nvshim-hook-e2e:glibc";
    let import = podman(&storage.0)
        .arg("import")
        .arg(&s.tar)
        .arg(image)
        .output()
        .expect("podman");
    ok(&import, "podman import");
    let run = |env: &[&str]| {
        let mut cmd = podman(&storage.0);
        cmd.arg("--hooks-dir").arg(&hooks).args(run_args(&s.node));
        for e in env {
            cmd.args(["-e", e]);
        }
        cmd.args([image, "sh", "-c"])
            .arg(format!("{GPU_SCRIPT}{PROBE}"))
            .output()
            .unwrap()
    };

    let printed = ok(&run(&["NVIDIA_VISIBLE_DEVICES=0"]), "podman run");
    assert_eq!(printed.gpu_nodes(), ["nvidia0"], "{}", printed.0);
    let smi = printed.smi_lines();
    assert!(smi.len() == 1 && smi[0].contains(s.uuid(0)), "{smi:?}");
    assert!(printed.section(2).contains("libcuda.so.1"), "{}", printed.0);
    assert_eq!(
        printed.section(3).lines().next(),
        Some("/dev/nvidia0 ENXIO"),
        "{}",
        printed.0
    );

    // By UUID: GPU 3 is /dev/nvidia2.
    let env = format!("NVIDIA_VISIBLE_DEVICES={}", s.uuid(3));
    let printed = ok(&run(&[&env]), "podman run by UUID");
    assert_eq!(printed.gpu_nodes(), ["nvidia2"], "{}", printed.0);

    // The hook runs for every container (hooks.d cannot match on env) and does nothing.
    let printed = ok(&run(&[]), "podman run without a GPU");
    assert!(printed.nvidia_nodes().is_empty(), "{}", printed.0);
}

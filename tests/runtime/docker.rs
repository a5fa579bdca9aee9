//! docker end to end: a dockerd started by the test (own socket, data-root,
//! exec-root, containerd; no iptables, no bridge) with our runtime registered in its
//! daemon.json, running an imported glibc image on a simulated 4-GPU node.
//!
//! On the standard 4-GPU node GPU 2 is `/dev/nvidia3` and GPU 3 is `/dev/nvidia2`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::process::Output;

use crate::common::{GPU_SCRIPT as SCRIPT, Node, Printed, node};
use nvshim_testkit::{Dockerd, NodeSpec, path_with_prefix, tar_rootfs};
use serde_json::json;

const IMAGE: &str = "nvshim-e2e:glibc";
const RUNTIME: &str = env!("CARGO_BIN_EXE_nvidia-container-runtime");
const HOOK: &str = env!("CARGO_BIN_EXE_nvidia-container-runtime-hook");

struct Docker {
    node: Node,
    // Dropped before the directory it lives in.
    daemon: Dockerd,
    _dir: tempfile::TempDir,
}

/// Starts a dockerd whose daemon.json registers `nvidia` (plus `extra` keys), and
/// imports the test image.
fn docker(extra: serde_json::Value) -> Docker {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let log = dir.path().join("runtime.log");
    fs::write(&config, node.sim.runtime_config("runc", Some(&log))).unwrap();
    // dockerd offers --gpus only when the hook is on its PATH.
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    symlink(HOOK, bin.join("nvidia-container-runtime-hook")).unwrap();
    let path = path_with_prefix(&bin);

    let mut daemon_json = json!({"runtimes": {"nvidia": {"path": RUNTIME}}});
    for (k, v) in extra.as_object().unwrap() {
        daemon_json[k] = v.clone();
    }
    let daemon = Dockerd::start_with_env(
        &dir.path().join("docker"),
        &daemon_json,
        &[
            ("PATH", path.to_str().unwrap()),
            ("NVIDIA_CTK_CONFIG_FILE_PATH", config.to_str().unwrap()),
        ],
    )
    .unwrap();

    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let tar = dir.path().join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    daemon.import(&tar, IMAGE).unwrap();
    Docker {
        node,
        daemon,
        _dir: dir,
    }
}

struct Run(Output);

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.0.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.0.stderr).into_owned()
    }
    fn ok(&self) -> &Run {
        assert!(
            self.0.status.success(),
            "docker run failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.0.status,
            self.stdout(),
            self.stderr()
        );
        self
    }
    fn printed(&self) -> Printed {
        Printed(self.stdout())
    }
}

impl Docker {
    fn uuid(&self, i: usize) -> &str {
        &self.node.sim.spec.gpus[i].uuid
    }

    fn run(&self, flags: &[&str]) -> Run {
        let mock = format!(
            "{}:/etc/mock-nvml.json:ro",
            self.node.sim.mock_config.display()
        );
        let out = self
            .daemon
            .docker()
            .args(["run", "--rm", "-v", &mock])
            .args(["-e", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
            .args(["-e", "MOCK_NVML_DEV_ROOT=/dev"])
            .args(flags)
            .args([IMAGE, "sh", "-c", SCRIPT])
            .output()
            .unwrap();
        Run(out)
    }
}

fn nodes(minors: &[u32]) -> Vec<String> {
    let mut v: Vec<String> = minors.iter().map(|m| format!("nvidia{m}")).collect();
    v.sort();
    v
}

#[test]
fn gpus_flag_with_our_runtime() {
    let d = docker(json!({}));

    let run = d.run(&["--runtime=nvidia", "--gpus", "\"device=0,1,2\""]);
    run.ok();
    assert_eq!(
        run.printed().gpu_nodes(),
        nodes(&[0, 1, 3]),
        "{}",
        run.stdout()
    );
    let smi = run.printed().smi_lines();
    assert_eq!(smi.len(), 3, "{}", run.stdout());
    for i in 0..3 {
        assert!(smi[i].contains(d.uuid(i)), "{smi:?}");
    }
    assert!(
        run.printed().section(0).contains("nvidiactl"),
        "{}",
        run.stdout()
    );
    assert!(
        run.printed().section(2).contains("libcuda.so.1"),
        "{}",
        run.stdout()
    );

    let run = d.run(&["--runtime=nvidia", "--gpus", "all"]);
    run.ok();
    assert_eq!(
        run.printed().gpu_nodes(),
        nodes(&[0, 1, 2, 3]),
        "{}",
        run.stdout()
    );
    assert_eq!(run.printed().smi_lines().len(), 4, "{}", run.stdout());

    // The env var alone, by UUID (GPU 3 is /dev/nvidia2).
    let env = format!("NVIDIA_VISIBLE_DEVICES={}", d.uuid(3));
    let run = d.run(&["--runtime=nvidia", "-e", &env]);
    run.ok();
    assert_eq!(run.printed().gpu_nodes(), nodes(&[2]), "{}", run.stdout());
    let smi = run.printed().smi_lines();
    assert!(smi.len() == 1 && smi[0].contains(d.uuid(3)), "{smi:?}");

    // No GPU asked for: runs as it would under runc.
    let run = d.run(&["--runtime=nvidia"]);
    run.ok();
    assert!(
        !run.printed().section(0).contains("nvidia"),
        "{}",
        run.stdout()
    );
    assert!(
        run.printed().section(1).contains("rc=127"),
        "{}",
        run.stdout()
    );
    assert!(
        !run.printed().section(2).contains("libcuda"),
        "{}",
        run.stdout()
    );
}

#[test]
fn errors_reach_docker_run() {
    let d = docker(json!({}));
    // An unknown GPU: our message, through runc's --log file, in docker's output.
    let run = d.run(&["--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=7"]);
    assert!(!run.0.status.success(), "{}", run.stdout());
    assert!(
        run.stderr().contains("\"7\""),
        "docker run should show our error: {}",
        run.stderr()
    );
    // --gpus with the stock runc: the prestart hook injects, and its errors reach
    // docker run too.
    let run = d.run(&["--gpus", "\"device=7\""]);
    assert!(!run.0.status.success(), "{}", run.stdout());
    assert!(
        run.stderr().contains("nvidia-container-runtime-hook") && run.stderr().contains("\"7\""),
        "the hook's error should reach docker run: {}",
        run.stderr()
    );
}

#[test]
fn default_runtime_needs_no_runtime_flag() {
    let d = docker(json!({"default-runtime": "nvidia"}));
    let run = d.run(&["--gpus", "1"]);
    run.ok();
    assert_eq!(run.printed().gpu_nodes(), nodes(&[0]), "{}", run.stdout());
    let smi = run.printed().smi_lines();
    assert!(smi.len() == 1 && smi[0].contains(d.uuid(0)), "{smi:?}");

    let run = d.run(&[]);
    run.ok();
    assert!(
        !run.printed().section(0).contains("nvidia"),
        "{}",
        run.stdout()
    );
}

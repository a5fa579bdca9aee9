//! containerd end to end: a private containerd started by the test, and `ctr run`
//! with our runtime as the runc binary, which is what containerd's `BinaryName`
//! does. The container gets the GPUs its environment asks for.
//!
//! On the standard 4-GPU node GPU 2 is `/dev/nvidia3`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::process::Output;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::node;
use nvshim_testkit::{Containerd, NodeSpec};

const SCRIPT: &str = "ls /dev; echo ---; nvidia-smi -L; echo ---; ldconfig -p";
const RUNTIME: &str = env!("CARGO_BIN_EXE_nvidia-container-runtime");

static IDS: AtomicUsize = AtomicUsize::new(0);

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn ctr_run_with_our_runtime_as_the_runc_binary() {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, node.sim.runtime_config("runc", None)).unwrap();
    let containerd = Containerd::start_with_env(
        &dir.path().join("ctd"),
        &[("NVIDIA_CTK_CONFIG_FILE_PATH", config.to_str().unwrap())],
    )
    .unwrap();

    let run = |env: &str| {
        // A fresh rootfs per container: the runtime writes its linker cache.
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let rootfs = dir.path().join(format!("rootfs-{n}"));
        node.sim.container_rootfs().build(&rootfs).unwrap();
        let mount = format!(
            "type=bind,src={},dst=/etc/mock-nvml.json,options=rbind:ro",
            node.sim.mock_config.display()
        );
        let id = format!("nvshim-ctr-{}-{n}", std::process::id());
        let out = containerd
            .ctr_run()
            .args(["--rm", "--rootfs", "--runc-binary", RUNTIME])
            .args(["--mount", &mount])
            .args(["--env", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
            .args(["--env", "MOCK_NVML_DEV_ROOT=/dev"])
            .args(["--env", env])
            .arg(&rootfs)
            .arg(&id)
            .args(["/bin/sh", "-c", SCRIPT])
            .output()
            .unwrap();
        text(&out)
    };

    let uuid = |i: usize| node.sim.spec.gpus[i].uuid.clone();
    let (out, err) = run("NVIDIA_VISIBLE_DEVICES=0,2");
    let sections: Vec<&str> = out.split("---\n").collect();
    assert_eq!(sections.len(), 3, "stdout:\n{out}\nstderr:\n{err}");
    let mut nodes: Vec<&str> = sections[0]
        .lines()
        .filter(|l| l.starts_with("nvidia"))
        .collect();
    nodes.sort();
    assert_eq!(
        nodes,
        [
            "nvidia-uvm",
            "nvidia-uvm-tools",
            "nvidia0",
            "nvidia3",
            "nvidiactl"
        ],
        "{out}"
    );
    let smi: Vec<&str> = sections[1]
        .lines()
        .filter(|l| l.starts_with("GPU "))
        .collect();
    assert_eq!(smi.len(), 2, "{out}");
    assert!(
        smi[0].contains(&uuid(0)) && smi[1].contains(&uuid(2)),
        "{smi:?}"
    );
    assert!(sections[2].contains("libnvidia-ml.so.1"), "{out}");

    // A container without a GPU request runs untouched.
    let (out, err) = run("NVIDIA_VISIBLE_DEVICES=void");
    assert!(out.contains("---"), "stdout:\n{out}\nstderr:\n{err}");
    assert!(
        !out.split("---\n").next().unwrap().contains("nvidia"),
        "{out}"
    );
}

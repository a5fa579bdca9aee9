//! Shared helpers for the integration tests: a simulated node in a tempdir and a way
//! to run our binaries against it.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

pub mod cdi_schema;
pub mod kubelet;
pub mod plugin_proc;
pub mod podman;

use std::path::Path;
use std::process::{Command, Output};

use nvshim_testkit::{Artifacts, NodeSpec, SimNode};

pub struct Node {
    pub sim: SimNode,
    _dir: tempfile::TempDir,
}

/// Builds a simulated node from `spec` in a fresh tempdir.
pub fn node(spec: &NodeSpec) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let artifacts =
        Artifacts::locate().expect("mock NVML artifacts (run `cargo build --workspace` first)");
    let sim =
        SimNode::build(spec, &dir.path().join("node"), &artifacts).expect("build simulated node");
    Node { sim, _dir: dir }
}

/// Runs `nvshim <args> <root flags>` with the mock's env and nothing inherited that
/// could change its behaviour.
pub fn nvshim(node: &Node, args: &[&str]) -> Output {
    nvshim_env(node, args, &[])
}

pub fn nvshim_env(node: &Node, args: &[&str], extra_env: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvshim"));
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(args)
        .args(node.sim.root_args());
    for (k, v) in node.sim.env() {
        cmd.env(k, v);
    }
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    cmd.output().expect("run nvshim")
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts success and returns stdout.
pub fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(&out),
        stderr(&out)
    );
    stdout(&out)
}

/// The shell command the end-to-end tests run in a GPU container: the device nodes,
/// `nvidia-smi -L` and its exit status, and the linker cache, in `---`-separated parts.
pub const GPU_SCRIPT: &str =
    "ls /dev; echo ---; nvidia-smi -L; echo \"rc=$?\"; echo ---; ldconfig -p";

/// A container's output of [`GPU_SCRIPT`].
pub struct Printed(pub String);

impl Printed {
    /// The `n`th `---` part.
    pub fn section(&self, n: usize) -> String {
        self.0.split("---\n").nth(n).unwrap_or("").to_string()
    }

    /// Every `/dev/nvidia*` entry, sorted.
    pub fn nvidia_nodes(&self) -> Vec<String> {
        let mut nodes: Vec<String> = self
            .section(0)
            .lines()
            .filter(|l| l.starts_with("nvidia"))
            .map(String::from)
            .collect();
        nodes.sort();
        nodes
    }

    /// The `/dev/nvidia<N>` entries only, sorted.
    pub fn gpu_nodes(&self) -> Vec<String> {
        self.nvidia_nodes()
            .into_iter()
            .filter(|n| {
                n.strip_prefix("nvidia")
                    .is_some_and(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()))
            })
            .collect()
    }

    /// `nvidia-smi -L`'s `GPU <i>: …` lines.
    pub fn smi_lines(&self) -> Vec<String> {
        self.section(1)
            .lines()
            .filter(|l| l.starts_with("GPU "))
            .map(String::from)
            .collect()
    }
}

/// The hook binary under test: `$NVSHIM_TEST_HOOK` (`make test` sets it to the static
/// build packages install) or cargo's build of it.
pub fn hook_bin() -> String {
    std::env::var("NVSHIM_TEST_HOOK")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nvidia-container-runtime-hook").to_string())
}

/// The runtime binary under test: `$NVSHIM_TEST_RUNTIME` (`make test` sets it to the
/// static build packages install) or cargo's build of it.
pub fn runtime_bin() -> String {
    std::env::var("NVSHIM_TEST_RUNTIME")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nvidia-container-runtime").to_string())
}

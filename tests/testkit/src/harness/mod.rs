// SPDX-License-Identifier: Apache-2.0
//! What the integration tests of both nvshim crates share: a simulated node in a tempdir,
//! checks on a process's output, what a GPU container prints, podman with private storage
//! ([`podman`]) and the CDI JSON schema ([`cdi_schema`]). Test helpers: they panic, with a
//! message, where a test could not go on.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

pub mod cdi_schema;
pub mod nfd_schema;
pub mod podman;

use std::process::Output;

use crate::{Artifacts, NodeSpec, SimNode};

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

/// Builds a WSL2-shaped node ([`SimNode::build_wsl`]) from `spec` in a fresh tempdir.
pub fn wsl_node(spec: &NodeSpec) -> Node {
    let dir = tempfile::tempdir().expect("tempdir");
    let artifacts =
        Artifacts::locate().expect("mock NVML artifacts (run `cargo build --workspace` first)");
    let sim = SimNode::build_wsl(spec, &dir.path().join("node"), &artifacts)
        .expect("build simulated WSL2 node");
    Node { sim, _dir: dir }
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

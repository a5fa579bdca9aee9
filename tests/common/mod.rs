//! Shared helpers for the integration tests: a simulated node in a tempdir and a way
//! to run our binaries against it.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

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

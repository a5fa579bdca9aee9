// SPDX-License-Identifier: Apache-2.0
//! The device plugin tests' harness: the testkit's (shared with the core crate's tests)
//! plus what only these tests need: the core crate's binaries, a fake kubelet
//! ([`kubelet`]), the plugin as a process ([`plugin_proc`]) and a real kubelet ([`kube`]).

#![allow(dead_code, unused_imports)]

pub mod kube;
pub mod kubelet;
pub mod plugin_proc;

pub use nvshim_testkit::harness::{GPU_SCRIPT, Node, Printed, cdi_schema, node, ok, podman};

use std::process::{Command, Output};

use nvshim_testkit::workspace_binary;

/// A binary of the core crate (`nvshim`, the runtime, the hook): `$env` when set (`make
/// test` points the runtime and hook at the static builds packages install), else
/// cargo's build of it beside this test. Cargo names only this crate's own binaries in
/// `CARGO_BIN_EXE_*`, so `cargo build --workspace` (or `-p nvshim --bins`) comes first.
fn core_binary(name: &'static str, env: &str) -> String {
    workspace_binary(name, env, name)
        .unwrap_or_else(|e| panic!("{e} (run `cargo build -p nvshim --bins` first)"))
        .display()
        .to_string()
}

/// Runs `nvshim <args> <root flags>` with the mock's env and nothing inherited that
/// could change its behaviour.
pub fn nvshim(node: &Node, args: &[&str]) -> Output {
    let mut cmd = Command::new(core_binary("nvshim", "NVSHIM_TEST_NVSHIM"));
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(args)
        .args(node.sim.root_args());
    for (k, v) in node.sim.env() {
        cmd.env(k, v);
    }
    cmd.output().expect("run nvshim")
}

/// The hook binary under test: `$NVSHIM_TEST_HOOK`, else cargo's build of it.
pub fn hook_bin() -> String {
    core_binary("nvidia-container-runtime-hook", "NVSHIM_TEST_HOOK")
}

/// The runtime binary under test: `$NVSHIM_TEST_RUNTIME`, else cargo's build of it.
pub fn runtime_bin() -> String {
    core_binary("nvidia-container-runtime", "NVSHIM_TEST_RUNTIME")
}

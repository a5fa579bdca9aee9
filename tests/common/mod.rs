//! Shared helpers for the integration tests: a simulated node in a tempdir and a way
//! to run our binaries against it.

#![allow(dead_code, unused_imports, clippy::expect_used, clippy::unwrap_used)]

// The node, output checks, podman and the CDI schema are the testkit's harness, shared
// with the device plugin's tests; the names here stay as the tests know them.
pub use nvshim_testkit::harness::{
    GPU_SCRIPT, Node, Printed, cdi_schema, node, ok, podman, stderr, stdout,
};

use std::path::Path;
use std::process::{Command, Output};

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

/// The `hooks` of a spec whose one prestart hook is ours, as dockerd writes it: the binary
/// under test as `nvidia-container-runtime-hook prestart`, with `env` (`KEY=value`).
pub fn prestart_hooks(env: &[String]) -> serde_json::Value {
    serde_json::json!({"prestart": [{
        "path": hook_bin(),
        "args": ["nvidia-container-runtime-hook", "prestart"],
        "env": env,
    }]})
}

/// Puts [`prestart_hooks`] into the bundle's `config.json`.
pub fn set_prestart_hook(bundle: &Path, env: &[String]) {
    let path = bundle.join("config.json");
    let mut spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["hooks"] = prestart_hooks(env);
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
}

// SPDX-License-Identifier: Apache-2.0
//! The core library links no async stack: tokio, tonic, hyper and the rest are the
//! device plugin crate's (`crates/device-plugin`), so the static runtime and hook, built
//! from the core, cannot pull them in by accident. Read from `cargo tree`, which is what
//! the linker gets.

use std::collections::BTreeSet;
use std::process::Command;

/// The plugin's async and gRPC stack, and the HTTP/2 decoder behind it.
const ASYNC_STACK: &[&str] = &[
    "tokio",
    "tokio-stream",
    "tonic",
    "tonic-prost",
    "prost",
    "hyper",
    "hyper-util",
    "http",
    "http-body-util",
    "bytes",
    "prometheus-client",
    "h2",
    "protox",
    "tonic-prost-build",
];

/// The packages `package` depends on as a library (normal edges only: no dev- or
/// build-dependencies), by name.
fn normal_dependencies(package: &str) -> BTreeSet<String> {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", package, "-e", "normal", "--prefix", "none"])
        .args(["--format", "{p}", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run cargo tree: {e}"));
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn async_stack_in(package: &str) -> Vec<&'static str> {
    let deps = normal_dependencies(package);
    ASYNC_STACK
        .iter()
        .copied()
        .filter(|name| deps.contains(*name))
        .collect()
}

#[test]
fn the_core_library_links_no_async_stack() {
    let found = async_stack_in("nvshim");
    assert!(
        found.is_empty(),
        "nvshim (the core library) depends on {found:?}: they belong in crates/device-plugin"
    );
}

/// The same check on the crate that does use them finds them, so the check above can
/// fail.
#[test]
fn the_check_finds_the_plugins_async_stack() {
    let found = async_stack_in("nvshim-device-plugin");
    for name in ["tokio", "tonic", "hyper", "h2", "prometheus-client"] {
        assert!(
            found.contains(&name),
            "case {name}: not found in the device plugin's tree ({found:?})"
        );
    }
}

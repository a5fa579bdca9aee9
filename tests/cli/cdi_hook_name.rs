//! `nvshim cdi generate` run from a copy of the binary under another name (a versioned or
//! renamed install, no `nvidia-container-runtime-hook` beside it): the spec's hooks run that
//! copy, started as `nvshim` so that it takes `hook link-driver`; started as the copy's own
//! name (what the spec used to say) it refused the stage as an unknown subcommand.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};

use crate::common::node;
use nvshim_testkit::NodeSpec;
use serde_json::Value;

#[test]
fn a_renamed_nvshim_writes_hooks_it_accepts() {
    let node = node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("nvshim-1.2");
    std::fs::copy(env!("CARGO_BIN_EXE_nvshim"), &copy).unwrap();
    let mut cmd = Command::new(&copy);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(["cdi", "generate", "--format", "json"])
        .args(node.sim.root_args());
    for (k, v) in node.sim.env() {
        cmd.env(k, v);
    }
    let spec: Value =
        serde_json::from_str(&crate::common::ok(cmd.output().unwrap(), "cdi generate")).unwrap();
    let hook = spec["containerEdits"]["hooks"]
        .as_array()
        .and_then(|h| {
            h.iter()
                .find(|h| h["args"].to_string().contains("link-driver"))
        })
        .unwrap_or_else(|| panic!("no link-driver hook: {spec}"));
    assert_eq!(hook["path"], copy.display().to_string(), "{hook}");
    let args: Vec<&str> = hook["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[..3], ["nvshim", "hook", "link-driver"], "{hook}");
    // Run as an OCI runtime runs a hook (path, argv as written), with a state that names no
    // live container: the stage must be taken and refuse the state, not the command line.
    let out = Command::new(&copy)
        .arg0(args[0])
        .args(&args[1..])
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an empty state cannot succeed");
    assert!(
        !stderr.contains("unrecognized subcommand") && !stderr.contains("unexpected argument"),
        "the hook's command line was refused: {stderr}"
    );
    assert!(stderr.to_lowercase().contains("state"), "{stderr}");
}

//! `nvshim configure docker|containerd|crio` end to end: the binary on a corpus of real-shaped
//! config files (`tests/fixtures/daemon-json`, `tests/fixtures/containerd`), then the engines
//! themselves loading what it wrote: a dockerd started by the test lists the runtime (and runs
//! a GPU container through it as the default), a containerd started by the test on the
//! configured `config.toml` loads the runtime into its CRI plugin, and `ctr` runs a GPU
//! container with the runtime the file names.
//!
//! `--restart` is exercised with `--dry-run` only: it would restart the system's daemons.
//!
//! The shared helpers and the CRI-O test are here; docker's in `docker`, containerd's in
//! `containerd`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{GPU_SCRIPT, Printed, node, runtime_bin};
use nvshim_testkit::{Containerd, Dockerd, NodeSpec, tar_rootfs};
use serde_json::{Map, Value};

mod containerd;
mod docker;

const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
const IMAGE: &str = "nvshim-configure:glibc";

fn fixture(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind)
        .join(name)
}

/// `nvshim configure <args>` with nothing inherited that could change its behaviour.
fn configure(args: &[&str]) -> Output {
    Command::new(NVSHIM)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .arg("configure")
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `nvshim configure <args>`, asserts success, returns stdout.
fn ok(args: &[&str], case: &str) -> String {
    let out = configure(args);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{case}: nvshim configure {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Every entry of `dir`, sorted.
fn listing(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

// ---------------------------------------------------------------------------------------------
// CRI-O

#[test]
fn crio_drop_in_written_and_removed() {
    let runtime = runtime_bin();
    let dir = tempfile::tempdir().unwrap();
    let conf_d = dir.path().join("crio.conf.d");
    let drop_in = conf_d.join("99-nvidia.toml");
    let args = [
        "crio",
        "--config-dir",
        s(&conf_d),
        "--runtime-path",
        &runtime,
    ];

    let out = ok(&[&args[..], &["--set-as-default"]].concat(), "add");
    assert!(out.contains("systemctl restart crio"), "{out}");
    let content = fs::read_to_string(&drop_in).unwrap();
    let doc: toml::Table = content.parse().unwrap();
    let entry = &doc["crio"]["runtime"]["runtimes"]["nvidia"];
    assert_eq!(entry["runtime_path"].as_str(), Some(runtime.as_str()));
    assert_eq!(entry["runtime_type"].as_str(), Some("oci"));
    assert_eq!(
        doc["crio"]["runtime"]["default_runtime"].as_str(),
        Some("nvidia")
    );
    assert!(
        content.starts_with("# Written by `nvshim configure crio`"),
        "{content}"
    );

    let out = ok(&[&args[..], &["--set-as-default"]].concat(), "again");
    assert!(out.contains("nothing to do"), "{out}");
    ok(&args, "without the default");
    let doc: toml::Table = fs::read_to_string(&drop_in).unwrap().parse().unwrap();
    assert!(doc["crio"]["runtime"].get("default_runtime").is_none());
    assert_eq!(
        listing(&conf_d),
        ["99-nvidia.toml"],
        "no backup where CRI-O would load it"
    );

    let out = ok(
        &["crio", "--config-dir", s(&conf_d), "--undo", "--dry-run"],
        "dry undo",
    );
    assert!(out.contains("+++ /dev/null"), "{out}");
    assert!(drop_in.exists());
    ok(&["crio", "--config-dir", s(&conf_d), "--undo"], "undo");
    assert!(!drop_in.exists());
    let out = ok(
        &["crio", "--config-dir", s(&conf_d), "--undo"],
        "undo again",
    );
    assert!(out.contains("nothing to do"), "{out}");
}

#[test]
fn undo_and_set_as_default_conflict() {
    let out = configure(&[
        "docker",
        "--config",
        "/nonexistent/x.json",
        "--undo",
        "--set-as-default",
    ]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        text(&out).1.contains("cannot be used with"),
        "{}",
        text(&out).1
    );
}

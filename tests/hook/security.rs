//! The prestart hook against hostile images (the CVE scenarios of NVIDIA's legacy
//! hook), through real runc with the hook in the spec:
//! - a mount target's parent, a mount target itself, or `/etc/ld.so.cache` is a
//!   symlink to a host path (CVE-2024-0133 and the link-following class): nothing is
//!   created, mounted or written on the host; the container either fails with the
//!   path named, or runs with everything inside its rootfs — each case asserts which;
//! - `LD_PRELOAD` / `LD_LIBRARY_PATH` in the image's env and a hostile
//!   `/sbin/ldconfig`, with a config that names the container's ldconfig
//!   (CVE-2025-23266, CVE-2024-0136): no image code runs, anywhere.
//!
//! Host-side targets live under `/tmp/nvshim-sentinel-<pid>-<n>`, an absolute host
//! path the image's links name; the test checks it stays as it was.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{Node, node};
use nvshim_testkit::{NodeSpec, runc_bundle};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
const LIB: &str = "usr/lib/x86_64-linux-gnu";

static IDS: AtomicUsize = AtomicUsize::new(0);

fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{}",
        std::process::id(),
        IDS.fetch_add(1, Ordering::Relaxed)
    )
}

/// A directory on the host that a hostile image points at; removed on drop.
struct Sentinel(PathBuf);

impl Sentinel {
    fn new() -> Sentinel {
        let dir = PathBuf::from("/tmp").join(unique("nvshim-sentinel"));
        fs::create_dir(&dir).unwrap();
        Sentinel(dir)
    }
    /// What is in it, sorted.
    fn contents(&self) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(&self.0)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }
    /// Its path without the leading `/`, as it lands inside a rootfs.
    fn in_root(&self, rootfs: &Path) -> PathBuf {
        rootfs.join(self.0.strip_prefix("/").unwrap())
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

struct E2e {
    node: Node,
    dir: tempfile::TempDir,
    rootfs: PathBuf,
}

fn setup() -> E2e {
    let node = node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    E2e { node, dir, rootfs }
}

struct Run {
    out: Output,
    bundle: PathBuf,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }
}

impl E2e {
    /// The hook's config.toml with `extra` appended (whole tables).
    fn config(&self, cli_extra: &str, extra: &str) -> PathBuf {
        let d = self.node.sim.dir.display();
        let path = self.dir.path().join(unique("config") + ".toml");
        fs::write(
            &path,
            format!(
                "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\n{cli_extra}\n\
                 [nvshim]\nproc-root = \"{d}\"\n\n{extra}\n"
            ),
        )
        .unwrap();
        path
    }

    /// Runs `script` (busybox `sh`, static) with `env` in a fresh bundle through plain
    /// runc with the hook in the spec; `prepare` may change the bundle's rootfs first.
    fn run(&self, env: &[&str], config: &Path, script: &str, prepare: impl FnOnce(&Path)) -> Run {
        let id = unique("nvshim-hook-sec");
        let bundle = self.dir.path().join(&id);
        runc_bundle(&bundle, &self.rootfs, &["/bin/sh", "-c", script], env).unwrap();
        prepare(&bundle.join("rootfs"));
        crate::common::set_prestart_hook(
            &bundle,
            &[
                format!("PATH={PATH}"),
                format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display()),
            ],
        );
        let out = Command::new("runc")
            .env_clear()
            .env("PATH", PATH)
            .arg("--root")
            .arg(self.dir.path().join("runc-root"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .output()
            .unwrap();
        Run { out, bundle }
    }
}

/// `nvidia<minor>` of GPU `index` (on the 2-GPU node GPU 0 is `/dev/nvidia1`).
fn node_of(e: &E2e, index: usize) -> String {
    format!("nvidia{}\n", e.node.sim.spec.gpus[index].minor)
}

/// No mount in the host's namespace names `dir`.
fn no_host_mounts_under(dir: &Path) {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    let leaked: Vec<&str> = mountinfo.lines().filter(|l| l.contains(&dir)).collect();
    assert!(leaked.is_empty(), "mounts on the host: {leaked:#?}");
}

/// Replaces the rootfs's directory `rel` with a symlink to `target`.
fn replace_with_link(rootfs: &Path, rel: &str, target: &Path) {
    let path = rootfs.join(rel);
    if fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir()) {
        fs::remove_dir_all(&path).unwrap();
    } else {
        let _ = fs::remove_file(&path);
    }
    symlink(target, &path).unwrap();
}

/// How the hook must answer a hostile layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// The create fails and the message names this container path.
    Fails(&'static str),
    /// The container runs; the injected files sit inside the rootfs.
    Runs,
}

#[test]
fn symlinks_in_the_image_never_reach_the_host() {
    let e = setup();
    let config = e.config("", "");
    let version = e.node.sim.library_version().to_string();
    type Prepare = fn(&Path, &Sentinel);
    let cases: [(&str, Prepare, Expect); 6] = [
        (
            "library dir -> absolute host path, missing in the rootfs",
            |rootfs, s| replace_with_link(rootfs, LIB, &s.0),
            Expect::Fails("/usr/lib/x86_64-linux-gnu"),
        ),
        (
            "library dir -> ../../.. climbing to a host path",
            |rootfs, s| {
                let up =
                    Path::new("../../../../../../../../..").join(s.0.strip_prefix("/").unwrap());
                replace_with_link(rootfs, LIB, &up)
            },
            Expect::Fails("/usr/lib/x86_64-linux-gnu"),
        ),
        (
            "library dir -> absolute host path that also exists in the rootfs",
            |rootfs, s| {
                let inside = s.in_root(rootfs);
                fs::create_dir_all(inside.parent().unwrap()).unwrap();
                fs::rename(rootfs.join(LIB), &inside).unwrap();
                symlink(&s.0, rootfs.join(LIB)).unwrap();
            },
            Expect::Runs,
        ),
        (
            "nvidia-smi (a mount target) -> dangling absolute host path",
            |rootfs, s| replace_with_link(rootfs, "usr/bin/nvidia-smi", &s.0.join("nvidia-smi")),
            Expect::Fails("/usr/bin/nvidia-smi"),
        ),
        (
            "/etc/ld.so.cache -> a host file",
            |rootfs, s| replace_with_link(rootfs, "etc/ld.so.cache", &s.0.join("ld.so.cache")),
            Expect::Runs,
        ),
        (
            "/etc/ld.so.cache is a FIFO (opening it would block the hook)",
            |rootfs, _| {
                fs::remove_file(rootfs.join("etc/ld.so.cache")).unwrap();
                nix::unistd::mkfifo(
                    &rootfs.join("etc/ld.so.cache"),
                    nix::sys::stat::Mode::from_bits_truncate(0o644),
                )
                .unwrap();
            },
            Expect::Fails("/etc/ld.so.cache"),
        ),
    ];
    for (case, prepare, expect) in cases {
        let sentinel = Sentinel::new();
        // A host file for the links to aim at.
        fs::write(sentinel.0.join("ld.so.cache"), "HOST CACHE").unwrap();
        let before = sentinel.contents();
        let run = e.run(
            &["NVIDIA_VISIBLE_DEVICES=1"],
            &config,
            "ls /dev; echo ---; grep -c libcuda.so.1 /etc/ld.so.cache",
            |rootfs| prepare(rootfs, &sentinel),
        );
        assert_eq!(sentinel.contents(), before, "{case}: the host dir changed");
        assert_eq!(
            fs::read_to_string(sentinel.0.join("ld.so.cache")).unwrap(),
            "HOST CACHE",
            "{case}: the host file was written"
        );
        no_host_mounts_under(&sentinel.0);
        no_host_mounts_under(&run.bundle);
        match expect {
            Expect::Fails(path) => {
                assert!(!run.out.status.success(), "{case}: ran:\n{}", run.stdout());
                assert!(
                    run.stderr().contains("nvidia-container-runtime-hook")
                        && run.stderr().contains(path),
                    "{case}: the error should name {path}: {}",
                    run.stderr()
                );
                if !case.starts_with("nvidia-smi") {
                    // Mounted before the failure, then taken back with its mountpoint.
                    let smi = run.rootfs().join("usr/bin/nvidia-smi");
                    assert!(
                        fs::symlink_metadata(&smi).is_err(),
                        "{case}: {} left",
                        smi.display()
                    );
                }
            }
            Expect::Runs => {
                assert!(
                    run.out.status.success(),
                    "{case}: failed:\n{}\n{}",
                    run.stdout(),
                    run.stderr()
                );
                assert!(
                    run.stdout().contains(&node_of(&e, 1)),
                    "{case}: {}",
                    run.stdout()
                );
                let count = run
                    .stdout()
                    .split("---\n")
                    .nth(1)
                    .unwrap_or("")
                    .trim()
                    .to_string();
                assert_ne!(
                    count, "0",
                    "{case}: the container's cache lacks libcuda.so.1"
                );
            }
        }
        if case.contains("also exists in the rootfs") {
            // The mountpoint was made at the link's in-root meaning.
            let inside = sentinel
                .in_root(&run.rootfs())
                .join(format!("libcuda.so.{version}"));
            assert!(inside.is_file(), "{case}: {} missing", inside.display());
        }
        if case.starts_with("/etc/ld.so.cache -> ") {
            // The link was replaced by a real cache inside the rootfs.
            let cache = run.rootfs().join("etc/ld.so.cache");
            assert!(fs::symlink_metadata(&cache).unwrap().is_file(), "{case}");
        }
    }
}

const EVIL_C: &str = r#"
#include <stdio.h>
__attribute__((constructor)) static void pwn(void) {
    FILE *f = fopen(MARKER, "w");
    if (f) { fputs("preloaded\n", f); fclose(f); }
}
"#;

#[test]
fn the_images_env_and_ldconfig_never_run() {
    let e = setup();
    let tag = unique("nvshim-marker");
    let preload_marker = PathBuf::from("/tmp").join(format!("{tag}-preload"));
    let ldconfig_marker = PathBuf::from("/tmp").join(format!("{tag}-ldconfig"));
    // A real shared object whose constructor leaves a marker wherever it runs.
    let src = e.dir.path().join("evil.c");
    let evil = e.dir.path().join("evil.so");
    fs::write(&src, EVIL_C).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&evil)
        .arg(format!("-DMARKER=\"{}\"", preload_marker.display()))
        .arg(&src)
        .output()
        .expect("gcc (needed to build the LD_PRELOAD library)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Even a config that names the container's ldconfig, with the feature that would
    // let NVIDIA's CLI run it, runs nothing.
    let config = e.config(
        "ldconfig = \"/sbin/ldconfig\"",
        "[features]\nallow-ldconfig-from-container = true",
    );
    let hostile = format!("#!/bin/sh\necho pwned > {}\n", ldconfig_marker.display());
    let run = e.run(
        &[
            "NVIDIA_VISIBLE_DEVICES=0",
            "LD_PRELOAD=/evil/evil.so",
            "LD_LIBRARY_PATH=/evil",
        ],
        &config,
        "ls /dev; echo ---; grep -c libcuda.so.1 /etc/ld.so.cache",
        |rootfs| {
            fs::create_dir_all(rootfs.join("evil")).unwrap();
            fs::copy(&evil, rootfs.join("evil/evil.so")).unwrap();
            for ldconfig in ["sbin/ldconfig", "usr/sbin/ldconfig"] {
                let path = rootfs.join(ldconfig);
                let _ = fs::remove_file(&path);
                fs::write(&path, &hostile).unwrap();
                let mut perms = fs::metadata(&path).unwrap().permissions();
                std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
                fs::set_permissions(&path, perms).unwrap();
            }
        },
    );
    assert!(
        run.out.status.success(),
        "the container should run:\n{}\n{}",
        run.stdout(),
        run.stderr()
    );
    assert!(run.stdout().contains(&node_of(&e, 0)), "{}", run.stdout());
    let count = run
        .stdout()
        .split("---\n")
        .nth(1)
        .unwrap_or("")
        .trim()
        .to_string();
    assert_ne!(count, "0", "the cache was written without ldconfig");
    for marker in [&preload_marker, &ldconfig_marker] {
        let inside = run.rootfs().join(marker.strip_prefix("/").unwrap());
        assert!(!marker.exists(), "{} exists on the host", marker.display());
        assert!(
            !inside.exists(),
            "{} exists in the rootfs",
            inside.display()
        );
    }
}

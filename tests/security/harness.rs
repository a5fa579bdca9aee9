//! The harness of the attack regression suite (`tests/security/`, scenarios S1–S12
//! of `docs/security.md`): a simulated 2-GPU node, a glibc rootfs to copy into each
//! bundle, host sentinels that hostile images point at, and one way to run a container
//! through each of the three paths that touch a rootfs:
//! - [`Via::Runtime`]: our `nvidia-container-runtime` edits `config.json` and writes
//!   the links and `ld.so.cache` from the host side, then execs real runc;
//! - [`Via::Hook`]: plain runc with our `nvidia-container-runtime-hook prestart` in
//!   `hooks.prestart` (what docker `--gpus`, podman and CRI-O do);
//! - [`Via::Cdi`]: our runtime in `mode = "cdi"` with a spec `nvshim cdi generate`
//!   wrote, whose `createContainer` hook is `nvshim hook link-driver`.
//!
//! Each suite file includes this one with `mod security_harness;`. Cargo also builds
//! it alone, as a test binary with no tests. Nothing is skipped for a missing tool:
//! runc and gcc are prerequisites and their absence fails the test, naming them.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use nvshim_testkit::{Artifacts, NodeSpec, SimNode, runc_bundle};
use serde_json::{Value, json};

pub const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The driver's library directory, in the node and in the container.
pub const LIB: &str = "usr/lib/x86_64-linux-gnu";
pub const HOOK: &str = env!("CARGO_BIN_EXE_nvidia-container-runtime-hook");
pub const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");

/// The runtime under test: `$NVSHIM_TEST_RUNTIME` (`make test` points it at the static
/// build packages install) or cargo's build (as `tests/common` does).
pub fn runtime_bin() -> String {
    std::env::var("NVSHIM_TEST_RUNTIME")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nvidia-container-runtime").to_string())
}

static IDS: AtomicUsize = AtomicUsize::new(0);

/// A name unique to this process and call.
pub fn unique(what: &str) -> String {
    format!(
        "{what}-{}-{}",
        std::process::id(),
        IDS.fetch_add(1, Ordering::Relaxed)
    )
}

/// The way a container gets its GPUs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Via {
    Runtime,
    Hook,
    Cdi,
}

impl Via {
    pub const ALL: [Via; 3] = [Via::Runtime, Via::Hook, Via::Cdi];
}

/// A simulated node, a rootfs template and a CDI spec for it.
pub struct Lab {
    pub sim: SimNode,
    _node: tempfile::TempDir,
    pub dir: tempfile::TempDir,
    pub rootfs: PathBuf,
    pub spec_dir: PathBuf,
}

/// One container to run.
#[derive(Debug, Clone, Copy)]
pub struct Job<'a> {
    pub via: Via,
    pub env: &'a [&'a str],
    /// Run by the rootfs's static busybox `sh -c`.
    pub script: &'a str,
    /// Top-level `config.toml` keys (they must precede every table).
    pub top: &'a str,
    /// Whole `config.toml` tables, appended.
    pub tables: &'a str,
}

impl<'a> Job<'a> {
    pub fn new(via: Via, env: &'a [&'a str], script: &'a str) -> Job<'a> {
        Job {
            via,
            env,
            script,
            top: "",
            tables: "",
        }
    }
}

impl Lab {
    pub fn build() -> Lab {
        let node = tempfile::tempdir().unwrap();
        let artifacts =
            Artifacts::locate().expect("mock NVML artifacts (run `cargo build --workspace` first)");
        let sim = SimNode::build(
            &NodeSpec::standard(2),
            &node.path().join("node"),
            &artifacts,
        )
        .expect("build the simulated node");
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        sim.container_rootfs().build(&rootfs).unwrap();
        let spec_dir = dir.path().join("cdi");
        let out = Command::new(NVSHIM)
            .env_clear()
            .env("PATH", PATH)
            .envs(sim.env())
            .args(["cdi", "generate", "--output"])
            .arg(spec_dir.join("nvidia.json"))
            .args(["--nvidia-cdi-hook-path", NVSHIM])
            .args(sim.root_args())
            .output()
            .unwrap();
        assert!(out.status.success(), "nvshim cdi generate: {out:?}");
        Lab {
            sim,
            _node: node,
            dir,
            rootfs,
            spec_dir,
        }
    }

    /// `config.toml` for `job`: the node's runtime config, `mode = "cdi"` for
    /// [`Via::Cdi`], and the job's own keys.
    fn config(&self, job: &Job<'_>) -> PathBuf {
        let mut text = format!("{}\n", job.top) + &self.sim.runtime_config("runc", None);
        if job.via == Via::Cdi {
            text = text.replace(
                "[nvidia-container-runtime]\n",
                "[nvidia-container-runtime]\nmode = \"cdi\"\n",
            );
            text += &format!(
                "\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = [\"{}\"]\n",
                self.spec_dir.display()
            );
        }
        text += &format!("\n{}\n", job.tables);
        let path = self.dir.path().join(unique("config") + ".toml");
        fs::write(&path, text).unwrap();
        path
    }

    /// The environment our runtime and hook get, as an engine would give it on a GPU
    /// host: `PATH`, the config file, and the mock NVML's (the host's NVML here).
    fn host_env(&self, config: &Path) -> Vec<String> {
        let mut env = vec![
            format!("PATH={PATH}"),
            format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display()),
        ];
        env.extend(self.sim.env().into_iter().map(|(k, v)| format!("{k}={v}")));
        env
    }

    /// A fresh bundle for `job`; `prepare` may change its rootfs and `config.json`
    /// before anything of ours sees them.
    pub fn stage(&self, job: &Job<'_>, prepare: impl FnOnce(&Path, &mut Value)) -> Pending {
        let id = unique("nvshim-sec");
        let bundle = self.dir.path().join(&id);
        runc_bundle(
            &bundle,
            &self.rootfs,
            &["/bin/sh", "-c", job.script],
            job.env,
        )
        .expect("an OCI bundle (needs runc and busybox)");
        let config = self.config(job);
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        prepare(&bundle.join("rootfs"), &mut spec);
        if job.via == Via::Hook {
            let hook = json!({
                "path": HOOK,
                "args": ["nvidia-container-runtime-hook", "prestart"],
                "env": self.host_env(&config),
            });
            spec["hooks"]["prestart"] = json!([hook]);
        }
        let before = serde_json::to_vec_pretty(&spec).unwrap();
        fs::write(&path, &before).unwrap();
        Pending {
            via: job.via,
            bundle,
            id,
            host_env: self.host_env(&config),
            runc_root: self.dir.path().join("runc-root"),
            spec_before: before,
        }
    }

    /// [`stage`](Self::stage), then [`Pending::launch`].
    pub fn run(&self, job: &Job<'_>, prepare: impl FnOnce(&Path, &mut Value)) -> Run {
        self.stage(job, prepare).launch()
    }

    /// The node's GPU `index` as the container's `ls /dev` prints it.
    pub fn gpu_node(&self, index: usize) -> String {
        format!("nvidia{}", self.sim.spec.gpus[index].minor)
    }
}

/// A bundle ready to run.
pub struct Pending {
    pub via: Via,
    pub bundle: PathBuf,
    pub id: String,
    host_env: Vec<String>,
    runc_root: PathBuf,
    spec_before: Vec<u8>,
}

impl Pending {
    pub fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }

    /// `runc run` (through our runtime except for [`Via::Hook`]); returns when the
    /// container has exited and runc has deleted it.
    pub fn launch(self) -> Run {
        let mut cmd = match self.via {
            Via::Hook => Command::new("runc"),
            Via::Runtime | Via::Cdi => Command::new(runtime_bin()),
        };
        cmd.env_clear();
        if self.via == Via::Hook {
            cmd.env("PATH", PATH);
        } else {
            cmd.envs(self.host_env.iter().filter_map(|kv| kv.split_once('=')));
        }
        let out = cmd
            .arg("--root")
            .arg(&self.runc_root)
            .args(["run", "--bundle"])
            .arg(&self.bundle)
            .arg(&self.id)
            .output()
            .expect("run the container (needs runc)");
        let exists = Command::new("runc")
            .arg("--root")
            .arg(&self.runc_root)
            .args(["state", &self.id])
            .output()
            .is_ok_and(|o| o.status.success());
        Run {
            via: self.via,
            out,
            exists,
            bundle: self.bundle,
            spec_before: self.spec_before,
        }
    }
}

/// A container run.
pub struct Run {
    pub via: Via,
    pub out: Output,
    /// Whether runc still knows the container afterwards.
    pub exists: bool,
    pub bundle: PathBuf,
    spec_before: Vec<u8>,
}

impl Run {
    pub fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }

    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }

    pub fn rootfs(&self) -> PathBuf {
        self.bundle.join("rootfs")
    }

    /// Asserts the container ran; returns its stdout.
    pub fn ok(&self, case: &str) -> String {
        assert!(
            self.out.status.success(),
            "{case} ({:?}): the container failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.via,
            self.out.status,
            self.stdout(),
            self.stderr()
        );
        self.stdout()
    }

    /// Whether the container ran. A failure must be a clean one: a message, and no
    /// container left behind.
    pub fn ran(&self, case: &str) -> bool {
        if self.out.status.success() {
            return true;
        }
        assert!(
            !self.stderr().trim().is_empty(),
            "{case} ({:?}): failed without a message",
            self.via
        );
        assert!(
            !self.exists,
            "{case} ({:?}): runc kept the container",
            self.via
        );
        false
    }

    /// `config.json` as runc last saw it.
    pub fn spec(&self) -> Value {
        serde_json::from_slice(&fs::read(self.bundle.join("config.json")).unwrap()).unwrap()
    }

    /// Whether `config.json` is byte for byte what the test wrote.
    pub fn spec_untouched(&self) -> bool {
        fs::read(self.bundle.join("config.json")).unwrap() == self.spec_before
    }

    /// `config.json` as the test wrote it.
    pub fn spec_before(&self) -> Value {
        serde_json::from_slice(&self.spec_before).unwrap()
    }
}

/// The `/dev/nvidia*` names in an `ls /dev` listing, sorted.
pub fn nvidia_nodes(listing: &str) -> Vec<String> {
    let mut nodes: Vec<String> = listing
        .split_whitespace()
        .filter(|l| l.starts_with("nvidia"))
        .map(String::from)
        .collect();
    nodes.sort();
    nodes
}

/// A host directory that hostile images point at, holding `secret` (a file with
/// known content); removed on drop.
pub struct Sentinel {
    pub dir: PathBuf,
    pub token: String,
}

/// What a directory tree is, to the byte and inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot(BTreeMap<PathBuf, String>);

impl Sentinel {
    pub fn create() -> Sentinel {
        let dir = PathBuf::from("/tmp").join(unique("nvshim-sec-sentinel"));
        fs::create_dir(&dir).unwrap();
        let token = unique("HOST-SECRET");
        fs::write(dir.join("secret"), &token).unwrap();
        Sentinel { dir, token }
    }

    /// The sentinel's path without the leading `/`: where the image's links land when
    /// resolved inside the rootfs.
    pub fn rel(&self) -> &Path {
        self.dir.strip_prefix("/").unwrap()
    }

    /// Every entry under the sentinel: kind, inode, size, mtime, and content or
    /// link target.
    pub fn snapshot(&self) -> Snapshot {
        let mut map = BTreeMap::new();
        walk(&self.dir, &mut map);
        Snapshot(map)
    }

    /// Asserts nothing under the sentinel changed since `before`, and nothing in the
    /// host's mount table names it.
    pub fn assert_untouched(&self, before: &Snapshot, case: &str) {
        let now = self.snapshot();
        let mut changed: Vec<String> = Vec::new();
        for (path, what) in &now.0 {
            match before.0.get(path) {
                None => changed.push(format!("new: {} {what}", path.display())),
                Some(was) if was != what => {
                    changed.push(format!("changed: {} {was} -> {what}", path.display()))
                }
                Some(_) => {}
            }
        }
        for path in before.0.keys().filter(|p| !now.0.contains_key(*p)) {
            changed.push(format!("gone: {}", path.display()));
        }
        assert!(
            changed.is_empty(),
            "{case}: the host sentinel changed: {changed:#?}"
        );
        no_host_mounts_under(&self.dir, case);
    }
}

impl Snapshot {
    /// Entry → what it is (see [`Sentinel::snapshot`]).
    pub fn entries(&self) -> &BTreeMap<PathBuf, String> {
        &self.0
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.dir);
    }
}

fn walk(dir: &Path, map: &mut BTreeMap<PathBuf, String>) {
    let mut entries: Vec<_> = fs::read_dir(dir).unwrap().map(|e| e.unwrap()).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).unwrap();
        let stamp = format!(
            "ino={} size={} mtime={}.{} mode={:o}",
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
            meta.mode()
        );
        let what = if meta.file_type().is_symlink() {
            format!(
                "link -> {} {stamp}",
                fs::read_link(&path).unwrap().display()
            )
        } else if meta.is_file() {
            let bytes = fs::read(&path).unwrap();
            let text = String::from_utf8_lossy(&bytes[..bytes.len().min(64)]).into_owned();
            format!("file {text:?} {stamp}")
        } else if meta.is_dir() {
            walk(&path, map);
            format!("dir {stamp}")
        } else {
            format!("other {stamp}")
        };
        map.insert(path, what);
    }
}

/// Asserts no mount in this (the host's) mount namespace names `dir`.
pub fn no_host_mounts_under(dir: &Path, case: &str) {
    let dir = dir.display().to_string();
    let leaked: Vec<MountLine> = mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap())
        .into_iter()
        .filter(|m| m.point.starts_with(&dir) || m.root.starts_with(&dir))
        .collect();
    assert!(leaked.is_empty(), "{case}: mounts on the host: {leaked:#?}");
}

/// One line of `/proc/<pid>/mountinfo`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MountLine {
    /// The path inside the mounted filesystem that is mounted here.
    pub root: String,
    pub point: String,
    pub fstype: String,
}

/// Parses mountinfo text; lines that do not parse are skipped.
pub fn mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fields: Vec<&str> = left.split(' ').collect();
            let fstype = right.split(' ').next()?;
            Some(MountLine {
                root: unescape(fields.get(3)?),
                point: unescape(fields.get(4)?),
                fstype: fstype.to_string(),
            })
        })
        .collect()
}

/// Undoes mountinfo's octal escapes (`\040` for a space).
fn unescape(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| {
            std::str::from_utf8(d)
                .ok()
                .and_then(|d| u8::from_str_radix(d, 8).ok())
        });
        match (bytes[i], octal) {
            (b'\\', Some(b)) => {
                out.push(b);
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Replaces the rootfs entry `rel` with a symlink to `target`, creating its parent.
pub fn replace_with_link(rootfs: &Path, rel: &str, target: &Path) {
    let path = rootfs.join(rel);
    match fs::symlink_metadata(&path) {
        Ok(m) if m.is_dir() => fs::remove_dir_all(&path).unwrap(),
        Ok(_) => fs::remove_file(&path).unwrap(),
        Err(_) => fs::create_dir_all(path.parent().unwrap()).unwrap(),
    }
    symlink(target, &path).unwrap();
}

/// Moves the rootfs directory `rel` to where the absolute path `inside` lands in the
/// rootfs, and leaves at `rel` a symlink whose text is `link` (which must lead to
/// `inside` when resolved in the root): the container sees the same files, while the
/// host side, following the link by name, would reach the host's `inside`.
pub fn move_behind_link(rootfs: &Path, rel: &str, inside: &Path, link: &Path) {
    let moved = rootfs.join(inside.strip_prefix("/").unwrap());
    fs::create_dir_all(moved.parent().unwrap()).unwrap();
    fs::rename(rootfs.join(rel), &moved).unwrap();
    symlink(link, rootfs.join(rel)).unwrap();
}

/// `target` (absolute) spelled relative, climbing more `..` than any rootfs is deep:
/// inside the root the climb stops at `/`; from the host it reaches the host's `/`.
pub fn climbing(target: &Path) -> PathBuf {
    Path::new("../../../../../../../../../../../../..").join(target.strip_prefix("/").unwrap())
}

/// Builds a shared object whose constructor appends the path of the program that
/// loaded it to `marker`.
pub fn build_poc(dir: &Path, marker: &Path) -> PathBuf {
    let src = dir.join("poc.c");
    let so = dir.join("poc.so");
    fs::write(
        &src,
        r#"
#include <stdio.h>
#include <unistd.h>
__attribute__((constructor)) static void poc(void) {
    char exe[512] = {0};
    FILE *f = fopen(MARKER, "a");
    if (readlink("/proc/self/exe", exe, sizeof exe - 1) < 0) exe[0] = '?';
    if (f) { fprintf(f, "loaded into %s\n", exe); fclose(f); }
}
"#,
    )
    .unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&so)
        .arg(format!("-DMARKER=\"{}\"", marker.display()))
        .arg(&src)
        .output()
        .expect("gcc (needed to build the LD_PRELOAD payload)");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    so
}

// SPDX-License-Identifier: Apache-2.0
//! `nvshim install` / `nvshim uninstall` (the toolkit container's installer, issue 23) against a
//! real containerd and a real dockerd that the tests start on the configs the installer edited,
//! on a simulated 4-GPU node.
//!
//! The "host" is a directory of the test's: the engine configs, the toolkit dir and the ready
//! file all live under it, and the installer runs with `--host-root /` and those paths, so the
//! paths it writes into the configs are the ones the engines started here really open. One case
//! runs with a temp dir as `--host-root` instead, to check that files land under it while what
//! is written in them are host paths.
//!
//! The simulated node keeps its device nodes and `/proc/driver/nvidia` in its own directory,
//! which no `config.toml` an installer writes for a real host names. So the engines get
//! `NVIDIA_CTK_CONFIG_FILE_PATH` naming a copy of the config.toml the installer wrote in the
//! toolkit dir with only the node's dev and proc roots added; everything else in it (driver
//! root, hook paths into the toolkit dir) is the installer's. The engines are pointed at the
//! runtime by the installer alone: ctr gets the `BinaryName` from `containerd config dump`,
//! docker only the runtime's name. The runtime's own lookup of the config.toml beside it is
//! `tests/runtime/shim.rs`'s to check.
//!
//! Byte-identical undo is checked on whole trees: every file, link and directory under the
//! host (modes and contents), so a `.bak`, a leftover directory or a changed byte shows.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::{GPU_SCRIPT, Node, Printed, hook_bin, node, runtime_bin};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvshim_testkit::{Containerd, Dockerd, NodeSpec, runc_bundle, tar_rootfs};
use serde_json::json;

const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// The binaries the installer copies from its source dir (the contract's list).
const SOURCE_BINARIES: [&str; 3] = [
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvshim",
];
/// The stable names the installer puts in the toolkit dir.
const TOOLKIT_NAMES: [&str; 5] = [
    "nvidia-container-runtime",
    "nvidia-container-runtime-hook",
    "nvidia-ctk",
    "nvidia-cdi-hook",
    "nvshim",
];
/// The installer's config.toml, relative to the toolkit dir.
const TOOLKIT_CONFIG: &str = ".config/nvidia-container-runtime/config.toml";
/// The toolkit dir and ready file on a real host (the contract's defaults).
const HOST_TOOLKIT_DIR: &str = "/usr/local/nvidia/toolkit";
const HOST_READY_FILE: &str = "run/nvidia/validations/toolkit-ready";
const CRI: &str = "io.containerd.grpc.v1.cri";
/// How long an installer, a reload or an undo may take: a limit, not a figure.
const WITHIN: Duration = Duration::from_secs(30);

/// A containerd v2 config as a Kubernetes node has it: CRI settings, `runc` with the systemd
/// cgroup driver, full-line and trailing comments. `{dir}` is where its host paths point.
fn containerd_config(dir: &Path) -> String {
    let d = dir.display();
    format!(
        "# containerd config for a Kubernetes GPU node (kubelet with the systemd cgroup driver).\n\
         # Managed by hand: keep the comments.\n\
         version = 2\n\n\
         root = \"{d}/var/lib/containerd\"   # default\n\
         state = \"{d}/run/containerd\"\n\n\
         [grpc]\n  address = \"{d}/run/containerd/containerd.sock\"\n\n\
         [plugins.\"{CRI}\"]\n\
         \x20 sandbox_image = \"registry.k8s.io/pause:3.9\"   # pinned for air-gapped nodes\n\n\
         \x20 [plugins.\"{CRI}\".containerd]\n\
         \x20   # kubelet's RuntimeClass \"runc\" maps here\n\
         \x20   default_runtime_name = \"runc\"\n\
         \x20   snapshotter = \"overlayfs\"\n\n\
         \x20   # The stock runtime; SystemdCgroup must match kubelet's cgroupDriver.\n\
         \x20   [plugins.\"{CRI}\".containerd.runtimes.runc]\n\
         \x20     runtime_type = \"io.containerd.runc.v2\"   # the runc shim\n\
         \x20     [plugins.\"{CRI}\".containerd.runtimes.runc.options]\n\
         \x20       SystemdCgroup = true   # systemd cgroup driver\n\n\
         \x20 [plugins.\"{CRI}\".cni]\n\
         \x20   bin_dir = \"{d}/opt/cni/bin\"\n\
         \x20   conf_dir = \"{d}/etc/cni/net.d\"\n\n\
         \x20 [plugins.\"{CRI}\".registry]\n\
         \x20   config_path = \"{d}/etc/containerd/certs.d\"\n\n\
         [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{d}/opt/containerd\"\n\n\
         # Metrics for the node exporter.\n\
         [metrics]\n  address = \"127.0.0.1:0\"\n"
    )
}

/// A file system entry as the byte-identity checks compare it.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Dir { mode: u32 },
    File { mode: u32, bytes: Vec<u8> },
    Link { target: PathBuf },
}

/// Every entry under `root` (not following links), by path relative to it.
fn tree(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, dir: &Path, found: &mut BTreeMap<PathBuf, Entry>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            let meta = fs::symlink_metadata(&path).unwrap();
            let rel = path.strip_prefix(root).unwrap().to_path_buf();
            let mode = meta.mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap();
                found.insert(rel, Entry::Link { target });
            } else if meta.is_dir() {
                found.insert(rel, Entry::Dir { mode });
                walk(root, &path, found);
            } else {
                let bytes = fs::read(&path).unwrap();
                found.insert(rel, Entry::File { mode, bytes });
            }
        }
    }
    let mut found = BTreeMap::new();
    walk(root, root, &mut found);
    found
}

/// The paths that differ between two [`tree`]s, each with what changed.
fn tree_changes(before: &BTreeMap<PathBuf, Entry>, after: &BTreeMap<PathBuf, Entry>) -> String {
    let mut changes = Vec::new();
    for (path, entry) in before {
        match after.get(path) {
            None => changes.push(format!("removed {}", path.display())),
            Some(now) if now != entry => changes.push(format!("changed {}", path.display())),
            Some(_) => {}
        }
    }
    for path in after.keys().filter(|p| !before.contains_key(*p)) {
        changes.push(format!("added {}", path.display()));
    }
    changes.join("\n")
}

/// Polls `done` every 20 ms until it holds; panics naming `what` after [`WITHIN`].
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WITHIN;
    while !done() {
        assert!(Instant::now() < deadline, "{what}: not within {WITHIN:?}");
        sleep(Duration::from_millis(20));
    }
}

fn text(out: &Output) -> String {
    format!(
        "status {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn s(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// A source dir for the installer: the binaries under test, each with `tag` appended (ELF
/// ignores trailing bytes), so two dirs with different tags are two builds that both run.
/// Copies, never links: the build's files are hard-linked into other trees.
fn source_dir(dir: &Path, tag: &[u8]) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let sources = [runtime_bin(), hook_bin(), NVSHIM.to_owned()];
    for (name, from) in SOURCE_BINARIES.iter().zip(sources) {
        let to = dir.join(name);
        fs::copy(&from, &to).unwrap();
        let mut file = fs::OpenOptions::new().append(true).open(&to).unwrap();
        file.write_all(tag).unwrap();
        fs::set_permissions(&to, fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir.to_path_buf()
}

/// `nvshim <args>` with nothing inherited that the installer reads (its env vars).
fn nvshim(args: &[&str]) -> Command {
    let mut cmd = Command::new(NVSHIM);
    cmd.env_clear().env("PATH", PATH).args(args);
    cmd
}

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.stdin(Stdio::null()).output().unwrap();
    assert!(out.status.success(), "{what}: {}", text(&out));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// An installer daemon (`nvshim install` without `--no-daemon`) with its output in a log file.
struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    fn spawn(args: &[String], log: PathBuf) -> Daemon {
        let out = File::create(&log).unwrap();
        let child = nvshim(&["install"])
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap();
        Daemon { child, log }
    }

    fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Fails with the log if the installer exited early.
    fn assert_running(&mut self, what: &str) {
        if let Some(status) = self.child.try_wait().unwrap() {
            panic!("{what}: the installer exited ({status}):\n{}", self.log());
        }
    }

    /// SIGTERM, then the exit status within [`WITHIN`].
    fn terminate(mut self, what: &str) -> ExitStatus {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        kill(pid, Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + WITHIN;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(status.success(), "{what}: {status}\n{}", self.log());
                return status;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                panic!(
                    "{what}: no exit within {WITHIN:?} of SIGTERM\n{}",
                    self.log()
                );
            }
            sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Daemon {
    /// A failed test must not leave an installer behind (it would undo into a removed dir).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// The test's host: the node, and under `<tmp>/host` the engine configs, the toolkit dir and
/// the ready file, installed with `--host-root /`.
struct Host {
    node: Node,
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let node = node(&NodeSpec::standard(4));
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("host/etc")).unwrap();
        Host { node, dir }
    }

    fn tmp(&self) -> PathBuf {
        self.dir.path().canonicalize().unwrap()
    }

    fn root(&self) -> PathBuf {
        self.tmp().join("host")
    }

    fn toolkit(&self) -> PathBuf {
        self.root().join("usr/local/nvidia/toolkit")
    }

    fn ready_file(&self) -> PathBuf {
        self.root().join(HOST_READY_FILE)
    }

    /// Where the engines' `NVIDIA_CTK_CONFIG_FILE_PATH` points (see the module comment).
    fn sim_config(&self) -> PathBuf {
        self.tmp().join("runtime-on-the-node.toml")
    }

    /// The install flags every case shares: this host's paths and the node's driver root.
    fn flags(&self, engine: &str, config: &Path, source: &Path) -> Vec<String> {
        let mut flags: Vec<String> = [
            "--runtime",
            engine,
            "--host-root",
            "/",
            "--toolkit-dir",
            s(&self.toolkit()),
            "--config",
            s(config),
            "--ready-file",
            s(&self.ready_file()),
            "--driver-root",
            s(&self.node.sim.driver_root),
            "--source-dir",
            s(source),
        ]
        .map(str::to_owned)
        .to_vec();
        if engine == "containerd" {
            let drop_in = self.root().join("etc/containerd/conf.d/99-nvidia.toml");
            flags.extend(["--drop-in-config".to_owned(), s(&drop_in).to_owned()]);
        }
        flags
    }

    /// The installed runtime, and its config.toml checked and copied to [`Host::sim_config`]
    /// with the node's dev and proc roots added.
    fn installed_runtime(&self) -> PathBuf {
        let toolkit = self.toolkit();
        for name in TOOLKIT_NAMES {
            let path = toolkit.join(name);
            let meta = fs::metadata(&path)
                .unwrap_or_else(|e| panic!("{} after install: {e}", path.display()));
            assert!(
                meta.mode() & 0o111 != 0,
                "{} is not executable",
                path.display()
            );
        }
        let written = fs::read_to_string(toolkit.join(TOOLKIT_CONFIG)).unwrap();
        let mut config: toml::Table = written.parse().unwrap();
        let cli = config["nvidia-container-cli"].as_table_mut().unwrap();
        assert_eq!(
            cli.get("root").and_then(|v| v.as_str()),
            Some(s(&self.node.sim.driver_root)),
            "the driver root in the installed config.toml:\n{written}"
        );
        let dir = s(&self.node.sim.dir).to_owned();
        cli.insert("dev-root".into(), dir.clone().into());
        let nvshim = config.entry("nvshim").or_insert(toml::Table::new().into());
        nvshim
            .as_table_mut()
            .unwrap()
            .insert("proc-root".into(), dir.into());
        fs::write(self.sim_config(), toml::to_string(&config).unwrap()).unwrap();
        toolkit.join("nvidia-container-runtime")
    }

    fn engine_env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("PATH", PATH.to_owned()),
            (
                "NVIDIA_CTK_CONFIG_FILE_PATH",
                s(&self.sim_config()).to_owned(),
            ),
        ]
    }

    /// A fresh glibc rootfs that can run the node's `nvidia-smi` once a runtime injects it.
    fn rootfs(&self, name: &str) -> PathBuf {
        let rootfs = self.tmp().join(name);
        self.node.sim.container_rootfs().build(&rootfs).unwrap();
        rootfs
    }

    fn mock_mount(&self) -> String {
        self.node.sim.mock_config.display().to_string()
    }
}

/// The GPU nodes and `nvidia-smi -L` lines a [`GPU_SCRIPT`] run printed, checked against the
/// node's GPUs 0 and 2 (`/dev/nvidia0` and `/dev/nvidia3` on the standard node).
fn assert_gpus_0_and_2(host: &Host, printed: &str, what: &str) {
    let printed = Printed(printed.to_owned());
    assert_eq!(
        printed.gpu_nodes(),
        ["nvidia0", "nvidia3"],
        "{what}: {}",
        printed.0
    );
    let smi = printed.smi_lines();
    let gpus = &host.node.sim.spec.gpus;
    assert!(
        smi.len() == 2 && smi[0].contains(&gpus[0].uuid) && smi[1].contains(&gpus[2].uuid),
        "{what}: {}",
        printed.0
    );
}

/// `containerd config dump`'s `nvidia` runtime: (`runtime_type`, `BinaryName`).
fn dumped_nvidia_runtime(config: &Path) -> (String, String) {
    let dump = run_ok(
        Command::new("containerd").args(["--config", s(config), "config", "dump"]),
        "containerd config dump",
    );
    let doc: toml::Table = dump.parse().unwrap();
    let runtimes = &doc["plugins"][CRI]["containerd"]["runtimes"];
    let runc = runtimes.get("runc").and_then(|r| r.get("runtime_type"));
    assert_eq!(
        runc.and_then(|v| v.as_str()),
        Some("io.containerd.runc.v2"),
        "runc survives the install:\n{dump}"
    );
    let nvidia = runtimes
        .get("nvidia")
        .unwrap_or_else(|| panic!("no nvidia runtime in the dump:\n{dump}"));
    let field = |v: Option<&toml::Value>| v.and_then(|v| v.as_str()).unwrap_or("").to_owned();
    (
        field(nvidia.get("runtime_type")),
        field(nvidia.get("options").and_then(|o| o.get("BinaryName"))),
    )
}

mod containerd_cases;
mod containerd_signal;
mod docker_case;

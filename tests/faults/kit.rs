//! Shared by the fault tests (`tests/faults/`): a simulated node, a stand-in runc that
//! records its argv, bundles made from a fixture, and what a failed `create` must leave behind.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use nvshim_testkit::NodeSpec;
use serde_json::{Value, json};

use crate::common::{self, Node, node};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/config-json");

/// What the stand-in runc exits with, so a test sees that the runtime exec'd it.
pub const FAKE_RUNC_EXIT: i32 = 7;

/// How long a runtime may take before a test calls it hung. Not a timing assertion: a
/// healthy runtime takes milliseconds, a hung one forever.
pub const HANG: Duration = Duration::from_secs(60);

/// A node, a stand-in runc and a config.toml, all in one tempdir.
pub struct Host {
    pub node: Node,
    pub dir: tempfile::TempDir,
}

impl Host {
    pub fn new(gpus: usize) -> Host {
        let node = node(&NodeSpec::standard(gpus));
        let dir = tempfile::tempdir().unwrap();
        let runc = dir.path().join("fake-runc");
        fs::write(
            &runc,
            format!(
                "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_RUNC_OUT\"\nexit {FAKE_RUNC_EXIT}\n"
            ),
        )
        .unwrap();
        fs::set_permissions(&runc, fs::Permissions::from_mode(0o755)).unwrap();
        let host = Host { node, dir };
        host.write_config(&host.default_config());
        host
    }

    pub fn fake_runc(&self) -> PathBuf {
        self.dir.path().join("fake-runc")
    }

    pub fn debug_log(&self) -> PathBuf {
        self.dir.path().join("runtime.log")
    }

    /// The node's config.toml: the stand-in runc, a debug log in the tempdir.
    pub fn default_config(&self) -> String {
        let runc = self.fake_runc();
        self.node
            .sim
            .runtime_config(runc.to_str().unwrap(), Some(&self.debug_log()))
    }

    pub fn write_config(&self, text: &str) {
        fs::write(self.dir.path().join("config.toml"), text).unwrap();
    }

    /// A bundle made from the containerd fixture with `env` as its NVIDIA_* variables and
    /// an empty `rootfs` beside it.
    pub fn bundle(&self, name: &str, env: &[&str]) -> PathBuf {
        let bundle = self.dir.path().join(name);
        fs::create_dir_all(bundle.join("rootfs")).unwrap();
        fs::write(bundle.join("config.json"), spec_bytes(env, "rootfs")).unwrap();
        bundle
    }

    /// The runtime with a cleared environment: PATH, the config file, the mock's env and
    /// where the stand-in runc records its argv.
    pub fn command(&self, args: &[&str]) -> Command {
        self.command_with(&common::runtime_bin(), args)
    }

    /// [`Host::command`] running `program` (a wrapper that runs the runtime) instead.
    pub fn command_with(&self, program: &str, args: &[&str]) -> Command {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env(
                "NVIDIA_CTK_CONFIG_FILE_PATH",
                self.dir.path().join("config.toml"),
            )
            .env("FAKE_RUNC_OUT", self.runc_argv_file())
            .envs(self.node.sim.env())
            .current_dir(self.dir.path())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        cmd
    }

    /// Runs the runtime to completion (or [`HANG`], which fails the test).
    pub fn runtime(&self, what: &str, args: &[&str]) -> Output {
        finish(what, self.command(args).spawn().unwrap())
    }

    pub fn runc_argv_file(&self) -> PathBuf {
        self.dir.path().join("runc-argv")
    }

    pub fn runc_argv(&self) -> Option<Vec<String>> {
        fs::read_to_string(self.runc_argv_file())
            .ok()
            .map(|s| s.lines().map(String::from).collect())
    }

    pub fn forget_runc(&self) {
        let _ = fs::remove_file(self.runc_argv_file());
    }
}

/// The containerd fixture with `env` as its NVIDIA_* variables and `root` as root.path.
pub fn spec_bytes(env: &[&str], root: &str) -> Vec<u8> {
    let mut spec: Value =
        serde_json::from_slice(&fs::read(Path::new(FIXTURES).join("containerd.json")).unwrap())
            .unwrap();
    let list = spec["process"]["env"].as_array_mut().unwrap();
    list.retain(|v| !v.as_str().unwrap_or("").starts_with("NVIDIA_"));
    list.extend(env.iter().map(|e| json!(e)));
    spec["root"]["path"] = json!(root);
    serde_json::to_vec_pretty(&spec).unwrap()
}

/// Waits for `child`, killing it and failing the test if it runs past [`HANG`].
pub fn finish(what: &str, mut child: Child) -> Output {
    let start = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if start.elapsed() > HANG {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: the runtime hung ({HANG:?}); stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    child.wait_with_output().unwrap()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The names in `dir`.
pub fn entries(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect()
}

/// Every leftover temp file (`.nvshim-` in its name) under `dir`, recursively, without
/// following symlinks.
pub fn temp_files(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(list) = fs::read_dir(&d) else { continue };
        for entry in list {
            let entry = entry.unwrap();
            let path = entry.path();
            if entry.file_name().to_string_lossy().contains(".nvshim-") {
                found.push(path.clone());
            }
            if entry.file_type().unwrap().is_dir() {
                stack.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Whether this process may mount (root in the initial user namespace, say). Under
/// `CI=true` nothing is skipped: a test that needs it fails instead.
pub fn can_mount(test: &str) -> bool {
    let ok = Command::new("unshare")
        .args(["-m", "sh", "-c", "mount -t tmpfs none /mnt"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: cannot mount a tmpfs in a private mount namespace, and CI=true skips nothing"
        );
        eprintln!("{test}: skipped: cannot mount a tmpfs in a private mount namespace");
    }
    ok
}

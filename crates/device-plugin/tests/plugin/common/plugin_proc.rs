// SPDX-License-Identifier: Apache-2.0
//! The `nvidia-device-plugin` binary as a real process on a simulated node: the flags
//! that point it at the node and at a socket directory, its stdout and stderr kept for
//! assertions, signals, its exit, and its memory figures from `/proc/<pid>/status`.
//!
//! Used by `tests/plugin/e2e/` and by `benches/plugin.rs`, which includes this file
//! by path; so it depends on nothing else in `common`. The waits poll with tokio's
//! timer, so a fake kubelet on the same runtime keeps answering while they wait.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvshim_testkit::SimNode;

/// The kubelet's registration socket, in the socket directory.
pub const KUBELET_SOCKET: &str = "kubelet.sock";
/// The CDI spec directory [`node_args`] gives the plugin, in the socket directory.
pub const CDI_DIR: &str = "cdi";
/// How often the waits look again.
const POLL: Duration = Duration::from_millis(5);
/// A `PATH` with nothing of the caller's in it.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// `node`'s mock NVML, as the plugin loads it.
pub fn nvml_lib(node: &SimNode) -> PathBuf {
    node.lib_dir().join("libnvidia-ml.so.1")
}

/// The flags that point the plugin at `node` and make `socket_dir` hold both the
/// kubelet's socket ([`KUBELET_SOCKET`]) and ours, and its [`CDI_DIR`] the CDI spec of
/// the `cdi-*` strategies (never the host's `/var/run/cdi`, where parallel tests would
/// replace or remove each other's spec).
pub fn node_args(node: &SimNode, socket_dir: &Path) -> Vec<String> {
    let path = |p: &Path| p.display().to_string();
    vec![
        "--kubelet-socket".into(),
        path(&socket_dir.join(KUBELET_SOCKET)),
        "--socket-dir".into(),
        path(socket_dir),
        "--cdi-spec-dir".into(),
        path(&socket_dir.join(CDI_DIR)),
        "--nvml-lib".into(),
        path(&nvml_lib(node)),
        "--nvidia-driver-root".into(),
        path(&node.driver_root),
        // Like NVIDIA's, our dev root is the directory that holds `dev/`.
        "--dev-root".into(),
        path(&node.dir),
    ]
}

/// A running plugin process, killed (and reaped) on drop. Reader threads collect its
/// stdout and stderr.
pub struct PluginProc {
    child: Child,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
    readers: Vec<JoinHandle<()>>,
    status: Option<ExitStatus>,
}

impl PluginProc {
    /// Starts `program` with `args` and an environment of `PATH` and `env` only, so
    /// nothing in the test's own environment (`MIG_STRATEGY`, `CONFIG_FILE`, …) can
    /// change what the plugin does.
    pub fn spawn(program: &Path, args: &[String], env: &[(String, String)]) -> Self {
        let mut child = Command::new(program)
            .env_clear()
            .env("PATH", PATH)
            .envs(env.iter().map(|(k, v)| (k, v)))
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", program.display()));
        let stdout = Arc::new(Mutex::new(String::new()));
        let stderr = Arc::new(Mutex::new(String::new()));
        let out: ChildStdout = child.stdout.take().unwrap();
        let err: ChildStderr = child.stderr.take().unwrap();
        let readers = vec![collect(out, stdout.clone()), collect(err, stderr.clone())];
        Self {
            child,
            stdout,
            stderr,
            readers,
            status: None,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// What the process wrote to stderr so far: its log.
    pub fn log(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    /// What the process wrote to stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) {
        let pid = Pid::from_raw(i32::try_from(self.pid()).unwrap());
        kill(pid, signal).unwrap_or_else(|e| panic!("kill -{signal} {pid}: {e}"));
    }

    /// The exit status, if the process has exited (it is reaped then).
    pub fn exited(&mut self) -> Option<ExitStatus> {
        if self.status.is_none() {
            self.status = self.child.try_wait().unwrap();
        }
        self.status
    }

    /// Waits at most `within` for the process to exit. Once it has, its output is
    /// complete in [`PluginProc::log`] and [`PluginProc::stdout`].
    pub async fn exit(&mut self, within: Duration) -> Option<ExitStatus> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(status) = self.exited() {
                for reader in self.readers.drain(..) {
                    let _ = reader.join();
                }
                return Some(status);
            }
            if tokio::time::Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// Waits at most `within` for `needle` to appear on stderr.
    pub async fn wait_log(&self, needle: &str, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if self.log().contains(needle) {
                return true;
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(POLL).await;
        }
    }

    /// A `kB` field of `/proc/<pid>/status` (`VmHWM`, `VmRSS`, `RssAnon`, …) in KiB.
    pub fn status_kib(&self, field: &str) -> Option<u64> {
        proc_kib(&format!("/proc/{}/status", self.pid()), field)
    }

    /// A `kB` field of `/proc/<pid>/smaps_rollup` (`Rss`, `Pss_Anon`, …) in KiB.
    pub fn smaps_kib(&self, field: &str) -> Option<u64> {
        proc_kib(&format!("/proc/{}/smaps_rollup", self.pid()), field)
    }

    /// `Threads:` from `/proc/<pid>/status`.
    pub fn threads(&self) -> Option<u64> {
        let text = std::fs::read_to_string(format!("/proc/{}/status", self.pid())).ok()?;
        text.lines()
            .find_map(|l| l.strip_prefix("Threads:"))
            .and_then(|v| v.trim().parse().ok())
    }
}

impl Drop for PluginProc {
    fn drop(&mut self) {
        if self.exited().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        for reader in self.readers.drain(..) {
            let _ = reader.join();
        }
    }
}

/// Copies a pipe into `into` until it closes.
fn collect(mut pipe: impl Read + Send + 'static, into: Arc<Mutex<String>>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 8192];
        while let Ok(n) = pipe.read(&mut buf) {
            if n == 0 {
                break;
            }
            into.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&buf[..n]));
        }
    })
}

/// `<field>: <n> kB` from a `/proc` file.
fn proc_kib(path: &str, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(path).ok()?;
    text.lines().find_map(|line| {
        let rest = line.strip_prefix(field)?.strip_prefix(':')?;
        rest.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

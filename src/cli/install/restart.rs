// SPDX-License-Identifier: Apache-2.0
//! Making the engine read its new config, as NVIDIA's installer does it:
//! - `signal`: SIGHUP to the process behind the engine's socket. dockerd reloads
//!   `daemon.json` (its runtimes included) on SIGHUP; containerd does not handle SIGHUP,
//!   so it exits and its service manager starts it again on the new config. The PID is
//!   the one the kernel attaches to a message the engine sends us (`SO_PASSCRED`,
//!   `SCM_CREDENTIALS`): with socket activation the listening socket's owner
//!   (`SO_PEERCRED`) would be systemd, the message's sender is the engine. Without a
//!   message in time, `SO_PEERCRED` it is, unless that names PID 1.
//! - `systemd`: `systemctl restart <unit>`, chrooted into the host root when there is one.
//! - `none`: nothing; the engine reads the config when someone restarts it.

use std::io::{self, IoSliceMut, Write};
use std::os::fd::AsFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{
    ControlMessageOwned, MsgFlags, UnixCredentials, getsockopt, recvmsg, setsockopt, sockopt,
};
use nix::unistd::Pid;

use super::InstallError;
use super::args::RestartMode;
use crate::cli::configure::EngineKind;

/// How long the engine has to answer on its socket.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);
/// How long to keep trying to reach an engine that is (re)starting.
const REACH_DEADLINE: Duration = Duration::from_secs(30);
/// How long containerd's service manager gets to start it again after the SIGHUP.
const COME_BACK_DEADLINE: Duration = Duration::from_secs(60);
const RETRY_INTERVAL: Duration = Duration::from_millis(500);

/// What docker answers (any HTTP request does); containerd's gRPC server speaks first.
const DOCKER_REQUEST: &[u8] = b"GET /_ping HTTP/1.0\r\n\r\n";

/// A runtime the engine should list once it has read its new config: `(name, path)`.
pub type Expected<'a> = Option<(&'a str, &'a str)>;

/// Restarts (or signals) `engine` as `mode` says. `socket` is a path here (under the
/// host root); `host_root` is where `systemctl` is chrooted. With `expect`, a signalled
/// dockerd (whose reload follows the signal by a moment) is asked until it lists that runtime,
/// so that the ready marker written next means what it says.
pub fn restart(
    engine: EngineKind,
    mode: RestartMode,
    socket: &Path,
    host_root: &Path,
    expect: Expected<'_>,
) -> Result<String, InstallError> {
    match mode {
        RestartMode::None => Ok(format!(
            "left {} alone (--restart-mode none): it reads the new config when it restarts",
            engine.display()
        )),
        RestartMode::Signal => {
            let pid = engine_pid_retrying(engine, socket)?;
            kill(Pid::from_raw(pid), Signal::SIGHUP).map_err(|e| InstallError::Signal {
                pid,
                socket: socket.to_path_buf(),
                reason: e.to_string(),
            })?;
            if engine != EngineKind::Containerd {
                if let (EngineKind::Docker, Some((name, path))) = (engine, expect) {
                    wait_for_docker_runtime(socket, name, path, REACH_DEADLINE)?;
                }
                return Ok(format!(
                    "sent SIGHUP to {} (pid {pid}, from {})",
                    engine.display(),
                    socket.display()
                ));
            }
            let new = wait_for_new_pid(engine, socket, pid, COME_BACK_DEADLINE)?;
            Ok(format!(
                "sent SIGHUP to containerd (pid {pid}, from {}); it is back as pid {new}",
                socket.display()
            ))
        }
        RestartMode::Systemd => {
            let argv = systemctl_argv(engine, host_root);
            let shown = argv.join(" ");
            let status = Command::new(&argv[0])
                .args(&argv[1..])
                .status()
                .map_err(|e| InstallError::Restart {
                    command: shown.clone(),
                    reason: e.to_string(),
                })?;
            if !status.success() {
                return Err(InstallError::Restart {
                    command: shown,
                    reason: status.to_string(),
                });
            }
            Ok(format!("ran `{shown}`"))
        }
    }
}

/// `systemctl restart <unit>`, through `chroot <host-root>` unless the root is `/`.
pub fn systemctl_argv(engine: EngineKind, host_root: &Path) -> Vec<String> {
    let mut argv = Vec::new();
    if host_root != Path::new("/") {
        argv.push("chroot".to_owned());
        argv.push(host_root.display().to_string());
    }
    argv.extend(["systemctl", "restart", engine.unit()].map(str::to_owned));
    argv
}

/// containerd exits on SIGHUP: the ready marker waits until a new process serves the
/// socket, so that it means what it says.
pub fn wait_for_new_pid(
    engine: EngineKind,
    socket: &Path,
    old: i32,
    within: Duration,
) -> Result<i32, InstallError> {
    let deadline = Instant::now() + within;
    loop {
        match engine_pid(engine, socket) {
            Ok(pid) if pid != old => return Ok(pid),
            _ if Instant::now() >= deadline => {
                return Err(InstallError::Socket {
                    socket: socket.to_path_buf(),
                    reason: format!(
                        "{} (pid {old}) exits on SIGHUP, and no new process served the socket within {} s: is a service manager restarting it? (else use --restart-mode systemd or none)",
                        engine.display(),
                        within.as_secs()
                    ),
                });
            }
            _ => std::thread::sleep(RETRY_INTERVAL),
        }
    }
}

/// Asks dockerd (`GET /info`) until it lists runtime `name` at `path`.
pub fn wait_for_docker_runtime(
    socket: &Path,
    name: &str,
    path: &str,
    within: Duration,
) -> Result<(), InstallError> {
    let deadline = Instant::now() + within;
    loop {
        let listed = docker_runtime_path(socket, name);
        match &listed {
            Ok(Some(p)) if p == path => return Ok(()),
            _ if Instant::now() >= deadline => {
                let saw = match listed {
                    Ok(Some(p)) => format!("it lists \"{name}\" at {p}"),
                    Ok(None) => format!("it does not list \"{name}\""),
                    Err(e) => e.to_string(),
                };
                return Err(InstallError::Socket {
                    socket: socket.to_path_buf(),
                    reason: format!(
                        "dockerd did not load runtime \"{name}\" = {path} within {} s of SIGHUP: {saw} (its log says why; else use --restart-mode systemd)",
                        within.as_secs()
                    ),
                });
            }
            _ => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// The path dockerd's `/info` gives runtime `name`, if it lists it.
fn docker_runtime_path(socket: &Path, name: &str) -> io::Result<Option<String>> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    stream.write_all(b"GET /info HTTP/1.0\r\n\r\n")?;
    let mut raw = Vec::new();
    io::Read::read_to_end(&mut io::Read::take(&mut stream, 4 << 20), &mut raw)?;
    let (status, body) = crate::cli::labels::apiserver::parse_response(&raw)
        .map_err(|e| io::Error::other(format!("dockerd's /info answer: {e}")))?;
    if status != 200 {
        return Err(io::Error::other(format!(
            "dockerd's /info answered HTTP {status}"
        )));
    }
    let info: serde_json::Value = serde_json::from_slice(&body)
        .map_err(|e| io::Error::other(format!("dockerd's /info is not JSON: {e}")))?;
    Ok(info["Runtimes"][name]["path"].as_str().map(str::to_owned))
}

fn engine_pid_retrying(engine: EngineKind, socket: &Path) -> Result<i32, InstallError> {
    let deadline = Instant::now() + REACH_DEADLINE;
    loop {
        match engine_pid(engine, socket) {
            Ok(pid) => return Ok(pid),
            Err(e) if Instant::now() >= deadline => {
                return Err(InstallError::Socket {
                    socket: socket.to_path_buf(),
                    reason: e.to_string(),
                });
            }
            Err(e) => {
                tracing::warn!(socket = %socket.display(), "cannot reach {} yet: {e}", engine.display());
                std::thread::sleep(RETRY_INTERVAL);
            }
        }
    }
}

/// The PID of the process serving `socket` (see the module doc).
pub fn engine_pid(engine: EngineKind, socket: &Path) -> io::Result<i32> {
    let mut stream = UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(ANSWER_TIMEOUT))?;
    setsockopt(&stream, sockopt::PassCred, &true)?;
    if engine == EngineKind::Docker {
        stream.write_all(DOCKER_REQUEST)?;
    }
    let mut buf = [0u8; 256];
    let mut space = nix::cmsg_space!(UnixCredentials);
    let sender = {
        let mut iov = [IoSliceMut::new(&mut buf)];
        match recvmsg::<()>(
            std::os::fd::AsRawFd::as_raw_fd(&stream),
            &mut iov,
            Some(&mut space),
            MsgFlags::empty(),
        ) {
            Ok(msg) => msg.cmsgs()?.find_map(|c| match c {
                ControlMessageOwned::ScmCredentials(cred) => Some(cred.pid()),
                _ => None,
            }),
            Err(e) => {
                tracing::debug!(socket = %socket.display(), "no answer on the socket ({e}), asking for the peer's credentials");
                None
            }
        }
    };
    if let Some(pid) = sender.filter(|p| *p > 0) {
        return Ok(pid);
    }
    let peer = getsockopt(&stream.as_fd(), sockopt::PeerCredentials)?;
    match peer.pid() {
        pid if pid > 1 => Ok(pid),
        0 => Err(io::Error::other(
            "the engine runs in another PID namespace, where its pid means nothing here: run the installer in the host's (hostPID: true)",
        )),
        pid => Err(io::Error::other(format!(
            "the socket's owner is pid {pid} (socket activation?), and the engine sent nothing to learn its own pid from"
        ))),
    }
}

/// The socket as seen from here.
pub fn socket_here(host_root: &Path, socket: &Path) -> PathBuf {
    crate::cli::configure::under_root(host_root, socket)
}

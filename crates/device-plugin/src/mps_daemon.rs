// SPDX-License-Identifier: Apache-2.0
//! `nvidia-device-plugin mps-control-daemon`: NVIDIA's `mps-control-daemon` role. For
//! each MPS-shared resource it starts `nvidia-cuda-mps-control -d` with the resource's
//! pipe and log directories and GPUs, sets the per-replica defaults through the control
//! client, writes `<mpsRoot>/<resource>/.started`, restarts a daemon that dies, and on
//! SIGTERM/SIGINT sends `quit` and removes `.started`.
//!
//! Plain threads, no async runtime: one thread waits for the signals (blocked
//! everywhere else), the main one supervises. Liveness is read from the daemon's own
//! pid file (`<pipe>/nvidia-cuda-mps-control.pid`): the pid must be a live process
//! (not a zombie) whose name is the control binary's. That costs three small `/proc`
//! reads per second and never talks to the daemon; a control command (`get_server_list`)
//! would spawn a client each time and hang when the daemon is wedged, and a pid we
//! forked ourselves is useless because `-d` forks the real daemon and exits.

use std::io::{self, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use nix::sys::signal::{SigSet, Signal};
use nix::sys::wait::{WaitPidFlag, waitpid};
use nix::unistd::Pid;

use crate::config::{self, PluginArgs, PluginConfigError};
use crate::mps::{
    CONTROL_BINARY, ENV_CUDA_VISIBLE_DEVICES, ENV_LOG_DIRECTORY, ENV_PIPE_DIRECTORY, Limits,
    PID_FILE, QUIT, SHM_DIR, STARTED_FILE, log_dir, pipe_dir, resource_dir,
};
use crate::node::{self, PluginError};
use crate::resources::{Device, Resource};
use nvshim::discover::table::BINARY_DIRS;

/// How often the daemons' liveness is checked.
const CHECK_EVERY: Duration = Duration::from_secs(1);
/// How long a daemon may take to write its pid file, and a client to answer.
const STARTUP: Duration = Duration::from_secs(10);
/// How long a daemon may take to exit after `quit`.
const SHUTDOWN: Duration = Duration::from_secs(5);
const POLL: Duration = Duration::from_millis(20);
/// `/proc/<pid>/comm` holds at most 15 bytes of the name.
const COMM_LEN: usize = 15;

/// Why the control daemons could not be run.
#[derive(Debug, thiserror::Error)]
pub enum MpsError {
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    #[error(transparent)]
    Discover(#[from] Box<PluginError>),
    #[error("cannot find {CONTROL_BINARY} (tried {tried})")]
    NoControl { tried: String },
    #[error("cannot create {}: {source}", path.display())]
    Dir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot run {} for {resource}: {source}", program.display())]
    Spawn {
        program: PathBuf,
        resource: String,
        #[source]
        source: io::Error,
    },
    #[error("{CONTROL_BINARY} {args} for {resource} failed ({status}): {output}")]
    Failed {
        args: String,
        resource: String,
        status: String,
        output: String,
    },
    #[error(
        "the MPS control daemon for {resource} did not write {} within {STARTUP:?} (see its log in {})",
        pid_file.display(), log.display()
    )]
    NotUp {
        resource: String,
        pid_file: PathBuf,
        log: PathBuf,
    },
    #[error("cannot handle SIGTERM and SIGINT: {0}")]
    Signals(#[source] nix::Error),
    #[error("cannot start the signal thread: {0}")]
    Thread(#[source] io::Error),
}

/// One resource's control daemon: where it lives, what it serves, how it is set up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    /// The advertised resource name, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// `--mps-root`.
    pub root: PathBuf,
    /// `CUDA_VISIBLE_DEVICES`: the GPUs' UUIDs, in index order.
    pub uuids: Vec<String>,
    /// The control commands that set the replicas' defaults.
    pub commands: Vec<String>,
}

impl Daemon {
    /// The daemons for the MPS-shared resources among `resources`.
    pub fn for_resources(resources: &[Resource], root: &Path) -> Vec<Daemon> {
        resources
            .iter()
            .filter(|r| r.is_mps())
            .map(|r| {
                let mut uuids: Vec<String> =
                    r.devices.iter().map(|d: &Device| d.uuid.clone()).collect();
                uuids.dedup();
                Daemon {
                    resource: r.name.clone(),
                    root: root.to_owned(),
                    uuids,
                    commands: Limits::of(r).commands(),
                }
            })
            .collect()
    }

    pub fn started_file(&self) -> PathBuf {
        resource_dir(&self.root, &self.resource).join(STARTED_FILE)
    }

    pub fn pid_file(&self) -> PathBuf {
        pipe_dir(&self.root, &self.resource).join(PID_FILE)
    }

    /// The environment every `nvidia-cuda-mps-control` call for this resource gets.
    pub fn env(&self) -> [(&'static str, String); 3] {
        let path = |p: PathBuf| p.display().to_string();
        [
            (
                ENV_PIPE_DIRECTORY,
                path(pipe_dir(&self.root, &self.resource)),
            ),
            (ENV_LOG_DIRECTORY, path(log_dir(&self.root, &self.resource))),
            (ENV_CUDA_VISIBLE_DEVICES, self.uuids.join(",")),
        ]
    }

    /// Whether the daemon is running (see the module doc for how this is told).
    pub fn alive(&self) -> bool {
        self.pid().is_some()
    }

    /// The running daemon's pid, from its pid file.
    fn pid(&self) -> Option<u32> {
        std::fs::read_to_string(self.pid_file())
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .filter(|pid| is_control_daemon(*pid))
    }

    /// Starts the daemon and sets its defaults, then writes `.started`.
    fn start(&self, control: &Path) -> Result<(), MpsError> {
        for dir in [
            pipe_dir(&self.root, &self.resource),
            log_dir(&self.root, &self.resource),
            self.root.join(SHM_DIR),
        ] {
            std::fs::create_dir_all(&dir).map_err(|source| MpsError::Dir { path: dir, source })?;
        }
        if self.alive() {
            // Left by an earlier run of ours (the daemon outlives its pod under
            // hostPID): `-d` would refuse to start a second one, and this one may have
            // other limits. Replace it.
            tracing::warn!(resource = %self.resource, "an MPS control daemon is already running; restarting it");
            self.stop(control);
        }
        let _ = std::fs::remove_file(self.started_file());
        // A pid file left by a daemon that died would pass for a live one if its pid
        // were reused by another control daemon; the new daemon writes its own.
        let _ = std::fs::remove_file(self.pid_file());
        self.run(control, &["-d"], None)?;
        let deadline = Instant::now() + STARTUP;
        while !self.alive() {
            if Instant::now() >= deadline {
                return Err(MpsError::NotUp {
                    resource: self.resource.clone(),
                    pid_file: self.pid_file(),
                    log: log_dir(&self.root, &self.resource),
                });
            }
            std::thread::sleep(POLL);
        }
        for command in &self.commands {
            self.run(control, &[], Some(command))?;
        }
        let started = self.started_file();
        std::fs::write(&started, b"").map_err(|source| MpsError::Dir {
            path: started,
            source,
        })?;
        tracing::info!(resource = %self.resource, gpus = %self.uuids.join(","), "MPS control daemon started");
        Ok(())
    }

    /// Sends `quit` and waits for the daemon to go; `.started` goes first, so that
    /// nothing takes a stopping daemon for a ready one.
    fn stop(&self, control: &Path) {
        let _ = std::fs::remove_file(self.started_file());
        let Some(pid) = self.pid() else {
            return;
        };
        if let Err(error) = self.run(control, &[], Some(QUIT)) {
            tracing::warn!(resource = %self.resource, "{error}");
        }
        // The daemon may remove its pid file before it is done: wait for the process.
        let deadline = Instant::now() + SHUTDOWN;
        while is_control_daemon(pid) && Instant::now() < deadline {
            std::thread::sleep(POLL);
        }
        if is_control_daemon(pid) {
            tracing::warn!(resource = %self.resource, pid, "the MPS control daemon did not quit within {SHUTDOWN:?}");
        } else {
            tracing::info!(resource = %self.resource, "MPS control daemon stopped");
        }
    }

    /// Runs the control binary with `args`, writing `stdin` (one command) to it; a
    /// client that does not answer within [`STARTUP`] is killed.
    fn run(&self, control: &Path, args: &[&str], stdin: Option<&str>) -> Result<(), MpsError> {
        let spawn_error = |source| MpsError::Spawn {
            program: control.to_owned(),
            resource: self.resource.clone(),
            source,
        };
        // `-d` forks the daemon, which would hold our pipes open for its whole life:
        // its output goes to our stderr (and its log directory) instead.
        let client = stdin.is_some();
        let piped_if = |piped: bool| if piped { Stdio::piped() } else { Stdio::null() };
        let mut child = Command::new(control)
            .args(args)
            .envs(self.env())
            .stdin(piped_if(client))
            .stdout(piped_if(client))
            .stderr(if client {
                Stdio::piped()
            } else {
                Stdio::inherit()
            })
            .spawn()
            .map_err(spawn_error)?;
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            // A client that finds no daemon exits without reading: the broken pipe says
            // less than its exit status and stderr, which are reported below.
            let _ = pipe.write_all(format!("{text}\n").as_bytes());
        }
        let deadline = Instant::now() + STARTUP;
        let status: Option<ExitStatus> = loop {
            match child.try_wait().map_err(spawn_error)? {
                Some(status) => break Some(status),
                None if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break None;
                }
                None => std::thread::sleep(POLL),
            }
        };
        let output = child.wait_with_output().map_err(spawn_error)?;
        if status.is_some_and(|s| s.success()) {
            return Ok(());
        }
        let mut text = String::from_utf8_lossy(&output.stderr).trim().to_string();
        if text.is_empty() {
            text = String::from_utf8_lossy(&output.stdout).trim().to_string();
        }
        if text.is_empty() {
            let log = log_dir(&self.root, &self.resource);
            text = format!("no output; see the log in {}", log.display());
        }
        Err(MpsError::Failed {
            args: stdin.map_or_else(|| args.join(" "), |c| format!("<<< {c}")),
            resource: self.resource.clone(),
            status: status.map_or_else(
                || format!("no answer within {STARTUP:?}"),
                |s| s.to_string(),
            ),
            output: text,
        })
    }
}

/// Whether `pid` is a live (not zombie) process named like the control binary, so
/// that a stale pid file naming a reused pid does not pass for a daemon.
fn is_control_daemon(pid: u32) -> bool {
    let proc = PathBuf::from(format!("/proc/{pid}"));
    let running = std::fs::read_to_string(proc.join("stat"))
        .ok()
        .and_then(|stat| {
            // The state follows the parenthesised name, which may hold spaces.
            let after = stat.rsplit_once(')')?.1;
            after.split_whitespace().next().map(|state| state != "Z")
        })
        .unwrap_or(false);
    let name = &CONTROL_BINARY[..COMM_LEN.min(CONTROL_BINARY.len())];
    running && std::fs::read_to_string(proc.join("comm")).is_ok_and(|comm| comm.trim_end() == name)
}

/// `nvidia-cuda-mps-control`: first in the driver root's binary directories (the
/// binary that matches the loaded driver), then on `PATH`.
pub fn find_control(
    driver_root: &Path,
    path: Option<&std::ffi::OsStr>,
) -> Result<PathBuf, MpsError> {
    let mut tried = Vec::new();
    let under_root = BINARY_DIRS
        .iter()
        .map(|dir| driver_root.join(dir.trim_start_matches('/')));
    let on_path = path
        .map(|p| std::env::split_paths(p).collect::<Vec<_>>())
        .unwrap_or_default();
    for dir in under_root.chain(on_path) {
        let candidate = dir.join(CONTROL_BINARY);
        if candidate.is_file() {
            return Ok(candidate);
        }
        tried.push(candidate.display().to_string());
    }
    Err(MpsError::NoControl {
        tried: tried.join(", "),
    })
}

/// Runs the daemons for the settings `args` resolve to, until SIGTERM or SIGINT.
pub fn run(args: &PluginArgs) -> Result<(), MpsError> {
    // Blocked before any thread starts, so that only the waiting thread takes them.
    let mut signals = SigSet::empty();
    signals.add(Signal::SIGTERM);
    signals.add(Signal::SIGINT);
    signals.thread_block().map_err(MpsError::Signals)?;
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("signals".into())
        .spawn(move || {
            if let Ok(signal) = signals.wait() {
                let _ = tx.send(signal);
            }
        })
        .map_err(MpsError::Thread)?;

    let settings = config::resolve_from_process(args)?;
    let mps = settings
        .sharing
        .as_ref()
        .is_some_and(|s| s.strategy == config::SharingStrategy::Mps);
    // Resolving the settings refused MPS without a root.
    let daemons = match &settings.mps_root {
        Some(root) if mps => {
            let resources = node::discover_resources(&settings).map_err(Box::new)?;
            Daemon::for_resources(&resources, root)
        }
        _ => Vec::new(),
    };
    if daemons.is_empty() {
        // Not an error: the DaemonSet follows a node label, and a crash loop would not
        // say more than this line does.
        tracing::warn!("no resource is shared with MPS (sharing.mps); waiting for a signal");
        let _ = rx.recv();
        return Ok(());
    }
    let path = std::env::var_os("PATH");
    let control = find_control(&settings.driver_root, path.as_deref())?;
    let mut up = Vec::with_capacity(daemons.len());
    for daemon in &daemons {
        if let Err(error) = daemon.start(&control) {
            up.iter().for_each(|d: &&Daemon| d.stop(&control));
            return Err(error);
        }
        up.push(daemon);
    }
    supervise(&daemons, &control, &rx);
    for daemon in &daemons {
        daemon.stop(&control);
    }
    Ok(())
}

/// Restarts dead daemons until a signal comes.
fn supervise(daemons: &[Daemon], control: &Path, signals: &mpsc::Receiver<Signal>) {
    loop {
        match signals.recv_timeout(CHECK_EVERY) {
            Ok(signal) => {
                tracing::info!(%signal, "stopping the MPS control daemons");
                return;
            }
            Err(RecvTimeoutError::Disconnected) => return,
            Err(RecvTimeoutError::Timeout) => {}
        }
        // As PID 1 of a container we inherit the forked daemons: reap the dead ones,
        // or they would stay zombies (which `alive` already reads as dead).
        while let Ok(status) = waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
            if status.pid().is_none() {
                break;
            }
        }
        for daemon in daemons.iter().filter(|d| !d.alive()) {
            tracing::warn!(resource = %daemon.resource, "the MPS control daemon is gone; restarting it");
            if let Err(error) = daemon.start(control) {
                tracing::error!(resource = %daemon.resource, "{error}; trying again in {CHECK_EVERY:?}");
            }
        }
    }
}

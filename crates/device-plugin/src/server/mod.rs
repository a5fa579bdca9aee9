//! The kubelet side of the device plugin: one gRPC `DevicePlugin` server per
//! resource on a Unix socket, registration with kubelet, and the loop that keeps
//! both alive across kubelet restarts, deleted sockets, SIGHUP and SIGTERM.
//!
//! ```text
//! serve(node) ─┬─ round: bind <socket_dir>/<endpoint> per resource, serve, Register
//!              ├─ inotify on the socket dirs ── kubelet.sock re-created / our socket gone
//!              │                                 → stop the round, start a new one
//!              ├─ Command::Restart (SIGHUP)   → rebuild the Node (config, discovery), new round
//!              ├─ Command::Stop (SIGTERM…)    → stop the round, remove our sockets, return
//!              ├─ /healthz, /readyz           (optional, on settings.health_addr)
//!              └─ /metrics                    (optional, on settings.metrics_addr)
//! ```
//!
//! Everything a call needs (resources, ID index, topology, settings) is built once
//! per [`Node`] and shared, so the handlers do no more work than their answer needs.
//! This is the only module that knows about gRPC and tokio; it decides nothing
//! about what a container gets (that is `allocate`) or which devices to prefer
//! (`preferred`).

mod authority;
mod limits;
mod probes;
mod register;
mod round;
mod service;
mod watch;

use std::fmt::Display;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::{mpsc, watch as channel};

use super::config::Settings;
use super::health::HealthBoard;
use super::metrics::{self, Metrics};
use super::resources::Resource;
use super::topology::Topology;
use round::{Prepared, Round, RoundEvent, Verdict};
use watch::DirWatch;

pub use authority::AuthorityFixed;
pub use limits::{Bounded, Limits};
pub use service::{DevicePluginService, DeviceStream};

/// What the plugin serves: the settings, the resources built from them, and the
/// shared health board and topology. Rebuilt from scratch on SIGHUP.
#[derive(Debug, Clone)]
pub struct Node {
    pub settings: Arc<Settings>,
    /// One socket and one registration each. Resources without devices are skipped,
    /// as is a resource whose socket name an earlier one already uses.
    pub resources: Vec<Resource>,
    pub health: Arc<HealthBoard>,
    pub topology: Arc<Topology>,
}

/// What a [`Control`] can ask of a running [`serve`] loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Stop serving, rebuild the [`Node`] (re-read config, re-discover) and serve it
    /// again: what SIGHUP does.
    Restart,
    /// Stop serving, remove our sockets and return: what SIGTERM and SIGINT do.
    Stop,
}

/// The outside handle on a [`serve`] loop: send it commands, read its readiness.
/// Cheap to clone.
#[derive(Debug, Clone)]
pub struct Control {
    commands: mpsc::UnboundedSender<Command>,
    ready: channel::Receiver<bool>,
}

impl Control {
    /// Asks for a full restart. Returns false when the loop has already ended.
    pub fn restart(&self) -> bool {
        self.commands.send(Command::Restart).is_ok()
    }

    /// Asks for a clean stop. Returns false when the loop has already ended.
    pub fn stop(&self) -> bool {
        self.commands.send(Command::Stop).is_ok()
    }

    /// Whether every resource is served, registered with the kubelet that is running
    /// now, and streamed by it (`ListAndWatch` open); without a kubelet socket, whether
    /// every resource is served.
    pub fn is_ready(&self) -> bool {
        *self.ready.borrow()
    }

    /// A receiver that changes with readiness, for waiting on it.
    pub fn readiness(&self) -> channel::Receiver<bool> {
        self.ready.clone()
    }
}

/// The loop's end of a [`Control`]; give it to [`serve`].
#[derive(Debug)]
pub struct Commands {
    commands: mpsc::UnboundedReceiver<Command>,
    ready: channel::Sender<bool>,
}

/// A connected [`Control`] and [`Commands`] pair.
pub fn control() -> (Control, Commands) {
    let (tx, rx) = mpsc::unbounded_channel();
    let (ready_tx, ready_rx) = channel::channel(false);
    (
        Control {
            commands: tx,
            ready: ready_rx,
        },
        Commands {
            commands: rx,
            ready: ready_tx,
        },
    )
}

/// Why serving could not start.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot start the async runtime")]
    Runtime(#[source] io::Error),
    #[error("cannot listen for signals")]
    Signals(#[source] io::Error),
    #[error("cannot watch directory {dir:?} (it must exist)")]
    Watch {
        dir: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove stale socket {path:?}")]
    Stale {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot listen on {path:?}")]
    Bind {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot serve health probes on {addr}")]
    Probes {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error("cannot serve metrics on {addr}")]
    Metrics {
        addr: SocketAddr,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    MetricsSettings(#[from] crate::metrics::MetricsError),
}

/// How often the loop re-checks the sockets even without an inotify event: a safety
/// net for a dropped watch (directory re-mounted) or a missed event.
const RECHECK: Duration = Duration::from_secs(2);

/// Runs the plugin on a single-threaded runtime until SIGTERM, SIGINT or SIGQUIT;
/// SIGHUP calls `rebuild` and serves its [`Node`]. This is all the
/// `nvidia-device-plugin` binary needs after building the first [`Node`].
pub fn run<R, E>(node: Node, rebuild: R) -> Result<(), ServerError>
where
    R: FnMut() -> Result<Node, E>,
    E: Display,
{
    let metrics = Metrics::for_settings(&node.settings)?;
    run_with_metrics(node, rebuild, metrics)
}

/// [`run`], counting into `metrics` and serving them on `settings.metrics_addr` (the
/// caller made `metrics`, so it can hand it each node's GPUs as it builds them).
pub fn run_with_metrics<R, E>(node: Node, rebuild: R, metrics: Metrics) -> Result<(), ServerError>
where
    R: FnMut() -> Result<Node, E>,
    E: Display,
{
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(ServerError::Runtime)?;
    runtime.block_on(async {
        let (control, commands) = control();
        let signals = forward_signals(control)?;
        let signals = tokio::spawn(signals);
        let served = serve_with_metrics(node, rebuild, commands, metrics).await;
        signals.abort();
        served
    })
}

/// Turns SIGHUP into [`Command::Restart`] and SIGTERM, SIGINT and SIGQUIT into
/// [`Command::Stop`]. The handlers are installed when this returns (call it inside a
/// runtime); spawn the future to forward signals.
pub fn forward_signals(control: Control) -> Result<impl Future<Output = ()>, ServerError> {
    let mut hup = signal(SignalKind::hangup()).map_err(ServerError::Signals)?;
    let mut term = signal(SignalKind::terminate()).map_err(ServerError::Signals)?;
    let mut int = signal(SignalKind::interrupt()).map_err(ServerError::Signals)?;
    let mut quit = signal(SignalKind::quit()).map_err(ServerError::Signals)?;
    Ok(async move {
        loop {
            let command = tokio::select! {
                _ = hup.recv() => Command::Restart,
                _ = term.recv() => Command::Stop,
                _ = int.recv() => Command::Stop,
                _ = quit.recv() => Command::Stop,
            };
            tracing::info!(?command, "signal received");
            if control.commands.send(command).is_err() {
                return;
            }
        }
    })
}

/// Serves `node` until [`Command::Stop`]: binds one socket per resource in
/// `settings.socket_dir`, registers each with kubelet (unless
/// `settings.kubelet_socket` is `None`), and starts over when kubelet restarts or one
/// of our sockets is deleted. [`Command::Restart`] calls `rebuild` first; if it fails,
/// the error is logged and the old node is served again.
///
/// Fails only when serving cannot start at all: a socket directory that cannot be
/// watched, a socket that cannot be bound the first time, or a health (or metrics)
/// address in use.
/// Later failures are logged and retried.
pub async fn serve<R, E>(node: Node, rebuild: R, commands: Commands) -> Result<(), ServerError>
where
    R: FnMut() -> Result<Node, E>,
    E: Display,
{
    let metrics = Metrics::for_settings(&node.settings)?;
    serve_with_metrics(node, rebuild, commands, metrics).await
}

/// [`serve`], counting into `metrics`; when they are on and `settings.metrics_addr` is
/// set, `/metrics` is served there (a port of 0 picks a free one; the log says which).
/// Like the probe address, the metrics address is read once: SIGHUP does not move it.
pub async fn serve_with_metrics<R, E>(
    node: Node,
    mut rebuild: R,
    commands: Commands,
    metrics: Metrics,
) -> Result<(), ServerError>
where
    R: FnMut() -> Result<Node, E>,
    E: Display,
{
    let Commands {
        commands: mut inbox,
        ready,
    } = commands;
    metrics.watch_health(&node.health);
    let mut prepared = Prepared::new(node, metrics.clone());
    let mut dirs = DirWatch::new(&prepared.watched_dirs())
        .map_err(|(dir, source)| ServerError::Watch { dir, source })?;
    let _probes = match prepared.settings().health_addr {
        Some(addr) => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Probes { addr, source })?;
            Some(AbortOnDrop(tokio::spawn(probes::serve(
                listener,
                ready.subscribe(),
            ))))
        }
        None => None,
    };
    let _metrics = match prepared.settings().metrics_addr {
        Some(addr) if metrics.is_enabled() => {
            let listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|source| ServerError::Metrics { addr, source })?;
            let bound = listener.local_addr().unwrap_or(addr);
            tracing::info!(addr = %bound, path = "/metrics", "serving metrics");
            Some(AbortOnDrop(tokio::spawn(metrics::serve(
                listener,
                metrics.clone(),
            ))))
        }
        _ => None,
    };
    let mut round = Some(Round::start(&prepared)?);
    let mut failures = 0u32;
    let mut retry_at: Option<tokio::time::Instant> = None;
    let mut recheck = tokio::time::interval(RECHECK);
    let mut inbox_open = true;

    let mut why_not: Option<String> = None;
    loop {
        let not_ready = match round.as_ref() {
            Some(round) => round.not_ready(&prepared),
            None => Some("not serving".to_string()),
        };
        if not_ready != why_not {
            match &not_ready {
                None => tracing::info!("ready: every resource is served and streamed by kubelet"),
                Some(why) => tracing::info!(reason = %why, "not ready"),
            }
            why_not.clone_from(&not_ready);
        }
        ready.send_if_modified(|r| {
            let now = not_ready.is_none();
            std::mem::replace(r, now) != now
        });
        let restart: Option<String> = tokio::select! {
            command = inbox.recv(), if inbox_open => match command {
                None => {
                    // Every Control is gone: nobody can stop us; serve on.
                    inbox_open = false;
                    None
                }
                Some(Command::Stop) => {
                    ready.send_replace(false);
                    if let Some(round) = round.take() {
                        round.stop().await;
                    }
                    tracing::info!("device plugin stopped");
                    return Ok(());
                }
                Some(Command::Restart) => {
                    ready.send_replace(false);
                    if let Some(round) = round.take() {
                        round.stop().await;
                    }
                    match rebuild() {
                        Ok(node) => {
                            metrics.watch_health(&node.health);
                            prepared = Prepared::new(node, metrics.clone());
                            rewatch_dirs(&mut dirs, &prepared);
                        }
                        Err(error) => tracing::error!(
                            error = %format!("{error:#}"),
                            "rebuilding the device plugin failed; serving the previous devices"
                        ),
                    }
                    Some("restart requested".to_string())
                }
            },
            touched = dirs.changed() => match touched {
                Ok(touched) => {
                    if touched.everything {
                        // A watched directory went away (and may be back already).
                        dirs.rewatch();
                    }
                    round.as_mut().and_then(|r| match r.check(&prepared, Some(&touched)) {
                        Verdict::Steady => None,
                        Verdict::Restart(why) => Some(why),
                    })
                }
                Err(error) => {
                    tracing::warn!(%error, "reading inotify events failed");
                    tokio::time::sleep(RECHECK).await;
                    None
                }
            },
            _ = recheck.tick() => {
                dirs.rewatch();
                if let Some(round) = round.as_mut() {
                    round.warn_if_silent(&prepared);
                }
                round.as_mut().and_then(|r| match r.check(&prepared, None) {
                    Verdict::Steady => None,
                    Verdict::Restart(why) => Some(why),
                })
            }
            event = round::next_event(&mut round) => match event {
                RoundEvent::Registered(result) => {
                    if let Some(round) = round.as_mut() {
                        round.registration_finished(result);
                    }
                    None
                }
                RoundEvent::ServerEnded(why) => Some(why),
            },
            () = prepared.streams_changed() => None,
            () = sleep_until(retry_at) => {
                retry_at = None;
                Some("retrying".to_string())
            }
        };

        let Some(why) = restart else { continue };
        ready.send_replace(false);
        if let Some(round) = round.take() {
            tracing::info!(reason = %why, "restarting the device plugin servers");
            round.stop().await;
        }
        match Round::start(&prepared) {
            Ok(started) => {
                round = Some(started);
                failures = 0;
            }
            Err(error) => {
                let delay = register::backoff(failures);
                failures = failures.saturating_add(1);
                tracing::error!(
                    error = %error,
                    retry_in_ms = delay.as_millis() as u64,
                    "cannot serve the device plugin"
                );
                retry_at = Some(tokio::time::Instant::now() + delay);
            }
        }
    }
}

/// Re-creates the directory watch when a rebuilt node uses other directories.
fn rewatch_dirs(dirs: &mut DirWatch, prepared: &Prepared) {
    let wanted = prepared.watched_dirs();
    let same = dirs.dirs().eq(dedup(&wanted));
    if same {
        return;
    }
    match DirWatch::new(&wanted) {
        Ok(new) => *dirs = new,
        Err((dir, error)) => tracing::error!(
            dir = %dir.display(),
            %error,
            "cannot watch the new socket directory; kubelet restarts will be noticed late"
        ),
    }
}

fn dedup<'a>(dirs: &'a [&'a Path]) -> impl Iterator<Item = &'a Path> {
    dirs.iter()
        .enumerate()
        .filter(|(i, d)| !dirs[..*i].contains(d))
        .map(|(_, d)| *d)
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Aborts a spawned task when dropped, so `serve` returning ends its helpers.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

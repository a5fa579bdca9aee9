//! One serving round: every resource's socket bound and served, and registered with
//! one kubelet. A kubelet restart, a deleted socket or a restart command ends the
//! round; the loop in `mod.rs` then starts a fresh one.

use std::future::pending;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UnixListener;
use tokio::sync::{Notify, watch};
use tokio::task::{JoinError, JoinHandle, JoinSet};
use tokio::time::Instant;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::Server;

use super::authority::AuthorityFixed;
use super::limits::Bounded;
use super::register::register_all;
use super::service::{DevicePluginService, Shared, options};
use super::watch::{FileId, Touched};
use super::{Node, ServerError};
use crate::api::device_plugin_server::DevicePluginServer;
use crate::api::{RegisterRequest, VERSION};
use crate::config::Settings;
use crate::metrics::Metrics;

/// How long stopping waits for open streams and connections to close before it
/// gives up on them.
const DRAIN: Duration = Duration::from_secs(1);
/// How long after registering a kubelet that opens no `ListAndWatch` is worth a
/// warning (kubelet dials back within milliseconds).
const SILENT: Duration = Duration::from_secs(10);

/// A [`Node`] with what every round and every call needs built once.
pub(super) struct Prepared {
    node: Node,
    services: Vec<Arc<Shared>>,
    metrics: Metrics,
    /// Told when any resource's `ListAndWatch` stream opens or closes.
    streams_changed: Arc<Notify>,
}

impl Prepared {
    pub(super) fn new(mut node: Node, metrics: Metrics) -> Self {
        let streams_changed = Arc::new(Notify::new());
        let mut services: Vec<Arc<Shared>> = Vec::with_capacity(node.resources.len());
        // Each resource moves into its service; `node` keeps the shared parts.
        for resource in std::mem::take(&mut node.resources) {
            if resource.devices.is_empty() {
                tracing::info!(resource = %resource.name, "no devices; not advertised");
                continue;
            }
            let endpoint = resource.endpoint();
            if let Some(first) = services
                .iter()
                .find(|s| s.resource().endpoint() == endpoint)
            {
                // Two servers on one socket would unbind each other forever.
                tracing::error!(
                    resource = %resource.name,
                    other = %first.resource().name,
                    %endpoint,
                    "two resources share a socket; only the first is advertised"
                );
                continue;
            }
            services.push(Arc::new(
                Shared::new(
                    node.settings.clone(),
                    resource,
                    node.health.clone(),
                    node.topology.clone(),
                )
                .with_metrics(metrics.clone())
                .with_stream_notify(streams_changed.clone()),
            ));
        }
        if services.is_empty() {
            tracing::warn!("no devices found; serving nothing until restarted");
        }
        Self {
            node,
            services,
            metrics,
            streams_changed,
        }
    }

    /// Resolves when a `ListAndWatch` stream opens or closes.
    pub(super) async fn streams_changed(&self) {
        self.streams_changed.notified().await;
    }

    pub(super) fn settings(&self) -> &Settings {
        &self.node.settings
    }

    fn kubelet(&self) -> Option<&Path> {
        self.node.settings.kubelet_socket.as_deref()
    }

    /// Our socket directory and kubelet's.
    pub(super) fn watched_dirs(&self) -> Vec<&Path> {
        let mut dirs = vec![self.node.settings.socket_dir.as_path()];
        if let Some(kubelet) = self.kubelet() {
            dirs.push(match kubelet.parent() {
                Some(dir) if !dir.as_os_str().is_empty() => dir,
                _ => Path::new("."),
            });
        }
        dirs
    }
}

/// What the loop should do after looking at the sockets.
pub(super) enum Verdict {
    Steady,
    Restart(String),
}

/// Something a running round reports by itself.
pub(super) enum RoundEvent {
    /// The registration task ended: the kubelet identity registered against.
    Registered(Result<Option<FileId>, JoinError>),
    /// A server ended although it was not asked to stop.
    ServerEnded(String),
}

pub(super) struct Round {
    stop: watch::Sender<bool>,
    servers: JoinSet<(String, Result<(), tonic::transport::Error>)>,
    /// Our sockets as bound.
    sockets: Vec<(PathBuf, FileId)>,
    /// Registration in progress.
    registration: Option<JoinHandle<Option<FileId>>>,
    /// Wakes a registration waiting out its backoff.
    kick: Arc<Notify>,
    registered: Registered,
    /// Whether [`Round::warn_if_silent`] has warned.
    warned_silent: bool,
}

/// Where registration stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Registered {
    /// No kubelet socket configured, or nothing to register.
    NotNeeded,
    Pending,
    /// Registered, with the identity `kubelet.sock` had just before, at this time.
    With(Option<FileId>, Instant),
}

impl Round {
    /// Binds and serves every resource, then starts registering them. On failure
    /// nothing is left served or bound.
    pub(super) fn start(prepared: &Prepared) -> Result<Self, ServerError> {
        let (stop, _) = watch::channel(false);
        let mut round = Self {
            stop,
            servers: JoinSet::new(),
            sockets: Vec::with_capacity(prepared.services.len()),
            registration: None,
            kick: Arc::new(Notify::new()),
            registered: Registered::NotNeeded,
            warned_silent: false,
        };
        for shared in &prepared.services {
            if let Err(error) = round.serve_one(prepared, shared) {
                round.abandon();
                return Err(error);
            }
        }
        round.register(prepared);
        Ok(round)
    }

    /// Binds one resource's socket and spawns its server.
    fn serve_one(&mut self, prepared: &Prepared, shared: &Arc<Shared>) -> Result<(), ServerError> {
        let path = prepared
            .settings()
            .socket_dir
            .join(shared.resource().endpoint());
        remove_stale(&path)?;
        let bind_error = |source| ServerError::Bind {
            path: path.clone(),
            source,
        };
        let listener = UnixListener::bind(&path).map_err(bind_error)?;
        let id =
            FileId::of(&path).ok_or_else(|| bind_error(std::io::ErrorKind::NotFound.into()))?;
        tracing::info!(
            resource = %shared.resource().name,
            socket = %path.display(),
            devices = shared.resource().devices.len(),
            "serving"
        );
        self.sockets.push((path, id));
        let service = DevicePluginService::stopping_with(shared.clone(), self.stop.subscribe());
        let mut until = self.stop.subscribe();
        let name = shared.resource().name.clone();
        let limit = shared.limits().message;
        // Every connection is read through the :authority fix (`http2`), so
        // clients that send the socket path (kubelet < 1.26, grpcio, grpc-java) work.
        let incoming = UnixListenerStream::new(listener).map(|c| c.map(AuthorityFixed::new));
        self.servers.spawn(async move {
            let served = Server::builder()
                // h2 buffers what a client sends up to the flow-control window before
                // we read it (hyper's default: 1 MiB a stream): keep it to one message.
                .initial_stream_window_size(window(limit))
                .initial_connection_window_size(2 * window(limit))
                .add_service(Bounded::new(DevicePluginServer::new(service), limit))
                .serve_with_incoming_shutdown(incoming, async move {
                    // A dropped sender also means stop.
                    let _ = until.wait_for(|stop| *stop).await;
                })
                .await;
            (name, served)
        });
        Ok(())
    }

    /// Starts registering every served resource with kubelet, when there is one.
    fn register(&mut self, prepared: &Prepared) {
        let Some(kubelet) = prepared.kubelet() else {
            return;
        };
        if prepared.services.is_empty() {
            return;
        }
        let requests: Vec<RegisterRequest> = prepared
            .services
            .iter()
            .map(|shared| RegisterRequest {
                version: VERSION.to_string(),
                endpoint: shared.resource().endpoint(),
                resource_name: shared.resource().name.clone(),
                options: Some(options()),
            })
            .collect();
        let kubelet = kubelet.to_path_buf();
        let kick = self.kick.clone();
        let metrics = prepared.metrics.clone();
        self.registration = Some(tokio::spawn(async move {
            register_all(&kubelet, &requests, kick, &metrics).await
        }));
        self.registered = Registered::Pending;
    }

    /// Undoes a partial start: stops the servers and removes the sockets bound.
    fn abandon(&mut self) {
        let _ = self.stop.send(true);
        self.servers.abort_all();
        self.remove_sockets();
    }

    /// Removes our sockets, only those that are still ours.
    fn remove_sockets(&self) {
        for (path, id) in &self.sockets {
            if FileId::of(path) == Some(*id)
                && let Err(error) = std::fs::remove_file(path)
            {
                tracing::warn!(socket = %path.display(), %error, "cannot remove our socket");
            }
        }
    }

    /// Records the end of the registration task.
    pub(super) fn registration_finished(&mut self, result: Result<Option<FileId>, JoinError>) {
        match result {
            Ok(kubelet) => self.registered = Registered::With(kubelet, Instant::now()),
            Err(error) => tracing::error!(%error, "registration task failed"),
        }
    }

    /// Compares the sockets on disk with what this round bound and registered with.
    pub(super) fn check(&mut self, prepared: &Prepared, touched: Option<&Touched>) -> Verdict {
        for (path, id) in &self.sockets {
            if FileId::of(path) != Some(*id) {
                return Verdict::Restart(format!("our socket {} was removed", path.display()));
            }
        }
        let Some(kubelet) = prepared.kubelet() else {
            return Verdict::Steady;
        };
        let now = FileId::of(kubelet);
        match self.registered {
            Registered::NotNeeded => Verdict::Steady,
            Registered::With(with, _) => {
                let created = touched
                    .zip(kubelet.file_name())
                    .is_some_and(|(t, name)| t.has_created(name));
                if now.is_some() && (now != with || created) {
                    Verdict::Restart(format!(
                        "{} was re-created: kubelet restarted",
                        kubelet.display()
                    ))
                } else {
                    // Gone (kubelet stopped) shows in readiness; its return restarts us.
                    Verdict::Steady
                }
            }
            Registered::Pending => {
                if now.is_some() {
                    // Registration is waiting out a backoff: try now.
                    self.kick.notify_one();
                }
                Verdict::Steady
            }
        }
    }

    /// Why the round is not ready, or `None` when it is: every socket is ours and,
    /// with a kubelet socket, registered with the kubelet that is there now, which
    /// streams `ListAndWatch` from every resource.
    pub(super) fn not_ready(&self, prepared: &Prepared) -> Option<String> {
        if let Some((path, _)) = self
            .sockets
            .iter()
            .find(|(path, id)| FileId::of(path) != Some(*id))
        {
            return Some(format!("our socket {} is gone", path.display()));
        }
        let kubelet = prepared.kubelet()?;
        match self.registered {
            Registered::NotNeeded => None,
            Registered::Pending => Some("not registered with kubelet yet".to_string()),
            Registered::With(with, _) => {
                if with.is_none() || FileId::of(kubelet) != with {
                    return Some(format!(
                        "the kubelet registered with is gone ({} changed)",
                        kubelet.display()
                    ));
                }
                // Registered is not enough: a kubelet that then fails every stream
                // shows 0 GPUs for the node.
                let silent: Vec<&str> = prepared
                    .services
                    .iter()
                    .filter(|s| s.streams() == 0)
                    .map(|s| s.resource().name.as_str())
                    .collect();
                (!silent.is_empty()).then(|| {
                    format!(
                        "registered, but kubelet has no ListAndWatch stream open for {}",
                        silent.join(", ")
                    )
                })
            }
        }
    }

    /// Once per round: a warning when kubelet accepted the registration [`SILENT`]
    /// ago or more but still streams nothing (the node then shows 0 devices).
    pub(super) fn warn_if_silent(&mut self, prepared: &Prepared) {
        let Registered::With(_, at) = self.registered else {
            return;
        };
        if self.warned_silent || at.elapsed() < SILENT {
            return;
        }
        if let Some(why) = self.not_ready(prepared) {
            self.warned_silent = true;
            tracing::warn!(
                reason = %why,
                seconds = at.elapsed().as_secs(),
                "kubelet accepted our registration but does not use us: the node advertises none \
                 of these devices (see kubelet's log for the device plugin)"
            );
        }
    }

    /// Stops serving: ends open `ListAndWatch` streams, waits briefly for connections
    /// to close, and removes our sockets (only those still ours).
    pub(super) async fn stop(mut self) {
        if let Some(registration) = self.registration.take() {
            registration.abort();
        }
        let _ = self.stop.send(true);
        let drained = tokio::time::timeout(DRAIN, async {
            while let Some(ended) = self.servers.join_next().await {
                if let Ok((name, Err(error))) = ended {
                    tracing::warn!(resource = %name, %error, "server ended with an error");
                }
            }
        })
        .await;
        if drained.is_err() {
            tracing::warn!("connections still open after {DRAIN:?}; dropping them");
            self.servers.abort_all();
        }
        self.remove_sockets();
    }
}

/// The next thing a running round reports; never resolves without a round.
pub(super) async fn next_event(round: &mut Option<Round>) -> RoundEvent {
    let Some(Round {
        servers,
        registration,
        ..
    }) = round.as_mut()
    else {
        return pending().await;
    };
    tokio::select! {
        result = async {
            match registration.as_mut() {
                Some(handle) => handle.await,
                None => pending().await,
            }
        } => {
            *registration = None;
            RoundEvent::Registered(result)
        }
        Some(ended) = servers.join_next() => RoundEvent::ServerEnded(match ended {
            Ok((name, Ok(()))) => format!("the server for {name} ended"),
            Ok((name, Err(error))) => format!("the server for {name} failed: {error}"),
            Err(error) => format!("a server task failed: {error}"),
        }),
        else => pending().await,
    }
}

/// The HTTP/2 flow-control window for a message limit: the message and its gRPC
/// prefix. (A connection's window can only grow past HTTP/2's 65,535 bytes.)
fn window(limit: usize) -> u32 {
    u32::try_from(limit + 5).unwrap_or(u32::MAX)
}

/// Removes what is left at our socket path from an earlier run. Like NVIDIA's
/// plugin, whatever is there goes; a directory there is an error.
fn remove_stale(path: &Path) -> Result<(), ServerError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(ServerError::Stale {
            path: path.to_path_buf(),
            source: e,
        }),
        _ => Ok(()),
    }
}

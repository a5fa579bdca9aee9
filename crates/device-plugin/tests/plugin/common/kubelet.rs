//! A fake kubelet for device-plugin tests: it serves `v1beta1.Registration` on
//! `<dir>/kubelet.sock`, records every `RegisterRequest` with the time it came, and
//! dials a plugin's endpoint in the same directory the way kubelet does (HTTP/2
//! authority `localhost`). Like kubelet, it opens a `ListAndWatch` stream on each
//! plugin that registers and keeps it open until it stops (`without_streams` turns
//! that off, for a kubelet that registers plugins but never uses them). Restarting it
//! deletes and re-creates `kubelet.sock`, which is what a real kubelet restart looks
//! like to a plugin.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nvshim_device_plugin::api::device_plugin_client::DevicePluginClient;
use nvshim_device_plugin::api::registration_server::{Registration, RegistrationServer};
use nvshim_device_plugin::api::{Empty, RegisterRequest, VERSION};
use tokio::net::UnixListener;
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server, Uri};
use tonic::{Request, Response, Status};

/// One `Register` call as the fake kubelet received it.
#[derive(Debug, Clone)]
pub struct Registered {
    pub request: RegisterRequest,
    pub at: Instant,
}

#[derive(Debug)]
struct Log {
    registered: Mutex<Vec<Registered>>,
    count: watch::Sender<usize>,
    /// How many coming `Register` calls to refuse.
    refuse: Mutex<usize>,
    /// Where plugin endpoints are, and whether to stream `ListAndWatch` from them.
    dir: PathBuf,
    streams: Mutex<Option<Vec<JoinHandle<()>>>>,
}

#[derive(Clone)]
struct Service(Arc<Log>);

#[tonic::async_trait]
impl Registration for Service {
    async fn register(&self, request: Request<RegisterRequest>) -> Result<Response<Empty>, Status> {
        let request = request.into_inner();
        {
            let mut refuse = self.0.refuse.lock().unwrap();
            if *refuse > 0 {
                *refuse -= 1;
                return Err(Status::unavailable(
                    "fake kubelet refuses this registration",
                ));
            }
        }
        // What kubelet checks before it accepts a plugin.
        if request.version != VERSION {
            return Err(Status::invalid_argument(format!(
                "unsupported device plugin API version {:?}",
                request.version
            )));
        }
        if request.endpoint.contains('/') {
            return Err(Status::invalid_argument(format!(
                "endpoint {:?} is not a file name",
                request.endpoint
            )));
        }
        if let Some(streams) = self.0.streams.lock().unwrap().as_mut() {
            // Kubelet dials back right after accepting the registration.
            let socket = self.0.dir.join(&request.endpoint);
            streams.push(tokio::spawn(async move {
                let Ok(endpoint) = Endpoint::from_shared(format!("unix:{}", socket.display()))
                else {
                    return;
                };
                let origin = endpoint.origin(Uri::from_static("http://localhost"));
                let Ok(channel) = origin.connect().await else {
                    return;
                };
                let mut client = DevicePluginClient::new(channel);
                if let Ok(stream) = client.list_and_watch(Empty {}).await {
                    let mut stream = stream.into_inner();
                    while let Ok(Some(_)) = stream.message().await {}
                }
            }));
        }
        self.0.registered.lock().unwrap().push(Registered {
            request,
            at: Instant::now(),
        });
        self.0.count.send_modify(|n| *n += 1);
        Ok(Response::new(Empty {}))
    }
}

/// The fake kubelet. Drop stops it (its socket stays until the tempdir goes).
pub struct FakeKubelet {
    dir: PathBuf,
    log: Arc<Log>,
    server: Option<(oneshot::Sender<()>, JoinHandle<()>)>,
}

impl FakeKubelet {
    /// The socket file name kubelet listens on.
    pub const SOCKET: &'static str = "kubelet.sock";

    /// Starts serving on `<dir>/kubelet.sock`; `dir` must exist. Call inside a runtime.
    pub fn start(dir: &Path) -> Self {
        Self::start_with(dir, true)
    }

    /// Like [`FakeKubelet::start`], but opens no `ListAndWatch` stream on the plugins
    /// that register.
    pub fn without_streams(dir: &Path) -> Self {
        Self::start_with(dir, false)
    }

    fn start_with(dir: &Path, streams: bool) -> Self {
        let (count, _) = watch::channel(0);
        let mut kubelet = Self {
            dir: dir.to_path_buf(),
            log: Arc::new(Log {
                registered: Mutex::new(Vec::new()),
                count,
                refuse: Mutex::new(0),
                dir: dir.to_path_buf(),
                streams: Mutex::new(streams.then(Vec::new)),
            }),
            server: None,
        };
        kubelet.listen();
        kubelet
    }

    /// Ends the `ListAndWatch` streams opened so far, as a kubelet going away does.
    pub fn drop_streams(&self) {
        if let Some(streams) = self.log.streams.lock().unwrap().as_mut() {
            for stream in streams.drain(..) {
                stream.abort();
            }
        }
    }

    fn listen(&mut self) {
        let socket = self.socket();
        let _ = std::fs::remove_file(&socket);
        let listener = UnixListener::bind(&socket).expect("bind kubelet.sock");
        let (stop, stopped) = oneshot::channel::<()>();
        let service = RegistrationServer::new(Service(self.log.clone()));
        let task = tokio::spawn(async move {
            Server::builder()
                .add_service(service)
                .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                    let _ = stopped.await;
                })
                .await
                .expect("fake kubelet server");
        });
        self.server = Some((stop, task));
    }

    /// `<dir>/kubelet.sock`.
    pub fn socket(&self) -> PathBuf {
        self.dir.join(Self::SOCKET)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops serving and deletes `kubelet.sock`, like a kubelet that went down.
    pub async fn stop(&mut self) {
        self.drop_streams();
        if let Some((stop, task)) = self.server.take() {
            let _ = stop.send(());
            if tokio::time::timeout(Duration::from_secs(2), task)
                .await
                .is_err()
            {
                panic!("fake kubelet did not stop within 2 s");
            }
        }
        let _ = std::fs::remove_file(self.socket());
    }

    /// Stops, deletes `kubelet.sock` and serves on a new one: a kubelet restart.
    /// Registrations recorded so far are kept.
    pub async fn restart(&mut self) {
        self.stop().await;
        self.listen();
    }

    /// Refuses the next `n` `Register` calls with `UNAVAILABLE`.
    pub fn refuse_next(&self, n: usize) {
        *self.log.refuse.lock().unwrap() = n;
    }

    /// Every registration so far, in arrival order.
    pub fn registrations(&self) -> Vec<Registered> {
        self.log.registered.lock().unwrap().clone()
    }

    /// Waits until `n` registrations in all have arrived, at most `within`, and
    /// returns them all; panics naming what did arrive on timeout.
    pub async fn wait_registrations(&self, n: usize, within: Duration) -> Vec<Registered> {
        let mut count = self.log.count.subscribe();
        let waited = tokio::time::timeout(within, count.wait_for(|c| *c >= n)).await;
        let all = self.registrations();
        assert!(
            matches!(waited, Ok(Ok(_))),
            "expected {n} registrations within {within:?}, got {}: {:?}",
            all.len(),
            all.iter()
                .map(|r| &r.request.resource_name)
                .collect::<Vec<_>>()
        );
        all
    }

    /// A `DevicePlugin` client on `<dir>/<endpoint>`, as kubelet dials it back.
    pub async fn dial(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        dial_plugin(&self.dir.join(endpoint)).await
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.drop_streams();
    }
}

/// A `DevicePlugin` client on a socket path, with authority `localhost` as kubelet
/// sends it.
pub async fn dial_plugin(socket: &Path) -> DevicePluginClient<Channel> {
    let channel = Endpoint::from_shared(format!("unix:{}", socket.display()))
        .expect("endpoint")
        .origin(Uri::from_static("http://localhost"))
        .connect()
        .await
        .unwrap_or_else(|e| panic!("dial {}: {e}", socket.display()));
    DevicePluginClient::new(channel)
}

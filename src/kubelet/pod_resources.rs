// SPDX-License-Identifier: Apache-2.0
//! A blocking client for kubelet's pod-resources API (v1), `List` only: which pod,
//! namespace and container holds which device of which resource. dcgm-exporter reads
//! the same socket for its `pod`/`namespace`/`container` labels; so does our exporter.
//!
//! One call is one Unix-socket connection: HTTP/2 with prior knowledge ([`http2`]), the
//! empty `ListPodResourcesRequest`, the response decoded by hand ([`wire`]). No async
//! stack, no code generation: the core library links neither. Bounded in time (one
//! deadline for connect and call) and in memory (16 MiB message, 64 KiB header block,
//! a frame budget).

pub mod http2;
pub mod wire;

use std::io::{self, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use http2::Http2Error;
pub use wire::WireError;

/// Where kubelet serves the pod-resources API (and where dcgm-exporter looks).
pub const DEFAULT_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// The gRPC method: `v1.PodResourcesLister/List`.
pub const LIST_PATH: &str = "/v1.PodResourcesLister/List";

/// The devices of one resource held by one container.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ContainerDevices {
    pub pod: String,
    pub namespace: String,
    pub container: String,
    /// The extended resource, e.g. `nvidia.com/gpu`.
    pub resource: String,
    /// The ids the device plugin advertised (UUIDs, or `UUID::n` replicas when shared).
    pub device_ids: Vec<String>,
}

/// A `List` call that failed, with the socket it was made on.
#[derive(Debug, thiserror::Error)]
#[error("pod-resources List on {}: {problem}", socket.display())]
pub struct PodResourcesError {
    pub socket: PathBuf,
    pub problem: Problem,
}

/// What went wrong in a `List` call.
#[derive(Debug, thiserror::Error)]
pub enum Problem {
    #[error("cannot connect (is kubelet running, and the socket mounted?): {0}")]
    Connect(#[source] io::Error),
    #[error("no complete answer within {0:?}")]
    Deadline(Duration),
    #[error("connection failed: {0}")]
    Io(#[source] io::Error),
    #[error("connection closed before the response ended")]
    Closed,
    #[error(transparent)]
    Http2(#[from] Http2Error),
    #[error("response does not decode: {0}")]
    Wire(#[from] WireError),
}

/// Calls `List` on the kubelet socket at `socket`, connect and call within `timeout`,
/// and returns one entry per (container, resource) with devices.
pub fn list(socket: &Path, timeout: Duration) -> Result<Vec<ContainerDevices>, PodResourcesError> {
    call(socket, timeout)
        .and_then(|message| Ok(wire::decode_list_response(&message)?))
        .map_err(|problem| PodResourcesError {
            socket: socket.to_path_buf(),
            problem,
        })
}

/// One unary call of `List`: the response message's bytes.
fn call(socket: &Path, timeout: Duration) -> Result<Vec<u8>, Problem> {
    let deadline = Instant::now() + timeout;
    // A Unix connect does not wait on a network: it succeeds, or fails at once when
    // nobody listens (or the backlog is full).
    let mut stream = UnixStream::connect(socket).map_err(Problem::Connect)?;
    let left = |now: Instant| {
        let left = deadline.saturating_duration_since(now);
        if left.is_zero() {
            Err(Problem::Deadline(timeout))
        } else {
            Ok(left)
        }
    };
    stream
        .set_write_timeout(Some(left(Instant::now())?))
        .map_err(Problem::Io)?;
    stream
        .write_all(&http2::request(LIST_PATH, "localhost", timeout))
        .map_err(|e| timed_out(e, timeout))?;
    let mut reader = http2::ResponseReader::default();
    let mut chunk = vec![0u8; 64 * 1024];
    let mut replies = Vec::new();
    loop {
        stream
            .set_read_timeout(Some(left(Instant::now())?))
            .map_err(Problem::Io)?;
        let n = match stream.read(&mut chunk) {
            Ok(0) => {
                return Err(reader
                    .closed_early()
                    .map_or(Problem::Closed, Problem::Http2));
            }
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(timed_out(e, timeout)),
        };
        let done = reader.feed(&chunk[..n], &mut replies)?;
        if let Some(message) = done {
            // Tell the server we are done; it may already have closed, which is fine.
            let _ = stream.write_all(&http2::goaway());
            return Ok(message);
        }
        if !replies.is_empty() {
            stream
                .set_write_timeout(Some(left(Instant::now())?))
                .map_err(Problem::Io)?;
            stream
                .write_all(&replies)
                .map_err(|e| timed_out(e, timeout))?;
            replies.clear();
        }
    }
}

fn timed_out(error: io::Error, timeout: Duration) -> Problem {
    match error.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => Problem::Deadline(timeout),
        _ => Problem::Io(error),
    }
}

#[cfg(test)]
#[path = "pod_resources/tests.rs"]
mod tests;

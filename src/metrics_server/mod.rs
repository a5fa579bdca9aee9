// SPDX-License-Identifier: Apache-2.0
//! A small HTTP/1.1 server for Prometheus scrapes, on std threads: `GET`/`HEAD
//! /metrics` answers with what the handler renders, `GET /health` with 200, every
//! other path 404, other methods 405, a malformed request 400. For `nvshim exporter`,
//! which links no async stack (nor does the core library).
//!
//! Bounded everywhere: the request head (8 KiB), read and write timeouts, requests per
//! kept-alive connection, and connections at once (one thread each; over the limit a
//! client gets 503 at once). It renders nothing itself and knows nothing of GPUs.

pub mod address;
pub mod request;

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

pub use address::{AddressError, ListenAddress, bind};
pub use request::{MAX_HEAD, RequestError, RequestHead};

/// Prometheus' text exposition format, as Prometheus' own exporters label it.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Renders one scrape: the body, or why there is none (served as a 500).
pub type Handler = Arc<dyn Fn() -> Result<String, String> + Send + Sync>;

/// The server's bounds; [`Default`] is what [`serve`] uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; one more is answered 503 and closed.
    pub connections: usize,
    /// How long one read or write may wait (an idle kept-alive connection closes then).
    pub io_timeout: Duration,
    /// Requests on one connection before the server closes it.
    pub requests_per_connection: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            connections: 16,
            io_timeout: Duration::from_secs(10),
            requests_per_connection: 100,
        }
    }
}

/// Serves `listener` until `stop` is readable, with the default [`Limits`].
///
/// `handler` renders `/metrics` (called once per `GET` or `HEAD`, on the connection's
/// thread: it must be cheap to call concurrently, e.g. read a snapshot), served as
/// `content_type` (usually [`PROMETHEUS_TEXT`]); its `Err` text becomes a 500.
///
/// `stop` ends the accept loop once it can be read or hangs up: a signalfd for SIGTERM
/// and SIGINT (block them before calling, so that the connection threads inherit the
/// mask), or the read end of a [`std::io::pipe`] whose writer is written or dropped.
/// Nothing is read from it. Connections already accepted finish on their own threads,
/// within the I/O timeout; `serve` does not wait for them.
///
/// Errors: only those of the listener itself (poll, accept); a failing connection is
/// logged and dropped.
pub fn serve(
    listener: TcpListener,
    handler: Handler,
    content_type: &'static str,
    stop: impl AsFd,
) -> io::Result<()> {
    serve_with(listener, handler, content_type, stop, Limits::default())
}

/// [`serve`] with other [`Limits`].
pub fn serve_with(
    listener: TcpListener,
    handler: Handler,
    content_type: &'static str,
    stop: impl AsFd,
    limits: Limits,
) -> io::Result<()> {
    listener.set_nonblocking(true)?;
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let mut fds = [
            PollFd::new(listener.as_fd(), PollFlags::POLLIN),
            PollFd::new(stop.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::NONE) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Err(e.into()),
        }
        if fds[1].any().unwrap_or(true) {
            tracing::debug!(fd = stop.as_fd().as_raw_fd(), "metrics server stopping");
            return Ok(());
        }
        let stream = match listener.accept() {
            Ok((stream, _)) => stream,
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock
                    || e.kind() == io::ErrorKind::Interrupted =>
            {
                continue;
            }
            // The client gave up between poll and accept: nothing to do.
            Err(e) if e.raw_os_error() == Some(libc::ECONNABORTED) => continue,
            // Out of descriptors for a moment: the connection stays queued and poll would
            // report it again at once, so back off briefly (as Go's net/http does) rather
            // than spin; neither ends the server.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                tracing::warn!(error = %e, "metrics server: accept failed");
                std::thread::sleep(Duration::from_millis(50));
                continue;
            }
            Err(e) => return Err(e),
        };
        if active.fetch_add(1, Ordering::AcqRel) >= limits.connections {
            active.fetch_sub(1, Ordering::AcqRel);
            refuse_busy(stream);
            continue;
        }
        let (handler, active) = (Arc::clone(&handler), Arc::clone(&active));
        let spawned = std::thread::Builder::new()
            .name("metrics-conn".into())
            .spawn(move || {
                if let Err(e) = connection(stream, &handler, content_type, limits) {
                    tracing::debug!(error = %e, "metrics connection ended");
                }
                active.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "metrics server: cannot start a connection thread");
        }
    }
}

/// Over the connection limit: read what the client has sent already (closing with
/// unread bytes would reset the connection before it reads our answer), answer 503.
fn refuse_busy(mut stream: TcpStream) {
    let wait = Some(Duration::from_millis(100));
    if stream.set_nonblocking(false).is_err()
        || stream.set_read_timeout(wait).is_err()
        || stream.set_write_timeout(wait).is_err()
    {
        return;
    }
    let mut head = [0u8; MAX_HEAD];
    let _ = stream.read(&mut head);
    let _ = stream.write_all(&response_bytes(
        503,
        "text/plain; charset=utf-8",
        b"too many connections\n",
        false,
        false,
    ));
}

/// One connection: requests until the client closes, asks to, errs, or the limits end it.
fn connection(
    mut stream: TcpStream,
    handler: &Handler,
    content_type: &'static str,
    limits: Limits,
) -> io::Result<()> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(limits.io_timeout))?;
    stream.set_write_timeout(Some(limits.io_timeout))?;
    stream.set_nodelay(true)?;
    let mut buffer = Vec::with_capacity(1024);
    let mut chunk = [0u8; 4096];
    for served in 1..=limits.requests_per_connection {
        let head = loop {
            match request::parse(&buffer) {
                Ok(Some((head, used))) => {
                    buffer.drain(..used);
                    break head;
                }
                Ok(None) => {}
                Err(e) => {
                    let status = if e == RequestError::TooLarge {
                        431
                    } else {
                        400
                    };
                    let body = format!("{e}\n");
                    stream.write_all(&response_bytes(
                        status,
                        "text/plain; charset=utf-8",
                        body.as_bytes(),
                        false,
                        false,
                    ))?;
                    return Ok(());
                }
            }
            match stream.read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(n) => buffer.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        let keep_alive =
            head.keep_alive && !head.has_body && served < limits.requests_per_connection;
        let (status, kind, body) = route(&head, handler, content_type);
        let head_only = head.method == "HEAD";
        stream.write_all(&response_bytes(
            status,
            kind,
            body.as_bytes(),
            keep_alive,
            head_only,
        ))?;
        if !keep_alive {
            break;
        }
    }
    Ok(())
}

/// Status, content type and body for a request.
fn route(
    head: &RequestHead,
    handler: &Handler,
    content_type: &'static str,
) -> (u16, &'static str, String) {
    const PLAIN: &str = "text/plain; charset=utf-8";
    let known = matches!(head.path.as_str(), "/metrics" | "/health");
    if !known {
        return (
            404,
            PLAIN,
            format!("no such path {:?} (served: /metrics, /health)\n", head.path),
        );
    }
    if head.method != "GET" && head.method != "HEAD" {
        return (
            405,
            PLAIN,
            format!("method {} not allowed (allowed: GET, HEAD)\n", head.method),
        );
    }
    if head.path == "/health" {
        return (200, PLAIN, "OK\n".to_owned());
    }
    match handler() {
        Ok(body) => (200, content_type, body),
        Err(message) => {
            tracing::warn!(error = %message, "metrics handler failed");
            (500, PLAIN, format!("{message}\n"))
        }
    }
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "",
    }
}

/// A whole response; `head_only` leaves the body out (HEAD) but keeps its length.
fn response_bytes(
    status: u16,
    content_type: &str,
    body: &[u8],
    keep_alive: bool,
    head_only: bool,
) -> Vec<u8> {
    let mut out = format!(
        "HTTP/1.1 {status} {}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: {}\r\n",
        reason(status),
        body.len(),
        if keep_alive { "keep-alive" } else { "close" },
    );
    if status == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    if !head_only {
        out.extend_from_slice(body);
    }
    out
}

#[cfg(test)]
mod tests;

//! `/healthz` and `/readyz` for kubelet's HTTP probes, hand-rolled over a TCP
//! listener: the probes need a status line and nothing else, and an HTTP stack would
//! cost more memory than the whole plugin.
//!
//! `/healthz` answers 200 while the serving loop runs (this task runs on the same
//! runtime, so an answer means the loop is being polled). `/readyz` answers 200 when
//! every resource is served and registered, 503 otherwise. NVIDIA's plugin has no
//! probe at all, so a plugin whose socket vanished looks healthy there while the
//! node's capacity drops to 0.

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// How long a client may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// The longest request head we read; the request line is all we look at.
const MAX_HEAD: usize = 1024;

/// Answers probes on `listener` until the task is dropped.
pub(super) async fn serve(listener: TcpListener, ready: watch::Receiver<bool>) {
    loop {
        match listener.accept().await {
            Ok((stream, _)) => {
                let ready = *ready.borrow();
                tokio::spawn(answer(stream, ready));
            }
            Err(error) => {
                // Out of descriptors and the like: wait a little instead of spinning.
                tracing::warn!(%error, "health probe accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn answer(mut stream: TcpStream, ready: bool) {
    let mut head = [0u8; MAX_HEAD];
    let mut len = 0;
    let read = tokio::time::timeout(READ_TIMEOUT, async {
        while len < head.len() && !head[..len].windows(2).any(|w| w == b"\r\n") {
            match stream.read(&mut head[len..]).await {
                Ok(0) | Err(_) => break,
                Ok(n) => len += n,
            }
        }
    })
    .await;
    if read.is_err() {
        return;
    }
    let status = status(&head[..len], ready);
    let reply = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{status}\n",
        status.len() + 1
    );
    // The client may already be gone; there is nobody to tell.
    let _ = stream.write_all(reply.as_bytes()).await;
    let _ = stream.shutdown().await;
}

/// The status line for a request head.
fn status(head: &[u8], ready: bool) -> &'static str {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (parts.next(), parts.next());
    if !matches!(method, Some(b"GET" | b"HEAD")) {
        return "405 Method Not Allowed";
    }
    // Ignore a query string: `/readyz?verbose`.
    let path = target.and_then(|t| t.split(|&b| b == b'?').next());
    match path {
        Some(b"/healthz" | b"/livez") => "200 OK",
        Some(b"/readyz") if ready => "200 OK",
        Some(b"/readyz") => "503 Service Unavailable",
        _ => "404 Not Found",
    }
}

#[cfg(test)]
mod tests {
    use super::status;

    #[test]
    fn routes() {
        let cases: [(&str, &[u8], bool, &str); 8] = [
            ("healthz", b"GET /healthz HTTP/1.1\r\n", false, "200 OK"),
            ("ready", b"GET /readyz HTTP/1.1\r\n", true, "200 OK"),
            (
                "not ready",
                b"GET /readyz HTTP/1.1\r\n",
                false,
                "503 Service Unavailable",
            ),
            ("query", b"GET /readyz?verbose HTTP/1.0\r\n", true, "200 OK"),
            ("head", b"HEAD /healthz HTTP/1.1\r\n", true, "200 OK"),
            (
                "unknown",
                b"GET /metrics HTTP/1.1\r\n",
                true,
                "404 Not Found",
            ),
            (
                "post",
                b"POST /readyz HTTP/1.1\r\n",
                true,
                "405 Method Not Allowed",
            ),
            ("garbage", b"\xff\xfe", true, "405 Method Not Allowed"),
        ];
        for (name, head, ready, want) in cases {
            assert_eq!(status(head, ready), want, "case {name}");
        }
    }
}

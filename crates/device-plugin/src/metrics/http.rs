// SPDX-License-Identifier: Apache-2.0
//! The `/metrics` listener: HTTP/1.1 with keep-alive (Prometheus reuses its connection
//! between scrapes) on hyper, which the plugin already carries for gRPC. `GET` and `HEAD`
//! of `/metrics` answer the exposition; any other path is 404, any other method 405.
//! Runs as a task on the plugin's runtime until it is aborted.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::header::{ALLOW, CONTENT_TYPE};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::Metrics;

/// The path the metrics are served on.
pub const PATH: &str = "/metrics";
/// How long a client may take to send a request's head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);
/// Connections served at once; more wait in the kernel's backlog. Prometheus needs one
/// per scraper, so this only bounds what a misbehaving client can hold.
const MAX_CONNECTIONS: usize = 16;

/// Serves `metrics` on `listener` until the task is dropped.
pub(crate) async fn serve(listener: TcpListener, metrics: Metrics) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(slot) = Arc::clone(&slots).acquire_owned().await else {
            return;
        };
        match listener.accept().await {
            Ok((stream, _)) => {
                let metrics = metrics.clone();
                tokio::spawn(async move {
                    connection(stream, metrics).await;
                    drop(slot);
                });
            }
            Err(error) => {
                // Out of descriptors and the like: wait a little instead of spinning.
                tracing::warn!(%error, "metrics accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

async fn connection(stream: TcpStream, metrics: Metrics) {
    let service = service_fn(move |request| {
        let metrics = metrics.clone();
        async move { Ok::<_, Infallible>(answer(&metrics, &request).await) }
    });
    let served = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_TIMEOUT)
        .serve_connection(TokioIo::new(stream), service)
        .await;
    if let Err(error) = served {
        tracing::debug!(%error, "metrics connection ended with an error");
    }
}

async fn answer(metrics: &Metrics, request: &Request<Incoming>) -> Response<Full<Bytes>> {
    if request.uri().path() != PATH {
        return plain(StatusCode::NOT_FOUND);
    }
    if !matches!(*request.method(), Method::GET | Method::HEAD) {
        let mut response = plain(StatusCode::METHOD_NOT_ALLOWED);
        response
            .headers_mut()
            .insert(ALLOW, hyper::header::HeaderValue::from_static("GET, HEAD"));
        return response;
    }
    match metrics.render().await {
        Ok(text) => {
            let mut response = Response::new(Full::new(Bytes::from(text)));
            response.headers_mut().insert(
                CONTENT_TYPE,
                hyper::header::HeaderValue::from_static(metrics.content_type()),
            );
            response
        }
        Err(error) => {
            tracing::warn!(error = %format!("{error:#}"), "cannot answer a metrics scrape");
            plain(StatusCode::INTERNAL_SERVER_ERROR)
        }
    }
}

/// A status with its reason as a text body.
fn plain(status: StatusCode) -> Response<Full<Bytes>> {
    let text = format!(
        "{} {}\n",
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let mut response = Response::new(Full::new(Bytes::from(text)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::super::CONTENT_TYPE as METRICS_CONTENT_TYPE;
    use super::*;

    async fn get(addr: std::net::SocketAddr, request: &str) -> String {
        let mut stream = TcpStream::connect(addr).await.unwrap();
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut reply = String::new();
        stream.read_to_string(&mut reply).await.unwrap();
        reply
    }

    #[tokio::test(flavor = "current_thread")]
    async fn routes() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(serve(
            listener,
            Metrics::enabled(None, crate::metrics::Names::Nvshim),
        ));
        let close = "Connection: close\r\n\r\n";
        let cases = [
            (
                "metrics",
                format!("GET /metrics HTTP/1.1\r\nHost: x\r\n{close}"),
                "200 OK",
                Some("# EOF"),
            ),
            (
                "query",
                format!("GET /metrics?x=1 HTTP/1.1\r\nHost: x\r\n{close}"),
                "200 OK",
                Some("# EOF"),
            ),
            (
                "head",
                format!("HEAD /metrics HTTP/1.1\r\nHost: x\r\n{close}"),
                "200 OK",
                None,
            ),
            (
                "other path",
                format!("GET / HTTP/1.1\r\nHost: x\r\n{close}"),
                "404 Not Found",
                None,
            ),
            (
                "post",
                format!("POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n{close}"),
                "405 Method Not Allowed",
                None,
            ),
        ];
        for (case, request, status, body) in cases {
            let reply = get(addr, &request).await;
            assert!(
                reply.starts_with(&format!("HTTP/1.1 {status}")),
                "case {case}: {reply}"
            );
            if let Some(body) = body {
                assert!(reply.contains(body), "case {case}: {reply}");
                assert!(reply.contains(METRICS_CONTENT_TYPE), "case {case}: {reply}");
            }
            if case == "head" {
                assert!(!reply.contains("# EOF"), "case {case}: a body: {reply}");
            }
        }
        server.abort();
    }
}

// SPDX-License-Identifier: Apache-2.0
//! A minimal Kubernetes API client for the NodeFeature output: the in-cluster config
//! (`KUBERNETES_SERVICE_HOST`/`_PORT`, the service account's token and CA), one HTTP/1.1
//! request per TLS connection (rustls with ring), JSON in and out. Enough for GET, POST,
//! PUT and DELETE of one object; no watch, no retries (the labeller's loop is the retry).
//!
//! Blocking on purpose: `nvshim` carries no async stack.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
#[cfg(feature = "node-feature-api")]
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "node-feature-api")]
use rustls::pki_types::pem::PemObject;
#[cfg(feature = "node-feature-api")]
use rustls::pki_types::{CertificateDer, ServerName};
#[cfg(feature = "node-feature-api")]
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::Value;

/// Where a pod's service account credentials are mounted.
pub const SERVICE_ACCOUNT_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";
/// Overrides [`SERVICE_ACCOUNT_DIR`] (a credentials directory laid out the same way).
pub const SERVICE_ACCOUNT_DIR_ENV: &str = "NVSHIM_SERVICE_ACCOUNT_DIR";
pub const HOST_ENV: &str = "KUBERNETES_SERVICE_HOST";
pub const PORT_ENV: &str = "KUBERNETES_SERVICE_PORT";
/// How long one request may take, connect to last byte.
const TIMEOUT: Duration = Duration::from_secs(30);
/// The largest response read (a NodeFeature is a few KiB).
const MAX_RESPONSE: u64 = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    #[error(
        "{HOST_ENV} and {PORT_ENV} are not set: the NodeFeature API needs the in-cluster \
         config (run in a pod, or set both)"
    )]
    NotInCluster,
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} holds no PEM certificate usable as a CA", path.display())]
    NoCa { path: PathBuf },
    #[error("{HOST_ENV}={0:?} is not a host name or IP address")]
    Host(String),
    #[error("cannot connect to the API server at {address}: {source}")]
    Connect {
        address: String,
        #[source]
        source: io::Error,
    },
    #[cfg(feature = "node-feature-api")]
    #[error("TLS: {0}")]
    Tls(#[from] rustls::Error),
    /// The static runtime's build leaves the TLS client out (its binaries never reach an
    /// API server); `nvshim` is built with it.
    #[cfg(not(feature = "node-feature-api"))]
    #[error("this build has no TLS client (cargo feature node-feature-api is off)")]
    NoTls,
    #[error("{method} {path}: {source}")]
    Io {
        method: &'static str,
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{method} {path}: malformed response: {reason}")]
    Malformed {
        method: &'static str,
        path: String,
        reason: String,
    },
    #[error("{method} {path}: HTTP {status}: {body}")]
    Status {
        method: &'static str,
        path: String,
        status: u16,
        body: String,
    },
}

/// A Kubernetes API server reached with the pod's service account.
#[derive(Clone)]
pub struct ApiServer {
    host: String,
    port: u16,
    token: String,
    tls: TlsConfig,
    /// The service account's namespace file, when there is one.
    pub namespace: Option<String>,
}

impl std::fmt::Debug for ApiServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the token.
        f.debug_struct("ApiServer")
            .field("host", &self.host)
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

/// A response: its status and JSON body (`Null` when empty).
#[derive(Debug, Clone, PartialEq)]
pub struct Response {
    pub status: u16,
    pub body: Value,
}

impl ApiServer {
    /// The in-cluster config: the service host and port from `env`, the token, CA and
    /// namespace from the service account directory.
    pub fn in_cluster(env: &dyn Fn(&str) -> Option<String>) -> Result<ApiServer, ApiError> {
        let (Some(host), Some(port)) = (
            env(HOST_ENV).filter(|v| !v.is_empty()),
            env(PORT_ENV).filter(|v| !v.is_empty()),
        ) else {
            return Err(ApiError::NotInCluster);
        };
        let port: u16 = port.parse().map_err(|_| ApiError::Connect {
            address: format!("{host}:{port}"),
            source: io::Error::new(io::ErrorKind::InvalidInput, "the port is not a number"),
        })?;
        let dir = env(SERVICE_ACCOUNT_DIR_ENV)
            .filter(|v| !v.is_empty())
            .map_or_else(|| PathBuf::from(SERVICE_ACCOUNT_DIR), PathBuf::from);
        let read = |name: &str| {
            let path = dir.join(name);
            std::fs::read_to_string(&path).map_err(|source| ApiError::Read { path, source })
        };
        let token = read("token")?.trim().to_string();
        let namespace = read("namespace").ok().map(|n| n.trim().to_string());
        let tls = tls_config(&dir.join("ca.crt"))?;
        Ok(ApiServer {
            host,
            port,
            token,
            tls,
            namespace: namespace.filter(|n| !n.is_empty()),
        })
    }

    /// One request; a status outside 2xx other than 404 is an error.
    pub fn request(
        &self,
        method: &'static str,
        path: &str,
        body: Option<&Value>,
    ) -> Result<Response, ApiError> {
        let io_err = |source| ApiError::Io {
            method,
            path: path.to_string(),
            source,
        };
        let host = self.host.trim_start_matches('[').trim_end_matches(']');
        // An IPv6 service address (`fd00::1`) goes in brackets, in the socket address and
        // in `Host`.
        let address = if host.contains(':') {
            format!("[{host}]:{}", self.port)
        } else {
            format!("{host}:{}", self.port)
        };
        let tcp = connect(&address)?;
        let mut stream = tls_stream(&self.tls, &self.host, host, tcp)?;

        let payload = body.map(Value::to_string).unwrap_or_default();
        let mut request = format!(
            "{method} {path} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: nvshim/{}\r\n\
             Authorization: Bearer {}\r\nAccept: application/json\r\nConnection: close\r\n",
            env!("CARGO_PKG_VERSION"),
            self.token
        );
        if body.is_some() {
            request.push_str("Content-Type: application/json\r\n");
        }
        request.push_str(&format!("Content-Length: {}\r\n\r\n", payload.len()));
        request.push_str(&payload);
        stream.write_all(request.as_bytes()).map_err(io_err)?;
        stream.flush().map_err(io_err)?;

        let mut raw = Vec::new();
        match Read::by_ref(&mut stream)
            .take(MAX_RESPONSE)
            .read_to_end(&mut raw)
        {
            Ok(_) => {}
            // A server that closes without TLS close_notify: what it sent is checked
            // for completeness below.
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => {}
            Err(e) => return Err(io_err(e)),
        }
        let malformed = |reason: String| ApiError::Malformed {
            method,
            path: path.to_string(),
            reason,
        };
        let (status, body) = parse_response(&raw).map_err(malformed)?;
        let text = String::from_utf8_lossy(&body).into_owned();
        if !(200..300).contains(&status) && status != 404 {
            return Err(ApiError::Status {
                method,
                path: path.to_string(),
                status,
                body: text.chars().take(500).collect(),
            });
        }
        let body = if text.trim().is_empty() {
            Value::Null
        } else {
            serde_json::from_str(&text).map_err(|e| malformed(format!("body is not JSON: {e}")))?
        };
        Ok(Response { status, body })
    }
}

fn connect(address: &str) -> Result<TcpStream, ApiError> {
    let err = |source| ApiError::Connect {
        address: address.to_string(),
        source,
    };
    let tcp = TcpStream::connect(address).map_err(err)?;
    tcp.set_read_timeout(Some(TIMEOUT)).map_err(err)?;
    tcp.set_write_timeout(Some(TIMEOUT)).map_err(err)?;
    Ok(tcp)
}

#[cfg(feature = "node-feature-api")]
type TlsConfig = Arc<ClientConfig>;
/// Stands for the TLS settings in a build without a TLS client (none is ever made).
#[cfg(not(feature = "node-feature-api"))]
#[derive(Clone)]
struct TlsConfig;

/// A TLS client session to `host` (as the service variable spelt it: `shown`) over `tcp`.
#[cfg(feature = "node-feature-api")]
fn tls_stream(
    tls: &TlsConfig,
    shown: &str,
    host: &str,
    tcp: TcpStream,
) -> Result<StreamOwned<ClientConnection, TcpStream>, ApiError> {
    let name =
        ServerName::try_from(host.to_string()).map_err(|_| ApiError::Host(shown.to_string()))?;
    let connection = ClientConnection::new(Arc::clone(tls), name)?;
    Ok(StreamOwned::new(connection, tcp))
}

#[cfg(not(feature = "node-feature-api"))]
fn tls_stream(_: &TlsConfig, _: &str, _: &str, _: TcpStream) -> Result<TcpStream, ApiError> {
    Err(ApiError::NoTls)
}

#[cfg(not(feature = "node-feature-api"))]
fn tls_config(_: &Path) -> Result<TlsConfig, ApiError> {
    Err(ApiError::NoTls)
}

/// TLS trusting exactly the certificates in `ca` (the cluster's CA bundle).
#[cfg(feature = "node-feature-api")]
fn tls_config(ca: &Path) -> Result<TlsConfig, ApiError> {
    let pem = std::fs::read(ca).map_err(|source| ApiError::Read {
        path: ca.to_path_buf(),
        source,
    })?;
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&pem).flatten() {
        // A bundle may hold certificates webpki cannot use; the others still count.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(ApiError::NoCa {
            path: ca.to_path_buf(),
        });
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// Status and body of an HTTP/1.1 response read to the end: `Content-Length`, chunked, or
/// up to the close.
pub fn parse_response(raw: &[u8]) -> Result<(u16, Vec<u8>), String> {
    let end = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or("no end of headers")?;
    let head = std::str::from_utf8(&raw[..end]).map_err(|_| "headers are not UTF-8")?;
    let rest = &raw[end + 4..];
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .filter(|_| status_line.starts_with("HTTP/1."))
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let mut length = None;
    let mut chunked = false;
    for line in lines {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        if name.eq_ignore_ascii_case("content-length") {
            length = Some(
                value
                    .parse::<usize>()
                    .map_err(|_| format!("bad Content-Length {value:?}"))?,
            );
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            chunked = value.to_ascii_lowercase().contains("chunked");
        }
    }
    if chunked {
        return dechunk(rest).map(|body| (status, body));
    }
    match length {
        Some(n) if rest.len() < n => Err(format!("body cut short: {} of {n} bytes", rest.len())),
        Some(n) => Ok((status, rest[..n].to_vec())),
        None => Ok((status, rest.to_vec())),
    }
}

fn dechunk(mut rest: &[u8]) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        let line_end = rest
            .windows(2)
            .position(|w| w == b"\r\n")
            .ok_or("chunk size line cut short")?;
        let line = std::str::from_utf8(&rest[..line_end]).map_err(|_| "bad chunk size")?;
        let size_text = line.split(';').next().unwrap_or_default().trim();
        let size = usize::from_str_radix(size_text, 16)
            .map_err(|_| format!("bad chunk size {size_text:?}"))?;
        rest = &rest[line_end + 2..];
        if size == 0 {
            return Ok(body);
        }
        let chunk = rest.get(..size).ok_or("chunk cut short")?;
        body.extend_from_slice(chunk);
        rest = rest.get(size + 2..).ok_or("chunk cut short")?;
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn responses_parse_by_length_chunks_or_close() {
        type Case<'a> = (&'a str, &'a [u8], Result<(u16, &'a [u8]), &'a str>);
        let cases: [Case; 6] = [
            (
                "length",
                b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}junk",
                Ok((200, b"{}")),
            ),
            (
                "chunked",
                b"HTTP/1.1 201 Created\r\nTransfer-Encoding: chunked\r\n\r\n2\r\n{\"\r\n3;x=y\r\na\":\r\n1\r\n1\r\n0\r\n\r\n",
                Ok((201, b"{\"a\":1")),
            ),
            (
                "to close",
                b"HTTP/1.0 404 Not Found\r\n\r\nnope",
                Ok((404, b"nope")),
            ),
            (
                "short",
                b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\n{}",
                Err("body cut short"),
            ),
            ("no headers end", b"HTTP/1.1 200 OK\r\n", Err("no end of headers")),
            ("not http", b"SSH-2.0\r\n\r\n", Err("bad status line")),
        ];
        for (case, raw, want) in cases {
            match (parse_response(raw), want) {
                (Ok((status, body)), Ok((want_status, want_body))) => {
                    assert_eq!(
                        (status, body.as_slice()),
                        (want_status, want_body),
                        "{case}"
                    );
                }
                (Err(e), Err(needle)) => assert!(e.contains(needle), "{case}: {e}"),
                (got, _) => panic!("{case}: {got:?}"),
            }
        }
    }

    #[test]
    fn the_in_cluster_config_names_what_is_missing() {
        let none = |_: &str| None;
        let error = ApiServer::in_cluster(&none).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains(HOST_ENV)));
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let sa = dir.path().display().to_string();
        let env = move |name: &str| match name {
            HOST_ENV => Some("127.0.0.1".to_string()),
            PORT_ENV => Some("6443".to_string()),
            SERVICE_ACCOUNT_DIR_ENV => Some(sa.clone()),
            _ => None,
        };
        let error = ApiServer::in_cluster(&env).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("token")), "no token");
        std::fs::write(dir.path().join("token"), "t\n").unwrap_or_else(|e| panic!("{e}"));
        std::fs::write(dir.path().join("ca.crt"), "not pem").unwrap_or_else(|e| panic!("{e}"));
        let error = ApiServer::in_cluster(&env).err().map(|e| e.to_string());
        assert!(error.is_some_and(|e| e.contains("ca.crt")), "bad CA");
    }

    proptest! {
        #[test]
        fn any_response_bytes_parse_or_fail_cleanly(raw in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_response(&raw);
        }
    }
}

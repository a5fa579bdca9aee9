// SPDX-License-Identifier: Apache-2.0
//! The HTTP/1.1 request head (RFC 9112, 3 and 5), parsed from bytes: method, path, the
//! few headers that decide how the connection goes on. Sans-IO and total: any input
//! gives a head, "need more bytes" or an error, never a panic (a property test holds
//! it to that).

/// The longest request head we read.
pub const MAX_HEAD: usize = 8 * 1024;

/// What the server needs from a request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    pub method: String,
    /// The path without the query, `/metrics` also when the target was absolute-form.
    pub path: String,
    /// The client wants the connection kept (HTTP/1.1 unless `Connection: close`;
    /// HTTP/1.0 only with `Connection: keep-alive`).
    pub keep_alive: bool,
    /// The request announces a body (`Content-Length` above 0 or `Transfer-Encoding`),
    /// which we do not read: the connection closes after the answer.
    pub has_body: bool,
}

/// Why a request head is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request head longer than {MAX_HEAD} bytes")]
    TooLarge,
    #[error("malformed request line {0:?} (expected METHOD TARGET HTTP/1.x)")]
    RequestLine(String),
    #[error("unsupported HTTP version {0:?} (valid: HTTP/1.0, HTTP/1.1)")]
    Version(String),
    #[error("malformed header line {0:?}")]
    Header(String),
    #[error("request head is not UTF-8")]
    NotUtf8,
}

/// Parses the head at the start of `buffer`: `Ok(None)` when it is not complete yet,
/// else the head and how many bytes it took.
pub fn parse(buffer: &[u8]) -> Result<Option<(RequestHead, usize)>, RequestError> {
    let Some(end) = buffer.windows(4).position(|w| w == b"\r\n\r\n") else {
        return if buffer.len() > MAX_HEAD {
            Err(RequestError::TooLarge)
        } else {
            Ok(None)
        };
    };
    if end + 4 > MAX_HEAD {
        return Err(RequestError::TooLarge);
    }
    let text = std::str::from_utf8(&buffer[..end]).map_err(|_| RequestError::NotUtf8)?;
    // A server should ignore empty lines before the request line (RFC 9112, 2.2).
    let text = text.trim_start_matches("\r\n");
    let mut lines = text.split("\r\n");
    let line = lines.next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Err(RequestError::RequestLine(line.to_owned()));
    };
    if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) || target.is_empty() {
        return Err(RequestError::RequestLine(line.to_owned()));
    }
    let http10 = match version {
        "HTTP/1.1" => false,
        "HTTP/1.0" => true,
        other => return Err(RequestError::Version(other.to_owned())),
    };
    let path = path_of(target).ok_or_else(|| RequestError::RequestLine(line.to_owned()))?;
    let mut keep_alive = !http10;
    let mut has_body = false;
    for header in lines {
        let (name, value) = header
            .split_once(':')
            .filter(|(name, _)| !name.is_empty() && !name.contains([' ', '\t']))
            .ok_or_else(|| RequestError::Header(header.to_owned()))?;
        let value = value.trim_matches([' ', '\t']);
        if name.eq_ignore_ascii_case("connection") {
            for token in value.split(',').map(str::trim) {
                if token.eq_ignore_ascii_case("close") {
                    keep_alive = false;
                } else if token.eq_ignore_ascii_case("keep-alive") {
                    keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case("transfer-encoding") {
            has_body = true;
        } else if name.eq_ignore_ascii_case("content-length") {
            match value.parse::<u64>() {
                Ok(0) => {}
                Ok(_) => has_body = true,
                Err(_) => return Err(RequestError::Header(header.to_owned())),
            }
        }
    }
    let head = RequestHead {
        method: method.to_owned(),
        path: path.to_owned(),
        keep_alive,
        has_body,
    };
    Ok(Some((head, end + 4)))
}

/// The path of an origin-form (`/metrics?x`) or absolute-form (`http://h/metrics`)
/// target; `*` (OPTIONS) is its own path.
fn path_of(target: &str) -> Option<&str> {
    let target = match target.split_once("://") {
        Some((_scheme, rest)) => rest.find('/').map_or("/", |at| &rest[at..]),
        None => target,
    };
    if target == "*" {
        return Some(target);
    }
    if !target.starts_with('/') {
        return None;
    }
    Some(target.split(['?', '#']).next().unwrap_or(target))
}

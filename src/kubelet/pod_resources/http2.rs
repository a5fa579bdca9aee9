// SPDX-License-Identifier: Apache-2.0
//! HTTP/2 for one unary gRPC call, written by hand and sans-IO: [`request`] is every
//! byte the client sends (preface, SETTINGS, a connection WINDOW_UPDATE, HEADERS, DATA),
//! and [`ResponseReader`] follows the server's frames until the stream ends, answering
//! SETTINGS and PING on the way and handing back the one gRPC message once the
//! trailers say `grpc-status: 0`. Header blocks are decoded with the HPACK pieces of
//! `nvshim-http2-authority`. Everything is bounded (frame size, frame count, header
//! block, message), and no input makes it panic (a property test feeds it noise).
//!
//! The windows are opened wide up front (stream and connection), larger than the
//! largest message we accept, so the server never waits for a WINDOW_UPDATE from us:
//! kubelet's answer on a busy node passes the default 64 KiB window easily.

use nvshim_http2_authority::hpack::{self, HpackError, Table};

/// The client connection preface (RFC 9113, 3.4).
pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The largest frame payload we accept: the default `SETTINGS_MAX_FRAME_SIZE`, which
/// we never raise.
pub const MAX_FRAME: usize = 16_384;
/// The largest gRPC message we accept.
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024;
/// The largest header block (HEADERS + CONTINUATION), encoded or decoded.
pub const MAX_HEADER_BLOCK: usize = 64 * 1024;
/// The most frames one response may take: enough for the largest message in DATA
/// frames of 16 KiB, plus room for control frames.
pub const MAX_FRAMES: usize = MAX_MESSAGE / MAX_FRAME + 1024;
/// The stream and connection window we give the server: the largest message, its
/// gRPC prefix and some padding.
const WINDOW: u32 = (MAX_MESSAGE + 1024 * 1024) as u32;
/// The only stream we open.
const STREAM: u32 = 1;

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PUSH_PROMISE: u8 = 0x5;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

/// Why the response is not a successful gRPC answer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Http2Error {
    #[error("frame of {length} bytes (largest allowed {max})")]
    FrameTooLarge { length: usize, max: usize },
    #[error("more than {max} frames in one response")]
    TooManyFrames { max: usize },
    #[error("HTTP/2 protocol error: {0}")]
    Protocol(&'static str),
    #[error("{kind} frame for stream {stream} (only stream 1 is open)")]
    UnknownStream { kind: &'static str, stream: u32 },
    #[error("header block larger than {max} bytes")]
    HeaderBlockTooLarge { max: usize },
    #[error("header block does not decode: {0}")]
    Hpack(#[from] HpackError),
    #[error("server sent GOAWAY ({code}, last stream {last_stream}): {debug:?}")]
    GoAway {
        code: ErrorCode,
        last_stream: u32,
        debug: String,
    },
    #[error("server reset the stream ({code})")]
    Reset { code: ErrorCode },
    #[error("HTTP status {status:?} (expected \"200\")")]
    HttpStatus { status: String },
    #[error("content-type {content_type:?} (expected application/grpc)")]
    ContentType { content_type: String },
    #[error("gRPC status {code} ({name}): {message:?}")]
    Grpc {
        code: u32,
        name: &'static str,
        message: String,
    },
    #[error("stream ended without a grpc-status")]
    MissingStatus,
    #[error("grpc-status {0:?} is not a number")]
    BadStatus(String),
    #[error("response message larger than {max} bytes")]
    MessageTooLarge { max: usize },
    #[error("gRPC message is compressed (flag {flag}), though we accept only identity")]
    Compressed { flag: u8 },
    #[error("gRPC framing: {declared} bytes declared, {got} received")]
    MessageLength { declared: usize, got: usize },
}

/// An HTTP/2 error code (RFC 9113, 7), shown by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorCode(pub u32);

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const NAMES: [&str; 14] = [
            "NO_ERROR",
            "PROTOCOL_ERROR",
            "INTERNAL_ERROR",
            "FLOW_CONTROL_ERROR",
            "SETTINGS_TIMEOUT",
            "STREAM_CLOSED",
            "FRAME_SIZE_ERROR",
            "REFUSED_STREAM",
            "CANCEL",
            "COMPRESSION_ERROR",
            "CONNECT_ERROR",
            "ENHANCE_YOUR_CALM",
            "INADEQUATE_SECURITY",
            "HTTP_1_1_REQUIRED",
        ];
        match usize::try_from(self.0).ok().and_then(|i| NAMES.get(i)) {
            Some(name) => write!(f, "{name}"),
            None => write!(f, "error code {}", self.0),
        }
    }
}

/// gRPC's status code names (`google.rpc.Code`).
pub fn grpc_code_name(code: u32) -> &'static str {
    const NAMES: [&str; 17] = [
        "OK",
        "CANCELLED",
        "UNKNOWN",
        "INVALID_ARGUMENT",
        "DEADLINE_EXCEEDED",
        "NOT_FOUND",
        "ALREADY_EXISTS",
        "PERMISSION_DENIED",
        "RESOURCE_EXHAUSTED",
        "FAILED_PRECONDITION",
        "ABORTED",
        "OUT_OF_RANGE",
        "UNIMPLEMENTED",
        "INTERNAL",
        "UNAVAILABLE",
        "DATA_LOSS",
        "UNAUTHENTICATED",
    ];
    usize::try_from(code)
        .ok()
        .and_then(|i| NAMES.get(i))
        .copied()
        .unwrap_or("unknown code")
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&(stream & 0x7fff_ffff).to_be_bytes());
    out.extend_from_slice(payload);
}

/// A header field as a literal without indexing, its name by static index when the
/// static table has it (RFC 7541, 6.2.2), so the server's table never changes.
fn literal(block: &mut Vec<u8>, name: &str, value: &str) {
    match hpack::static_name_index(name.as_bytes()) {
        Some(index) => hpack::write_int(block, 0x00, 4, index),
        None => {
            block.push(0x00);
            hpack::write_str(block, name.as_bytes());
        }
    }
    hpack::write_str(block, value.as_bytes());
}

/// Every byte the client sends for a unary call of `path` with an empty request
/// message, `timeout` passed on as `grpc-timeout` (whole milliseconds, at least 1).
pub fn request(path: &str, authority: &str, timeout: std::time::Duration) -> Vec<u8> {
    let mut out = PREFACE.to_vec();
    let mut settings = Vec::new();
    for (id, value) in [
        (0x2u16, 0u32),                 // SETTINGS_ENABLE_PUSH: off
        (0x4, WINDOW),                  // SETTINGS_INITIAL_WINDOW_SIZE
        (0x6, MAX_HEADER_BLOCK as u32), // SETTINGS_MAX_HEADER_LIST_SIZE
    ] {
        settings.extend_from_slice(&id.to_be_bytes());
        settings.extend_from_slice(&value.to_be_bytes());
    }
    frame(&mut out, SETTINGS, 0, 0, &settings);
    // The connection window starts at 65,535 whatever SETTINGS say.
    frame(
        &mut out,
        WINDOW_UPDATE,
        0,
        0,
        &(WINDOW - 65_535).to_be_bytes(),
    );
    let millis = timeout.as_millis().clamp(1, 99_999_999);
    let mut block = Vec::new();
    literal(&mut block, ":method", "POST");
    literal(&mut block, ":scheme", "http");
    literal(&mut block, ":path", path);
    literal(&mut block, ":authority", authority);
    literal(&mut block, "content-type", "application/grpc");
    literal(&mut block, "te", "trailers");
    literal(&mut block, "grpc-accept-encoding", "identity");
    literal(&mut block, "grpc-timeout", &format!("{millis}m"));
    literal(&mut block, "user-agent", "nvshim");
    frame(&mut out, HEADERS, END_HEADERS, STREAM, &block);
    // One gRPC message: not compressed, zero bytes long.
    frame(&mut out, DATA, END_STREAM, STREAM, &[0, 0, 0, 0, 0]);
    out
}

/// A GOAWAY saying we are done (sent before closing after a complete call).
pub fn goaway() -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, GOAWAY, 0, 0, &[0; 8]);
    out
}

/// A header block being collected across HEADERS and CONTINUATION frames.
struct PendingBlock {
    bytes: Vec<u8>,
    end_stream: bool,
}

/// Follows the server's side of the connection.
#[derive(Default)]
pub struct ResponseReader {
    buffer: Vec<u8>,
    frames: usize,
    table: Table,
    pending: Option<PendingBlock>,
    /// The response headers came (and said 200, application/grpc).
    headers: bool,
    body: Vec<u8>,
    goaway: Option<Http2Error>,
}

impl ResponseReader {
    /// Takes bytes read from the server; frames that need an answer (SETTINGS, PING)
    /// get it appended to `replies`. `Some(message)` once the stream has ended with
    /// `grpc-status: 0`; the message is the gRPC payload without its 5-byte prefix.
    pub fn feed(
        &mut self,
        input: &[u8],
        replies: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Http2Error> {
        self.buffer.extend_from_slice(input);
        let mut at = 0;
        let result = loop {
            let Some(header) = self.buffer.get(at..at + 9) else {
                break Ok(None);
            };
            let length =
                usize::from(header[0]) << 16 | usize::from(header[1]) << 8 | usize::from(header[2]);
            if length > MAX_FRAME {
                break Err(Http2Error::FrameTooLarge {
                    length,
                    max: MAX_FRAME,
                });
            }
            let (kind, flags) = (header[3], header[4]);
            let stream =
                u32::from_be_bytes([header[5], header[6], header[7], header[8]]) & 0x7fff_ffff;
            let Some(payload) = self.buffer.get(at + 9..at + 9 + length) else {
                break Ok(None);
            };
            let payload = payload.to_vec();
            at += 9 + length;
            self.frames += 1;
            if self.frames > MAX_FRAMES {
                break Err(Http2Error::TooManyFrames { max: MAX_FRAMES });
            }
            match self.on_frame(kind, flags, stream, &payload, replies) {
                Ok(None) => {}
                done => break done,
            }
        };
        self.buffer.drain(..at.min(self.buffer.len()));
        result
    }

    /// What to report when the server closes the connection before the stream ended:
    /// its GOAWAY if it sent one.
    pub fn closed_early(&self) -> Option<Http2Error> {
        self.goaway.clone()
    }

    fn on_frame(
        &mut self,
        kind: u8,
        flags: u8,
        stream: u32,
        payload: &[u8],
        replies: &mut Vec<u8>,
    ) -> Result<Option<Vec<u8>>, Http2Error> {
        if self.pending.is_some() && kind != CONTINUATION {
            return Err(Http2Error::Protocol(
                "header block interrupted by another frame",
            ));
        }
        match kind {
            DATA => {
                self.check_stream("DATA", stream)?;
                if !self.headers {
                    return Err(Http2Error::Protocol("DATA before the response headers"));
                }
                let data = unpad(flags, payload)?;
                if self.body.len() + data.len() > MAX_MESSAGE + 5 {
                    return Err(Http2Error::MessageTooLarge { max: MAX_MESSAGE });
                }
                self.body.extend_from_slice(data);
                if flags & END_STREAM != 0 {
                    return Err(Http2Error::MissingStatus);
                }
                Ok(None)
            }
            HEADERS => {
                self.check_stream("HEADERS", stream)?;
                let mut block = unpad(flags, payload)?;
                if flags & PRIORITY != 0 {
                    block = block
                        .get(5..)
                        .ok_or(Http2Error::Protocol("HEADERS too short for its priority"))?;
                }
                self.pending = Some(PendingBlock {
                    bytes: block.to_vec(),
                    end_stream: flags & END_STREAM != 0,
                });
                self.continue_block(flags)
            }
            CONTINUATION => {
                self.check_stream("CONTINUATION", stream)?;
                let Some(pending) = self.pending.as_mut() else {
                    return Err(Http2Error::Protocol("CONTINUATION without HEADERS"));
                };
                pending.bytes.extend_from_slice(payload);
                self.continue_block(flags)
            }
            RST_STREAM => {
                let code = u32_at(payload)
                    .ok_or(Http2Error::Protocol("RST_STREAM shorter than 4 bytes"))?;
                if stream == STREAM {
                    Err(Http2Error::Reset {
                        code: ErrorCode(code),
                    })
                } else {
                    Ok(None)
                }
            }
            SETTINGS => {
                if stream != 0 || !payload.len().is_multiple_of(6) {
                    return Err(Http2Error::Protocol(
                        "SETTINGS off stream 0 or not a multiple of 6 bytes",
                    ));
                }
                if flags & ACK == 0 {
                    frame(replies, SETTINGS, ACK, 0, &[]);
                }
                Ok(None)
            }
            PUSH_PROMISE => Err(Http2Error::Protocol("PUSH_PROMISE though push is disabled")),
            PING => {
                if payload.len() != 8 || stream != 0 {
                    return Err(Http2Error::Protocol("PING not 8 bytes on stream 0"));
                }
                if flags & ACK == 0 {
                    frame(replies, PING, ACK, 0, payload);
                }
                Ok(None)
            }
            GOAWAY => {
                let last_stream = u32_at(payload)
                    .ok_or(Http2Error::Protocol("GOAWAY shorter than 8 bytes"))?
                    & 0x7fff_ffff;
                let code = payload
                    .get(4..)
                    .and_then(u32_at)
                    .ok_or(Http2Error::Protocol("GOAWAY shorter than 8 bytes"))?;
                let error = Http2Error::GoAway {
                    code: ErrorCode(code),
                    last_stream,
                    debug: String::from_utf8_lossy(payload.get(8..).unwrap_or_default())
                        .into_owned(),
                };
                // A graceful GOAWAY that includes our stream lets it finish.
                if last_stream < STREAM || code != 0 {
                    return Err(error);
                }
                self.goaway = Some(error);
                Ok(None)
            }
            // PRIORITY, WINDOW_UPDATE (our request fits the initial window) and
            // unknown types (RFC 9113, 4.1) need nothing.
            _ => Ok(None),
        }
    }

    fn check_stream(&self, kind: &'static str, stream: u32) -> Result<(), Http2Error> {
        if stream == STREAM {
            Ok(())
        } else {
            Err(Http2Error::UnknownStream { kind, stream })
        }
    }

    fn continue_block(&mut self, flags: u8) -> Result<Option<Vec<u8>>, Http2Error> {
        let Some(pending) = self.pending.as_ref() else {
            return Ok(None);
        };
        if pending.bytes.len() > MAX_HEADER_BLOCK {
            return Err(Http2Error::HeaderBlockTooLarge {
                max: MAX_HEADER_BLOCK,
            });
        }
        if flags & END_HEADERS == 0 {
            return Ok(None);
        }
        let Some(PendingBlock { bytes, end_stream }) = self.pending.take() else {
            return Ok(None);
        };
        let fields = decode_block(&mut self.table, &bytes)?;
        if !self.headers {
            check_response_headers(&fields)?;
            self.headers = true;
            if !end_stream {
                return Ok(None);
            }
            // A trailers-only response: the status is in these headers.
        } else if !end_stream {
            return Err(Http2Error::Protocol("trailers without END_STREAM"));
        }
        check_grpc_status(&fields)?;
        message(&self.body).map(Some)
    }
}

fn u32_at(bytes: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(..4)?.try_into().ok()?))
}

/// The payload of a DATA or HEADERS frame without its padding.
fn unpad(flags: u8, payload: &[u8]) -> Result<&[u8], Http2Error> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let (&pad, rest) = payload
        .split_first()
        .ok_or(Http2Error::Protocol("padded frame without a pad length"))?;
    rest.len()
        .checked_sub(usize::from(pad))
        .and_then(|end| rest.get(..end))
        .ok_or(Http2Error::Protocol("padding longer than the frame"))
}

/// Decoded header fields: (name, value) in order.
pub type HeaderFields = Vec<(Vec<u8>, Vec<u8>)>;

/// Decodes a header block into (name, value) pairs (RFC 7541, 6), updating `table`.
pub fn decode_block(table: &mut Table, block: &[u8]) -> Result<HeaderFields, Http2Error> {
    let mut fields = Vec::new();
    let mut decoded = 0usize;
    let mut at = 0;
    while at < block.len() {
        let first = block[at];
        let (name, value) = if first & 0x80 != 0 {
            let index = hpack::read_int(block, &mut at, 7)?;
            let (name, value) = table.get(index)?;
            (name.to_vec(), value.to_vec())
        } else if first & 0xe0 == 0x20 {
            let size = hpack::read_int(block, &mut at, 5)?;
            if !fields.is_empty() {
                return Err(HpackError::LateSizeUpdate.into());
            }
            table.resize(size)?;
            continue;
        } else {
            let (prefix, indexing) = if first & 0xc0 == 0x40 {
                (6, true)
            } else {
                (4, false)
            };
            let index = hpack::read_int(block, &mut at, prefix)?;
            let name = if index == 0 {
                hpack::read_str(block, &mut at)?.decode()?
            } else {
                table.get(index)?.0.to_vec()
            };
            let value = hpack::read_str(block, &mut at)?.decode()?;
            if indexing {
                table.insert(name.clone(), value.clone());
            }
            (name, value)
        };
        decoded += name.len() + value.len() + 32;
        if decoded > MAX_HEADER_BLOCK {
            return Err(HpackError::TooLarge {
                limit: MAX_HEADER_BLOCK,
            }
            .into());
        }
        fields.push((name, value));
    }
    Ok(fields)
}

fn field<'a>(fields: &'a [(Vec<u8>, Vec<u8>)], name: &str) -> Option<&'a [u8]> {
    fields
        .iter()
        .find(|(n, _)| n == name.as_bytes())
        .map(|(_, v)| v.as_slice())
}

fn check_response_headers(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), Http2Error> {
    let status = field(fields, ":status").unwrap_or_default();
    if status != b"200" {
        return Err(Http2Error::HttpStatus {
            status: String::from_utf8_lossy(status).into_owned(),
        });
    }
    let content_type = field(fields, "content-type").unwrap_or_default();
    if !content_type.starts_with(b"application/grpc") {
        return Err(Http2Error::ContentType {
            content_type: String::from_utf8_lossy(content_type).into_owned(),
        });
    }
    Ok(())
}

fn check_grpc_status(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<(), Http2Error> {
    let status = field(fields, "grpc-status").ok_or(Http2Error::MissingStatus)?;
    let text = String::from_utf8_lossy(status).into_owned();
    let code: u32 = text
        .parse()
        .map_err(|_| Http2Error::BadStatus(text.clone()))?;
    if code == 0 {
        return Ok(());
    }
    Err(Http2Error::Grpc {
        code,
        name: grpc_code_name(code),
        message: percent_decode(field(fields, "grpc-message").unwrap_or_default()),
    })
}

/// `grpc-message` is percent-encoded (gRPC over HTTP/2, "Responses").
fn percent_decode(value: &[u8]) -> String {
    let mut out = Vec::with_capacity(value.len());
    let mut at = 0;
    while at < value.len() {
        let hex = value
            .get(at + 1..at + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (value[at], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                at += 3;
            }
            (byte, _) => {
                out.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The one message of a unary response, without its 5-byte gRPC prefix.
fn message(body: &[u8]) -> Result<Vec<u8>, Http2Error> {
    let Some((prefix, rest)) = body.split_first_chunk::<5>() else {
        return Err(Http2Error::MessageLength {
            declared: 5,
            got: body.len(),
        });
    };
    if prefix[0] != 0 {
        return Err(Http2Error::Compressed { flag: prefix[0] });
    }
    let declared = u32::from_be_bytes([prefix[1], prefix[2], prefix[3], prefix[4]]) as usize;
    if declared != rest.len() {
        return Err(Http2Error::MessageLength {
            declared,
            got: rest.len(),
        });
    }
    Ok(rest.to_vec())
}

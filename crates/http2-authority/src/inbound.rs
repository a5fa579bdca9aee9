//! The client-to-server bytes of one HTTP/2 connection (RFC 7540), passed on frame by
//! frame: the preface and every frame but request headers untouched (a `DATA`
//! payload streams through as it arrives), and each header block (`HEADERS` plus its
//! `CONTINUATION`s) collected whole and handed to the [`BlockRewriter`].
//!
//! A block that needs no change goes on as the very frames it came in. A rewritten
//! one goes on as a `HEADERS` frame with the same stream, `END_STREAM` and priority
//! fields, no padding, and as many `CONTINUATION`s as needed to keep every frame
//! within 16,384 bytes (the size every peer must accept). Anything we cannot read
//! (a bad preface, a broken frame, a block that does not decode) is handed on as it
//! came and the rest of the connection passes untouched: h2 rejects it with the
//! right error, which is better than ours.

use super::block::BlockRewriter;
use super::hpack::HpackError;

/// What every HTTP/2 client sends first.
pub const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
/// The most bytes (frame headers included) one header block may take. Kubelet's are
/// about 200; h2's default limit on a decoded header list is 16 KiB.
pub const MAX_BLOCK_BYTES: usize = 64 * 1024;

const FRAME_HEADER: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The largest frame payload every peer accepts (RFC 7540, 4.2).
const SAFE_FRAME: usize = 16_384;

/// Why a connection cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Http2Error {
    #[error("an HTTP/2 header block larger than {limit} bytes")]
    BlockTooLarge { limit: usize },
    #[error("an HTTP/2 header block that decodes to more than {limit} bytes")]
    HeaderListTooLarge { limit: usize },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// How many bytes of the preface have been seen.
    Preface(usize),
    Frames,
    /// Everything passes untouched from here on.
    Transparent,
}

/// A header block being collected.
#[derive(Debug)]
struct OpenBlock {
    stream: u32,
    /// The `HEADERS` frame's flags.
    flags: u8,
    priority: Option<[u8; 5]>,
    /// The frames as they came, to pass on unchanged.
    frames: Vec<u8>,
    /// The header block fragments, padding and priority removed.
    fragment: Vec<u8>,
}

/// The client-to-server half of one HTTP/2 connection. Feed it what was read; it
/// appends what h2 should read.
#[derive(Debug)]
pub struct Inbound {
    stage: Stage,
    /// Input not yet passed on: at most a frame header plus one header-block frame.
    pending: Vec<u8>,
    /// Payload bytes of a passed-through frame still to come.
    passing: usize,
    block: Option<OpenBlock>,
    rewriter: BlockRewriter,
    /// Why the connection went transparent, when it did.
    stopped: Option<HpackError>,
}

impl Default for Inbound {
    fn default() -> Self {
        Self {
            stage: Stage::Preface(0),
            pending: Vec::new(),
            passing: 0,
            block: None,
            rewriter: BlockRewriter::default(),
            stopped: None,
        }
    }
}

impl Inbound {
    /// How many `:authority` fields were replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewriter.rewritten()
    }

    /// Whether the rest of the connection passes untouched.
    pub fn is_transparent(&self) -> bool {
        self.stage == Stage::Transparent
    }

    /// The decoding error that made the connection transparent, if one did.
    pub fn stopped_by(&self) -> Option<&HpackError> {
        self.stopped.as_ref()
    }

    /// Takes bytes read from the client and appends to `out` what h2 should read.
    pub fn feed(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(), Http2Error> {
        if self.pending.is_empty() {
            // The common case: no partial frame held back.
            let used = self.process(input, out)?;
            self.pending.extend_from_slice(&input[used..]);
        } else {
            let mut pending = std::mem::take(&mut self.pending);
            pending.extend_from_slice(input);
            let used = self.process(&pending, out)?;
            pending.drain(..used);
            self.pending = pending;
        }
        Ok(())
    }

    /// Passes on what `input` holds of whole units; returns how much it used.
    fn process(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, Http2Error> {
        let mut at = 0;
        loop {
            let rest = &input[at..];
            match self.stage {
                Stage::Transparent => {
                    out.extend_from_slice(rest);
                    return Ok(input.len());
                }
                Stage::Preface(seen) => {
                    let n = rest.len().min(PREFACE.len() - seen);
                    if rest[..n] != PREFACE[seen..seen + n] {
                        self.stage = Stage::Transparent;
                        continue;
                    }
                    out.extend_from_slice(&rest[..n]);
                    at += n;
                    if seen + n < PREFACE.len() {
                        self.stage = Stage::Preface(seen + n);
                        return Ok(at);
                    }
                    self.stage = Stage::Frames;
                }
                Stage::Frames if self.passing > 0 => {
                    let n = rest.len().min(self.passing);
                    out.extend_from_slice(&rest[..n]);
                    self.passing -= n;
                    at += n;
                    if self.passing > 0 {
                        return Ok(at);
                    }
                }
                Stage::Frames => {
                    let Some(header) = rest.get(..FRAME_HEADER) else {
                        return Ok(at);
                    };
                    let len = usize::from(header[0]) << 16
                        | usize::from(header[1]) << 8
                        | usize::from(header[2]);
                    let (kind, flags) = (header[3], header[4]);
                    let stream = u32::from_be_bytes([header[5], header[6], header[7], header[8]])
                        & 0x7fff_ffff;
                    let collecting = match &self.block {
                        None => kind == HEADERS,
                        Some(block) => kind == CONTINUATION && stream == block.stream,
                    };
                    if !collecting {
                        if let Some(block) = self.block.take() {
                            // A frame inside a header block: a protocol error h2 will
                            // name. Hand everything on as it came.
                            out.extend_from_slice(&block.frames);
                            self.stage = Stage::Transparent;
                            continue;
                        }
                        out.extend_from_slice(header);
                        at += FRAME_HEADER;
                        self.passing = len;
                        continue;
                    }
                    let held = self.block.as_ref().map_or(0, |b| b.frames.len());
                    if held + FRAME_HEADER + len > MAX_BLOCK_BYTES {
                        return Err(Http2Error::BlockTooLarge {
                            limit: MAX_BLOCK_BYTES,
                        });
                    }
                    let Some(frame) = rest.get(..FRAME_HEADER + len) else {
                        return Ok(at);
                    };
                    at += frame.len();
                    self.take_block_frame(frame, kind, flags, stream, out)?;
                }
            }
        }
    }

    /// Adds a whole `HEADERS` or `CONTINUATION` frame to the open block, and passes the
    /// block on when it ends.
    fn take_block_frame(
        &mut self,
        frame: &[u8],
        kind: u8,
        flags: u8,
        stream: u32,
        out: &mut Vec<u8>,
    ) -> Result<(), Http2Error> {
        let payload = &frame[FRAME_HEADER..];
        if kind == HEADERS {
            let Some((priority, fragment)) = headers_fragment(flags, payload) else {
                // Bad padding or priority: h2's error to give.
                out.extend_from_slice(frame);
                self.stage = Stage::Transparent;
                return Ok(());
            };
            self.block = Some(OpenBlock {
                stream,
                flags,
                priority,
                frames: frame.to_vec(),
                fragment: fragment.to_vec(),
            });
        } else if let Some(block) = self.block.as_mut() {
            block.frames.extend_from_slice(frame);
            block.fragment.extend_from_slice(payload);
        }
        if flags & END_HEADERS == 0 {
            return Ok(());
        }
        let Some(block) = self.block.take() else {
            return Ok(());
        };
        match self.rewriter.rewrite(&block.fragment) {
            Ok(None) => out.extend_from_slice(&block.frames),
            Ok(Some(rewritten)) => write_block(out, &block, &rewritten),
            Err(HpackError::TooLarge { limit }) => {
                return Err(Http2Error::HeaderListTooLarge { limit });
            }
            Err(error) => {
                out.extend_from_slice(&block.frames);
                self.stopped = Some(error);
                self.stage = Stage::Transparent;
            }
        }
        Ok(())
    }
}

/// A `HEADERS` payload's priority fields and header block fragment, or `None` when its
/// padding or priority fields do not fit (RFC 7540, 6.2).
fn headers_fragment(flags: u8, payload: &[u8]) -> Option<(Option<[u8; 5]>, &[u8])> {
    let mut body = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&len, rest) = body.split_first()?;
        pad = usize::from(len);
        body = rest;
    }
    let mut priority = None;
    if flags & PRIORITY != 0 {
        let (fields, rest) = body.split_first_chunk::<5>()?;
        priority = Some(*fields);
        body = rest;
    }
    let end = body.len().checked_sub(pad)?;
    Some((priority, &body[..end]))
}

/// Writes `block` as a `HEADERS` frame and `CONTINUATION`s for `open`'s stream.
fn write_block(out: &mut Vec<u8>, open: &OpenBlock, block: &[u8]) {
    let first_room = SAFE_FRAME - if open.priority.is_some() { 5 } else { 0 };
    let (first, mut rest) = block.split_at(block.len().min(first_room));
    let mut flags = open.flags & (END_STREAM | PRIORITY);
    if rest.is_empty() {
        flags |= END_HEADERS;
    }
    let priority = open.priority.as_ref().map_or(&[][..], |p| &p[..]);
    write_frame_header(
        out,
        priority.len() + first.len(),
        HEADERS,
        flags,
        open.stream,
    );
    out.extend_from_slice(priority);
    out.extend_from_slice(first);
    while !rest.is_empty() {
        let (chunk, tail) = rest.split_at(rest.len().min(SAFE_FRAME));
        rest = tail;
        let flags = if rest.is_empty() { END_HEADERS } else { 0 };
        write_frame_header(out, chunk.len(), CONTINUATION, flags, open.stream);
        out.extend_from_slice(chunk);
    }
}

fn write_frame_header(out: &mut Vec<u8>, len: usize, kind: u8, flags: u8, stream: u32) {
    let len = len.to_be_bytes();
    out.extend_from_slice(&len[len.len() - 3..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
}

#[cfg(test)]
#[path = "inbound_tests.rs"]
mod tests;

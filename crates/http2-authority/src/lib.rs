//! HTTP/2 in front of h2: makes requests whose `:authority` h2 would refuse acceptable
//! to it, and touches nothing else.
//!
//! Every gRPC client that dials a Unix socket by its path sends something as the
//! HTTP/2 `:authority`: grpc-go before 1.26's kubelets the socket path itself, Python's
//! `grpcio` (gRPC C core) the path percent-encoded, others an empty string. h2 parses
//! the value as a URI authority and resets the stream with `PROTOCOL_ERROR` when it is
//! not one, before any of our code runs; NVIDIA's plugin (grpc-go) takes anything.
//! h2 will not relax the check, so the client's bytes are rewritten before h2 reads
//! them: [`Inbound`] follows the frames, [`block`] the HPACK state, so that the
//! client's encoder and h2's decoder never disagree about the header table.
//!
//! Pure and synchronous: the tokio side is the device plugin's `server::authority`
//! (`crates/device-plugin`), which re-exports this crate as its `http2` module. The plugin
//! serves nothing that looks at the authority, so replacing it loses nothing.
//!
//! ```text
//! inbound   preface, frames; header blocks collected whole (HEADERS + CONTINUATION)
//! block     one block: decode (mirroring the client's table), fix :authority, re-emit
//! hpack     integers, string literals, the static and dynamic tables
//! huffman   RFC 7541's Huffman code, decoding
//! ```
//!
//! `block` and `inbound` are behind the default feature `authority` (they use `http`);
//! `hpack` and `huffman` build without it, for HTTP/2 clients that only decode headers.

#[cfg(feature = "authority")]
pub mod block;
pub mod hpack;
pub mod huffman;
#[cfg(feature = "authority")]
pub mod inbound;

#[cfg(feature = "authority")]
pub use block::{BlockRewriter, acceptable, substitute};
#[cfg(feature = "authority")]
pub use inbound::{Http2Error, Inbound, MAX_BLOCK_BYTES, PREFACE};

#![allow(clippy::unwrap_used)]

use super::super::block::substitute;
use super::super::hpack::{write_int, write_str};
use super::*;

fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    write_frame_header(&mut out, payload.len(), kind, flags, stream);
    out.extend_from_slice(payload);
    out
}

/// A request header block: POST, http, a path, and `authority` added to the table.
fn block(authority: &str) -> Vec<u8> {
    let mut out = vec![0x83, 0x86];
    write_int(&mut out, 0x40, 6, 4);
    write_str(&mut out, b"/v1beta1.DevicePlugin/Allocate");
    write_int(&mut out, 0x40, 6, 1);
    write_str(&mut out, authority.as_bytes());
    out
}

const SETTINGS: u8 = 0x4;
const DATA: u8 = 0x0;
const SOCKET: &str = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock";

fn feed_all(input: &[u8]) -> Result<Vec<u8>, Http2Error> {
    let mut inbound = Inbound::default();
    let mut out = Vec::new();
    inbound.feed(input, &mut out)?;
    Ok(out)
}

/// Splits `input` at every position and feeds it in two pieces, and byte by byte:
/// the output must not depend on how reads fall.
fn same_whatever_the_reads(input: &[u8], case: &str) -> Vec<u8> {
    let whole = feed_all(input).unwrap();
    for cut in 0..=input.len() {
        let mut inbound = Inbound::default();
        let mut out = Vec::new();
        inbound.feed(&input[..cut], &mut out).unwrap();
        inbound.feed(&input[cut..], &mut out).unwrap();
        assert_eq!(out, whole, "case {case}: cut at {cut}");
    }
    let mut inbound = Inbound::default();
    let mut out = Vec::new();
    for byte in input {
        inbound.feed(std::slice::from_ref(byte), &mut out).unwrap();
    }
    assert_eq!(out, whole, "case {case}: byte by byte");
    whole
}

/// The header block fragments h2 will read from `out` (after the preface), by stream,
/// with the frames' flags checked on the way.
fn blocks(out: &[u8]) -> Vec<(u32, u8, Vec<u8>)> {
    assert_eq!(&out[..24], PREFACE);
    let mut at = 24;
    let mut found: Vec<(u32, u8, Vec<u8>)> = Vec::new();
    while at < out.len() {
        let len =
            usize::from(out[at]) << 16 | usize::from(out[at + 1]) << 8 | usize::from(out[at + 2]);
        let (kind, flags) = (out[at + 3], out[at + 4]);
        let stream = u32::from_be_bytes(out[at + 5..at + 9].try_into().unwrap());
        assert!(len <= SAFE_FRAME, "frame of {len} bytes");
        let payload = &out[at + 9..at + 9 + len];
        match kind {
            HEADERS => {
                let (_, fragment) = headers_fragment(flags, payload).unwrap();
                found.push((stream, flags, fragment.to_vec()));
            }
            CONTINUATION => found.last_mut().unwrap().2.extend_from_slice(payload),
            _ => {}
        }
        at += 9 + len;
    }
    found
}

#[test]
fn frames_other_than_headers_pass_untouched() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(SETTINGS, 0, 0, &[0, 4, 0, 0, 0xff, 0xff]));
    input.extend(frame(HEADERS, END_HEADERS, 1, &block("localhost")));
    input.extend(frame(DATA, END_STREAM, 1, &[0, 0, 0, 0, 2, 8, 1]));
    input.extend(frame(0x8, 0, 0, &[0, 0, 1, 0])); // WINDOW_UPDATE
    let out = same_whatever_the_reads(&input, "valid authority");
    assert_eq!(out, input);
}

#[test]
fn a_socket_path_is_replaced_in_every_framing() {
    let fragment = block(SOCKET);
    let mut padded = vec![3];
    padded.extend(&fragment);
    padded.extend([0, 0, 0]);
    let mut prioritised = vec![0, 0, 0, 0, 15];
    prioritised.extend(&fragment);
    let (head, tail) = fragment.split_at(10);
    let cases: [(&str, Vec<u8>, u8); 4] = [
        ("plain", frame(HEADERS, END_HEADERS, 1, &fragment), 0),
        (
            "padded",
            frame(HEADERS, END_HEADERS | PADDED | END_STREAM, 3, &padded),
            END_STREAM,
        ),
        (
            "priority",
            frame(HEADERS, END_HEADERS | PRIORITY, 5, &prioritised),
            PRIORITY,
        ),
        (
            "continuation",
            [
                frame(HEADERS, 0, 7, head),
                frame(CONTINUATION, 0, 7, &[]),
                frame(CONTINUATION, END_HEADERS, 7, tail),
            ]
            .concat(),
            0,
        ),
    ];
    for (name, frames, kept_flags) in cases {
        let mut input = PREFACE.to_vec();
        input.extend(&frames);
        input.extend(frame(DATA, END_STREAM, 1, b"\0\0\0\0\0"));
        let out = same_whatever_the_reads(&input, name);
        let found = blocks(&out);
        assert_eq!(found.len(), 1, "case {name}");
        let (_, flags, rewritten) = &found[0];
        assert_eq!(
            flags & !END_HEADERS,
            kept_flags,
            "case {name}: flags {flags:#x}"
        );
        let want = block(std::str::from_utf8(&substitute(SOCKET.len())).unwrap());
        assert_eq!(rewritten, &want, "case {name}");
        assert!(
            out.ends_with(&frame(DATA, END_STREAM, 1, b"\0\0\0\0\0")),
            "case {name}"
        );
    }
}

#[test]
fn a_rewritten_block_larger_than_a_frame_gets_continuations() {
    // A Huffman-coded bad authority of 14,000 bytes (mostly '0': 5 bits each) becomes
    // 14,000 raw bytes of the same length; with a 12,000-byte header that stays as it
    // is, the block no longer fits one 16 KiB frame.
    let long = format!("/{}", "0".repeat(13_999));
    let mut coded = Vec::new();
    super::super::huffman::encode(long.as_bytes(), &mut coded);
    let mut fragment = vec![0x83, 0x86];
    write_int(&mut fragment, 0x00, 4, 0);
    write_str(&mut fragment, b"x-big");
    write_str(&mut fragment, "y".repeat(12_000).as_bytes());
    write_int(&mut fragment, 0x40, 6, 1);
    write_int(&mut fragment, 0x80, 7, coded.len());
    fragment.extend(&coded);
    let mut input = PREFACE.to_vec();
    let (a, b) = fragment.split_at(16_000);
    input.extend(frame(HEADERS, END_STREAM, 1, a));
    input.extend(frame(CONTINUATION, END_HEADERS, 1, b));
    let out = feed_all(&input).unwrap();
    let found = blocks(&out);
    assert_eq!(found.len(), 1);
    assert!(
        found[0].2.len() > SAFE_FRAME,
        "one block over several frames"
    );
    assert!(found[0].2.ends_with(&substitute(14_000)), "same length");
    assert_eq!(found[0].1 & END_STREAM, END_STREAM);
}

#[test]
fn what_cannot_be_read_passes_as_it_came() {
    let fragment = block(SOCKET);
    let interleaved = [
        PREFACE.to_vec(),
        frame(HEADERS, 0, 1, &fragment),
        frame(DATA, 0, 1, b"x"),
    ]
    .concat();
    let bad_padding = [
        PREFACE.to_vec(),
        frame(HEADERS, END_HEADERS | PADDED, 1, &[200, 1, 2]),
    ]
    .concat();
    let bad_hpack = [PREFACE.to_vec(), frame(HEADERS, END_HEADERS, 1, &[0x80])].concat();
    let not_http2 = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n".to_vec();
    for (name, input) in [
        ("frame inside a block", interleaved),
        ("padding longer than the frame", bad_padding),
        ("index 0", bad_hpack),
        ("HTTP/1.1", not_http2),
    ] {
        let mut inbound = Inbound::default();
        let mut out = Vec::new();
        inbound.feed(&input, &mut out).unwrap();
        assert_eq!(out, input, "case {name}");
        assert!(inbound.is_transparent(), "case {name}");
        // And so is everything after it.
        inbound.feed(b"more", &mut out).unwrap();
        assert!(out.ends_with(b"more"), "case {name}");
    }
}

#[test]
fn oversized_blocks_close_the_connection() {
    let mut input = PREFACE.to_vec();
    input.extend(frame(HEADERS, 0, 1, &[0x82; 16_000]));
    for _ in 0..4 {
        input.extend(frame(CONTINUATION, 0, 1, &[0x82; 16_000]));
    }
    assert_eq!(
        feed_all(&input),
        Err(Http2Error::BlockTooLarge {
            limit: MAX_BLOCK_BYTES
        })
    );
    // A frame header announcing 16 MiB is refused before its payload is awaited.
    let mut huge = PREFACE.to_vec();
    huge.extend([0xff, 0xff, 0xff, HEADERS, 0, 0, 0, 0, 1]);
    assert_eq!(
        feed_all(&huge),
        Err(Http2Error::BlockTooLarge {
            limit: MAX_BLOCK_BYTES
        })
    );
    // A large DATA frame streams through without being held.
    let mut inbound = Inbound::default();
    let mut out = Vec::new();
    let mut data = PREFACE.to_vec();
    data.extend([0xff, 0xff, 0xff, DATA, 0, 0, 0, 0, 1]);
    inbound.feed(&data, &mut out).unwrap();
    inbound.feed(&[7; 100_000], &mut out).unwrap();
    assert_eq!(out.len(), data.len() + 100_000);
    assert!(inbound.pending.is_empty());
}

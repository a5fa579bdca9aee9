// SPDX-License-Identifier: Apache-2.0
//! The `:authority` fix (`nvshim_device_plugin::http2`) against the decoder that matters: h2's
//! own (its frame codec, through h2's `unstable` feature, as a dev-dependency only).
//!
//! A property test plays many clients: each sends several requests on one connection,
//! every header field coded at random (a table reference when one exists, a literal
//! added to the table, not added, never indexed; Huffman or raw; a name by index or
//! spelled out), with dynamic-table size updates, padding, priority fields and blocks
//! split over `CONTINUATION` frames, and an `:authority` that is valid, a socket path,
//! percent-encoded, empty, or missing. The client's HPACK encoder here is the test's
//! own, with its own table. Whatever the reads' split, h2 must decode every header
//! block of the rewritten stream, see every header as sent, and an `:authority` that
//! is the one sent when that was valid, a valid one otherwise.

use std::collections::VecDeque;
use std::io::Cursor;

use h2::frame::Frame;
use nvshim_device_plugin::http2::hpack::{STATIC, write_int};
use nvshim_device_plugin::http2::{Inbound, PREFACE, huffman};
use proptest::prelude::*;
use tokio_stream::StreamExt;

/// The client's dynamic table, kept by the test's encoder (RFC 7541, 4).
#[derive(Default)]
struct ClientTable {
    entries: VecDeque<(String, String)>,
    size: usize,
    max: usize,
}

impl ClientTable {
    fn new() -> Self {
        Self {
            max: 4096,
            ..Self::default()
        }
    }

    fn insert(&mut self, name: &str, value: &str) {
        self.size += name.len() + value.len() + 32;
        self.entries.push_front((name.into(), value.into()));
        self.evict();
    }

    fn resize(&mut self, max: usize) {
        self.max = max;
        self.evict();
    }

    fn evict(&mut self) {
        while self.size > self.max {
            let (n, v) = self.entries.pop_back().unwrap();
            self.size -= n.len() + v.len() + 32;
        }
    }

    /// The 1-based index of `name` and `value` (static first), if present.
    fn find(&self, name: &str, value: Option<&str>) -> Option<usize> {
        let hit = |(n, v): (&str, &str)| n == name && value.is_none_or(|value| v == value);
        STATIC
            .iter()
            .position(|&(n, v)| hit((n, v)))
            .map(|i| i + 1)
            .or_else(|| {
                self.entries
                    .iter()
                    .position(|(n, v)| hit((n, v)))
                    .map(|i| i + 62)
            })
    }
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    value: String,
    /// 0: a table reference if one matches, 1: literal added, 2: not added, 3: never.
    how: u8,
    by_name_index: bool,
    huffman: bool,
}

#[derive(Debug, Clone)]
struct Request {
    size_update: Option<usize>,
    fields: Vec<Field>,
    pad: Option<u8>,
    priority: bool,
    /// Split the block into fragments of this size (0: one frame).
    split: usize,
}

fn string(out: &mut Vec<u8>, s: &str, huffman: bool) {
    if huffman {
        let mut coded = Vec::new();
        huffman::encode(s.as_bytes(), &mut coded);
        write_int(out, 0x80, 7, coded.len());
        out.extend_from_slice(&coded);
    } else {
        write_int(out, 0, 7, s.len());
        out.extend_from_slice(s.as_bytes());
    }
}

fn encode(table: &mut ClientTable, request: &Request) -> Vec<u8> {
    let mut out = Vec::new();
    if let Some(size) = request.size_update {
        write_int(&mut out, 0x20, 5, size);
        table.resize(size);
    }
    for f in &request.fields {
        if f.how == 0
            && let Some(index) = table.find(&f.name, Some(&f.value))
        {
            write_int(&mut out, 0x80, 7, index);
            continue;
        }
        let (flags, bits) = match f.how {
            2 => (0x00, 4),
            3 => (0x10, 4),
            _ => (0x40, 6),
        };
        let name_index = if f.by_name_index {
            table.find(&f.name, None)
        } else {
            None
        };
        write_int(&mut out, flags, bits, name_index.unwrap_or(0));
        if name_index.is_none() {
            string(&mut out, &f.name, f.huffman);
        }
        string(&mut out, &f.value, f.huffman);
        if flags == 0x40 {
            table.insert(&f.name, &f.value);
        }
    }
    out
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The request's HEADERS (and CONTINUATION) frames for `stream`.
fn frames(out: &mut Vec<u8>, request: &Request, block: &[u8], stream: u32) {
    // h2 refuses more than a few CONTINUATION frames a block (a flood guard): at most
    // 5 here, as real clients send (they fill each frame).
    let chunks: Vec<&[u8]> = if request.split == 0 || block.is_empty() {
        vec![block]
    } else {
        block
            .chunks(request.split.max(block.len().div_ceil(5)))
            .collect()
    };
    let mut flags = 0x1; // END_STREAM
    let mut payload = Vec::new();
    if let Some(pad) = request.pad {
        flags |= 0x8;
        payload.push(pad);
    }
    if request.priority {
        flags |= 0x20;
        payload.extend_from_slice(&[0, 0, 0, 0, 42]);
    }
    payload.extend_from_slice(chunks[0]);
    if let Some(pad) = request.pad {
        payload.extend(std::iter::repeat_n(0, usize::from(pad)));
    }
    if chunks.len() == 1 {
        flags |= 0x4;
    }
    frame(out, 0x1, flags, stream, &payload);
    for (i, chunk) in chunks.iter().enumerate().skip(1) {
        let end = if i + 1 == chunks.len() { 0x4 } else { 0 };
        frame(out, 0x9, end, stream, chunk);
    }
}

const SOCKET: &str = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock";

fn authority() -> impl Strategy<Value = Option<String>> {
    prop_oneof![
        Just(Some("localhost".to_string())),
        Just(Some(SOCKET.to_string())),
        Just(Some(SOCKET.trim_start_matches('/').replace('/', "%2F"))),
        Just(Some(String::new())),
        Just(Some("[::]:50051".to_string())),
        Just(None),
        "/run/[a-z]{0,40}\\.sock".prop_map(Some),
        "[a-z0-9.:%/-]{0,30}".prop_map(Some),
    ]
}

fn field(name: &'static str, value: impl Strategy<Value = String>) -> impl Strategy<Value = Field> {
    (value, 0u8..4, any::<bool>(), any::<bool>()).prop_map(
        move |(value, how, by_name_index, huffman)| Field {
            name: name.to_string(),
            value,
            how,
            by_name_index,
            huffman,
        },
    )
}

fn request() -> impl Strategy<Value = Request> {
    let regular = prop_oneof![
        field("content-type", Just("application/grpc".to_string())),
        field("user-agent", "[a-z/ .0-9]{0,60}"),
        field("grpc-timeout", "[0-9]{1,8}m"),
        field("x-filler", "[a-z]{0,3000}"),
    ];
    (
        authority(),
        field(":path", "/v1beta1\\.DevicePlugin/[A-Za-z]{1,30}"),
        (0u8..4, any::<bool>(), any::<bool>()),
        prop::collection::vec(regular, 0..5),
        prop::option::of(prop_oneof![Just(0usize), Just(64), Just(256), Just(4096)]),
        prop::option::of(0u8..20),
        any::<bool>(),
        prop_oneof![Just(0usize), 1usize..40, Just(16_384)],
        any::<bool>(),
    )
        .prop_map(
            |(
                authority,
                path,
                (how, by_name_index, huffman),
                regular,
                size_update,
                pad,
                priority,
                split,
                authority_first,
            )| {
                let method = Field {
                    name: ":method".into(),
                    value: "POST".into(),
                    how: 0,
                    by_name_index: true,
                    huffman: false,
                };
                let scheme = Field {
                    name: ":scheme".into(),
                    value: "http".into(),
                    how: 0,
                    by_name_index: true,
                    huffman: false,
                };
                let mut fields = vec![path, method, scheme];
                if let Some(value) = authority {
                    let a = Field {
                        name: ":authority".into(),
                        value,
                        how,
                        by_name_index,
                        huffman,
                    };
                    // grpcio puts it before :method, grpc-go last of the pseudo-headers.
                    if authority_first {
                        fields.insert(1, a)
                    } else {
                        fields.push(a)
                    }
                }
                fields.extend(regular);
                Request {
                    size_update,
                    fields,
                    pad,
                    priority,
                    split,
                }
            },
        )
}

fn valid(authority: &str) -> bool {
    http::uri::Authority::try_from(authority).is_ok()
}

/// Feeds `input` to an `Inbound` in reads cut at `cuts` (fractions of the length).
fn rewritten(input: &[u8], cuts: &[u16]) -> Vec<u8> {
    let mut at: Vec<usize> = cuts
        .iter()
        .map(|&c| usize::from(c) * input.len() / 65_536)
        .collect();
    at.push(0);
    at.push(input.len());
    at.sort_unstable();
    let mut inbound = Inbound::default();
    let mut out = Vec::new();
    for pair in at.windows(2) {
        inbound.feed(&input[pair[0]..pair[1]], &mut out).unwrap();
    }
    assert!(
        !inbound.is_transparent(),
        "gave up: {:?}",
        inbound.stopped_by()
    );
    out
}

/// One HEADERS frame as h2 decoded it: `:authority`, `:path`, the regular fields.
type Seen = (Option<String>, String, Vec<(String, String)>);

/// Every HEADERS frame h2 decodes from `bytes` (after the preface).
fn decoded(bytes: Vec<u8>) -> Vec<Seen> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let mut codec: h2::Codec<_, bytes::Bytes> = h2::Codec::new(Cursor::new(bytes));
        let mut found = Vec::new();
        while let Some(frame) = codec.next().await {
            match frame.expect("h2 decodes every frame") {
                Frame::Headers(headers) => {
                    let (pseudo, fields) = headers.into_parts();
                    let regular = fields
                        .iter()
                        .map(|(n, v)| (n.to_string(), v.to_str().unwrap().to_string()))
                        .collect();
                    found.push((
                        pseudo.authority.map(|a| a.to_string()),
                        pseudo.path.map(|p| p.to_string()).unwrap_or_default(),
                        regular,
                    ));
                }
                other => panic!("unexpected frame {other:?}"),
            }
        }
        found
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn h2_decodes_every_rewritten_request(
        requests in prop::collection::vec(request(), 1..8),
        cuts in prop::collection::vec(any::<u16>(), 0..4),
    ) {
        let mut table = ClientTable::new();
        let mut input = PREFACE.to_vec();
        for (i, request) in requests.iter().enumerate() {
            let block = encode(&mut table, request);
            frames(&mut input, request, &block, 2 * i as u32 + 1);
        }
        let out = rewritten(&input, &cuts);
        let seen = decoded(out[PREFACE.len()..].to_vec());
        prop_assert_eq!(seen.len(), requests.len());
        for (request, (authority, path, regular)) in requests.iter().zip(&seen) {
            let sent = |name: &str| request.fields.iter().find(|f| f.name == name).map(|f| f.value.clone());
            prop_assert_eq!(Some(path.clone()), sent(":path"));
            match (sent(":authority"), authority) {
                (None, None) => {}
                (Some(a), Some(b)) if valid(&a) => prop_assert_eq!(&a, b),
                (Some(_), Some(b)) => prop_assert!(valid(b), "h2 was given {:?}", b),
                (sent, got) => prop_assert!(false, "sent {:?}, h2 saw {:?}", sent, got),
            }
            let want: Vec<(String, String)> = request
                .fields
                .iter()
                .filter(|f| !f.name.starts_with(':'))
                .map(|f| (f.name.clone(), f.value.clone()))
                .collect();
            let mut want_sorted = want.clone();
            want_sorted.sort();
            let mut got_sorted = regular.clone();
            got_sorted.sort();
            prop_assert_eq!(got_sorted, want_sorted);
        }
    }
}

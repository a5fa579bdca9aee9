// SPDX-License-Identifier: Apache-2.0
use std::time::Duration;

use nvshim_http2_authority::hpack;
use proptest::prelude::*;

use super::ContainerDevices;
use super::http2::{self, ErrorCode, Http2Error, ResponseReader};
use super::wire::{WireError, decode_list_response};

// --- a protobuf encoder for the fixtures (the client only decodes) ---

fn varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn bytes_field(out: &mut Vec<u8>, number: u64, bytes: &[u8]) {
    varint(out, number << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// A container's name and its (resource, device ids).
type Container<'a> = (&'a str, Vec<(&'a str, Vec<String>)>);

struct Pod<'a> {
    name: &'a str,
    namespace: &'a str,
    containers: Vec<Container<'a>>,
}

fn encode(pods: &[Pod<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for pod in pods {
        let mut p = Vec::new();
        bytes_field(&mut p, 1, pod.name.as_bytes());
        bytes_field(&mut p, 2, pod.namespace.as_bytes());
        for (container, devices) in &pod.containers {
            let mut c = Vec::new();
            bytes_field(&mut c, 1, container.as_bytes());
            for (resource, ids) in devices {
                let mut d = Vec::new();
                bytes_field(&mut d, 1, resource.as_bytes());
                for id in ids {
                    bytes_field(&mut d, 2, id.as_bytes());
                }
                // topology = 3 { nodes = 1 { ID = 1: 0 } }: skipped by the decoder
                bytes_field(&mut d, 3, &[0x0a, 0x02, 0x08, 0x00]);
                bytes_field(&mut c, 2, &d);
            }
            // cpu_ids = 3 (packed int64), skipped
            bytes_field(&mut c, 3, &[1, 2, 3]);
            bytes_field(&mut p, 3, &c);
        }
        bytes_field(&mut out, 1, &p);
    }
    out
}

fn ids(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn entry(
    pod: &str,
    namespace: &str,
    container: &str,
    resource: &str,
    devices: &[&str],
) -> ContainerDevices {
    ContainerDevices {
        pod: pod.into(),
        namespace: namespace.into(),
        container: container.into(),
        resource: resource.into(),
        device_ids: ids(devices),
    }
}

fn two_pods() -> Vec<u8> {
    encode(&[
        Pod {
            name: "train",
            namespace: "ml",
            containers: vec![
                ("worker", vec![("nvidia.com/gpu", ids(&["GPU-a", "GPU-b"]))]),
                ("sidecar", vec![]),
            ],
        },
        Pod {
            name: "infer",
            namespace: "default",
            containers: vec![(
                "server",
                vec![
                    ("nvidia.com/gpu", ids(&["GPU-c::1"])),
                    ("example.com/nic", ids(&["eth1"])),
                    ("nvidia.com/gpu", ids(&["GPU-c::2"])),
                ],
            )],
        },
    ])
}

fn two_pods_decoded() -> Vec<ContainerDevices> {
    vec![
        entry(
            "train",
            "ml",
            "worker",
            "nvidia.com/gpu",
            &["GPU-a", "GPU-b"],
        ),
        entry(
            "infer",
            "default",
            "server",
            "nvidia.com/gpu",
            &["GPU-c::1", "GPU-c::2"],
        ),
        entry("infer", "default", "server", "example.com/nic", &["eth1"]),
    ]
}

#[test]
fn decodes_one_entry_per_container_and_resource() {
    assert_eq!(
        decode_list_response(&two_pods()).unwrap(),
        two_pods_decoded()
    );
    assert_eq!(decode_list_response(&[]).unwrap(), vec![]);
}

#[test]
fn fields_in_any_order_and_unknown_fields_are_read() {
    // containers before the pod's name; unknown varint, fixed64 and fixed32 fields
    let mut d = Vec::new();
    bytes_field(&mut d, 2, b"GPU-x");
    bytes_field(&mut d, 1, b"nvidia.com/gpu");
    let mut c = Vec::new();
    c.extend_from_slice(&[0x20, 0x96, 0x01]); // field 4, varint 150
    bytes_field(&mut c, 2, &d);
    bytes_field(&mut c, 1, b"main");
    let mut p = Vec::new();
    bytes_field(&mut p, 3, &c);
    p.extend_from_slice(&[0x49, 1, 2, 3, 4, 5, 6, 7, 8]); // field 9, fixed64
    p.extend_from_slice(&[0x55, 1, 2, 3, 4]); // field 10, fixed32
    bytes_field(&mut p, 2, b"ns");
    bytes_field(&mut p, 1, b"pod");
    let mut out = Vec::new();
    bytes_field(&mut out, 1, &p);
    assert_eq!(
        decode_list_response(&out).unwrap(),
        vec![entry("pod", "ns", "main", "nvidia.com/gpu", &["GPU-x"])]
    );
}

#[test]
fn malformed_messages_are_errors_that_say_where() {
    let cases: [(&str, Vec<u8>, WireError); 5] = [
        (
            "truncated length",
            vec![0x0a, 0x05, 0x0a],
            WireError::Truncated { at: 2 },
        ),
        (
            "long varint",
            vec![0x08; 1].into_iter().chain([0xff; 11]).collect(),
            WireError::VarintTooLong { at: 1 },
        ),
        (
            "group wire type",
            vec![0x0b],
            WireError::WireType {
                field: 1,
                wire_type: 3,
            },
        ),
        (
            "pod_resources as a varint",
            vec![0x08, 0x01],
            WireError::UnexpectedWireType {
                message: "ListPodResourcesResponse",
                field: 1,
                wire_type: 0,
                expected: 2,
            },
        ),
        (
            "name not UTF-8",
            vec![0x0a, 0x03, 0x0a, 0x01, 0xff],
            WireError::NotUtf8 {
                message: "PodResources",
                field: 1,
            },
        ),
    ];
    for (name, input, expected) in cases {
        assert_eq!(decode_list_response(&input), Err(expected), "case {name}");
    }
}

// --- HTTP/2 frames from a server, built by hand ---

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// Header fields as literals with incremental indexing (name and value as literals),
/// so that a later block can refer to them by index.
fn indexed_block(fields: &[(&str, &str)]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x40);
        hpack::write_str(&mut block, name.as_bytes());
        hpack::write_str(&mut block, value.as_bytes());
    }
    block
}

fn grpc_message(message: &[u8]) -> Vec<u8> {
    let mut out = vec![0];
    out.extend_from_slice(&(message.len() as u32).to_be_bytes());
    out.extend_from_slice(message);
    out
}

/// A whole successful response: SETTINGS, PING, headers, the message in DATA frames of
/// at most 16 KiB, trailers.
fn response(message: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    frame(&mut out, 0x4, 0, 0, &[0, 3, 0, 0, 0, 100]);
    frame(&mut out, 0x6, 0, 0, b"pingpong");
    frame(&mut out, 0x8, 0, 0, &[0, 0, 1, 0]);
    // :status 200 fully indexed from the static table, content-type as a literal
    let mut headers = vec![0x88];
    headers.extend(indexed_block(&[("content-type", "application/grpc")]));
    frame(&mut out, 0x1, 0x4, 1, &headers);
    for chunk in grpc_message(message).chunks(16_384) {
        frame(&mut out, 0x0, 0, 1, chunk);
    }
    // grpc-status by a fresh literal; a dynamic-table reference to content-type
    let mut trailers = indexed_block(&[("grpc-status", "0")]);
    trailers.push(0x80 | 63); // index 62 is grpc-status now, 63 content-type
    frame(&mut out, 0x1, 0x4 | 0x1, 1, &trailers);
    out
}

#[test]
fn a_whole_response_fed_byte_by_byte_and_at_once() {
    let message = two_pods();
    let bytes = response(&message);
    let mut reader = ResponseReader::default();
    let mut replies = Vec::new();
    let mut result = None;
    for byte in &bytes {
        if let Some(done) = reader
            .feed(std::slice::from_ref(byte), &mut replies)
            .unwrap()
        {
            result = Some(done);
        }
    }
    assert_eq!(result.as_deref(), Some(&message[..]));
    // SETTINGS ACK, then PING ACK with the same payload
    let mut expected = Vec::new();
    frame(&mut expected, 0x4, 0x1, 0, &[]);
    frame(&mut expected, 0x6, 0x1, 0, b"pingpong");
    assert_eq!(replies, expected);
    let mut reader = ResponseReader::default();
    assert_eq!(
        reader.feed(&bytes, &mut Vec::new()).unwrap().as_deref(),
        Some(&message[..])
    );
}

#[test]
fn server_errors_are_reported_with_their_codes() {
    let headers = {
        let mut b = vec![0x88];
        b.extend(indexed_block(&[("content-type", "application/grpc")]));
        b
    };
    let trailers_only = {
        let mut b = headers.clone();
        b.extend(indexed_block(&[
            ("grpc-status", "7"),
            ("grpc-message", "no%20access%3A %E2%9C%93"),
        ]));
        b
    };
    let mut cases: Vec<(&str, Vec<u8>, Http2Error)> = Vec::new();
    let mut b = Vec::new();
    frame(&mut b, 0x1, 0x5, 1, &trailers_only);
    cases.push((
        "trailers-only",
        b,
        Http2Error::Grpc {
            code: 7,
            name: "PERMISSION_DENIED",
            message: "no access: ✓".into(),
        },
    ));
    let mut b = Vec::new();
    frame(
        &mut b,
        0x7,
        0,
        0,
        &[0, 0, 0, 0, 0, 0, 0, 11, b'c', b'a', b'l', b'm'],
    );
    cases.push((
        "GOAWAY before our stream",
        b,
        Http2Error::GoAway {
            code: ErrorCode(11),
            last_stream: 0,
            debug: "calm".into(),
        },
    ));
    let mut b = Vec::new();
    frame(&mut b, 0x1, 0x4, 1, &headers);
    frame(&mut b, 0x3, 0, 1, &[0, 0, 0, 8]);
    cases.push(("RST_STREAM", b, Http2Error::Reset { code: ErrorCode(8) }));
    let mut b = Vec::new();
    frame(&mut b, 0x1, 0x4, 1, &[0x8d]); // :status 404
    cases.push((
        "HTTP 404",
        b,
        Http2Error::HttpStatus {
            status: "404".into(),
        },
    ));
    let mut b = Vec::new();
    frame(&mut b, 0x1, 0x4, 1, &headers);
    frame(&mut b, 0x0, 0x1, 1, &grpc_message(b""));
    cases.push(("no trailers", b, Http2Error::MissingStatus));
    let mut b = Vec::new();
    frame(&mut b, 0x9, 0x4, 1, &headers);
    cases.push((
        "stray CONTINUATION",
        b,
        Http2Error::Protocol("CONTINUATION without HEADERS"),
    ));
    let mut b = Vec::new();
    b.extend_from_slice(&[0x00, 0x40, 0x01, 0x0, 0, 0, 0, 0, 1]);
    cases.push((
        "frame too large",
        b,
        Http2Error::FrameTooLarge {
            length: 16_385,
            max: 16_384,
        },
    ));
    for (name, bytes, expected) in cases {
        let got = ResponseReader::default().feed(&bytes, &mut Vec::new());
        assert_eq!(got, Err(expected), "case {name}");
    }
}

#[test]
fn headers_split_over_continuation_frames_and_padding() {
    let message = grpc_message(b"");
    let mut block = vec![0x88];
    block.extend(indexed_block(&[("content-type", "application/grpc+proto")]));
    let (first, second) = block.split_at(3);
    let mut bytes = Vec::new();
    // HEADERS, PADDED + PRIORITY: pad length 2, 5 priority bytes, fragment, 2 bytes pad
    let mut payload = vec![2, 0, 0, 0, 0, 16];
    payload.extend_from_slice(first);
    payload.extend_from_slice(&[0, 0]);
    frame(&mut bytes, 0x1, 0x8 | 0x20, 1, &payload);
    frame(&mut bytes, 0x9, 0x4, 1, second);
    let mut data = vec![3];
    data.extend_from_slice(&message);
    data.extend_from_slice(&[0, 0, 0]);
    frame(&mut bytes, 0x0, 0x8, 1, &data);
    frame(
        &mut bytes,
        0x1,
        0x5,
        1,
        &indexed_block(&[("grpc-status", "0")]),
    );
    let got = ResponseReader::default()
        .feed(&bytes, &mut Vec::new())
        .unwrap();
    assert_eq!(got, Some(vec![]));
}

#[test]
fn the_request_is_a_preface_settings_window_headers_and_an_empty_message() {
    let bytes = http2::request(
        "/v1.PodResourcesLister/List",
        "localhost",
        Duration::from_secs(2),
    );
    assert!(bytes.starts_with(http2::PREFACE));
    // the last frame: DATA with END_STREAM on stream 1, the empty gRPC message
    assert!(bytes.ends_with(&[0, 0, 5, 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0]));
    // the HEADERS block decodes with the same HPACK code the server side uses
    let at = http2::PREFACE.len() + 9 + 18 + 9 + 4;
    let len = usize::from(bytes[at + 1]) << 8 | usize::from(bytes[at + 2]);
    assert_eq!(&bytes[at + 3..at + 5], &[0x1, 0x4]);
    let fields =
        http2::decode_block(&mut hpack::Table::default(), &bytes[at + 9..at + 9 + len]).unwrap();
    let text: Vec<(String, String)> = fields
        .into_iter()
        .map(|(n, v)| (String::from_utf8(n).unwrap(), String::from_utf8(v).unwrap()))
        .collect();
    assert!(
        text.contains(&(":path".into(), "/v1.PodResourcesLister/List".into())),
        "{text:?}"
    );
    assert!(
        text.contains(&("grpc-timeout".into(), "2000m".into())),
        "{text:?}"
    );
    assert!(text.contains(&("te".into(), "trailers".into())), "{text:?}");
}

proptest! {
    #[test]
    fn the_protobuf_decoder_never_panics(input in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = decode_list_response(&input);
    }

    /// Noise alone, and noise after a valid start (so the HPACK and DATA paths see it).
    #[test]
    fn the_frame_reader_never_panics(
        noise in proptest::collection::vec(any::<u8>(), 0..1024),
        split in 0usize..64,
    ) {
        let mut reader = ResponseReader::default();
        let _ = reader.feed(&noise, &mut Vec::new());
        let mut start = Vec::new();
        frame(&mut start, 0x1, 0x4, 1, &[0x88]);
        start.extend_from_slice(&noise);
        let mut reader = ResponseReader::default();
        let (a, b) = start.split_at(split.min(start.len()));
        if reader.feed(a, &mut Vec::new()).is_ok() {
            let _ = reader.feed(b, &mut Vec::new());
        }
    }
}

#[test]
fn a_message_over_16_mib_is_refused() {
    let mut bytes = Vec::new();
    let mut headers = vec![0x88];
    headers.extend(indexed_block(&[("content-type", "application/grpc")]));
    frame(&mut bytes, 0x1, 0x4, 1, &headers);
    let mut reader = ResponseReader::default();
    assert_eq!(reader.feed(&bytes, &mut Vec::new()), Ok(None));
    let chunk = vec![0u8; http2::MAX_FRAME];
    let mut data = Vec::new();
    frame(&mut data, 0x0, 0, 1, &chunk);
    let mut result = Ok(None);
    for _ in 0..=http2::MAX_MESSAGE / http2::MAX_FRAME {
        result = reader.feed(&data, &mut Vec::new());
        if result.is_err() {
            break;
        }
    }
    assert_eq!(
        result,
        Err(Http2Error::MessageTooLarge {
            max: http2::MAX_MESSAGE
        })
    );
}

#[path = "socket_tests.rs"]
mod socket;

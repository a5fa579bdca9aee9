#![allow(clippy::unwrap_used)]

use super::super::huffman;
use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

type Headers = Vec<(String, String)>;

/// Decodes `block` as h2 would, with `h2` standing for h2's copy of the table.
fn decode(h2: &mut BlockRewriter, block: &[u8]) -> Headers {
    h2.parse(block).unwrap();
    h2.fields
        .iter()
        .filter(|f| f.kind != Kind::SizeUpdate)
        .map(|f| {
            (
                String::from_utf8_lossy(&h2.arena[f.name.clone()]).into_owned(),
                String::from_utf8_lossy(&h2.arena[f.value.clone()]).into_owned(),
            )
        })
        .collect()
}

fn headers(list: &[(&str, &str)]) -> Headers {
    list.iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect()
}

/// RFC 7541 C.3 (raw) and C.4 (Huffman): three requests on one connection, with a
/// valid authority, pass through untouched, and decode to the RFC's headers.
#[test]
fn rfc_request_sequences_pass_untouched() {
    let c3 = [
        "8286 8441 0f77 7777 2e65 7861 6d70 6c65 2e63 6f6d",
        "8286 84be 5808 6e6f 2d63 6163 6865",
        "8287 85bf 400a 6375 7374 6f6d 2d6b 6579 0c63 7573 746f 6d2d 7661 6c75 65",
    ];
    let c4 = [
        "8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff",
        "8286 84be 5886 a8eb 1064 9cbf",
        "8287 85bf 4088 25a8 49e9 5ba9 7d7f 8925 a849 e95b b8e8 b4bf",
    ];
    let want = [
        headers(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
        ]),
        headers(&[
            (":method", "GET"),
            (":scheme", "http"),
            (":path", "/"),
            (":authority", "www.example.com"),
            ("cache-control", "no-cache"),
        ]),
        headers(&[
            (":method", "GET"),
            (":scheme", "https"),
            (":path", "/index.html"),
            (":authority", "www.example.com"),
            ("custom-key", "custom-value"),
        ]),
    ];
    for (name, blocks) in [("C.3", c3), ("C.4", c4)] {
        let mut rewriter = BlockRewriter::default();
        let mut h2 = BlockRewriter::default();
        for (i, block) in blocks.iter().enumerate() {
            let block = hex(block);
            assert_eq!(rewriter.rewrite(&block).unwrap(), None, "case {name}.{i}");
            assert_eq!(decode(&mut h2, &block), want[i], "case {name}.{i}");
        }
        // C.3.3 / C.4.3: the table holds three entries, 164 bytes.
        assert_eq!(rewriter.table.entries(), 3, "case {name}");
        assert_eq!(rewriter.table.size(), 164, "case {name}");
    }
}

/// A small HPACK encoder playing the client: each field coded as told.
#[derive(Clone, Copy)]
enum Rep {
    Indexed(usize),
    /// flags (0x40, 0x00, 0x10), name index (0: literal name), Huffman.
    Literal(u8, usize, bool),
    SizeUpdate(usize),
}

fn encode(fields: &[(Rep, &str, &str)]) -> Vec<u8> {
    let mut out = Vec::new();
    let string = |out: &mut Vec<u8>, s: &str, huffman: bool| {
        if huffman {
            let mut coded = Vec::new();
            huffman::encode(s.as_bytes(), &mut coded);
            write_int(out, 0x80, 7, coded.len());
            out.extend_from_slice(&coded);
        } else {
            write_str(out, s.as_bytes());
        }
    };
    for &(rep, name, value) in fields {
        match rep {
            Rep::Indexed(i) => write_int(&mut out, 0x80, 7, i),
            Rep::SizeUpdate(size) => write_int(&mut out, 0x20, 5, size),
            Rep::Literal(flags, index, huffman) => {
                write_int(&mut out, flags, if flags == 0x40 { 6 } else { 4 }, index);
                if index == 0 {
                    string(&mut out, name, huffman);
                }
                string(&mut out, value, huffman);
            }
        }
    }
    out
}

const SOCKET: &str = "/var/lib/kubelet/device-plugins/nvidia-gpu.sock";
const GRPCIO: &str = "var%2Flib%2Fkubelet%2Fdevice-plugins%2Fnvidia-gpu.sock";

fn request(authority: Rep, value: &'static str) -> Vec<(Rep, &'static str, &'static str)> {
    vec![
        (
            Rep::Literal(0x40, 4, false),
            ":path",
            "/v1beta1.DevicePlugin/Allocate",
        ),
        (authority, ":authority", value),
        (Rep::Indexed(3), ":method", "POST"),
        (Rep::Indexed(6), ":scheme", "http"),
        (
            Rep::Literal(0x40, 31, true),
            "content-type",
            "application/grpc",
        ),
        (Rep::Literal(0x40, 0, true), "te", "trailers"),
    ]
}

/// Each way a client can send a bad `:authority`, over three requests on one
/// connection (the later ones reference the table): h2's decoder, fed what we pass
/// on, always sees a valid authority, every other header as sent, and a table of the
/// client's size.
#[test]
fn bad_authorities_become_valid_and_tables_stay_in_step() {
    let cases: [(&str, Rep, &str, &str); 9] = [
        (
            "path, indexed name, raw",
            Rep::Literal(0x40, 1, false),
            SOCKET,
            "localhost",
        ),
        (
            "path, Huffman",
            Rep::Literal(0x40, 1, true),
            SOCKET,
            "localhost",
        ),
        ("grpcio's", Rep::Literal(0x40, 1, true), GRPCIO, "localhost"),
        (
            "literal name",
            Rep::Literal(0x40, 0, true),
            SOCKET,
            "localhost",
        ),
        (
            "not indexed",
            Rep::Literal(0x00, 1, false),
            SOCKET,
            "localhost",
        ),
        (
            "never indexed",
            Rep::Literal(0x10, 1, true),
            SOCKET,
            "localhost",
        ),
        ("static empty", Rep::Indexed(1), "", "localhost"),
        (
            "empty, not indexed",
            Rep::Literal(0x00, 1, false),
            "",
            "localhost",
        ),
        (
            "empty, indexed",
            Rep::Literal(0x40, 1, false),
            "",
            "localhost",
        ),
    ];
    for (name, rep, value, want) in cases {
        let mut rewriter = BlockRewriter::default();
        let mut h2 = BlockRewriter::default();
        let first = encode(&request(rep, value));
        // The second request finds the first's entries in the table: the authority
        // at 62 + 2 (te and content-type came later) when it was added.
        let again = if let Rep::Literal(0x40, ..) = rep {
            Rep::Indexed(64)
        } else {
            rep
        };
        let mut second = request(again, value);
        second[0].0 = Rep::Indexed(if matches!(rep, Rep::Literal(0x40, ..)) {
            65
        } else {
            64
        });
        second[4].0 = Rep::Indexed(63);
        second[5].0 = Rep::Indexed(62);
        for (i, block) in [first, encode(&second)].iter().enumerate() {
            let out = rewriter.rewrite(block).unwrap();
            let out = out.as_deref().unwrap_or(block);
            let seen = decode(&mut h2, out);
            let authority = &seen.iter().find(|(n, _)| n == ":authority").unwrap().1;
            assert!(
                acceptable(authority.as_bytes()),
                "case {name}.{i}: {authority:?}"
            );
            let expected_len = if matches!(rep, Rep::Literal(0x40, ..)) && !value.is_empty() {
                value.len()
            } else {
                want.len()
            };
            assert_eq!(authority.len(), expected_len, "case {name}.{i}");
            assert!(
                authority.starts_with(&want[..want.len().min(expected_len)]),
                "case {name}.{i}"
            );
            let others: Headers = seen
                .iter()
                .filter(|(n, _)| n != ":authority")
                .cloned()
                .collect();
            assert_eq!(
                others,
                headers(&[
                    (":path", "/v1beta1.DevicePlugin/Allocate"),
                    (":method", "POST"),
                    (":scheme", "http"),
                    ("content-type", "application/grpc"),
                    ("te", "trailers"),
                ]),
                "case {name}.{i}"
            );
            if !rewriter.reencode {
                assert_eq!(rewriter.table.size(), h2.table.size(), "case {name}.{i}");
            }
        }
        assert_eq!(
            rewriter.reencode,
            name == "empty, indexed",
            "case {name}: re-encoding only for an empty authority added to the table"
        );
        assert!(rewriter.rewritten() >= 1, "case {name}");
    }
}

#[test]
fn valid_authorities_are_left_alone() {
    for value in [
        "localhost",
        "[::]:50051",
        "127.0.0.1:80",
        "example.com",
        "x",
    ] {
        let block = encode(&request(Rep::Literal(0x40, 1, true), value));
        let mut rewriter = BlockRewriter::default();
        assert_eq!(rewriter.rewrite(&block).unwrap(), None, "case {value}");
    }
}

#[test]
fn substitutes_are_valid_at_every_length() {
    for len in 1..=300 {
        let value = substitute(len);
        assert_eq!(value.len(), len);
        assert!(acceptable(&value), "length {len}: {value:?}");
    }
    assert!(!acceptable(b""));
    assert!(!acceptable(SOCKET.as_bytes()));
    assert!(!acceptable(GRPCIO.as_bytes()));
}

/// Evictions: a small table, many requests with fresh bad authorities; the two
/// tables must keep the same size and h2 must find each index the client used.
#[test]
fn evictions_keep_the_tables_in_step() {
    let mut rewriter = BlockRewriter::default();
    let mut h2 = BlockRewriter::default();
    let paths: Vec<String> = (0..40)
        .map(|i| format!("/run/plugin-{i}/{}.sock", "x".repeat(i)))
        .collect();
    for (i, path) in paths.iter().enumerate() {
        let mut fields = vec![(
            Rep::Literal(0x40, 1, i % 2 == 0),
            ":authority",
            path.as_str(),
        )];
        if i == 0 {
            fields.insert(0, (Rep::SizeUpdate(300), "", ""));
        }
        if i > 0 {
            // The previous request's authority, now at index 63 (this one is 62).
            fields.push((Rep::Indexed(63), ":authority", ""));
        }
        let block = encode(&fields);
        let out = rewriter.rewrite(&block).unwrap();
        let seen = decode(&mut h2, out.as_deref().unwrap_or(&block));
        assert!(
            seen.iter().all(|(_, v)| acceptable(v.as_bytes())),
            "request {i}: {seen:?}"
        );
        assert_eq!(seen[0].1.len(), path.len(), "request {i}");
        assert_eq!(rewriter.table.size(), h2.table.size(), "request {i}");
        assert_eq!(rewriter.table.entries(), h2.table.entries(), "request {i}");
    }
}

#[test]
fn bad_blocks_are_errors() {
    let big = "v".repeat(4000);
    let mut bomb = encode(&[(Rep::Literal(0x40, 0, false), "k", &big)]);
    bomb.extend(std::iter::repeat_n(0xbe, 20)); // 20 references to it: 80 KB
    let cases: [(&str, Vec<u8>, HpackError); 5] = [
        ("index 0", vec![0x80], HpackError::BadIndex(0)),
        ("unknown index", vec![0xff, 0x00], HpackError::BadIndex(127)),
        (
            "truncated string",
            vec![0x41, 0x05, b'a'],
            HpackError::Truncated,
        ),
        (
            "late size update",
            vec![0x82, 0x20],
            HpackError::LateSizeUpdate,
        ),
        (
            "bomb",
            bomb,
            HpackError::TooLarge {
                limit: MAX_HEADER_LIST,
            },
        ),
    ];
    for (name, block, want) in cases {
        let mut rewriter = BlockRewriter::default();
        assert_eq!(rewriter.rewrite(&block), Err(want), "case {name}");
    }
}

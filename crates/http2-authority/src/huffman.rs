//! HPACK's Huffman code (RFC 7541, Appendix B). The rewriter only decodes: what it
//! writes is raw (a raw string decodes to the same bytes, which is all h2 needs);
//! [`encode`] is for tests and fuzzing, which play the client.
//!
//! The code is canonical: codes of one length are consecutive numbers in symbol order,
//! and each length's first code follows from the counts of the shorter ones. So the
//! 257 code lengths below are the whole table; the decoder is built from them at
//! compile time.

/// The code length in bits of each symbol: bytes 0–255, then EOS (256).
const LENGTHS: [u8; 257] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, // 0x00
    28, 28, 28, 28, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 28, // 0x10
    6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, // ' ' .. '/'
    5, 5, 5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, // '0' .. '?'
    13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, // '@' .. 'O'
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, // 'P' .. '_'
    15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6, 6, 5, // '`' .. 'o'
    6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, // 'p' .. 0x7f
    20, 22, 20, 20, 22, 22, 22, 23, 22, 23, 23, 23, 23, 23, 24, 23, // 0x80
    24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, // 0x90
    22, 21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, // 0xa0
    21, 21, 22, 21, 23, 22, 23, 23, 20, 22, 22, 22, 23, 22, 22, 23, // 0xb0
    26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, // 0xc0
    19, 21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, // 0xd0
    20, 24, 20, 21, 22, 21, 21, 23, 22, 22, 25, 25, 24, 24, 26, 23, // 0xe0
    26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26, // 0xf0
    30, // EOS
];

const EOS: u16 = 256;
const MAX_LEN: usize = 30;

/// The canonical decoding tables: for each length, how many codes it has, the first
/// code's value, and where its symbols start in `symbols` (sorted by length, then
/// symbol).
struct Canonical {
    count: [u16; MAX_LEN + 1],
    first: [u32; MAX_LEN + 1],
    offset: [u16; MAX_LEN + 1],
    symbols: [u16; 257],
}

const CANONICAL: Canonical = canonical();

const fn canonical() -> Canonical {
    let mut count = [0u16; MAX_LEN + 1];
    let mut s = 0;
    while s < LENGTHS.len() {
        count[LENGTHS[s] as usize] += 1;
        s += 1;
    }
    let mut first = [0u32; MAX_LEN + 1];
    let mut offset = [0u16; MAX_LEN + 1];
    let mut code = 0u32;
    let mut at = 0u16;
    let mut len = 1;
    while len <= MAX_LEN {
        first[len] = code;
        offset[len] = at;
        code = (code + count[len] as u32) << 1;
        at += count[len];
        len += 1;
    }
    let mut symbols = [0u16; 257];
    let mut next = offset;
    let mut s = 0;
    while s < LENGTHS.len() {
        let len = LENGTHS[s] as usize;
        symbols[next[len] as usize] = s as u16;
        next[len] += 1;
        s += 1;
    }
    Canonical {
        count,
        first,
        offset,
        symbols,
    }
}

/// Why a Huffman-coded string does not decode (RFC 7541, 5.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HuffmanError {
    #[error("the EOS symbol inside a Huffman-coded string")]
    Eos,
    #[error("a Huffman-coded string ends with padding longer than 7 bits or not all ones")]
    Padding,
}

/// Decodes a Huffman-coded string, appending the bytes to `out`.
pub fn decode(input: &[u8], out: &mut Vec<u8>) -> Result<(), HuffmanError> {
    let table = &CANONICAL;
    let mut code = 0u32;
    let mut len = 0usize;
    for byte in input {
        for shift in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> shift) & 1);
            len += 1;
            if len > MAX_LEN {
                // No code is this long: only a run of 1s (EOS's prefix) gets here,
                // and 30 ones is EOS itself, refused below before this can happen.
                return Err(HuffmanError::Eos);
            }
            let Some(rank) = code.checked_sub(table.first[len]) else {
                continue;
            };
            if rank < u32::from(table.count[len]) {
                let symbol = table.symbols[usize::from(table.offset[len]) + rank as usize];
                if symbol == EOS {
                    return Err(HuffmanError::Eos);
                }
                out.push(symbol as u8);
                code = 0;
                len = 0;
            }
        }
    }
    // What is left must be a strict prefix of EOS (all ones), at most 7 bits.
    if len > 7 || code != (1u32 << len) - 1 {
        return Err(HuffmanError::Padding);
    }
    Ok(())
}

/// Huffman-codes `input`, appending to `out` (padded with EOS's leading ones).
pub fn encode(input: &[u8], out: &mut Vec<u8>) {
    let table = &CANONICAL;
    let mut bits = 0u64;
    let mut held = 0u32;
    for &byte in input {
        let len = usize::from(LENGTHS[usize::from(byte)]);
        let start = usize::from(table.offset[len]);
        let end = start + usize::from(table.count[len]);
        let rank = table.symbols[start..end]
            .iter()
            .position(|&s| s == u16::from(byte))
            .unwrap_or_default();
        let code = table.first[len] + rank as u32;
        bits = (bits << len) | u64::from(code);
        held += len as u32;
        while held >= 8 {
            held -= 8;
            out.push((bits >> held) as u8);
        }
    }
    if held > 0 {
        let pad = 8 - held;
        out.push(((bits << pad) | ((1 << pad) - 1)) as u8);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn decoded(input: &[u8]) -> Result<Vec<u8>, HuffmanError> {
        let mut out = Vec::new();
        decode(input, &mut out).map(|()| out)
    }

    /// The Huffman-coded strings of RFC 7541, Appendix C.4 and C.6.
    #[test]
    fn rfc_examples() {
        let cases = [
            (
                "C.4.1 authority",
                "f1e3 c2e5 f23a 6ba0 ab90 f4ff",
                "www.example.com",
            ),
            ("C.4.2 no-cache", "a8eb 1064 9cbf", "no-cache"),
            ("C.4.3 custom-key", "25a8 49e9 5ba9 7d7f", "custom-key"),
            (
                "C.4.3 custom-value",
                "25a8 49e9 5bb8 e8b4 bf",
                "custom-value",
            ),
            ("C.6.1 302", "6402", "302"),
            ("C.6.1 private", "aec3 771a 4b", "private"),
            (
                "C.6.1 date",
                "d07a be94 1054 d444 a820 0595 040b 8166 e082 a62d 1bff",
                "Mon, 21 Oct 2013 20:13:21 GMT",
            ),
            (
                "C.6.1 location",
                "9d29 ad17 1863 c78f 0b97 c8e9 ae82 ae43 d3",
                "https://www.example.com",
            ),
            (
                "C.6.3 cookie",
                "94e7 821d d7f2 e6c7 b335 dfdf cd5b 3960 d5af 2708 7f36 72c1 ab27 0fb5 291f 9587 3160 65c0 03ed 4ee5 b106 3d50 07",
                "foo=ASDJKHQKBZXOQWEOPIUAXQWEOIU; max-age=3600; version=1",
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(
                decoded(&hex(input)).unwrap(),
                want.as_bytes(),
                "case {name}"
            );
        }
    }

    #[test]
    fn bad_padding_and_eos() {
        let cases: [(&str, &[u8], HuffmanError); 4] = [
            // '0' is 00000; three padding bits of 0 are not EOS's prefix.
            ("zero padding", &[0b0000_0000], HuffmanError::Padding),
            // A whole byte of 1s after a complete symbol: 8 bits of padding.
            ("long padding", &[0b0000_0111, 0xff], HuffmanError::Padding),
            // Thirty 1s are EOS.
            ("eos", &[0xff, 0xff, 0xff, 0xfc], HuffmanError::Eos),
            ("all ones", &[0xff; 5], HuffmanError::Eos),
        ];
        for (name, input, want) in cases {
            assert_eq!(decoded(input), Err(want), "case {name}");
        }
        assert_eq!(decoded(&[]).unwrap(), b"", "empty");
        // '0' then 3 bits of EOS prefix.
        assert_eq!(decoded(&[0b0000_0111]).unwrap(), b"0", "short padding");
    }

    #[test]
    fn encode_round_trips_every_byte() {
        let all: Vec<u8> = (0..=255).collect();
        for input in [
            &all[..],
            b"www.example.com",
            b"",
            b"/var/lib/kubelet/device-plugins/x.sock",
        ] {
            let mut coded = Vec::new();
            encode(input, &mut coded);
            assert_eq!(decoded(&coded).unwrap(), input);
        }
        let mut coded = Vec::new();
        encode(b"www.example.com", &mut coded);
        assert_eq!(
            coded,
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff"),
            "RFC 7541 C.4.1"
        );
    }

    #[test]
    fn every_symbol_has_its_length() {
        // Canonical codes must fill the code space exactly (Kraft equality).
        let kraft: f64 = LENGTHS.iter().map(|&l| 0.5f64.powi(i32::from(l))).sum();
        assert!((kraft - 1.0).abs() < 1e-12, "kraft sum {kraft}");
    }
}

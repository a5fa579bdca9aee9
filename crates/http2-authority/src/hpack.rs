//! HPACK (RFC 7541) pieces for reading a client's header blocks: prefixed integers,
//! string literals, the static table, and a mirror of the client encoder's dynamic
//! table. Nothing here allocates more than the block it reads, and the table never
//! holds more than its size limit.

use std::collections::VecDeque;

use super::huffman::{self, HuffmanError};

/// Why a header block does not decode.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HpackError {
    #[error("header block ends inside a field")]
    Truncated,
    #[error("integer too large in a header block")]
    Overflow,
    #[error("header index {0} is not in the table")]
    BadIndex(usize),
    #[error("dynamic table size update to {size} (largest allowed {max})")]
    TableSize { size: usize, max: usize },
    #[error("dynamic table size update after the first field of a block")]
    LateSizeUpdate,
    #[error(transparent)]
    Huffman(#[from] HuffmanError),
    #[error("header block decodes to more than {limit} bytes")]
    TooLarge { limit: usize },
}

/// The largest dynamic table we mirror. h2 lets a client use 4,096 bytes (it never
/// advertises another `SETTINGS_HEADER_TABLE_SIZE` for tonic); a larger size update
/// is h2's to refuse, so we only bound our own memory here.
pub const MAX_TABLE_SIZE: usize = 64 * 1024;
/// The table size every HTTP/2 connection starts with (RFC 7540, 6.5.2).
pub const INITIAL_TABLE_SIZE: usize = 4096;
/// What an entry costs on top of its name and value (RFC 7541, 4.1).
const ENTRY_OVERHEAD: usize = 32;

/// The static table (RFC 7541, Appendix A); index 1 is `STATIC[0]`.
pub const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// The static index of `:authority` (with an empty value).
pub const AUTHORITY_INDEX: usize = 1;
pub const AUTHORITY: &[u8] = b":authority";

/// The static index of the first entry named `name`, if any.
pub fn static_name_index(name: &[u8]) -> Option<usize> {
    STATIC
        .iter()
        .position(|(n, _)| n.as_bytes() == name)
        .map(|i| i + 1)
}

/// Reads an integer with an `n`-bit prefix (RFC 7541, 5.1) from `input[*at..]`.
pub fn read_int(input: &[u8], at: &mut usize, prefix_bits: u8) -> Result<usize, HpackError> {
    let first = *input.get(*at).ok_or(HpackError::Truncated)?;
    *at += 1;
    let max_prefix = (1usize << prefix_bits) - 1;
    let mut value = usize::from(first) & max_prefix;
    if value < max_prefix {
        return Ok(value);
    }
    // At most 4 continuation bytes: 28 more bits, far beyond any real length or
    // index, and no risk of overflow on any platform we build for.
    for shift in (0..28).step_by(7) {
        let byte = *input.get(*at).ok_or(HpackError::Truncated)?;
        *at += 1;
        value += usize::from(byte & 0x7f) << shift;
        if byte & 0x80 == 0 {
            return Ok(value);
        }
    }
    Err(HpackError::Overflow)
}

/// Appends an integer with an `n`-bit prefix; `flags` fills the bits above it.
pub fn write_int(out: &mut Vec<u8>, flags: u8, prefix_bits: u8, mut value: usize) {
    let max_prefix = (1usize << prefix_bits) - 1;
    if value < max_prefix {
        out.push(flags | value as u8);
        return;
    }
    out.push(flags | max_prefix as u8);
    value -= max_prefix;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// Appends a raw (not Huffman-coded) string literal.
pub fn write_str(out: &mut Vec<u8>, value: &[u8]) {
    write_int(out, 0, 7, value.len());
    out.extend_from_slice(value);
}

/// A string literal as it stands in the block: where its bytes are and how coded.
#[derive(Debug, Clone, Copy)]
pub struct StrLit<'a> {
    pub huffman: bool,
    pub bytes: &'a [u8],
}

impl StrLit<'_> {
    /// The decoded string.
    pub fn decode(&self) -> Result<Vec<u8>, HpackError> {
        if self.huffman {
            // Huffman codes are at least 5 bits a byte: 8/5 of the input at most.
            let mut out = Vec::with_capacity(self.bytes.len() * 8 / 5);
            huffman::decode(self.bytes, &mut out)?;
            Ok(out)
        } else {
            Ok(self.bytes.to_vec())
        }
    }
}

/// Reads a string literal (RFC 7541, 5.2) from `input[*at..]` without decoding it.
pub fn read_str<'a>(input: &'a [u8], at: &mut usize) -> Result<StrLit<'a>, HpackError> {
    let huffman = input.get(*at).ok_or(HpackError::Truncated)? & 0x80 != 0;
    let len = read_int(input, at, 7)?;
    let end = at.checked_add(len).ok_or(HpackError::Truncated)?;
    let bytes = input.get(*at..end).ok_or(HpackError::Truncated)?;
    *at = end;
    Ok(StrLit { huffman, bytes })
}

/// One table entry: name and value.
type Entry = (Box<[u8]>, Box<[u8]>);

/// The client encoder's dynamic table as the client sees it (RFC 7541, 2.3.2): the
/// newest entry first, evicted from the back when the size limit is passed.
#[derive(Debug, Clone)]
pub struct Table {
    entries: VecDeque<Entry>,
    size: usize,
    max: usize,
}

impl Default for Table {
    fn default() -> Self {
        Self {
            entries: VecDeque::new(),
            size: 0,
            max: INITIAL_TABLE_SIZE,
        }
    }
}

impl Table {
    /// The entry at a 1-based HPACK index: the static table, then this one.
    pub fn get(&self, index: usize) -> Result<(&[u8], &[u8]), HpackError> {
        if index == 0 {
            return Err(HpackError::BadIndex(index));
        }
        if let Some((name, value)) = STATIC.get(index - 1) {
            return Ok((name.as_bytes(), value.as_bytes()));
        }
        self.entries
            .get(index - 1 - STATIC.len())
            .map(|(n, v)| (&**n, &**v))
            .ok_or(HpackError::BadIndex(index))
    }

    /// Adds an entry, evicting old ones to make room; one larger than the whole
    /// table empties it (RFC 7541, 4.4).
    pub fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let cost = name.len() + value.len() + ENTRY_OVERHEAD;
        if cost > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.size += cost;
        self.evict();
        self.entries
            .push_front((name.into_boxed_slice(), value.into_boxed_slice()));
    }

    /// A dynamic table size update.
    pub fn resize(&mut self, max: usize) -> Result<(), HpackError> {
        if max > MAX_TABLE_SIZE {
            return Err(HpackError::TableSize {
                size: max,
                max: MAX_TABLE_SIZE,
            });
        }
        self.max = max;
        self.evict();
        Ok(())
    }

    fn evict(&mut self) {
        while self.size > self.max {
            match self.entries.pop_back() {
                Some((name, value)) => self.size -= name.len() + value.len() + ENTRY_OVERHEAD,
                None => {
                    self.size = 0;
                    break;
                }
            }
        }
    }

    #[cfg(test)]
    pub fn entries(&self) -> usize {
        self.entries.len()
    }

    #[cfg(test)]
    pub fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn integers_round_trip_and_match_the_rfc() {
        // RFC 7541, C.1: 10 with a 5-bit prefix, 1337 with a 5-bit prefix, 42 with 8.
        let cases: [(&str, u8, usize, &[u8]); 3] = [
            ("C.1.1", 5, 10, &[0x0a]),
            ("C.1.2", 5, 1337, &[0x1f, 0x9a, 0x0a]),
            ("C.1.3", 8, 42, &[0x2a]),
        ];
        for (name, bits, value, bytes) in cases {
            let mut out = Vec::new();
            write_int(&mut out, 0, bits, value);
            assert_eq!(out, bytes, "case {name} write");
            let mut at = 0;
            assert_eq!(
                read_int(bytes, &mut at, bits).unwrap(),
                value,
                "case {name} read"
            );
            assert_eq!(at, bytes.len(), "case {name} consumed");
        }
        for value in [0, 1, 14, 15, 16, 126, 127, 128, 300, 16_383, 1 << 20] {
            for bits in 1..=8 {
                let mut out = Vec::new();
                write_int(&mut out, 0, bits, value);
                let mut at = 0;
                assert_eq!(
                    read_int(&out, &mut at, bits).unwrap(),
                    value,
                    "{value}/{bits}"
                );
            }
        }
    }

    #[test]
    fn bad_integers() {
        let mut at = 0;
        assert_eq!(
            read_int(&[0x1f, 0x80], &mut at, 5),
            Err(HpackError::Truncated)
        );
        let mut at = 0;
        let long = [0x1f, 0xff, 0xff, 0xff, 0xff, 0x01];
        assert_eq!(read_int(&long, &mut at, 5), Err(HpackError::Overflow));
        let mut at = 0;
        assert_eq!(read_int(&[], &mut at, 5), Err(HpackError::Truncated));
    }

    #[test]
    fn table_evicts_oldest_and_indexes_newest_first() {
        let mut table = Table::default();
        table.resize(100).unwrap();
        table.insert(b"a".to_vec(), b"1".to_vec()); // 34
        table.insert(b"b".to_vec(), b"2".to_vec()); // 68
        assert_eq!(table.get(62).unwrap(), (&b"b"[..], &b"2"[..]));
        assert_eq!(table.get(63).unwrap(), (&b"a"[..], &b"1"[..]));
        table.insert(b"c".to_vec(), b"3".to_vec()); // 102 > 100: "a" goes
        assert_eq!(table.entries(), 2);
        assert_eq!(table.size(), 68);
        assert_eq!(table.get(64), Err(HpackError::BadIndex(64)));
        table.insert(vec![b'x'; 100], Vec::new()); // larger than the table
        assert_eq!(table.entries(), 0);
        assert_eq!(table.get(1).unwrap(), (AUTHORITY, &b""[..]));
        assert_eq!(table.get(0), Err(HpackError::BadIndex(0)));
        assert!(table.resize(MAX_TABLE_SIZE + 1).is_err());
    }
}

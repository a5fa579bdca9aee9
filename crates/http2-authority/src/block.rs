//! One connection's header blocks, read as h2 will read them, with every `:authority`
//! that h2 would refuse replaced by one it accepts.
//!
//! h2 decodes with its own copy of the client's dynamic table, so whatever we hand it
//! must leave that copy in step with the client's encoder: the same entries, of the
//! same sizes, in the same order. Hence the two ways a block is rewritten:
//!
//! - **In place** (the usual case): fields that need no change are copied byte for
//!   byte; a bad `:authority` added to the table becomes an entry of the same decoded
//!   length (`localhost`, cut or padded with `0`), so every later eviction and index
//!   agrees; one not added to the table, or the static table's empty `:authority`,
//!   becomes a literal `localhost` that h2 does not keep.
//! - **Re-encoded** (only after an *empty* `:authority` that the client adds to its
//!   table: no valid authority has length 0): from that block on, every field is
//!   written as a literal that h2 does not add to its table, decoded from the client's
//!   table, which we go on mirroring. h2's table then never changes again and cannot
//!   disagree with anything.

use std::ops::Range;

use super::hpack::{
    AUTHORITY, AUTHORITY_INDEX, HpackError, Table, read_int, read_str, static_name_index,
    write_int, write_str,
};

/// The most decoded header bytes one block may hold (names, values and 32 bytes a
/// field, as `SETTINGS_MAX_HEADER_LIST_SIZE` counts them). Kubelet sends about 300;
/// tonic's h2 refuses requests above 16 KiB anyway. It bounds what a block of
/// references to one large table entry can make us allocate.
pub const MAX_HEADER_LIST: usize = 64 * 1024;
/// What a bad `:authority` becomes when its length is free.
const LOCALHOST: &[u8] = b"localhost";

/// How a field stands in the block (RFC 7541, 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// A table reference.
    Indexed(usize),
    /// A literal: `0x40` added to the table, `0x00` not, `0x10` never.
    Literal {
        flags: u8,
        name_index: Option<usize>,
    },
    /// A dynamic table size update.
    SizeUpdate,
}

const INCREMENTAL: u8 = 0x40;
const WITHOUT_INDEXING: u8 = 0x00;
const NEVER_INDEXED: u8 = 0x10;

/// One field of a block: how it was coded, where it stands, and its decoded name and
/// value (as ranges into the rewriter's arena).
#[derive(Debug, Clone)]
struct Field {
    kind: Kind,
    bytes: Range<usize>,
    name: Range<usize>,
    value: Range<usize>,
}

/// What to do with a field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fix {
    Keep,
    /// A valid authority of this many bytes, added to the table as the client's was.
    SameLength(usize),
    /// `localhost`, not added to the table.
    Localhost,
    /// Cannot be fixed in place: re-encode.
    Reencode,
}

/// The state of one connection's header decoding.
#[derive(Debug, Default)]
pub struct BlockRewriter {
    table: Table,
    reencode: bool,
    arena: Vec<u8>,
    fields: Vec<Field>,
    rewritten: u64,
}

impl BlockRewriter {
    /// How many `:authority` fields were replaced so far.
    pub fn rewritten(&self) -> u64 {
        self.rewritten
    }

    /// Reads one complete header block. `Ok(None)`: pass it on as it is; `Ok(Some)`:
    /// hand h2 this block instead. On an error the table may be out of step: the
    /// connection must stop being rewritten.
    pub fn rewrite(&mut self, block: &[u8]) -> Result<Option<Vec<u8>>, HpackError> {
        self.parse(block)?;
        let fixes: Vec<Fix> = self.fields.iter().map(|f| self.fix(f)).collect();
        if fixes.contains(&Fix::Reencode) {
            self.reencode = true;
        }
        if self.reencode {
            return Ok(Some(self.reencoded()));
        }
        if fixes.iter().all(|f| *f == Fix::Keep) {
            return Ok(None);
        }
        let mut out = Vec::with_capacity(block.len() + 16);
        for (field, fix) in self.fields.iter().zip(&fixes) {
            match *fix {
                // Re-encoding was decided above; no field is left to it here.
                Fix::Keep | Fix::Reencode => out.extend_from_slice(&block[field.bytes.clone()]),
                Fix::SameLength(len) => {
                    self.write_literal_name(&mut out, field, INCREMENTAL, 6);
                    write_str(&mut out, &substitute(len));
                    self.rewritten += 1;
                }
                Fix::Localhost => {
                    let flags = match field.kind {
                        Kind::Literal { flags, .. } if flags == NEVER_INDEXED => NEVER_INDEXED,
                        _ => WITHOUT_INDEXING,
                    };
                    self.write_literal_name(&mut out, field, flags, 4);
                    write_str(&mut out, LOCALHOST);
                    self.rewritten += 1;
                }
            }
        }
        Ok(Some(out))
    }

    /// Decodes every field of `block` into `self.fields`, updating the table as the
    /// client's encoder did.
    fn parse(&mut self, block: &[u8]) -> Result<(), HpackError> {
        self.arena.clear();
        self.fields.clear();
        let mut listed = 0usize;
        let mut at = 0;
        while at < block.len() {
            let start = at;
            let first = block[at];
            let (kind, name, value) = if first & 0x80 != 0 {
                let index = read_int(block, &mut at, 7)?;
                let (name, value) = self.table.get(index)?;
                let name = push(&mut self.arena, name);
                let value = push(&mut self.arena, value);
                (Kind::Indexed(index), name, value)
            } else if first & 0xe0 == 0x20 {
                if !self.fields.iter().all(|f| f.kind == Kind::SizeUpdate) {
                    return Err(HpackError::LateSizeUpdate);
                }
                let size = read_int(block, &mut at, 5)?;
                self.table.resize(size)?;
                (Kind::SizeUpdate, 0..0, 0..0)
            } else {
                let (flags, bits) = match first & 0xf0 {
                    0x00 => (WITHOUT_INDEXING, 4),
                    0x10 => (NEVER_INDEXED, 4),
                    _ => (INCREMENTAL, 6),
                };
                let index = read_int(block, &mut at, bits)?;
                let (name_index, name) = if index == 0 {
                    let literal = read_str(block, &mut at)?.decode()?;
                    (None, push(&mut self.arena, &literal))
                } else {
                    let (name, _) = self.table.get(index)?;
                    (Some(index), push(&mut self.arena, name))
                };
                let literal = read_str(block, &mut at)?.decode()?;
                let value = push(&mut self.arena, &literal);
                if flags == INCREMENTAL {
                    self.table
                        .insert(self.arena[name.clone()].to_vec(), literal);
                }
                (Kind::Literal { flags, name_index }, name, value)
            };
            listed += name.len() + value.len() + 32;
            if listed > MAX_HEADER_LIST {
                return Err(HpackError::TooLarge {
                    limit: MAX_HEADER_LIST,
                });
            }
            self.fields.push(Field {
                kind,
                bytes: start..at,
                name,
                value,
            });
        }
        Ok(())
    }

    /// What an in-place rewrite must do with `field`.
    fn fix(&self, field: &Field) -> Fix {
        if &self.arena[field.name.clone()] != AUTHORITY {
            return Fix::Keep;
        }
        let value = &self.arena[field.value.clone()];
        match field.kind {
            Kind::SizeUpdate => Fix::Keep,
            // A dynamic entry holds what h2 was given for it, valid by construction;
            // the static table's `:authority` is empty.
            Kind::Indexed(index) if index != AUTHORITY_INDEX => Fix::Keep,
            Kind::Indexed(_) => Fix::Localhost,
            Kind::Literal { .. } if acceptable(value) => Fix::Keep,
            Kind::Literal { flags, .. } if flags == INCREMENTAL => match value.len() {
                0 => Fix::Reencode,
                len => Fix::SameLength(len),
            },
            Kind::Literal { .. } => Fix::Localhost,
        }
    }

    /// Writes a literal field's first byte(s) and name: the client's name index when
    /// it had one (static or dynamic: both tables agree on names), else the name.
    fn write_literal_name(&self, out: &mut Vec<u8>, field: &Field, flags: u8, bits: u8) {
        match field.kind {
            Kind::Literal {
                name_index: Some(index),
                ..
            } => write_int(out, flags, bits, index),
            Kind::Indexed(index) => write_int(out, flags, bits, index),
            _ => {
                write_int(out, flags, bits, 0);
                write_str(out, &self.arena[field.name.clone()]);
            }
        }
    }

    /// The block as literals h2 does not keep, with bad authorities fixed.
    fn reencoded(&mut self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.arena.len() + 4 * self.fields.len());
        for field in &self.fields {
            let flags = match field.kind {
                Kind::SizeUpdate => continue,
                Kind::Literal { flags, .. } if flags == NEVER_INDEXED => NEVER_INDEXED,
                _ => WITHOUT_INDEXING,
            };
            let name = &self.arena[field.name.clone()];
            let mut value = &self.arena[field.value.clone()];
            if name == AUTHORITY && !acceptable(value) {
                value = LOCALHOST;
                self.rewritten += 1;
            }
            match static_name_index(name) {
                Some(index) => write_int(&mut out, flags, 4, index),
                None => {
                    write_int(&mut out, flags, 4, 0);
                    write_str(&mut out, name);
                }
            }
            write_str(&mut out, value);
        }
        out
    }
}

/// Appends `bytes` to the arena and says where they are.
fn push(arena: &mut Vec<u8>, bytes: &[u8]) -> Range<usize> {
    let start = arena.len();
    arena.extend_from_slice(bytes);
    start..arena.len()
}

/// Whether h2 takes `value` as an `:authority` (it parses it with `http`'s
/// `Authority`, exactly as here).
pub fn acceptable(value: &[u8]) -> bool {
    http::uri::Authority::try_from(value).is_ok()
}

/// A valid authority of exactly `len` bytes (`len >= 1`): `localhost`, cut short or
/// padded with `0`s.
pub fn substitute(len: usize) -> Vec<u8> {
    let mut value: Vec<u8> = LOCALHOST.iter().copied().take(len).collect();
    value.resize(len, b'0');
    value
}

#[cfg(test)]
#[path = "block_tests.rs"]
mod tests;

// SPDX-License-Identifier: Apache-2.0
//! Reading a cache from bytes. Every read goes through `slice::get`, every offset sum is done in
//! `u64`, and counts are checked against the buffer before anything is allocated.

use super::{
    ENDIAN_LITTLE, EXTENSION_HEADER_SIZE, EXTENSION_MAGIC, EXTENSION_SECTION_SIZE,
    EXTENSION_TAG_GENERATOR, Entry, Format, LdCache, LdCacheError, NEW_ALIGN, NEW_ENTRY_SIZE,
    NEW_HEADER_SIZE, NEW_MAGIC, OLD_ENTRY_SIZE, OLD_HEADER_SIZE, OLD_MAGIC,
};

/// Decoded strings may add up to this many times the file size, plus [`STRING_SLACK`]. Real
/// caches share suffixes (the key is the tail of the value) and come in well under 2x; the cap
/// stops a crafted file whose entries all point into one long string from costing
/// `entries × length` bytes of memory.
const STRING_FACTOR: u64 = 4;
const STRING_SLACK: u64 = 64 << 10;
/// How much of a non-UTF-8 string an error quotes.
const QUOTE_LIMIT: usize = 256;

/// Parses a cache in any of the three layouts. The new layout is tried at offset 0, then the
/// old one, whose entries are used only when no new-format cache follows them. Entries come
/// out in file order; offsets, counts, strings and the header's endianness are all checked, and
/// any problem with them is an error rather than a partial result, except that an entry whose
/// strings are not UTF-8 is left out and counted (`skipped_not_utf8`). (A malformed extension
/// directory only costs the generator string, as it costs `ld.so` nothing.)
pub fn parse(bytes: &[u8]) -> Result<LdCache, LdCacheError> {
    if bytes.is_empty() {
        return Err(LdCacheError::Empty);
    }
    if bytes.starts_with(NEW_MAGIC) {
        let (entries, generator, skipped_not_utf8) = parse_new(bytes, 0)?;
        return Ok(LdCache {
            entries,
            format: Format::New,
            generator,
            skipped_not_utf8,
        });
    }
    if bytes.starts_with(OLD_MAGIC) {
        return parse_old(bytes);
    }
    let have = len64(bytes);
    if NEW_MAGIC.starts_with(bytes) {
        return Err(LdCacheError::Truncated {
            what: "new-format header",
            need: NEW_HEADER_SIZE as u64,
            have,
        });
    }
    if OLD_MAGIC.starts_with(bytes) {
        return Err(LdCacheError::Truncated {
            what: "old-format header",
            need: OLD_HEADER_SIZE as u64,
            have,
        });
    }
    let shown = bytes.get(..NEW_MAGIC.len()).unwrap_or(bytes);
    Err(LdCacheError::BadMagic {
        found: shown.escape_ascii().to_string(),
    })
}

/// The old layout, or the compat layout when a new-format cache follows the old entries.
fn parse_old(bytes: &[u8]) -> Result<LdCache, LdCacheError> {
    let have = len64(bytes);
    let nlibs = u32_at(bytes, 12).ok_or(LdCacheError::Truncated {
        what: "old-format header",
        need: OLD_HEADER_SIZE as u64,
        have,
    })?;
    let strings_at = OLD_HEADER_SIZE as u64 + u64::from(nlibs) * OLD_ENTRY_SIZE as u64;
    if strings_at > have {
        return Err(LdCacheError::Truncated {
            what: "old-format entry table",
            need: strings_at,
            have,
        });
    }
    // In range: strings_at <= bytes.len().
    let strings_at = strings_at as usize;

    // Like ld.so and `ldconfig -p`: a new-format cache right after the (aligned) old entries
    // is the real one; the old entries then only exist for pre-2.2 loaders.
    let new_at = strings_at.next_multiple_of(NEW_ALIGN);
    if bytes
        .get(new_at..)
        .is_some_and(|tail| tail.starts_with(NEW_MAGIC))
    {
        let (entries, generator, skipped_not_utf8) = parse_new(bytes, new_at)?;
        return Ok(LdCache {
            entries,
            format: Format::OldWithNew,
            generator,
            skipped_not_utf8,
        });
    }

    let mut budget = StringBudget::new(bytes);
    let mut entries = Vec::with_capacity(nlibs as usize);
    let mut skipped = 0;
    for index in 0..nlibs as usize {
        let at = OLD_HEADER_SIZE + index * OLD_ENTRY_SIZE;
        let (flags, key, value) = entry_fields(bytes, at)
            .ok_or_else(|| internal_truncation("old-format entry", at + OLD_ENTRY_SIZE, have))?;
        let Some((key, value)) =
            entry_strings(bytes, strings_at, (key, value), index, &mut budget)?
        else {
            skipped += 1;
            continue;
        };
        entries.push(Entry {
            key,
            value,
            flags,
            hwcap: 0,
        });
    }
    Ok(LdCache {
        entries,
        format: Format::Old,
        generator: None,
        skipped_not_utf8: skipped,
    })
}

/// A new-format cache whose header starts at `base` (0, or after the old part of a compat
/// cache). Returns the entries, the generator string and how many entries were skipped for
/// not being UTF-8.
fn parse_new(
    bytes: &[u8],
    base: usize,
) -> Result<(Vec<Entry>, Option<String>, usize), LdCacheError> {
    let have = len64(bytes);
    let header_end = base as u64 + NEW_HEADER_SIZE as u64;
    if header_end > have {
        return Err(LdCacheError::Truncated {
            what: "new-format header",
            need: header_end,
            have,
        });
    }
    let truncated = || internal_truncation("new-format header", base + NEW_HEADER_SIZE, have);
    let nlibs = u32_at(bytes, base + 20).ok_or_else(truncated)?;
    let flags = *bytes.get(base + 28).ok_or_else(truncated)?;
    let extension_offset = u32_at(bytes, base + 32).ok_or_else(truncated)?;
    // `cache_file_new_matches_endian`: 0 is "written before ldconfig recorded endianness".
    if flags != 0 && flags & 3 != ENDIAN_LITTLE {
        return Err(LdCacheError::Endianness { flags });
    }

    let entries_end = header_end + u64::from(nlibs) * NEW_ENTRY_SIZE as u64;
    if entries_end > have {
        return Err(LdCacheError::Truncated {
            what: "new-format entry table",
            need: entries_end,
            have,
        });
    }

    let mut budget = StringBudget::new(bytes);
    let mut entries = Vec::with_capacity(nlibs as usize);
    let mut skipped = 0;
    for index in 0..nlibs as usize {
        let at = base + NEW_HEADER_SIZE + index * NEW_ENTRY_SIZE;
        let (flags, key, value) = entry_fields(bytes, at)
            .ok_or_else(|| internal_truncation("new-format entry", at + NEW_ENTRY_SIZE, have))?;
        let hwcap = u64_at(bytes, at + 16)
            .ok_or_else(|| internal_truncation("new-format entry", at + NEW_ENTRY_SIZE, have))?;
        // String offsets count from the start of the new header.
        let Some((key, value)) = entry_strings(bytes, base, (key, value), index, &mut budget)?
        else {
            skipped += 1;
            continue;
        };
        entries.push(Entry {
            key,
            value,
            flags,
            hwcap,
        });
    }
    Ok((entries, generator(bytes, extension_offset), skipped))
}

/// The generator string from the extension directory at file offset `offset`, checked the way
/// glibc's `cache_extension_load` checks it. A malformed directory yields `None`: `ld.so` also
/// carries on without extensions, and the entries do not depend on them.
fn generator(bytes: &[u8], offset: u32) -> Option<String> {
    if offset == 0 || !offset.is_multiple_of(4) {
        return None;
    }
    let at = usize::try_from(offset).ok()?;
    if u32_at(bytes, at)? != EXTENSION_MAGIC {
        return None;
    }
    let count = u32_at(bytes, at + 4)?;
    let sections_end = u64::from(offset)
        + EXTENSION_HEADER_SIZE as u64
        + u64::from(count) * EXTENSION_SECTION_SIZE as u64;
    if sections_end > len64(bytes) {
        return None;
    }
    let mut found = None;
    for index in 0..count as usize {
        let section = at + EXTENSION_HEADER_SIZE + index * EXTENSION_SECTION_SIZE;
        let tag = u32_at(bytes, section)?;
        let start = u32_at(bytes, section + 8)?;
        let size = u32_at(bytes, section + 12)?;
        let end = u64::from(start) + u64::from(size);
        if end > len64(bytes) {
            return None;
        }
        if tag == EXTENSION_TAG_GENERATOR {
            // In range: end <= bytes.len().
            let text = bytes.get(start as usize..end as usize)?;
            found = std::str::from_utf8(text).ok().map(str::to_owned);
        }
    }
    found
}

/// Both strings of one entry, or `None` when either is not UTF-8. Such an entry cannot name a
/// library we look for, and one odd file name on a host must not make the whole cache (and
/// with it every GPU container) unusable; bad offsets are still errors.
fn entry_strings(
    bytes: &[u8],
    base: usize,
    (key, value): (u32, u32),
    entry: usize,
    budget: &mut StringBudget,
) -> Result<Option<(String, String)>, LdCacheError> {
    let key = string_at(bytes, base, key, entry, "key", budget);
    let value = string_at(bytes, base, value, entry, "value", budget);
    match (key, value) {
        (Ok(key), Ok(value)) => Ok(Some((key, value))),
        (Err(LdCacheError::NotUtf8 { .. }), Ok(_))
        | (Ok(_), Err(LdCacheError::NotUtf8 { .. }))
        | (Err(LdCacheError::NotUtf8 { .. }), Err(LdCacheError::NotUtf8 { .. })) => Ok(None),
        (Err(e), _) | (_, Err(e)) => Err(e),
    }
}

/// The NUL-terminated string at `base + offset`.
fn string_at(
    bytes: &[u8],
    base: usize,
    offset: u32,
    entry: usize,
    field: &'static str,
    budget: &mut StringBudget,
) -> Result<String, LdCacheError> {
    let out_of_bounds = || LdCacheError::StringOutOfBounds {
        entry,
        field,
        offset: u64::from(offset),
    };
    let start = usize::try_from(u64::from(offset) + base as u64).map_err(|_| out_of_bounds())?;
    let rest = bytes
        .get(start..)
        .filter(|rest| !rest.is_empty())
        .ok_or_else(out_of_bounds)?;
    let Some(len) = rest.iter().position(|&b| b == 0) else {
        return Err(LdCacheError::Unterminated {
            entry,
            field,
            offset: u64::from(offset),
        });
    };
    budget.spend(len, entry)?;
    let raw = rest.get(..len).unwrap_or_default();
    match std::str::from_utf8(raw) {
        Ok(text) => Ok(text.to_owned()),
        Err(_) => Err(LdCacheError::NotUtf8 {
            entry,
            field,
            lossy: String::from_utf8_lossy(raw.get(..QUOTE_LIMIT).unwrap_or(raw)).into_owned(),
        }),
    }
}

/// Caps the total length of decoded strings (see [`STRING_FACTOR`]).
struct StringBudget {
    left: u64,
    limit: u64,
    have: u64,
}

impl StringBudget {
    fn new(bytes: &[u8]) -> Self {
        let have = len64(bytes);
        let limit = have
            .saturating_mul(STRING_FACTOR)
            .saturating_add(STRING_SLACK);
        Self {
            left: limit,
            limit,
            have,
        }
    }

    fn spend(&mut self, len: usize, entry: usize) -> Result<(), LdCacheError> {
        let cost = len as u64 + 1;
        self.left = self
            .left
            .checked_sub(cost)
            .ok_or(LdCacheError::StringsTooLarge {
                entry,
                limit: self.limit,
                have: self.have,
            })?;
        Ok(())
    }
}

/// flags, key and value: the fields shared by `file_entry` and `file_entry_new`.
fn entry_fields(bytes: &[u8], at: usize) -> Option<(i32, u32, u32)> {
    let flags = i32::from_le_bytes(array_at(bytes, at)?);
    Some((flags, u32_at(bytes, at + 4)?, u32_at(bytes, at + 8)?))
}

fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    array_at(bytes, at).map(u32::from_le_bytes)
}

fn u64_at(bytes: &[u8], at: usize) -> Option<u64> {
    array_at(bytes, at).map(u64::from_le_bytes)
}

fn array_at<const N: usize>(bytes: &[u8], at: usize) -> Option<[u8; N]> {
    bytes.get(at..at.checked_add(N)?)?.try_into().ok()
}

fn len64(bytes: &[u8]) -> u64 {
    bytes.len() as u64
}

/// A read past the end after the size checks passed; cannot happen, but is an error rather
/// than a panic if it ever does.
fn internal_truncation(what: &'static str, end: usize, have: u64) -> LdCacheError {
    LdCacheError::Truncated {
        what,
        need: end as u64,
        have,
    }
}

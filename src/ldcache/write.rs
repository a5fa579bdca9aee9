// SPDX-License-Identifier: Apache-2.0
//! Writing a cache the way glibc 2.36's `ldconfig` does (`elf/cache.c`, `elf/stringtable.c`),
//! byte for byte for caches without glibc-hwcaps subdirectories, little-endian. The writers
//! keep the order they are given; [`sort_like_ldconfig`] puts entries in the order `ld.so`'s
//! binary search needs.

use std::cmp::Ordering;
use std::collections::HashMap;

use super::{
    ENDIAN_LITTLE, EXTENSION_HEADER_SIZE, EXTENSION_MAGIC, EXTENSION_SECTION_SIZE,
    EXTENSION_TAG_GENERATOR, Entry, Format, GENERATOR, NEW_ALIGN, NEW_ENTRY_SIZE, NEW_HEADER_SIZE,
    NEW_MAGIC, OLD_ENTRY_SIZE, OLD_HEADER_SIZE, OLD_MAGIC,
};

/// A new-format cache (what `ldconfig` writes by default since glibc 2.32) holding `entries` in
/// the given order, with [`GENERATOR`] as its generator string.
///
/// `ld.so` binary-searches the entries, so a cache meant for a loader must be sorted with
/// [`sort_like_ldconfig`] first. The `hwcap` values are written as given; the glibc-hwcaps
/// subdirectory names they index are not (this module does not model them), so `ld.so` ignores
/// entries marked with [`HWCAP_EXTENSION`](super::HWCAP_EXTENSION).
pub fn write_new(entries: &[Entry]) -> Vec<u8> {
    write_with_generator(Format::New, entries, GENERATOR)
}

/// An old-format cache (`ld.so-1.7.0`, `ldconfig -c old`, glibc's only format before 2.2)
/// holding `entries` in the given order. The format has no `hwcap` field: every entry is written
/// and its `hwcap` dropped, as glibc 2.36's `ldconfig -c old` does.
pub fn write_old(entries: &[Entry]) -> Vec<u8> {
    write_with_generator(Format::Old, entries, "")
}

/// A compat cache (`ldconfig -c compat`, the default before glibc 2.32): the old format, its
/// entry count rounded up to even by repeating the last entry (so that the new part is 8-byte
/// aligned), followed by a new-format cache.
pub fn write_compat(entries: &[Entry]) -> Vec<u8> {
    write_with_generator(Format::OldWithNew, entries, GENERATOR)
}

/// Any of the three layouts, with `generator` as the generator string of the new part (unused
/// for [`Format::Old`]). With `ldconfig`'s own generator string and its entry order, the result
/// is byte-identical to what `ldconfig` wrote.
///
/// Offsets are 32-bit: string tables beyond 4 GiB cannot be represented and come out corrupt
/// (`parse` rejects them) instead of panicking.
pub fn write_with_generator(format: Format, entries: &[Entry], generator: &str) -> Vec<u8> {
    let strings = StringTable::build(entries);
    match format {
        Format::New => {
            let mut out = Vec::new();
            push_new(&mut out, entries, &strings, generator);
            out
        }
        Format::Old => {
            let mut out = Vec::new();
            push_old(&mut out, entries, &strings, 0, entries.len());
            out.extend_from_slice(&strings.bytes);
            out
        }
        Format::OldWithNew => {
            // Old string offsets point into the new part's string table, which starts after
            // the (aligned) new header and entries.
            let old_count = entries.len().next_multiple_of(2);
            let old_size = OLD_HEADER_SIZE + old_count * OLD_ENTRY_SIZE;
            let pad = old_size.next_multiple_of(NEW_ALIGN) - old_size;
            let shift = pad + NEW_HEADER_SIZE + entries.len() * NEW_ENTRY_SIZE;
            let mut out = Vec::new();
            push_old(&mut out, entries, &strings, shift, old_count);
            out.resize(old_size + pad, 0);
            push_new(&mut out, entries, &strings, generator);
            out
        }
    }
}

/// Sorts `entries` into the order `ldconfig` writes and `ld.so`'s binary search expects: key
/// descending by `_dl_cache_libcmp` (digit runs compare as numbers and above other bytes), then
/// flags descending, then glibc-hwcaps entries before the others, ordered by subdirectory index
/// (which `ldconfig` assigns in name order). The sort is stable, like `ldconfig`'s insertion, so
/// entries equal on all of that keep their given order (for `ldconfig`: directory scan order).
pub fn sort_like_ldconfig(entries: &mut [Entry]) {
    entries.sort_by(compare_like_ldconfig);
}

/// `compare` in glibc's `elf/cache.c`.
pub(super) fn compare_like_ldconfig(a: &Entry, b: &Entry) -> Ordering {
    libcmp(&b.key, &a.key)
        .then_with(|| b.flags.cmp(&a.flags))
        .then_with(
            || match (a.is_hwcaps_subdirectory(), b.is_hwcaps_subdirectory()) {
                (true, false) => Ordering::Less,
                (false, true) => Ordering::Greater,
                // The low 32 bits index the subdirectory names, sorted by name.
                (true, true) => (a.hwcap as u32).cmp(&(b.hwcap as u32)),
                (false, false) => Ordering::Equal,
            },
        )
}

/// glibc's `_dl_cache_libcmp`: runs of ASCII digits compare by value and above any other byte;
/// other bytes compare as the platform's `char` (signed on x86), with the end of the string as
/// 0. glibc accumulates digit runs in an `int` (overflow past 9 digits is undefined there);
/// here they compare by exact value, which keeps the order total, as `sort_by` requires.
pub(super) fn libcmp(a: &str, b: &str) -> Ordering {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let (mut i, mut j) = (0, 0);
    loop {
        match (a.get(i).copied(), b.get(j).copied()) {
            (None, None) => return Ordering::Equal,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let (run_a, run_b) = (digit_run(a, i), digit_run(b, j));
                match compare_numbers(run_a, run_b) {
                    Ordering::Equal => {
                        i += run_a.len();
                        j += run_b.len();
                    }
                    unequal => return unequal,
                }
            }
            (Some(x), _) if x.is_ascii_digit() => return Ordering::Greater,
            (_, Some(y)) if y.is_ascii_digit() => return Ordering::Less,
            (x, y) => match as_c_char(x).cmp(&as_c_char(y)) {
                Ordering::Equal => {
                    i += 1;
                    j += 1;
                }
                unequal => return unequal,
            },
        }
    }
}

fn digit_run(s: &[u8], from: usize) -> &[u8] {
    let rest = s.get(from..).unwrap_or_default();
    let len = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    rest.get(..len).unwrap_or_default()
}

/// Compares two runs of ASCII digits by value, of any length.
fn compare_numbers(a: &[u8], b: &[u8]) -> Ordering {
    let leading_zeros = |run: &[u8]| run.iter().take_while(|&&d| d == b'0').count();
    let a = a.get(leading_zeros(a)..).unwrap_or_default();
    let b = b.get(leading_zeros(b)..).unwrap_or_default();
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

/// A byte as C's `char` (the end of the string is NUL).
#[allow(clippy::unnecessary_cast)] // c_char is u8 on some targets
fn as_c_char(byte: Option<u8>) -> i32 {
    i32::from(byte.unwrap_or(0) as std::ffi::c_char)
}

/// The old header and `count` old entries (`count` may exceed `entries.len()` by one: the last
/// entry is repeated). String offsets are the string table's plus `shift`.
fn push_old(
    out: &mut Vec<u8>,
    entries: &[Entry],
    strings: &StringTable,
    shift: usize,
    count: usize,
) {
    out.extend_from_slice(OLD_MAGIC);
    out.push(0);
    out.extend_from_slice(&to_u32(count).to_le_bytes());
    let mut last = None;
    for index in 0..count {
        let Some(entry) = entries.get(index).or(last) else {
            break;
        };
        let (key, value) = strings.offsets(entry);
        out.extend_from_slice(&entry.flags.to_le_bytes());
        out.extend_from_slice(&to_u32(shift + key).to_le_bytes());
        out.extend_from_slice(&to_u32(shift + value).to_le_bytes());
        last = Some(entry);
    }
}

/// A complete new-format cache appended at the current end of `out`: header, entries, strings,
/// then the extension directory at the next 4-byte boundary of the file.
fn push_new(out: &mut Vec<u8>, entries: &[Entry], strings: &StringTable, generator: &str) {
    let base = out.len();
    let strings_at = NEW_HEADER_SIZE + entries.len() * NEW_ENTRY_SIZE;
    let extension_at = (base + strings_at + strings.bytes.len()).next_multiple_of(4);

    out.extend_from_slice(NEW_MAGIC);
    out.extend_from_slice(&to_u32(entries.len()).to_le_bytes());
    out.extend_from_slice(&to_u32(strings.bytes.len()).to_le_bytes());
    out.extend_from_slice(&[ENDIAN_LITTLE, 0, 0, 0]);
    // The extension offset counts from the start of the file, not of the new header.
    out.extend_from_slice(&to_u32(extension_at).to_le_bytes());
    out.extend_from_slice(&[0; 12]);
    for entry in entries {
        let (key, value) = strings.offsets(entry);
        out.extend_from_slice(&entry.flags.to_le_bytes());
        out.extend_from_slice(&to_u32(strings_at + key).to_le_bytes());
        out.extend_from_slice(&to_u32(strings_at + value).to_le_bytes());
        out.extend_from_slice(&0u32.to_le_bytes()); // osversion, unused since glibc 2.33
        out.extend_from_slice(&entry.hwcap.to_le_bytes());
    }
    out.extend_from_slice(&strings.bytes);
    out.resize(extension_at, 0);

    // One section, the generator, placed right after the directory (no data between them
    // without a glibc-hwcaps section).
    let generator_at = extension_at + EXTENSION_HEADER_SIZE + EXTENSION_SECTION_SIZE;
    out.extend_from_slice(&EXTENSION_MAGIC.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    out.extend_from_slice(&EXTENSION_TAG_GENERATOR.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes()); // section flags
    out.extend_from_slice(&to_u32(generator_at).to_le_bytes());
    out.extend_from_slice(&to_u32(generator.len()).to_le_bytes());
    out.extend_from_slice(generator.as_bytes());
}

/// glibc's `stringtable`: every distinct key and value once, sorted so that a string that is
/// the tail of the one before it (a soname at the end of its path) shares its bytes.
struct StringTable<'a> {
    bytes: Vec<u8>,
    offsets: HashMap<&'a str, usize>,
}

impl<'a> StringTable<'a> {
    fn build(entries: &'a [Entry]) -> Self {
        let mut strings: Vec<&str> = entries
            .iter()
            .flat_map(|entry| [entry.key.as_str(), entry.value.as_str()])
            .collect();
        // `finalize_compare`: by reversed bytes, descending, so that a string follows the
        // longer strings it is a suffix of. Distinct strings never compare equal.
        strings.sort_unstable_by(|a, b| b.bytes().rev().cmp(a.bytes().rev()));
        strings.dedup();

        let mut offsets = HashMap::with_capacity(strings.len());
        let mut previous: Option<(&str, usize)> = None;
        for &string in &strings {
            let offset = match previous {
                None => 0,
                Some((prev, at)) if prev.ends_with(string) => at + prev.len() - string.len(),
                Some((prev, at)) => at + prev.len() + 1,
            };
            offsets.insert(string, offset);
            previous = Some((string, offset));
        }
        let size = previous.map_or(0, |(last, at)| at + last.len() + 1);
        let mut bytes = vec![0; size];
        for (string, &at) in &offsets {
            if let Some(slot) = bytes.get_mut(at..at + string.len()) {
                slot.copy_from_slice(string.as_bytes());
            }
        }
        Self { bytes, offsets }
    }

    /// The table offsets of an entry's key and value.
    fn offsets(&self, entry: &Entry) -> (usize, usize) {
        let find = |s: &str| self.offsets.get(s).copied().unwrap_or_default();
        (find(&entry.key), find(&entry.value))
    }
}

fn to_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

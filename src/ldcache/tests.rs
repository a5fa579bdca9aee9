// SPDX-License-Identifier: Apache-2.0
//! Unit and property tests for the cache parser and writers. The fixtures are real `ldconfig`
//! output (tests/fixtures/ldcache/README.md says how they were made).

use std::cmp::Ordering;

use super::write::libcmp;
use super::*;

const LDCONFIG_GENERATOR: &str =
    "ldconfig (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36";

/// (name, bytes, format) of every fixture.
const FIXTURES: [(&str, &[u8], Format); 7] = [
    (
        "small.new",
        include_bytes!("../../tests/fixtures/ldcache/small.new.cache"),
        Format::New,
    ),
    (
        "small.old",
        include_bytes!("../../tests/fixtures/ldcache/small.old.cache"),
        Format::Old,
    ),
    (
        "small.compat",
        include_bytes!("../../tests/fixtures/ldcache/small.compat.cache"),
        Format::OldWithNew,
    ),
    (
        "driver.new",
        include_bytes!("../../tests/fixtures/ldcache/driver.new.cache"),
        Format::New,
    ),
    (
        "driver.old",
        include_bytes!("../../tests/fixtures/ldcache/driver.old.cache"),
        Format::Old,
    ),
    (
        "driver.compat",
        include_bytes!("../../tests/fixtures/ldcache/driver.compat.cache"),
        Format::OldWithNew,
    ),
    (
        "hwcaps.new",
        include_bytes!("../../tests/fixtures/ldcache/hwcaps.new.cache"),
        Format::New,
    ),
];

fn entry(key: &str, value: &str, flags: i32, hwcap: u64) -> Entry {
    Entry {
        key: key.to_owned(),
        value: value.to_owned(),
        flags,
        hwcap,
    }
}

pub(super) const X86_64: i32 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64;

/// A mix: shared suffixes, one key for three ABIs, a glibc-hwcaps entry, an empty string.
fn sample() -> Vec<Entry> {
    vec![
        entry(
            "libnvidia-ml.so.1",
            "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            X86_64,
            0,
        ),
        entry(
            "libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1",
            X86_64,
            HWCAP_EXTENSION | (3 << 32),
        ),
        entry(
            "libcuda.so.1",
            "/usr/libx32/libcuda.so.1",
            FLAG_ELF_LIBC6 | FLAG_X8664_LIBX32,
            0,
        ),
        entry(
            "libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            X86_64,
            0,
        ),
        entry(
            "libcuda.so.1",
            "/usr/lib/i386-linux-gnu/libcuda.so.1",
            FLAG_ELF_LIBC6,
            0,
        ),
        entry("so.1", "/so.1", X86_64, 0),
        entry("", "/weird/empty-key", FLAG_ELF, 0),
    ]
}

pub(super) fn without_hwcap(entries: &[Entry]) -> Vec<Entry> {
    entries
        .iter()
        .map(|e| Entry {
            hwcap: 0,
            ..e.clone()
        })
        .collect()
}

#[test]
fn round_trips_through_every_writer() {
    let cases: [(&str, Vec<Entry>); 4] = [
        ("empty", vec![]),
        ("one", sample()[..1].to_vec()),
        ("two", sample()[..2].to_vec()),
        ("sample", sample()),
    ];
    for (name, entries) in cases {
        let new = parse(&write_new(&entries)).unwrap_or_else(|e| panic!("{name} new: {e}"));
        assert_eq!(new.entries, entries, "{name}: new entries");
        assert_eq!(new.format, Format::New, "{name}: new format");
        assert_eq!(
            new.generator.as_deref(),
            Some(GENERATOR),
            "{name}: new generator"
        );

        let old = parse(&write_old(&entries)).unwrap_or_else(|e| panic!("{name} old: {e}"));
        assert_eq!(old.entries, without_hwcap(&entries), "{name}: old entries");
        assert_eq!(old.format, Format::Old, "{name}: old format");
        assert_eq!(old.generator, None, "{name}: old generator");

        let compat =
            parse(&write_compat(&entries)).unwrap_or_else(|e| panic!("{name} compat: {e}"));
        assert_eq!(compat.entries, entries, "{name}: compat entries");
        assert_eq!(compat.format, Format::OldWithNew, "{name}: compat format");
        assert_eq!(
            compat.generator.as_deref(),
            Some(GENERATOR),
            "{name}: compat generator"
        );
    }
}

#[test]
fn fixtures_parse_and_rewrite_byte_for_byte() {
    for (name, bytes, format) in FIXTURES {
        let cache = parse(bytes).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(cache.format, format, "{name}: format");
        let generator = cache.generator.as_deref();
        match format {
            Format::Old => assert_eq!(generator, None, "{name}: generator"),
            _ => assert_eq!(generator, Some(LDCONFIG_GENERATOR), "{name}: generator"),
        }
        let mut sorted = cache.entries.clone();
        sorted.reverse();
        sort_like_ldconfig(&mut sorted);
        assert_eq!(sorted, cache.entries, "{name}: ldconfig's order");
        // The hwcaps fixture also holds the subdirectory names, which the writers do not model.
        if !name.starts_with("hwcaps") {
            let rewritten =
                write_with_generator(format, &cache.entries, generator.unwrap_or_default());
            assert!(rewritten == bytes, "{name}: rewritten bytes differ");
        }
    }
}

#[test]
fn fixture_contents() {
    let driver = parse(FIXTURES[3].1).unwrap();
    let found: Vec<(&str, &str, Class)> = driver
        .lookup("libcuda.so.1")
        .map(|e| (e.key.as_str(), e.value.as_str(), e.class()))
        .collect();
    assert_eq!(
        found,
        [
            ("libcuda.so.1", "/usr/libx32/libcuda.so.1", Class::Other),
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                Class::Lib64
            ),
            (
                "libcuda.so.1",
                "/usr/lib/i386-linux-gnu/libcuda.so.1",
                Class::Lib32
            ),
        ]
    );
    assert_eq!(driver.lookup("libcuda.so").count(), 1);
    assert_eq!(driver.lookup("libnvidia-ml.so").count(), 0);

    let hwcaps = parse(FIXTURES[6].1).unwrap();
    let summary: Vec<(bool, u64, &str)> = hwcaps
        .entries
        .iter()
        .map(|e| (e.is_hwcaps_subdirectory(), e.hwcap, e.value.as_str()))
        .collect();
    assert_eq!(
        summary,
        [
            (
                true,
                HWCAP_EXTENSION,
                "/opt/lib/glibc-hwcaps/x86-64-v2/libfoo.so.1.2.3"
            ),
            (
                true,
                HWCAP_EXTENSION | 1,
                "/opt/lib/glibc-hwcaps/x86-64-v3/libfoo.so.1.2.3"
            ),
            (false, 0, "/opt/lib/libfoo.so.1"),
        ]
    );
}

#[test]
fn class_by_flags() {
    let cases = [
        ("x86-64", X86_64, Class::Lib64),
        ("aarch64", FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64, Class::Lib64),
        ("ppc64", FLAG_ELF_LIBC6 | FLAG_POWERPC_LIB64, Class::Lib64),
        ("s390x", FLAG_ELF_LIBC6 | FLAG_S390_LIB64, Class::Lib64),
        ("sparc64", FLAG_ELF_LIBC6 | FLAG_SPARC_LIB64, Class::Lib64),
        ("ia64", FLAG_ELF_LIBC6 | FLAG_IA64_LIB64, Class::Lib64),
        (
            "mips n64",
            FLAG_ELF_LIBC6 | FLAG_MIPS64_LIBN64,
            Class::Lib64,
        ),
        (
            "mips n64 nan2008",
            FLAG_ELF_LIBC6 | FLAG_MIPS64_LIBN64_NAN2008,
            Class::Lib64,
        ),
        ("i386", FLAG_ELF_LIBC6, Class::Lib32),
        ("x32", FLAG_ELF_LIBC6 | FLAG_X8664_LIBX32, Class::Other),
        (
            "mips n32",
            FLAG_ELF_LIBC6 | FLAG_MIPS64_LIBN32,
            Class::Other,
        ),
        ("arm hf", FLAG_ELF_LIBC6 | FLAG_ARM_LIBHF, Class::Other),
        (
            "riscv",
            FLAG_ELF_LIBC6 | FLAG_RISCV_FLOAT_ABI_DOUBLE,
            Class::Other,
        ),
        (
            "libc5 x86-64",
            FLAG_ELF_LIBC5 | FLAG_X8664_LIB64,
            Class::Other,
        ),
        ("plain ELF", FLAG_ELF, Class::Other),
        ("libc4", 0, Class::Other),
        ("extra bits", X86_64 | 0x10000, Class::Other),
        ("negative", -1, Class::Other),
    ];
    for (name, flags, class) in cases {
        assert_eq!(entry("k", "v", flags, 0).class(), class, "{name}");
    }
}

#[test]
fn hwcaps_marker() {
    let cases = [
        ("none", 0, false),
        ("extension", HWCAP_EXTENSION, true),
        ("extension, index 7", HWCAP_EXTENSION | 7, true),
        ("extension, ISA level 3", HWCAP_EXTENSION | (3 << 32), true),
        ("legacy hwcap bits", 1 << 63 | HWCAP_EXTENSION, false),
        ("legacy platform bits", 0x0000_0001_0000_0000, false),
    ];
    for (name, hwcap, expected) in cases {
        assert_eq!(
            entry("k", "v", X86_64, hwcap).is_hwcaps_subdirectory(),
            expected,
            "{name}"
        );
    }
}

/// A small valid new-format cache, for corrupting.
fn new_bytes() -> Vec<u8> {
    write_new(&sample()[..2])
}

fn put_u32(bytes: &mut [u8], at: usize, value: u32) {
    bytes[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

#[test]
fn rejects_bad_input() {
    let mut absurd_new = new_bytes();
    put_u32(&mut absurd_new, 20, u32::MAX);
    let mut absurd_old = write_old(&sample());
    put_u32(&mut absurd_old, 12, u32::MAX);
    let mut key_past_end = new_bytes();
    put_u32(&mut key_past_end, 48 + 4, u32::MAX);
    let mut value_at_end = new_bytes();
    let len = value_at_end.len() as u32;
    put_u32(&mut value_at_end, 48 + 8, len);
    // The extension directory ends with the generator, which has no NUL after it.
    let mut unterminated = new_bytes();
    put_u32(&mut unterminated, 48 + 8, len - 1);
    let mut old_past_end = write_old(&sample());
    put_u32(&mut old_past_end, 16 + 4, 0x7fff_fff0);
    let mut big_endian = new_bytes();
    big_endian[28] = 3;
    let mut invalid = new_bytes();
    invalid[28] = 1;
    let mut unknown_endian = new_bytes();
    unknown_endian[28] = 4;
    let mut compat_truncated = write_compat(&sample());
    compat_truncated.truncate(16 + 8 * 12 + 48 + 24);

    let absurd_new_need = format!(
        "the new-format entry table needs {} bytes",
        48 + u64::from(u32::MAX) * 24
    );
    let absurd_old_need = format!(
        "the old-format entry table needs {} bytes",
        16 + u64::from(u32::MAX) * 12
    );

    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "ld.so.cache is empty"),
        (
            "new magic cut",
            b"glibc-ld.so".to_vec(),
            "ld.so.cache is truncated: the new-format header needs 48 bytes, the file has 11",
        ),
        (
            "old magic cut",
            b"ld.so-1".to_vec(),
            "ld.so.cache is truncated: the old-format header needs 16 bytes, the file has 7",
        ),
        (
            "new header cut",
            new_bytes()[..40].to_vec(),
            "ld.so.cache is truncated: the new-format header needs 48 bytes, the file has 40",
        ),
        (
            "old header cut",
            b"ld.so-1.7.0\0\x01".to_vec(),
            "ld.so.cache is truncated: the old-format header needs 16 bytes, the file has 13",
        ),
        (
            "new entries cut",
            new_bytes()[..48 + 30].to_vec(),
            "ld.so.cache is truncated: the new-format entry table needs 96 bytes, the file has 78",
        ),
        ("absurd new count", absurd_new, &absurd_new_need),
        ("absurd old count", absurd_old, &absurd_old_need),
        (
            "compat new part cut",
            compat_truncated,
            "ld.so.cache is truncated: the new-format entry table needs",
        ),
        (
            "bad magic",
            b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0>\0\x01\0".to_vec(),
            r#"not an ld.so.cache: starts with "\x7fELF\x02\x01\x01\x00"#,
        ),
        (
            "other version",
            b"glibc-ld.so.cache1.2 and more".to_vec(),
            r#"starts with "glibc-ld.so.cache1.2""#,
        ),
        (
            "key past end",
            key_past_end,
            "ld.so.cache entry 0: key offset 4294967295 points outside the file",
        ),
        (
            "value at end",
            value_at_end,
            "ld.so.cache entry 0: value offset",
        ),
        ("unterminated", unterminated, "entry 0: value at offset"),
        (
            "old key past end",
            old_past_end,
            "ld.so.cache entry 0: key offset 2147483632 points outside the file",
        ),
        ("big-endian", big_endian, "flags 0x03 mark it big-endian"),
        ("invalid", invalid, "flags 0x01 mark it invalid"),
        (
            "unknown endianness",
            unknown_endian,
            "flags 0x04 mark it of unknown endianness",
        ),
    ];
    for (name, bytes, expected) in cases {
        match parse(&bytes) {
            Ok(cache) => panic!("{name}: parsed as {cache:?}"),
            Err(e) => assert!(
                e.to_string().contains(expected),
                "{name}: {e:?} ({e}) lacks {expected:?}"
            ),
        }
    }
}

#[test]
fn skips_entries_that_are_not_utf8() {
    let entries = [
        entry("libx.so.1", "/opt/libx.so.1", X86_64, 0),
        entry("libcuda.so.1", "/usr/lib/libcuda.so.1", X86_64, 0),
    ];
    let cases: [(&str, Vec<u8>); 2] = [("new", write_new(&entries)), ("old", write_old(&entries))];
    for (name, mut bytes) in cases {
        // The string table holds "libx.so.1" (and "/opt/libx.so.1", possibly sharing it).
        let at = bytes.windows(4).position(|w| w == b"libx").unwrap() + 3;
        bytes[at] = 0xff;
        let cache = parse(&bytes).unwrap();
        assert_eq!(cache.skipped_not_utf8, 1, "{name}");
        let keys: Vec<&str> = cache.entries.iter().map(|e| e.key.as_str()).collect();
        assert_eq!(keys, ["libcuda.so.1"], "{name}: the good entry survives");
    }
}

#[test]
fn accepts_unset_endianness_and_ignores_a_broken_extension() {
    let mut bytes = new_bytes();
    bytes[28] = 0;
    assert_eq!(
        parse(&bytes).unwrap().entries,
        sample()[..2],
        "unset endianness"
    );

    let ext = u32::from_le_bytes(bytes[32..36].try_into().unwrap()) as usize;
    let cases: [(&str, usize, u32); 4] = [
        ("misaligned offset", 32, ext as u32 + 1),
        ("offset past end", 32, u32::MAX - 3),
        ("bad magic", ext, 0),
        ("section past end", ext + 8 + 8, u32::MAX),
    ];
    for (name, at, value) in cases {
        let mut broken = new_bytes();
        put_u32(&mut broken, at, value);
        let cache = parse(&broken).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(cache.entries, sample()[..2], "{name}: entries");
        assert_eq!(cache.generator, None, "{name}: generator");
    }
}

#[test]
fn caps_decoded_strings() {
    // 40,000 entries whose keys and values all point at one 60,000-byte string: a 1 MiB file
    // that would decode to 4.8 GB.
    let count = 40_000u32;
    let long = 60_000usize;
    let strings_at = 48 + 24 * count as usize;
    let mut bytes = vec![0u8; strings_at + long + 1];
    bytes[..20].copy_from_slice(NEW_MAGIC);
    put_u32(&mut bytes, 20, count);
    bytes[28] = 2;
    for index in 0..count as usize {
        let at = 48 + 24 * index;
        put_u32(&mut bytes, at, X86_64 as u32);
        put_u32(&mut bytes, at + 4, strings_at as u32);
        put_u32(&mut bytes, at + 8, strings_at as u32);
    }
    bytes[strings_at..strings_at + long].fill(b'a');
    let err = parse(&bytes).unwrap_err();
    assert!(
        matches!(err, LdCacheError::StringsTooLarge { .. }),
        "{err:?}"
    );
}

#[test]
fn lookup_keeps_file_order() {
    let cache = parse(&write_new(&sample())).unwrap();
    let values: Vec<&str> = cache
        .lookup("libcuda.so.1")
        .map(|e| e.value.as_str())
        .collect();
    assert_eq!(
        values,
        [
            "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1",
            "/usr/libx32/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
            "/usr/lib/i386-linux-gnu/libcuda.so.1",
        ]
    );
    assert_eq!(cache.lookup("libcuda.so").count(), 0);
    assert_eq!(cache.lookup("").count(), 1);
}

#[test]
fn libcmp_like_glibc() {
    let cases = [
        ("equal", "libc.so.6", "libc.so.6", Ordering::Equal),
        (
            "numbers by value",
            "libx.so.10",
            "libx.so.9",
            Ordering::Greater,
        ),
        ("leading zeros", "libx.so.01", "libx.so.1", Ordering::Equal),
        (
            "longer wins",
            "libcuda.so.1",
            "libcuda.so",
            Ordering::Greater,
        ),
        ("digit above letter", "lib1", "liba", Ordering::Greater),
        ("digit above end", "lib1", "lib", Ordering::Greater),
        ("letter above end", "liba", "lib", Ordering::Greater),
        ("plain bytes", "libb", "liba", Ordering::Greater),
        ("dot below letter", "lib.", "liba", Ordering::Less),
        (
            "huge numbers",
            "a99999999999999999999",
            "a99999999999999999998",
            Ordering::Greater,
        ),
    ];
    for (name, a, b, expected) in cases {
        assert_eq!(libcmp(a, b), expected, "{name}");
        assert_eq!(libcmp(b, a), expected.reverse(), "{name} reversed");
    }
    // Bytes above 0x7f are negative `char`s on x86, so they sort below the end of a string.
    #[cfg(target_arch = "x86_64")]
    assert_eq!(libcmp("lib\u{e9}", "lib"), Ordering::Less, "high byte");
}

#[test]
fn sorts_like_ldconfig() {
    let mut entries = sample();
    sort_like_ldconfig(&mut entries);
    let order: Vec<(&str, &str)> = entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        order,
        [
            ("so.1", "/so.1"),
            (
                "libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
            ),
            ("libcuda.so.1", "/usr/libx32/libcuda.so.1"),
            (
                "libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/glibc-hwcaps/x86-64-v3/libcuda.so.1"
            ),
            ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            ("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1"),
            ("", "/weird/empty-key"),
        ]
    );
}

#[test]
fn load_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let cases: [(&str, Option<&[u8]>, &str); 3] = [
        ("missing", None, "cannot read ld.so.cache"),
        ("garbage", Some(b"garbage"), "invalid ld.so.cache"),
        ("valid", Some(FIXTURES[0].1), ""),
    ];
    for (name, contents, expected) in cases {
        let path = dir.path().join(name);
        if let Some(contents) = contents {
            std::fs::write(&path, contents).unwrap();
        }
        match load(&path) {
            Ok(cache) => {
                assert!(expected.is_empty(), "{name}: loaded");
                assert_eq!(cache.entries.len(), 2, "{name}");
            }
            Err(e) => {
                let message = e.to_string();
                assert!(message.contains(expected), "{name}: {message}");
                assert!(
                    message.contains(&*path.to_string_lossy()),
                    "{name}: {message}"
                );
                assert!(std::error::Error::source(&e).is_some(), "{name}: no source");
            }
        }
    }
    let err = load(Path::new("/dev/zero")).unwrap_err();
    assert!(
        matches!(err, LdCacheError::FileTooLarge { .. }),
        "/dev/zero: {err:?}"
    );
}

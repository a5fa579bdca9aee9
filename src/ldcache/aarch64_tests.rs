// SPDX-License-Identifier: Apache-2.0
//! The aarch64 side of the cache, on any build machine: caches written by Debian 12's aarch64
//! `ldconfig` (run under qemu-user, tests/fixtures/ldcache/aarch64/make-fixtures.sh) parse
//! with aarch64's flags, and entries made with [`Arch::Aarch64`]'s flags are written exactly
//! as that `ldconfig` writes them. Under qemu-user (scripts/arm64.sh) the same tests run as
//! the native build, where the high-byte order is aarch64's own.

use std::cmp::Ordering;

use super::write::libcmp;
use super::*;

const LDCONFIG_GENERATOR: &str =
    "ldconfig (Debian GLIBC 2.36-9+deb12u14) stable release version 2.36";
const DRIVER: &[u8] = include_bytes!("../../tests/fixtures/ldcache/aarch64/driver.new.cache");
const HIGH_BYTE: &[u8] = include_bytes!("../../tests/fixtures/ldcache/aarch64/highbyte.new.cache");
const LIB: &str = "/usr/lib/aarch64-linux-gnu";

fn keys(cache: &LdCache) -> Vec<(&str, &str)> {
    cache
        .entries
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect()
}

#[test]
fn aarch64_ldconfig_output_parses_with_aarch64_flags() {
    let cache = parse(DRIVER).unwrap();
    assert_eq!(cache.format, Format::New);
    assert_eq!(cache.generator.as_deref(), Some(LDCONFIG_GENERATOR));
    // What the fixture's `ldconfig -p` printed, in its order.
    let printed = include_str!("../../tests/fixtures/ldcache/aarch64/driver.new.ldconfig-p.txt");
    let listed: Vec<(&str, &str)> = printed
        .lines()
        .filter_map(|l| {
            let (key, rest) = l.trim().split_once(" (libc6,AArch64) => ")?;
            Some((key, rest))
        })
        .collect();
    assert_eq!(keys(&cache), listed);
    assert_eq!(listed.len(), 4);
    for entry in &cache.entries {
        assert_eq!(entry.flags, 0x0a03, "{}", entry.key);
        assert_eq!(Arch::Aarch64.flags(Class::Lib64), Some(entry.flags));
        assert_eq!(entry.class(), Class::Lib64, "{}", entry.key);
        assert!(entry.value.starts_with(LIB), "{}", entry.value);
    }
}

/// What the runtime and the hook do to an aarch64 container's cache: add the driver's
/// entries with aarch64's flags, sort like `ldconfig`, write. The bytes are the aarch64
/// `ldconfig`'s own, whatever the order the entries came in.
#[test]
fn entries_with_aarch64_flags_are_written_as_aarch64_ldconfig_writes_them() {
    let flags = Arch::Aarch64.flags(Class::Lib64).unwrap();
    let entry = |key: &str| Entry {
        key: key.to_owned(),
        value: format!("{LIB}/{key}"),
        flags,
        hwcap: 0,
    };
    let mut entries = vec![
        entry("libcuda.so"),
        entry("libcuda.so.1"),
        entry("libnvidia-ptxjitcompiler.so.1"),
        entry("libnvidia-ml.so.1"),
    ];
    sort_like_ldconfig(&mut entries);
    assert_eq!(entries, parse(DRIVER).unwrap().entries);
    assert!(write_with_generator(Format::New, &entries, LDCONFIG_GENERATOR) == DRIVER);
}

/// `_dl_cache_libcmp` compares other bytes as C's `char`, unsigned on aarch64: its `ldconfig`
/// puts `libé.so.1` above `libz.so.1` (the cache is sorted descending), x86-64's below. Our
/// sort is the build's own, which is the container's: the native build reproduces the
/// aarch64 file byte for byte, an x86-64 build orders the two the other way.
#[test]
fn a_high_byte_sorts_as_aarch64s_unsigned_char() {
    let cache = parse(HIGH_BYTE).unwrap();
    let high = "lib\u{e9}.so.1";
    assert_eq!(
        keys(&cache),
        [
            (high, "/opt/lib/lib\u{e9}.so.1"),
            ("libz.so.1", "/opt/lib/libz.so.1")
        ]
    );
    let mut sorted = cache.entries.clone();
    sort_like_ldconfig(&mut sorted);
    if cfg!(target_arch = "aarch64") {
        assert_eq!(libcmp(high, "libz.so.1"), Ordering::Greater);
        assert_eq!(libcmp("lib\u{e9}", "lib"), Ordering::Greater);
        assert_eq!(sorted, cache.entries);
        let rewritten = write_with_generator(Format::New, &sorted, LDCONFIG_GENERATOR);
        assert!(rewritten == HIGH_BYTE, "rewritten bytes differ");
    } else if cfg!(target_arch = "x86_64") {
        assert_eq!(libcmp(high, "libz.so.1"), Ordering::Less);
        assert_eq!(sorted[0].key, "libz.so.1");
    }
}

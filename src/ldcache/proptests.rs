// SPDX-License-Identifier: Apache-2.0
//! Property tests: `parse` never panics, whatever the bytes; the writers round-trip.

use std::cmp::Ordering;

use proptest::prelude::*;

use super::tests::{X86_64, without_hwcap};
use super::*;

fn arb_entry() -> impl Strategy<Value = Entry> {
    let key = "lib[a-z0-9_+-]{0,12}(\\.so(\\.[0-9]{1,4}){0,3})?";
    let dir = "/[a-z0-9_./-]{0,30}/";
    let flags = prop_oneof![
        Just(X86_64),
        Just(FLAG_ELF_LIBC6),
        Just(FLAG_ELF_LIBC6 | FLAG_X8664_LIBX32),
        Just(FLAG_ELF_LIBC6 | FLAG_AARCH64_LIB64),
        any::<i32>(),
    ];
    let hwcap = prop_oneof![
        3 => Just(0u64),
        1 => (0u64..4, 0u64..8).prop_map(|(level, index)| HWCAP_EXTENSION | level << 32 | index),
        1 => any::<u64>(),
    ];
    (key, dir, any::<bool>(), flags, hwcap).prop_map(|(key, dir, own_name, flags, hwcap)| {
        // Usually the value ends with the key, as in real caches (and shares its bytes).
        let file = if own_name {
            key.clone()
        } else {
            "other.so".to_owned()
        };
        Entry {
            value: format!("{dir}{file}"),
            key,
            flags,
            hwcap,
        }
    })
}

fn arb_cache() -> impl Strategy<Value = Vec<u8>> {
    (
        prop::collection::vec(arb_entry(), 0..6),
        prop_oneof![
            Just(Format::New),
            Just(Format::Old),
            Just(Format::OldWithNew)
        ],
    )
        .prop_map(|(entries, format)| write_with_generator(format, &entries, "gen"))
}

proptest! {
    #[test]
    fn parse_never_panics_on_arbitrary_bytes(
        prefix in prop_oneof![
            Just(&b""[..]),
            Just(&NEW_MAGIC[..]),
            Just(&OLD_MAGIC[..]),
        ],
        tail in prop::collection::vec(any::<u8>(), 0..600),
    ) {
        let mut bytes = prefix.to_vec();
        bytes.extend_from_slice(&tail);
        let _ = parse(&bytes);
    }

    #[test]
    fn parse_never_panics_on_truncated_caches(bytes in arb_cache(), cut in any::<prop::sample::Index>()) {
        let cut = cut.index(bytes.len() + 1);
        let _ = parse(&bytes[..cut]);
    }

    #[test]
    fn parse_never_panics_on_flipped_bytes(
        mut bytes in arb_cache(),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let at = at.index(bytes.len());
        bytes[at] ^= flip;
        let _ = parse(&bytes);
    }

    #[test]
    fn writers_round_trip(entries in prop::collection::vec(arb_entry(), 0..12)) {
        let new = parse(&write_new(&entries)).unwrap();
        prop_assert_eq!(&new.entries, &entries);
        prop_assert_eq!(new.format, Format::New);
        let compat = parse(&write_compat(&entries)).unwrap();
        prop_assert_eq!(&compat.entries, &entries);
        prop_assert_eq!(compat.format, Format::OldWithNew);
        let old = parse(&write_old(&entries)).unwrap();
        prop_assert_eq!(old.entries, without_hwcap(&entries));
        prop_assert_eq!(old.format, Format::Old);
    }

    #[test]
    fn sort_is_ordered_and_a_permutation(mut entries in prop::collection::vec(arb_entry(), 0..24)) {
        let original = entries.clone();
        sort_like_ldconfig(&mut entries);
        for pair in entries.windows(2) {
            prop_assert_ne!(
                write::compare_like_ldconfig(&pair[0], &pair[1]),
                Ordering::Greater
            );
        }
        let mut again = entries.clone();
        sort_like_ldconfig(&mut again);
        prop_assert_eq!(&again, &entries);
        let mut a = original.clone();
        let mut b = entries.clone();
        a.sort_by(|x, y| (&x.key, &x.value, x.flags, x.hwcap).cmp(&(&y.key, &y.value, y.flags, y.hwcap)));
        b.sort_by(|x, y| (&x.key, &x.value, x.flags, x.hwcap).cmp(&(&y.key, &y.value, y.flags, y.hwcap)));
        prop_assert_eq!(a, b);
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Kubernetes' rules for node label keys and values, and the sanitiser that turns any
//! text (a GPU's marketing name, a DMI product name) into a valid value. Pure.
//!
//! The sanitiser starts as gpu-feature-discovery's does (keep letters, digits, `-`, `_`,
//! `.` and spaces; runs of spaces become one `-`) and then also enforces what GFD leaves
//! to chance: at most 63 characters, and a letter or digit at both ends.

/// The longest label value, and the longest name part of a label key.
pub const MAX_NAME_LEN: usize = 63;
/// The longest prefix (DNS subdomain) of a label key.
const MAX_PREFIX_LEN: usize = 253;

/// `text` as a label value of at most `max` characters (and never more than
/// [`MAX_NAME_LEN`]): only `[A-Za-z0-9-_.]`, spaces turned into `-`, cut to length, and
/// trimmed so that it starts and ends with a letter or digit. May be empty (a valid
/// value) when nothing of `text` survives.
pub fn sanitise(text: &str, max: usize) -> String {
    let kept: String = text
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ' '))
        .collect();
    let joined = kept.split_whitespace().collect::<Vec<_>>().join("-");
    let cut: String = joined.chars().take(max.min(MAX_NAME_LEN)).collect();
    cut.trim_matches(|c: char| !c.is_ascii_alphanumeric())
        .to_string()
}

/// Whether `value` is a valid label value: empty, or a [name](is_valid_name).
pub fn is_valid_label_value(value: &str) -> bool {
    value.is_empty() || is_valid_name(value)
}

/// Whether `key` is a valid label key: `[prefix/]name`, the prefix a DNS subdomain of at
/// most 253 characters, the name at most 63 characters of `[A-Za-z0-9-_.]` that starts
/// and ends with a letter or digit.
pub fn is_valid_label_key(key: &str) -> bool {
    match key.split_once('/') {
        Some((prefix, name)) => is_dns_subdomain(prefix) && is_valid_name(name),
        None => is_valid_name(key),
    }
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, at most 63 characters.
fn is_valid_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            bytes.len() <= MAX_NAME_LEN
                && first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        }
        _ => false,
    }
}

/// RFC 1123 subdomain as Kubernetes checks it: dot-separated parts of lowercase letters,
/// digits and `-`, each starting and ending with a letter or digit; 253 characters at most.
fn is_dns_subdomain(prefix: &str) -> bool {
    !prefix.is_empty()
        && prefix.len() <= MAX_PREFIX_LEN
        && prefix.split('.').all(|part| {
            let bytes = part.as_bytes();
            let edge =
                |b: Option<&u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
            edge(bytes.first())
                && edge(bytes.last())
                && bytes
                    .iter()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
        })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn sanitise_follows_gfd_and_fits_kubernetes() {
        let long = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition with a long tail";
        let cases = [
            ("a100", "NVIDIA A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB"),
            ("t4", "Tesla T4", "Tesla-T4"),
            (
                "runs of spaces",
                "  NVIDIA   H100  80GB HBM3 ",
                "NVIDIA-H100-80GB-HBM3",
            ),
            (
                "dropped chars",
                "GeForce RTX™ 4090 (rev 2)",
                "GeForce-RTX-4090-rev-2",
            ),
            ("trailing dot", "Model 7.", "Model-7"),
            ("leading dash", "-_x_-", "x"),
            ("nothing left", "™ ()", ""),
            ("newline", "DGX A100\n", "DGX-A100"),
            (
                "cut to 63",
                long,
                "NVIDIA-RTX-PRO-6000-Blackwell-Max-Q-Workstation-Edition-with-a",
            ),
        ];
        for (case, input, want) in cases {
            let got = sanitise(input, MAX_NAME_LEN);
            assert_eq!(got, want, "case {case}");
            assert!(is_valid_label_value(&got), "case {case}: {got:?}");
        }
        assert_eq!(sanitise("Tesla T4", 5), "Tesla", "short budget");
        assert_eq!(sanitise("Tesla T4", 6), "Tesla", "budget ending on a dash");
    }

    #[test]
    fn keys_and_values_follow_kubernetes() {
        let keys = [
            ("gfd key", "nvidia.com/gpu.product", true),
            ("mig key", "nvidia.com/mig-1g.10gb.count", true),
            ("no prefix", "gpu.count", true),
            ("upper prefix", "NVIDIA.com/gpu", false),
            ("empty name", "nvidia.com/", false),
            ("empty prefix", "/gpu", false),
            ("two slashes", "nvidia.com/a/b", false),
            ("dash end", "nvidia.com/gpu-", false),
            ("dot part", "nvidia..com/gpu", false),
            ("64 name", &format!("nvidia.com/{}", "a".repeat(64)), false),
            ("63 name", &format!("nvidia.com/{}", "a".repeat(63)), true),
        ];
        for (case, key, want) in keys {
            assert_eq!(is_valid_label_key(key), want, "case {case}: {key}");
        }
        let values = [
            ("empty", "", true),
            ("product", "NVIDIA-A100-SXM4-80GB", true),
            ("space", "Tesla T4", false),
            ("slash", "a/b", false),
            ("dot end", "12.", false),
            ("64", &"a".repeat(64), false),
        ];
        for (case, value, want) in values {
            assert_eq!(is_valid_label_value(value), want, "case {case}: {value}");
        }
    }

    proptest! {
        #[test]
        fn sanitise_always_gives_a_valid_value(text in any::<String>(), max in 0usize..80) {
            let value = sanitise(&text, max);
            prop_assert!(is_valid_label_value(&value), "{text:?} -> {value:?}");
            prop_assert!(value.len() <= max.min(MAX_NAME_LEN));
            prop_assert_eq!(sanitise(&value, max), value.clone(), "idempotent");
        }

        #[test]
        fn sanitise_keeps_valid_values(value in "[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?") {
            prop_assert_eq!(sanitise(&value, MAX_NAME_LEN), value);
        }
    }
}

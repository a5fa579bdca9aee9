//! CDI qualified device names: `vendor/class=name`, e.g. `nvidia.com/gpu=0`.
//!
//! The syntax is the CDI library's (its `parser` package), restricted to ASCII as it
//! is: a vendor or class starts with a letter, ends with a letter or digit, and has
//! letters, digits, `.`, `-` and `_` in between; a device name may also start with a
//! digit and may contain `:` (MIG devices are `0:1`). Parsing never normalises, so a
//! name prints back exactly as it was written.

use std::fmt;
use std::str::FromStr;

/// What a vendor or class may look like, for error messages.
const VENDOR_CLASS_RULE: &str = "it must start with a letter, end with a letter or digit, \
     and contain only letters, digits, '.', '-' and '_'";

/// What a device name may look like, for error messages.
const DEVICE_RULE: &str = "it must start and end with a letter or digit, \
     and contain only letters, digits, '.', '-', '_' and ':'";

/// A malformed CDI name or kind; each variant quotes the input and says what is valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CdiNameError {
    #[error("invalid CDI device name {input:?}: expected vendor/class=name, e.g. nvidia.com/gpu=0")]
    Format { input: String },
    #[error("invalid CDI kind {input:?}: expected vendor/class, e.g. nvidia.com/gpu")]
    KindFormat { input: String },
    #[error("invalid CDI vendor {value:?}{}: {VENDOR_CLASS_RULE}", within(.input, .value))]
    Vendor { value: String, input: String },
    #[error("invalid CDI class {value:?}{}: {VENDOR_CLASS_RULE}", within(.input, .value))]
    Class { value: String, input: String },
    #[error("invalid CDI device name {value:?}{}: {DEVICE_RULE}", within(.input, .value))]
    Device { value: String, input: String },
}

/// ` in "input"` when the bad part is not the whole input.
fn within(input: &str, value: &str) -> String {
    if input == value {
        String::new()
    } else {
        format!(" in {input:?}")
    }
}

/// A fully qualified CDI device name. Ordered by vendor, class, then name, so a
/// sorted list groups devices by kind.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    vendor: String,
    class: String,
    name: String,
}

impl QualifiedName {
    /// Builds a name from its parts, checking each.
    pub fn new(vendor: &str, class: &str, name: &str) -> Result<Self, CdiNameError> {
        let input = format!("{vendor}/{class}={name}");
        check_vendor(vendor, &input)?;
        check_class(class, &input)?;
        check_device(name, &input)?;
        Ok(Self {
            vendor: vendor.to_owned(),
            class: class.to_owned(),
            name: name.to_owned(),
        })
    }

    /// `nvidia.com` in `nvidia.com/gpu=0`.
    pub fn vendor(&self) -> &str {
        &self.vendor
    }

    /// `gpu` in `nvidia.com/gpu=0`.
    pub fn class(&self) -> &str {
        &self.class
    }

    /// `0` in `nvidia.com/gpu=0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `vendor/class`: the `kind` of the spec that defines the device.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }
}

impl FromStr for QualifiedName {
    type Err = CdiNameError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        let format = || CdiNameError::Format {
            input: input.to_owned(),
        };
        let (kind, name) = input.split_once('=').ok_or_else(format)?;
        let (vendor, class) = kind.split_once('/').ok_or_else(format)?;
        // Neither part may hold a second separator; the character checks below would
        // reject it too, but as a bad vendor or class, which misleads.
        if class.contains('/') || name.contains('=') {
            return Err(format());
        }
        check_vendor(vendor, input)?;
        check_class(class, input)?;
        check_device(name, input)?;
        Ok(Self {
            vendor: vendor.to_owned(),
            class: class.to_owned(),
            name: name.to_owned(),
        })
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

/// Splits and checks a spec's `kind`, `vendor/class`.
pub fn parse_kind(kind: &str) -> Result<(String, String), CdiNameError> {
    let (vendor, class) = kind
        .split_once('/')
        .filter(|(_, class)| !class.contains('/'))
        .ok_or_else(|| CdiNameError::KindFormat {
            input: kind.to_owned(),
        })?;
    check_vendor(vendor, kind)?;
    check_class(class, kind)?;
    Ok((vendor.to_owned(), class.to_owned()))
}

/// Checks the `name` part of a qualified name (a spec's `devices[].name`).
pub fn validate_device_name(name: &str) -> Result<(), CdiNameError> {
    check_device(name, name)
}

fn check_vendor(vendor: &str, input: &str) -> Result<(), CdiNameError> {
    if is_vendor_or_class(vendor) {
        Ok(())
    } else {
        Err(CdiNameError::Vendor {
            value: vendor.to_owned(),
            input: input.to_owned(),
        })
    }
}

fn check_class(class: &str, input: &str) -> Result<(), CdiNameError> {
    if is_vendor_or_class(class) {
        Ok(())
    } else {
        Err(CdiNameError::Class {
            value: class.to_owned(),
            input: input.to_owned(),
        })
    }
}

fn check_device(name: &str, input: &str) -> Result<(), CdiNameError> {
    let bytes = name.as_bytes();
    let ok = match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphanumeric()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_' | b':'))
        }
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(CdiNameError::Device {
            value: name.to_owned(),
            input: input.to_owned(),
        })
    }
}

fn is_vendor_or_class(part: &str) -> bool {
    let bytes = part.as_bytes();
    match (bytes.first(), bytes.last()) {
        (Some(first), Some(last)) => {
            first.is_ascii_alphabetic()
                && last.is_ascii_alphanumeric()
                && bytes
                    .iter()
                    .all(|&c| c.is_ascii_alphanumeric() || matches!(c, b'.' | b'-' | b'_'))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn good_names_parse_into_their_parts() {
        let cases = [
            ("index", "nvidia.com/gpu=0", "nvidia.com", "gpu", "0"),
            ("index 1", "nvidia.com/gpu=1", "nvidia.com", "gpu", "1"),
            (
                "uuid",
                "nvidia.com/gpu=GPU-0d1c2b3a-1111-2222-3333-444455556666",
                "nvidia.com",
                "gpu",
                "GPU-0d1c2b3a-1111-2222-3333-444455556666",
            ),
            (
                "mig uuid",
                "nvidia.com/gpu=MIG-0d1c2b3a-1111-2222-3333-444455556666",
                "nvidia.com",
                "gpu",
                "MIG-0d1c2b3a-1111-2222-3333-444455556666",
            ),
            (
                "mig index",
                "nvidia.com/gpu=0:1",
                "nvidia.com",
                "gpu",
                "0:1",
            ),
            ("gpu0", "nvidia.com/gpu=gpu0", "nvidia.com", "gpu", "gpu0"),
            (
                "mig0:1",
                "nvidia.com/gpu=mig0:1",
                "nvidia.com",
                "gpu",
                "mig0:1",
            ),
            ("all", "nvidia.com/gpu=all", "nvidia.com", "gpu", "all"),
            (
                "dotted class",
                "nvidia.com/gpu.mig=0",
                "nvidia.com",
                "gpu.mig",
                "0",
            ),
            ("one-letter parts", "a/b=c", "a", "b", "c"),
            (
                "underscores",
                "ven_dor/cl_ass=na_me",
                "ven_dor",
                "cl_ass",
                "na_me",
            ),
            ("upper case", "Vendor.IO/GPU=X", "Vendor.IO", "GPU", "X"),
        ];
        for (case, input, vendor, class, name) in cases {
            let parsed: QualifiedName =
                input.parse().unwrap_or_else(|e| panic!("case {case}: {e}"));
            assert_eq!(parsed.vendor(), vendor, "case {case}");
            assert_eq!(parsed.class(), class, "case {case}");
            assert_eq!(parsed.name(), name, "case {case}");
            assert_eq!(parsed.kind(), format!("{vendor}/{class}"), "case {case}");
            assert_eq!(parsed.to_string(), input, "case {case}");
            let built = QualifiedName::new(vendor, class, name)
                .unwrap_or_else(|e| panic!("case {case}: {e}"));
            assert_eq!(built, parsed, "case {case}");
        }
    }

    #[test]
    fn bad_names_are_rejected_with_the_bad_part() {
        let cases = [
            ("no name", "nvidia.com/gpu", "expected vendor/class=name"),
            ("no kind", "gpu=0", "expected vendor/class=name"),
            ("empty", "", "expected vendor/class=name"),
            (
                "two slashes",
                "nvidia.com/gpu/x=0",
                "expected vendor/class=name",
            ),
            (
                "two equals",
                "nvidia.com/gpu=0=1",
                "expected vendor/class=name",
            ),
            ("empty vendor", "/gpu=0", "invalid CDI vendor \"\""),
            ("empty class", "nvidia.com/=0", "invalid CDI class \"\""),
            (
                "empty name",
                "nvidia.com/gpu=",
                "invalid CDI device name \"\"",
            ),
            (
                "vendor starts with digit",
                "1nv/gpu=0",
                "invalid CDI vendor \"1nv\"",
            ),
            (
                "vendor ends with dot",
                "nvidia./gpu=0",
                "invalid CDI vendor \"nvidia.\"",
            ),
            (
                "class ends with dash",
                "nvidia.com/gpu-=0",
                "invalid CDI class \"gpu-\"",
            ),
            (
                "class with colon",
                "nvidia.com/g:pu=0",
                "invalid CDI class \"g:pu\"",
            ),
            (
                "name starts with dash",
                "nvidia.com/gpu=-0",
                "invalid CDI device name \"-0\"",
            ),
            (
                "name ends with colon",
                "nvidia.com/gpu=0:",
                "invalid CDI device name \"0:\"",
            ),
            (
                "name with space",
                "nvidia.com/gpu=a b",
                "invalid CDI device name \"a b\"",
            ),
            (
                "non-ascii",
                "nvidia.com/gpu=é",
                "invalid CDI device name \"é\"",
            ),
        ];
        for (case, input, want) in cases {
            let err = match input.parse::<QualifiedName>() {
                Ok(name) => panic!("case {case}: parsed as {name:?}"),
                Err(err) => err.to_string(),
            };
            assert!(err.contains(want), "case {case}: {err:?} lacks {want:?}");
            assert!(
                err.contains(&format!("{input:?}")),
                "case {case}: {err:?} lacks input"
            );
        }
    }

    #[test]
    fn format_error_gives_an_example() {
        let err = "nvidia.com/gpu".parse::<QualifiedName>().err();
        assert_eq!(
            err.map(|e| e.to_string()).as_deref(),
            Some(
                "invalid CDI device name \"nvidia.com/gpu\": expected vendor/class=name, \
                 e.g. nvidia.com/gpu=0"
            )
        );
    }

    #[test]
    fn kinds_and_device_names() {
        let kinds = [
            ("plain", "nvidia.com/gpu", true),
            ("dotted class", "example.com/a.b", true),
            ("no slash", "nvidia.com", false),
            ("two slashes", "a/b/c", false),
            ("bad vendor", "-a/b", false),
            ("empty class", "a/", false),
        ];
        for (case, kind, ok) in kinds {
            assert_eq!(parse_kind(kind).is_ok(), ok, "case {case}");
        }
        assert_eq!(
            parse_kind("nvidia.com/gpu"),
            Ok(("nvidia.com".to_owned(), "gpu".to_owned()))
        );
        let names = [
            ("digit", "0", true),
            ("mig", "0:1", true),
            ("slash", "a/b", false),
        ];
        for (case, name, ok) in names {
            assert_eq!(validate_device_name(name).is_ok(), ok, "case {case}");
        }
        let err = validate_device_name("a/b").map_err(|e| e.to_string());
        assert_eq!(
            err,
            Err(format!("invalid CDI device name \"a/b\": {DEVICE_RULE}"))
        );
    }

    #[test]
    fn sorted_names_group_by_kind() {
        let mut names: Vec<QualifiedName> = ["b.com/x=0", "a.com/y=1", "a.com/x=2", "a.com/x=1"]
            .iter()
            .filter_map(|s| s.parse().ok())
            .collect();
        names.sort();
        let printed: Vec<String> = names.iter().map(ToString::to_string).collect();
        assert_eq!(
            printed,
            ["a.com/x=1", "a.com/x=2", "a.com/y=1", "b.com/x=0"]
        );
    }

    proptest! {
        #[test]
        fn parse_never_panics_and_round_trips(input in any::<String>()) {
            if let Ok(name) = input.parse::<QualifiedName>() {
                prop_assert_eq!(name.to_string(), input);
            }
        }

        #[test]
        fn near_miss_names_round_trip(input in "[a-z0-9./=:_-]{0,6}/[a-z0-9./=:_-]{0,6}=[a-zA-Z0-9./=:_-]{0,8}") {
            if let Ok(name) = input.parse::<QualifiedName>() {
                prop_assert_eq!(name.to_string(), input.clone());
                let rebuilt = QualifiedName::new(name.vendor(), name.class(), name.name());
                prop_assert_eq!(rebuilt, Ok(name));
            }
        }
    }
}

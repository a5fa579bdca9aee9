//! Device lists: `NVIDIA_VISIBLE_DEVICES`, swarm resources, volume-mount ids and CDI
//! names all share this grammar.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::{Quoted, RequestError};

/// A parsed `NVIDIA_VISIBLE_DEVICES`-style list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceList {
    /// Unset, empty or `void`: not a GPU container; nothing is injected.
    Void,
    /// `none`: the driver (libraries, binaries, control nodes) but no GPU.
    None,
    /// `all`: every GPU and every MIG device.
    All,
    /// Specific devices, in the order given (duplicates are folded later, by identity).
    Ids(Vec<DeviceId>),
}

/// One element of a device list.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum DeviceId {
    /// `3`: a GPU by NVML index (PCI bus order).
    Index(u32),
    /// `0:1`: MIG device 1 (enumeration order) of GPU 0.
    MigIndex { gpu: u32, mig: u32 },
    /// `GPU-xxxxxxxx-…`, stored lowercase.
    GpuUuid(String),
    /// `MIG-xxxxxxxx-…`, stored lowercase.
    MigUuid(String),
    /// `MIG-GPU-<uuid>/<gi>/<ci>`: the pre-R470 MIG naming.
    MigLegacy {
        gpu_uuid: String,
        gpu_instance_id: u32,
        compute_instance_id: u32,
    },
    /// `0000:07:00.0`: a GPU by PCI address (sysfs form, lowercase).
    BusId(String),
    /// `nvidia.com/gpu=0`: a fully qualified CDI device name.
    Cdi { kind: String, name: String },
}

impl FromStr for DeviceList {
    type Err = RequestError;

    fn from_str(list: &str) -> Result<Self, Self::Err> {
        let trimmed = list.trim();
        if trimmed.is_empty() {
            return Ok(Self::Void);
        }
        let elements: Vec<&str> = trimmed.split(',').map(str::trim).collect();
        if let Some(position) = elements.iter().position(|e| e.is_empty()) {
            return Err(RequestError::EmptyEntry {
                position: position + 1,
                list: Quoted::new(list),
            });
        }
        // As NVIDIA's tools do: `void` anywhere disables, `all` anywhere wins.
        if elements.contains(&"void") {
            return Ok(Self::Void);
        }
        if elements.contains(&"all") {
            return Ok(Self::All);
        }
        if elements.contains(&"none") {
            if elements.len() > 1 {
                return Err(RequestError::NotAlone {
                    word: "none",
                    list: Quoted::new(list),
                });
            }
            return Ok(Self::None);
        }
        elements
            .into_iter()
            .map(|e| DeviceId::parse(e, list))
            .collect::<Result<Vec<_>, _>>()
            .map(Self::Ids)
    }
}

impl DeviceId {
    /// Parses one element; `list` is the whole value, for error messages.
    fn parse(element: &str, list: &str) -> Result<Self, RequestError> {
        let invalid = || RequestError::InvalidDevice {
            element: Quoted::new(element),
            list: Quoted::new(list),
        };
        let malformed = |reason| RequestError::MalformedUuid {
            element: Quoted::new(element),
            list: Quoted::new(list),
            reason,
        };
        if let Some(index) = parse_index(element) {
            return Ok(Self::Index(index));
        }
        if let Some((gpu, mig)) = element.split_once(':')
            && let (Some(gpu), Some(mig)) = (parse_index(gpu), parse_index(mig))
        {
            return Ok(Self::MigIndex { gpu, mig });
        }
        if let Some(rest) = strip_prefix_ci(element, "MIG-GPU-") {
            let mut parts = rest.split('/');
            let (Some(uuid), Some(gi), Some(ci), None) =
                (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                return Err(malformed("a legacy MIG id is MIG-GPU-<uuid>/<gi>/<ci>"));
            };
            let (Some(gi), Some(ci)) = (parse_index(gi), parse_index(ci)) else {
                return Err(malformed("a legacy MIG id is MIG-GPU-<uuid>/<gi>/<ci>"));
            };
            if !is_uuid_body(uuid) {
                return Err(malformed(UUID_SHAPE));
            }
            return Ok(Self::MigLegacy {
                gpu_uuid: format!("GPU-{}", uuid.to_ascii_lowercase()),
                gpu_instance_id: gi,
                compute_instance_id: ci,
            });
        }
        if let Some(body) = strip_prefix_ci(element, "GPU-") {
            return if is_uuid_body(body) {
                Ok(Self::GpuUuid(format!("GPU-{}", body.to_ascii_lowercase())))
            } else {
                Err(malformed(UUID_SHAPE))
            };
        }
        if let Some(body) = strip_prefix_ci(element, "MIG-") {
            return if is_uuid_body(body) {
                Ok(Self::MigUuid(format!("MIG-{}", body.to_ascii_lowercase())))
            } else {
                Err(malformed(UUID_SHAPE))
            };
        }
        if let Some(bus) = normalize_bus_id(element) {
            return Ok(Self::BusId(bus));
        }
        if let Some((kind, name)) = element.split_once('=')
            && is_cdi_kind(kind)
            && is_cdi_name(name)
        {
            return Ok(Self::Cdi {
                kind: kind.to_string(),
                name: name.to_string(),
            });
        }
        Err(invalid())
    }
}

const UUID_SHAPE: &str = "a UUID is GPU- or MIG- followed by 32 hex digits in 8-4-4-4-12 groups";

/// A plain decimal index: digits only (no sign, no spaces), fits in u32.
fn parse_index(s: &str) -> Option<u32> {
    if s.is_empty() || s.len() > 10 || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

fn strip_prefix_ci<'a>(s: &'a str, prefix: &str) -> Option<&'a str> {
    let head = s.get(..prefix.len())?;
    head.eq_ignore_ascii_case(prefix)
        .then(|| &s[prefix.len()..])
}

/// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`, hex.
fn is_uuid_body(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// `vendor/class`: vendor a dotted DNS-ish name, class alphanumeric with `-_.`.
pub(super) fn is_cdi_kind(kind: &str) -> bool {
    let Some((vendor, class)) = kind.split_once('/') else {
        return false;
    };
    let ok = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
            && s.as_bytes()[0].is_ascii_alphanumeric()
    };
    ok(vendor) && ok(class)
}

pub(super) fn is_cdi_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 128
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.:".contains(&b))
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Index(i) => write!(f, "{i}"),
            Self::MigIndex { gpu, mig } => write!(f, "{gpu}:{mig}"),
            Self::GpuUuid(u) | Self::MigUuid(u) | Self::BusId(u) => f.write_str(u),
            Self::MigLegacy {
                gpu_uuid,
                gpu_instance_id,
                compute_instance_id,
            } => write!(f, "MIG-{gpu_uuid}/{gpu_instance_id}/{compute_instance_id}"),
            Self::Cdi { kind, name } => write!(f, "{kind}={name}"),
        }
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Void => f.write_str("void"),
            Self::None => f.write_str("none"),
            Self::All => f.write_str("all"),
            Self::Ids(ids) => {
                for (i, id) in ids.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{id}")?;
                }
                Ok(())
            }
        }
    }
}

impl Serialize for DeviceList {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Normalises a PCI bus id to the sysfs form: 4-digit domain, lowercase
/// (`00000000:07:00.0` from NVML becomes `0000:07:00.0`). Returns `None` when the value
/// is not a bus id.
pub fn normalize_bus_id(raw: &str) -> Option<String> {
    let raw = raw.trim();
    let (domain, rest) = raw.split_once(':')?;
    let (bus, rest) = rest.split_once(':')?;
    let (device, function) = rest.split_once('.')?;
    let domain = u32::from_str_radix(domain, 16).ok()?;
    let bus = u8::from_str_radix(bus, 16).ok()?;
    let device = u8::from_str_radix(device, 16).ok()?;
    let function = u8::from_str_radix(function, 16).ok()?;
    if domain > 0xffff || device > 0x1f || function > 7 {
        return None;
    }
    Some(format!("{domain:04x}:{bus:02x}:{device:02x}.{function:x}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const U0: &str = "GPU-4e1f0000-0000-4000-8000-000000000000";

    #[test]
    fn device_lists_parse() {
        let cases: Vec<(&str, &str, DeviceList)> = vec![
            ("unset/empty", "", DeviceList::Void),
            ("blank", "  ", DeviceList::Void),
            ("void", "void", DeviceList::Void),
            ("void wins", "0,void", DeviceList::Void),
            ("none", "none", DeviceList::None),
            ("all", "all", DeviceList::All),
            ("all wins", "0,all", DeviceList::All),
            (
                "indices",
                "0, 1",
                DeviceList::Ids(vec![DeviceId::Index(0), DeviceId::Index(1)]),
            ),
            (
                "uuid upper",
                "GPU-4E1F0000-0000-4000-8000-000000000000",
                DeviceList::Ids(vec![DeviceId::GpuUuid(U0.into())]),
            ),
            (
                "mig index",
                "0:1",
                DeviceList::Ids(vec![DeviceId::MigIndex { gpu: 0, mig: 1 }]),
            ),
            (
                "mig uuid",
                "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee",
                DeviceList::Ids(vec![DeviceId::MigUuid(
                    "MIG-aaaaaaaa-bbbb-cccc-dddd-eeeeeeeeeeee".into(),
                )]),
            ),
            (
                "legacy mig",
                "MIG-GPU-4e1f0000-0000-4000-8000-000000000000/1/0",
                DeviceList::Ids(vec![DeviceId::MigLegacy {
                    gpu_uuid: U0.into(),
                    gpu_instance_id: 1,
                    compute_instance_id: 0,
                }]),
            ),
            (
                "bus id",
                "00000000:B1:00.0",
                DeviceList::Ids(vec![DeviceId::BusId("0000:b1:00.0".into())]),
            ),
            (
                "cdi",
                "nvidia.com/gpu=0",
                DeviceList::Ids(vec![DeviceId::Cdi {
                    kind: "nvidia.com/gpu".into(),
                    name: "0".into(),
                }]),
            ),
        ];
        for (name, input, want) in cases {
            assert_eq!(input.parse::<DeviceList>(), Ok(want), "case {name}");
        }
    }

    #[test]
    fn bad_device_lists_name_the_bad_value() {
        let junk = "x".repeat(10 * 1024);
        let cases: Vec<(&str, String, &str)> = vec![
            ("negative", "-1".into(), "\"-1\""),
            ("bad uuid", "GPU-nope".into(), "\"GPU-nope\""),
            ("empty entry", "0,,1".into(), "position 2"),
            ("trailing comma", "0,".into(), "position 2"),
            ("plus sign", "+1".into(), "\"+1\""),
            ("none mixed", "none,0".into(), "\"none\""),
            ("junk", junk.clone(), "(10240 bytes)"),
            ("overflow", "99999999999".into(), "\"99999999999\""),
            ("bad mig", "0:x".into(), "\"0:x\""),
            (
                "bad legacy mig",
                "MIG-GPU-zz/1/0".into(),
                "\"MIG-GPU-zz/1/0\"",
            ),
        ];
        for (name, input, needle) in cases {
            let err = match input.parse::<DeviceList>() {
                Ok(list) => panic!("case {name}: {input:.40} parsed as {list:?}"),
                Err(e) => e.to_string(),
            };
            assert!(
                err.contains(needle),
                "case {name}: {err:?} lacks {needle:?}"
            );
            assert!(
                err.len() < 600,
                "case {name}: message too long ({} bytes)",
                err.len()
            );
        }
    }

    #[test]
    fn device_lists_print_back() {
        for input in [
            "0,1",
            "all",
            "none",
            "void",
            "0:1",
            U0,
            "nvidia.com/gpu=all",
        ] {
            let list: DeviceList = match input.parse() {
                Ok(l) => l,
                Err(e) => panic!("case {input}: {e}"),
            };
            assert_eq!(list.to_string(), input, "case {input}");
        }
    }

    proptest! {
        #[test]
        fn device_list_parsing_never_panics(s in ".{0,300}") {
            let _ = s.parse::<DeviceList>();
        }

        #[test]
        fn device_list_parsing_of_near_valid_input_never_panics(
            s in "[0-9a-fA-FGPUMI:,./= -]{0,80}"
        ) {
            if let Ok(list) = s.parse::<DeviceList>() {
                // Whatever parses prints back to something that parses to the same list.
                let again: DeviceList = list.to_string().parse().map_err(|e| {
                    TestCaseError::fail(format!("{list} did not re-parse: {e}"))
                })?;
                prop_assert_eq!(again, list);
            }
        }
    }
}

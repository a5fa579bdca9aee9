// SPDX-License-Identifier: Apache-2.0
//! What gpu-feature-discovery labels beyond the inventory, read from the node: each GPU's
//! PCI class in sysfs (`gpu.mode`), the vGPU capability in PCI config space
//! (`vgpu.present`, `vgpu.host-driver-*`), the NVLink fabric ids from NVML
//! (`gpu.clique`) and each MIG profile's attributes from NVML
//! (`mig-<profile>.{multiprocessors,slices.*,engines.*,memory}`).
//!
//! [`read`] does the I/O and never fails: a fact it cannot read is left unknown (and the
//! label follows GFD's rule for that case). [`labels`] and the parsers are pure.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::inventory::Inventory;
use crate::nvml::{MigAttributes, Nvml};

/// Where sysfs lists PCI functions, under the proc root (as `discover::drm` reads it).
pub const SYSFS_PCI_DEVICES: &str = "sys/bus/pci/devices";
/// NVIDIA's PCI vendor id as sysfs writes it.
const NVIDIA_VENDOR: &str = "0x10de";
/// A VGA controller: a GPU in graphics mode.
pub const PCI_CLASS_VGA: u32 = 0x03_00_00;
/// A 3D controller: a GPU in compute mode.
pub const PCI_CLASS_3D: u32 = 0x03_02_00;

/// The node's facts besides the inventory.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeviceFacts {
    /// Each GPU's PCI class (with the programming interface: `0x030200`), in inventory
    /// order; `None` where sysfs could not say.
    pub pci_classes: Vec<Option<u32>>,
    /// The vGPU functions of a guest, in sysfs order.
    pub vgpus: Vec<Vgpu>,
    /// `(cluster UUID, clique id)` of every GPU attached to an NVLink fabric.
    pub fabric: Vec<(String, u32)>,
    /// By MIG profile (`1g.10gb`, `+` kept): what NVML reports for a device of it.
    pub mig_attributes: BTreeMap<String, MigAttributes>,
}

/// A vGPU function and its host driver record, when the capability has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Vgpu {
    pub host_driver: Option<HostDriver>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostDriver {
    pub version: String,
    pub branch: String,
}

/// Reads the facts for `inventory`'s GPUs: sysfs under `proc_root`, NVML through
/// `nvml` when the labels come from it.
pub fn read(proc_root: &Path, inventory: &Inventory, nvml: Option<&Nvml>) -> DeviceFacts {
    let devices = proc_root.join(SYSFS_PCI_DEVICES);
    let pci_classes = inventory
        .gpus
        .iter()
        .map(|gpu| {
            let path = devices.join(&gpu.bus_id).join("class");
            let class = std::fs::read_to_string(&path)
                .ok()
                .and_then(|t| parse_class(&t));
            if class.is_none() {
                tracing::debug!(path = %path.display(), "no PCI class");
            }
            class
        })
        .collect();
    let mut facts = DeviceFacts {
        pci_classes,
        vgpus: read_vgpus(&devices),
        ..DeviceFacts::default()
    };
    if let Some(nvml) = nvml {
        read_nvml(nvml, inventory, &mut facts);
    }
    facts
}

/// The vGPU functions among NVIDIA's PCI functions in `devices`.
fn read_vgpus(devices: &Path) -> Vec<Vgpu> {
    let Ok(entries) = std::fs::read_dir(devices) else {
        return Vec::new();
    };
    let mut names: Vec<_> = entries.flatten().map(|e| e.path()).collect();
    names.sort();
    names
        .iter()
        .filter(|dir| {
            std::fs::read_to_string(dir.join("vendor")).is_ok_and(|v| v.trim() == NVIDIA_VENDOR)
        })
        .filter_map(|dir| match std::fs::read(dir.join("config")) {
            Ok(config) => vgpu_capability(&config),
            Err(error) => {
                tracing::debug!(path = %dir.display(), %error, "no PCI config space");
                None
            }
        })
        .collect()
}

fn read_nvml(nvml: &Nvml, inventory: &Inventory, facts: &mut DeviceFacts) {
    for gpu in &inventory.gpus {
        let Ok(device) = nvml.device_by_index(gpu.index) else {
            continue;
        };
        match device.fabric_info() {
            Ok(info) if info.is_attached() => facts
                .fabric
                .push((info.cluster_uuid_string(), info.clique_id)),
            Ok(_) => {}
            Err(error) => tracing::debug!(gpu = gpu.index, %error, "no fabric info"),
        }
        for mig in &gpu.mig_devices {
            if facts.mig_attributes.contains_key(&mig.profile) {
                continue;
            }
            let attributes = nvml
                .device_by_uuid(&mig.uuid)
                .and_then(|device| device.mig_attributes());
            match attributes {
                Ok(attributes) => {
                    facts.mig_attributes.insert(mig.profile.clone(), attributes);
                }
                Err(error) => tracing::debug!(mig = %mig.uuid, %error, "no MIG attributes"),
            }
        }
    }
}

/// `0x030200` (sysfs's `class` file) → 0x030200.
pub fn parse_class(text: &str) -> Option<u32> {
    let hex = text.trim().strip_prefix("0x")?;
    u32::from_str_radix(hex, 16).ok()
}

/// Config space offsets and ids of the PCI capability list.
const STATUS: usize = 0x06;
const STATUS_CAPABILITY_LIST: u8 = 0x10;
const CAPABILITY_POINTER: usize = 0x34;
const VENDOR_CAPABILITY_ID: u8 = 0x09;
/// The vendor capability's records start after id, next, length and the `VF` signature.
const RECORDS_AT: usize = 5;
/// The host driver record: id 0, then 10 bytes of version and 10 of branch.
const FIELD_LEN: usize = 10;

/// The vGPU found in a function's config space: its first vendor-specific capability
/// carries the `VF` signature (NVIDIA's vGPU guest marker). `None` for anything else,
/// including a config space too short to hold one (unprivileged readers get 64 bytes;
/// GFD refuses those outright, we treat them as "no vGPU").
pub fn vgpu_capability(config: &[u8]) -> Option<Vgpu> {
    if config.len() < 256 || config[STATUS] & STATUS_CAPABILITY_LIST == 0 {
        return None;
    }
    let mut seen = [false; 256];
    let mut at = usize::from(config[CAPABILITY_POINTER]);
    while at != 0 && at + 2 < config.len() && !seen[at] {
        seen[at] = true;
        let id = config[at];
        if id == 0xff {
            return None;
        }
        if id == VENDOR_CAPABILITY_ID {
            let length = usize::from(config[at + 2]);
            let capability = config.get(at..at + length)?;
            return is_vgpu(capability).then(|| Vgpu {
                host_driver: host_driver(capability),
            });
        }
        at = usize::from(config[at + 1]);
    }
    None
}

fn is_vgpu(capability: &[u8]) -> bool {
    capability.get(3..5) == Some(b"VF".as_slice())
}

/// Walks the capability's records to the host driver one (id 0).
fn host_driver(capability: &[u8]) -> Option<HostDriver> {
    let mut at = RECORDS_AT;
    while *capability.get(at)? != 0 {
        let length = usize::from(*capability.get(at + 1)?);
        if length == 0 {
            return None;
        }
        at += length;
    }
    let data = capability.get(at + 2..at + 2 + 2 * FIELD_LEN)?;
    let text = |bytes: &[u8]| {
        String::from_utf8_lossy(bytes)
            .trim_matches('\0')
            .to_string()
    };
    Some(HostDriver {
        version: text(&data[..FIELD_LEN]),
        branch: text(&data[FIELD_LEN..]),
    })
}

/// `gpu.mode` from the classes: GFD's rule, in our words: every GPU must share one
/// class, a VGA controller is `graphics`, a 3D controller `compute`; anything else, a
/// mix, or a class that could not be read, is `unknown`.
pub fn gpu_mode(classes: &[Option<u32>]) -> &'static str {
    let distinct: BTreeSet<Option<u32>> = classes.iter().copied().collect();
    match distinct.into_iter().collect::<Vec<_>>().as_slice() {
        [Some(PCI_CLASS_VGA)] => "graphics",
        [Some(PCI_CLASS_3D)] => "compute",
        _ => "unknown",
    }
}

/// `gpu.mode`, `gpu.clique` and the `vgpu.*` labels, by name (without `nvidia.com/`).
pub fn labels(facts: &DeviceFacts) -> BTreeMap<&'static str, String> {
    let mut labels = BTreeMap::new();
    let mut put = |name: &'static str, value: String| {
        labels.insert(name, value);
    };
    if !facts.pci_classes.is_empty() {
        put("gpu.mode", gpu_mode(&facts.pci_classes).to_string());
    }
    if !facts.vgpus.is_empty() {
        put("vgpu.present", "true".to_string());
    }
    // GFD lets the last vGPU's record win; they come from one host, so they agree.
    if let Some(host) = facts
        .vgpus
        .iter()
        .rev()
        .find_map(|v| v.host_driver.as_ref())
    {
        put("vgpu.host-driver-version", sanitised(&host.version));
        put("vgpu.host-driver-branch", sanitised(&host.branch));
    }
    // The clique label only when every attached GPU names the same cluster and clique
    // (GFD logs the conflict and leaves the label out).
    let clusters: BTreeSet<&str> = facts.fabric.iter().map(|(c, _)| c.as_str()).collect();
    let cliques: BTreeSet<u32> = facts.fabric.iter().map(|(_, id)| *id).collect();
    if let ([cluster], [clique]) = (
        clusters.into_iter().collect::<Vec<_>>().as_slice(),
        cliques.into_iter().collect::<Vec<_>>().as_slice(),
    ) {
        put("gpu.clique", format!("{cluster}.{clique}"));
    }
    labels
}

/// A host driver field as a valid label value (it is read from config space).
fn sanitised(text: &str) -> String {
    super::k8s::sanitise(text, super::k8s::MAX_NAME_LEN)
}

/// The `<prefix>.*` attribute labels of a MIG profile, as GFD names them.
pub fn mig_attribute_labels(a: &MigAttributes) -> [(&'static str, String); 9] {
    [
        ("memory", a.memory_mib.to_string()),
        ("multiprocessors", a.multiprocessors.to_string()),
        ("slices.gi", a.gpu_instance_slices.to_string()),
        ("slices.ci", a.compute_instance_slices.to_string()),
        ("engines.copy", a.copy_engines.to_string()),
        ("engines.decoder", a.decoders.to_string()),
        ("engines.encoder", a.encoders.to_string()),
        ("engines.jpeg", a.jpeg_engines.to_string()),
        ("engines.ofa", a.ofa_engines.to_string()),
    ]
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// 256 bytes of config space with `capability` at 0x40 as the only capability.
    fn config_with(capability: &[u8]) -> Vec<u8> {
        let mut config = vec![0u8; 256];
        config[STATUS] = STATUS_CAPABILITY_LIST;
        config[CAPABILITY_POINTER] = 0x40;
        config[0x40..0x40 + capability.len()].copy_from_slice(capability);
        config
    }

    /// A vendor capability: `VF`, then `records`, with its length filled in.
    fn vendor(records: &[u8]) -> Vec<u8> {
        let mut capability = vec![VENDOR_CAPABILITY_ID, 0, 0, b'V', b'F'];
        capability.extend_from_slice(records);
        capability[2] = capability.len() as u8;
        capability
    }

    fn host_record(version: &str, branch: &str) -> Vec<u8> {
        let mut record = vec![0, 22];
        for text in [version, branch] {
            let mut field = [0u8; FIELD_LEN];
            field[..text.len()].copy_from_slice(text.as_bytes());
            record.extend_from_slice(&field);
        }
        record
    }

    #[test]
    fn vgpus_are_found_by_the_vendor_capabilitys_signature() {
        let host = Some(HostDriver {
            version: "550.90.05".into(),
            branch: "r550_00".into(),
        });
        let mut skipped = vec![7, 4, 0xaa, 0xbb];
        skipped.extend(host_record("550.90.05", "r550_00"));
        let mut looped = config_with(&[0x01, 0x40, 0, 0]);
        looped[0x40 + 1] = 0x40;
        let mut no_list = config_with(&vendor(&host_record("1", "2")));
        no_list[STATUS] = 0;
        let cases: Vec<(&str, Vec<u8>, Option<Vgpu>)> = vec![
            (
                "host record first",
                config_with(&vendor(&host_record("550.90.05", "r550_00"))),
                Some(Vgpu {
                    host_driver: host.clone(),
                }),
            ),
            (
                "another record before it",
                config_with(&vendor(&skipped)),
                Some(Vgpu { host_driver: host }),
            ),
            (
                "no host record",
                config_with(&vendor(&[7, 0])),
                Some(Vgpu { host_driver: None }),
            ),
            (
                "record cut short",
                config_with(&vendor(&[0, 22, b'5'])),
                Some(Vgpu { host_driver: None }),
            ),
            (
                "not VF",
                config_with(&[VENDOR_CAPABILITY_ID, 0, 5, b'X', b'Y']),
                None,
            ),
            ("no capability list", no_list, None),
            ("looped chain", looped, None),
            ("broken chain", config_with(&[0xff, 0x50, 0]), None),
            ("unprivileged read", vec![0u8; 64], None),
        ];
        for (case, config, want) in cases {
            assert_eq!(vgpu_capability(&config), want, "case {case}");
        }
    }

    #[test]
    fn gpu_mode_needs_one_class_for_every_gpu() {
        let cases: [(&str, &[Option<u32>], &str); 6] = [
            ("3d", &[Some(PCI_CLASS_3D), Some(PCI_CLASS_3D)], "compute"),
            ("vga", &[Some(PCI_CLASS_VGA)], "graphics"),
            (
                "mixed",
                &[Some(PCI_CLASS_3D), Some(PCI_CLASS_VGA)],
                "unknown",
            ),
            ("other class", &[Some(0x03_80_00)], "unknown"),
            ("unreadable", &[Some(PCI_CLASS_3D), None], "unknown"),
            ("vga with prog-if", &[Some(0x03_00_01)], "unknown"),
        ];
        for (case, classes, want) in cases {
            assert_eq!(gpu_mode(classes), want, "case {case}");
        }
        assert_eq!(parse_class("0x030200\n"), Some(PCI_CLASS_3D));
        assert_eq!(parse_class("030200"), None, "sysfs always writes 0x");
    }

    #[test]
    fn the_clique_label_needs_one_cluster_and_one_clique() {
        let uuid = "3f1c2b6a-9d4e-4c1a-8b7e-5a6d2c9e0f11";
        let other = "00000000-0000-0000-0000-000000000001";
        type Case<'a> = (&'a str, Vec<(&'a str, u32)>, Option<String>);
        let cases: [Case; 5] = [
            ("none attached", vec![], None),
            ("one", vec![(uuid, 7)], Some(format!("{uuid}.7"))),
            (
                "agreeing",
                vec![(uuid, 7), (uuid, 7)],
                Some(format!("{uuid}.7")),
            ),
            ("two cliques", vec![(uuid, 7), (uuid, 8)], None),
            ("two clusters", vec![(uuid, 7), (other, 7)], None),
        ];
        for (case, fabric, want) in cases {
            let facts = DeviceFacts {
                fabric: fabric.iter().map(|(u, c)| (u.to_string(), *c)).collect(),
                ..DeviceFacts::default()
            };
            let labels = labels(&facts);
            assert_eq!(labels.get("gpu.clique"), want.as_ref(), "case {case}");
            assert!(!labels.contains_key("gpu.mode"), "case {case}: no GPUs");
            assert!(!labels.contains_key("vgpu.present"), "case {case}");
        }
    }

    proptest! {
        #[test]
        fn config_space_never_panics(config in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = vgpu_capability(&config);
        }

        #[test]
        fn host_driver_values_are_valid_labels(version in ".{0,10}", branch in ".{0,10}") {
            let facts = DeviceFacts {
                vgpus: vec![Vgpu {
                    host_driver: Some(HostDriver { version, branch }),
                }],
                ..DeviceFacts::default()
            };
            for (key, value) in &labels(&facts) {
                prop_assert!(super::super::k8s::is_valid_label_value(value), "{key}={value}");
            }
        }
    }
}

//! Resolves a [`DeviceList`] against the [`Inventory`]: which GPUs and MIG devices the
//! container gets.
//!
//! Pure: values in, values out. Every id must name something that exists; an unknown
//! one is an error that quotes it and lists what the node has. The same device named
//! twice (`0,GPU-<uuid of 0>`) is folded to one, keeping the first mention's place.
//! [`check()`] then holds the container's `NVIDIA_REQUIRE_*` constraints against the
//! driver and the selected GPUs.

mod check;
mod mig_access;

use std::fmt::Write as _;

use serde::Serialize;

use crate::inventory::{Gpu, Inventory, MigDevice};
use crate::request::{DeviceId, DeviceList, Quoted};

pub use check::{Facts, GpuFacts, check};
pub use mig_access::mig_access_gpus;

/// CDI kinds whose device names we resolve ourselves (the JIT-CDI vocabulary), with
/// the kind the device plugin's `cdi-annotations` and `cdi-cri` strategies name
/// (`k8s.device-plugin.nvidia.com/gpu=<runtime id>`), so those work with no spec file.
pub const NVIDIA_CDI_KINDS: [&str; 3] = [
    "nvidia.com/gpu",
    "runtime.nvidia.com/gpu",
    "k8s.device-plugin.nvidia.com/gpu",
];

/// A full GPU the container gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelectedGpu {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub bus_id: String,
}

/// A MIG device the container gets, with the parent whose node it also needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelectedMig {
    pub parent: SelectedGpu,
    /// The `M` of `N:M`.
    pub index: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
}

/// What the container gets. Empty lists with a non-void request mean "driver only".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    pub gpus: Vec<SelectedGpu>,
    pub mig_devices: Vec<SelectedMig>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectError {
    #[error("unknown GPU {id} (this node has: {known})")]
    UnknownGpu { id: Quoted, known: String },
    #[error("unknown MIG device {id} (this node has: {known})")]
    UnknownMig { id: Quoted, known: String },
    #[error(
        "unsupported CDI device kind {kind} in {id}: nvshim resolves {} itself; \
         other vendors' devices need a CDI spec file",
        NVIDIA_CDI_KINDS.join(" and ")
    )]
    ForeignCdiKind { kind: Quoted, id: Quoted },
    #[error("invalid CDI device name {id}: {source}")]
    BadCdiName {
        id: Quoted,
        #[source]
        source: crate::request::RequestError,
    },
    /// A requirement that does not hold; `reasons` says why each alternative fails.
    #[error("unsatisfied {variable} {requirement}: {reasons}")]
    Unsatisfied {
        variable: String,
        requirement: Quoted,
        reasons: String,
    },
    /// A requirement that cannot be decided because a fact it needs is unknown.
    #[error("cannot check {variable} {requirement}: {missing}")]
    UnknownFact {
        variable: String,
        requirement: Quoted,
        missing: String,
    },
    /// NVIDIA's "cannot enable mig-config with specific MIG devices selected".
    #[error("{variable} cannot be combined with particular MIG devices: request full GPUs or all")]
    MigAccessWithMigDevices { variable: &'static str },
}

/// Resolves `list` against `inventory`. `Void` and `None` select nothing.
pub fn resolve(list: &DeviceList, inventory: &Inventory) -> Result<Selection, SelectError> {
    let mut selection = Selection::default();
    match list {
        DeviceList::Void | DeviceList::None => {}
        DeviceList::All => add_all(&mut selection, inventory),
        DeviceList::Ids(ids) => {
            for id in ids {
                add(&mut selection, id, inventory)?;
            }
        }
    }
    Ok(selection)
}

fn add_all(selection: &mut Selection, inventory: &Inventory) {
    for gpu in &inventory.gpus {
        push_gpu(selection, gpu);
        for mig in &gpu.mig_devices {
            push_mig(selection, gpu, mig);
        }
    }
}

fn add(selection: &mut Selection, id: &DeviceId, inventory: &Inventory) -> Result<(), SelectError> {
    let gpus = &inventory.gpus;
    let unknown_gpu = || SelectError::UnknownGpu {
        id: Quoted::new(&id.to_string()),
        known: known_gpus(inventory),
    };
    let unknown_mig = || SelectError::UnknownMig {
        id: Quoted::new(&id.to_string()),
        known: known_migs(inventory),
    };
    match id {
        DeviceId::Index(i) => {
            let gpu = gpus
                .iter()
                .find(|g| g.index == *i)
                .ok_or_else(unknown_gpu)?;
            push_gpu(selection, gpu);
        }
        DeviceId::GpuUuid(uuid) => {
            let gpu = gpus
                .iter()
                .find(|g| g.uuid.eq_ignore_ascii_case(uuid))
                .ok_or_else(unknown_gpu)?;
            push_gpu(selection, gpu);
        }
        DeviceId::BusId(bus) => {
            let gpu = gpus
                .iter()
                .find(|g| g.bus_id == *bus)
                .ok_or_else(unknown_gpu)?;
            push_gpu(selection, gpu);
        }
        DeviceId::MigIndex { gpu, mig } => {
            let (g, m) = gpus
                .iter()
                .find(|g| g.index == *gpu)
                .and_then(|g| {
                    g.mig_devices
                        .iter()
                        .find(|m| m.index == *mig)
                        .map(|m| (g, m))
                })
                .ok_or_else(unknown_mig)?;
            push_mig(selection, g, m);
        }
        DeviceId::MigUuid(uuid) => {
            let (g, m) = gpus
                .iter()
                .find_map(|g| {
                    g.mig_devices
                        .iter()
                        .find(|m| m.uuid.eq_ignore_ascii_case(uuid))
                        .map(|m| (g, m))
                })
                .ok_or_else(unknown_mig)?;
            push_mig(selection, g, m);
        }
        DeviceId::MigLegacy {
            gpu_uuid,
            gpu_instance_id,
            compute_instance_id,
        } => {
            let (g, m) = gpus
                .iter()
                .find(|g| g.uuid.eq_ignore_ascii_case(gpu_uuid))
                .and_then(|g| {
                    g.mig_devices
                        .iter()
                        .find(|m| {
                            m.gpu_instance_id == *gpu_instance_id
                                && m.compute_instance_id == *compute_instance_id
                        })
                        .map(|m| (g, m))
                })
                .ok_or_else(unknown_mig)?;
            push_mig(selection, g, m);
        }
        DeviceId::Cdi { kind, name } => {
            if !NVIDIA_CDI_KINDS.contains(&kind.as_str()) {
                return Err(SelectError::ForeignCdiKind {
                    kind: Quoted::new(kind),
                    id: Quoted::new(&id.to_string()),
                });
            }
            let inner: DeviceList = name.parse().map_err(|source| SelectError::BadCdiName {
                id: Quoted::new(&id.to_string()),
                source,
            })?;
            // A CDI name is one device (or `all`), never a list or another CDI name.
            match inner {
                DeviceList::All => add_all(selection, inventory),
                DeviceList::Ids(ids)
                    if ids.len() == 1 && !matches!(ids[0], DeviceId::Cdi { .. }) =>
                {
                    // Errors quote the name the user wrote, not the inner id.
                    add(selection, &ids[0], inventory).map_err(|e| match e {
                        SelectError::UnknownGpu { known, .. } => SelectError::UnknownGpu {
                            id: Quoted::new(&id.to_string()),
                            known,
                        },
                        SelectError::UnknownMig { known, .. } => SelectError::UnknownMig {
                            id: Quoted::new(&id.to_string()),
                            known,
                        },
                        other => other,
                    })?;
                }
                _ => return Err(unknown_gpu()),
            }
        }
    }
    Ok(())
}

fn selected(gpu: &Gpu) -> SelectedGpu {
    SelectedGpu {
        index: gpu.index,
        minor: gpu.minor,
        uuid: gpu.uuid.clone(),
        bus_id: gpu.bus_id.clone(),
    }
}

fn push_gpu(selection: &mut Selection, gpu: &Gpu) {
    if !selection.gpus.iter().any(|g| g.uuid == gpu.uuid) {
        selection.gpus.push(selected(gpu));
    }
}

fn push_mig(selection: &mut Selection, gpu: &Gpu, mig: &MigDevice) {
    if !selection.mig_devices.iter().any(|m| m.uuid == mig.uuid) {
        selection.mig_devices.push(SelectedMig {
            parent: selected(gpu),
            index: mig.index,
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
            uuid: mig.uuid.clone(),
        });
    }
}

/// At most this many devices are listed in an error.
const KNOWN_MAX: usize = 16;

fn known_gpus(inventory: &Inventory) -> String {
    if inventory.gpus.is_empty() {
        return "no GPUs".into();
    }
    let mut out = String::new();
    for (n, gpu) in inventory.gpus.iter().enumerate() {
        if n == KNOWN_MAX {
            let _ = write!(out, ", … {} more", inventory.gpus.len() - KNOWN_MAX);
            break;
        }
        let sep = if n == 0 { "" } else { ", " };
        let _ = write!(out, "{sep}{} {} {}", gpu.index, gpu.uuid, gpu.bus_id);
    }
    out
}

fn known_migs(inventory: &Inventory) -> String {
    let migs: Vec<String> = inventory
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices
                .iter()
                .map(move |m| format!("{}:{} {}", g.index, m.index, m.uuid))
        })
        .collect();
    if migs.is_empty() {
        if inventory.gpus.iter().all(|g| g.mig_enabled.is_none()) {
            return "no MIG devices known; only the NVML backend lists MIG devices".into();
        }
        return "no MIG devices".into();
    }
    let mut shown: Vec<String> = migs.iter().take(KNOWN_MAX).cloned().collect();
    if migs.len() > KNOWN_MAX {
        shown.push(format!("… {} more", migs.len() - KNOWN_MAX));
    }
    shown.join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::DriverInfo;

    fn uuid(i: u32) -> String {
        format!("GPU-4e1f0000-0000-4000-8000-{i:012x}")
    }

    fn inventory() -> Inventory {
        let gpus = (0..4)
            .map(|i| Gpu {
                index: i,
                minor: 3 - i,
                uuid: uuid(i),
                bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_bytes: None,
                compute_capability: None,
                brand: None,
                mig_enabled: Some(i == 0),
                mig_devices: if i == 0 {
                    vec![
                        MigDevice {
                            index: 0,
                            gpu_instance_id: 1,
                            compute_instance_id: 0,
                            uuid: "MIG-aaaaaaaa-0000-4000-8000-000000000000".into(),
                            memory_bytes: None,
                            profile: "1g.10gb".into(),
                        },
                        MigDevice {
                            index: 1,
                            gpu_instance_id: 2,
                            compute_instance_id: 0,
                            uuid: "MIG-aaaaaaaa-0000-4000-8000-000000000001".into(),
                            memory_bytes: None,
                            profile: "2g.20gb".into(),
                        },
                    ]
                } else {
                    vec![]
                },
            })
            .collect();
        Inventory {
            driver: DriverInfo {
                version: "550.54.15".into(),
                cuda_version: None,
            },
            gpus,
        }
    }

    fn pick(list: &str) -> Result<Selection, String> {
        let list: DeviceList = list.parse().map_err(|e| format!("parse: {e}"))?;
        resolve(&list, &inventory()).map_err(|e| e.to_string())
    }

    #[test]
    fn lists_resolve_to_devices() {
        let u3 = uuid(3);
        let cases: Vec<(&str, String, Vec<u32>, Vec<&str>)> = vec![
            (
                "indices keep request order",
                "2,0".into(),
                vec![2, 0],
                vec![],
            ),
            (
                "uuid folds with index",
                format!("3,{}", u3.to_uppercase()),
                vec![3],
                vec![],
            ),
            ("bus id", "0000:11:00.0".into(), vec![1], vec![]),
            ("none", "none".into(), vec![], vec![]),
            ("void", "void".into(), vec![], vec![]),
            (
                "all",
                "all".into(),
                vec![0, 1, 2, 3],
                vec!["1g.10gb", "2g.20gb"],
            ),
            ("mig by index", "0:1".into(), vec![], vec!["2g.20gb"]),
            (
                "mig by uuid",
                "MIG-aaaaaaaa-0000-4000-8000-000000000000".into(),
                vec![],
                vec!["1g.10gb"],
            ),
            (
                "mig legacy",
                format!("MIG-{}/2/0", uuid(0)),
                vec![],
                vec!["2g.20gb"],
            ),
            ("cdi index", "nvidia.com/gpu=1".into(), vec![1], vec![]),
            (
                "cdi mig",
                "nvidia.com/gpu=0:0".into(),
                vec![],
                vec!["1g.10gb"],
            ),
            (
                "cdi all",
                "runtime.nvidia.com/gpu=all".into(),
                vec![0, 1, 2, 3],
                vec!["1g.10gb", "2g.20gb"],
            ),
            ("duplicates", "1,1,nvidia.com/gpu=1".into(), vec![1], vec![]),
        ];
        let inv = inventory();
        for (name, list, want_gpus, want_migs) in cases {
            let sel = match pick(&list) {
                Ok(s) => s,
                Err(e) => panic!("case {name}: {e}"),
            };
            let gpus: Vec<u32> = sel.gpus.iter().map(|g| g.index).collect();
            assert_eq!(gpus, want_gpus, "case {name}");
            let profiles: Vec<&str> = sel
                .mig_devices
                .iter()
                .map(|m| {
                    inv.gpus[m.parent.index as usize].mig_devices[m.index as usize]
                        .profile
                        .as_str()
                })
                .collect();
            assert_eq!(profiles, want_migs, "case {name}");
        }
    }

    #[test]
    fn unknown_devices_are_named_with_what_exists() {
        let cases = [
            ("index", "9", "\"9\"", "0 GPU-4e1f0000"),
            (
                "uuid",
                "GPU-4e1f0000-0000-4000-8000-0000000000ff",
                "0000000000ff",
                "3 GPU-",
            ),
            ("mig index", "1:0", "\"1:0\"", "0:0 MIG-"),
            (
                "cdi foreign",
                "example.com/gpu=0",
                "\"example.com/gpu\"",
                "nvidia.com/gpu",
            ),
            (
                "cdi unknown",
                "nvidia.com/gpu=7",
                "\"nvidia.com/gpu=7\"",
                "0 GPU-",
            ),
            (
                "cdi junk",
                "nvidia.com/gpu=x",
                "\"nvidia.com/gpu=x\"",
                "expected an index",
            ),
        ];
        for (name, list, quoted, known) in cases {
            match pick(list) {
                Ok(sel) => panic!("case {name}: selected {sel:?}"),
                Err(e) => {
                    assert!(e.contains(quoted), "case {name}: {e}");
                    assert!(e.contains(known), "case {name}: {e}");
                }
            }
        }
    }

    #[test]
    fn procfs_inventories_explain_missing_mig_devices() {
        let mut inv = inventory();
        for g in &mut inv.gpus {
            g.mig_enabled = None;
            g.mig_devices.clear();
        }
        let list: DeviceList = "0:0".parse().unwrap_or(DeviceList::Void);
        let err = resolve(&list, &inv).map(|_| ()).map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(e) if e.contains("only the NVML backend")),
            "{err:?}"
        );
    }
}

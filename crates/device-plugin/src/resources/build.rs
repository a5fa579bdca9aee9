// SPDX-License-Identifier: Apache-2.0
//! Inventory × Settings → the advertised resources, following NVIDIA's MIG strategies
//! (`none`, `single`, `mixed`), ID strategies and the replicas of time-slicing and MPS.
//!
//! Reads sysfs (each GPU's `numa_node`) and nothing else; the caller passes the text
//! of `mig-minors` when it wants the MIG capability nodes. Decides nothing about
//! allocation.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use crate::config::{DeviceIdStrategy, MigStrategy, Settings, SharingStrategy};
use nvshim::discover::parse_mig_minors;
use nvshim::discover::table::{CAPS_DIR, MIG_MINORS};
use nvshim::inventory::{Gpu, Inventory, MigDevice};

use super::{
    Device, GPU_RESOURCE, MIG_RESOURCE_PREFIX, REPLICA_SEPARATOR, Resource, SHARED_SUFFIX, Unit,
};

/// Why the resources cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot parse {path}: {value:?} is not a NUMA node number")]
    NumaNode { path: PathBuf, value: String },
    #[error(
        "mig-strategy=single needs every GPU in the same MIG mode, \
         but MIG is enabled on GPUs {enabled} and disabled on GPUs {disabled}"
    )]
    SingleMixedMigMode { enabled: String, disabled: String },
    #[error(
        "mig-strategy=single needs at least one MIG device on every MIG-enabled GPU, \
         but GPUs {gpus} have none"
    )]
    SingleEmptyGpu { gpus: String },
    #[error(
        "mig-strategy=single needs one MIG profile on the whole node, \
         found {profiles} (use mig-strategy=mixed for several profiles)"
    )]
    SingleMixedProfiles { profiles: String },
    #[error(
        "MIG device {uuid} on GPU {gpu} has profile {profile:?}, which cannot be part of \
         a resource name (valid: letters, digits, '-', '_', '.', '+', ending in a letter \
         or digit, at most 59 characters)"
    )]
    InvalidProfile {
        gpu: u32,
        uuid: String,
        profile: String,
    },
    #[error("device id {id:?} is used twice in resource {resource}: by {first} and {second}")]
    DuplicateId {
        resource: String,
        id: String,
        first: String,
        second: String,
    },
    #[error(
        "sharing.mps cannot share GPUs with MIG enabled (NVIDIA's plugin refuses it too), \
         but MIG is enabled on GPUs {gpus}: disable MIG or use sharing.timeSlicing"
    )]
    MpsWithMig { gpus: String },
    #[error("{MIG_MINORS} has no entry {name:?} for MIG device {uuid}")]
    MigMinors { name: String, uuid: String },
}

/// Builds every resource to advertise, without the MIG capability nodes (see
/// [`build_with_mig_minors`]). Resources come in name order (`nvidia.com/gpu` first),
/// devices in GPU index, MIG index, replica order; resources with no devices are
/// left out.
pub fn build(
    inventory: &Inventory,
    settings: &Settings,
    sysfs: &Path,
) -> Result<Vec<Resource>, ResourceError> {
    build_with_mig_minors(inventory, settings, sysfs, None)
}

/// [`build`], and, given the text of `/proc/driver/nvidia-caps/mig-minors`, each MIG
/// device's nodes also list its GPU instance's and compute instance's `access`
/// capability nodes (`<dev root>/dev/nvidia-caps/nvidia-cap<N>`), as NVIDIA's plugin
/// passes them. A MIG device the file does not list is then an error.
pub fn build_with_mig_minors(
    inventory: &Inventory,
    settings: &Settings,
    sysfs: &Path,
    mig_minors: Option<&str>,
) -> Result<Vec<Resource>, ResourceError> {
    let mut gpus: Vec<&Gpu> = inventory.gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    if settings
        .sharing
        .as_ref()
        .is_some_and(|s| s.strategy == SharingStrategy::Mps)
    {
        let mig: Vec<&Gpu> = gpus.iter().copied().filter(|g| mig_on(g)).collect();
        if !mig.is_empty() {
            return Err(ResourceError::MpsWithMig {
                gpus: gpu_list(mig),
            });
        }
    }
    let minors: Option<HashMap<&str, u32>> =
        mig_minors.map(|text| parse_mig_minors(text).into_iter().collect());
    let mut groups: BTreeMap<String, Vec<Base>> = BTreeMap::new();
    for (gpu, what) in advertise(&gpus, settings.mig_strategy)? {
        let numa_node = read_numa_node(sysfs, &gpu.bus_id)?;
        let gpu_node = settings.dev_root.join(format!("dev/nvidia{}", gpu.minor));
        match what {
            Advertise::Whole => groups
                .entry(GPU_RESOURCE.to_string())
                .or_default()
                .push(Base {
                    unit: Unit {
                        gpu: gpu.index,
                        mig: None,
                    },
                    uuid: gpu.uuid.clone(),
                    runtime_id: match settings.device_id_strategy {
                        DeviceIdStrategy::Uuid => gpu.uuid.clone(),
                        DeviceIdStrategy::Index => gpu.index.to_string(),
                    },
                    numa_node,
                    bus_id: gpu.bus_id.clone(),
                    memory_mib: gpu.memory_bytes.map(mib),
                    nodes: vec![gpu_node],
                }),
            Advertise::Mig { mixed } => {
                let mut migs: Vec<&MigDevice> = gpu.mig_devices.iter().collect();
                migs.sort_by_key(|m| m.index);
                for mig in migs {
                    let name = if mixed {
                        mig_resource_name(gpu, mig)?
                    } else {
                        GPU_RESOURCE.to_string()
                    };
                    let mut nodes = vec![gpu_node.clone()];
                    if let Some(minors) = &minors {
                        nodes.extend(mig_cap_nodes(&settings.dev_root, gpu, mig, minors)?);
                    }
                    groups.entry(name).or_default().push(Base {
                        unit: Unit {
                            gpu: gpu.index,
                            mig: Some(mig.index),
                        },
                        uuid: mig.uuid.clone(),
                        runtime_id: match settings.device_id_strategy {
                            DeviceIdStrategy::Uuid => mig.uuid.clone(),
                            DeviceIdStrategy::Index => format!("{}:{}", gpu.index, mig.index),
                        },
                        numa_node,
                        bus_id: gpu.bus_id.clone(),
                        memory_mib: mig.memory_bytes.map(mib),
                        nodes,
                    });
                }
            }
        }
    }
    let mut resources = Vec::with_capacity(groups.len());
    for (name, bases) in groups {
        let resource = expand(name, bases, settings);
        if resource.devices.is_empty() {
            continue;
        }
        check_unique(&resource)?;
        resources.push(resource);
    }
    Ok(resources)
}

/// Reads `<sysfs>/bus/pci/devices/<bus id>/numa_node`. A missing file (or a bus id
/// that cannot name one) and a negative node (`-1`: no NUMA affinity) are `None`.
pub fn read_numa_node(sysfs: &Path, bus_id: &str) -> Result<Option<i64>, ResourceError> {
    if bus_id.is_empty() || bus_id.contains('/') || bus_id.starts_with('.') {
        return Ok(None);
    }
    let path = sysfs.join("bus/pci/devices").join(bus_id).join("numa_node");
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(ResourceError::Read { path, source }),
    };
    match text.trim().parse::<i64>() {
        Ok(node) if node >= 0 => Ok(Some(node)),
        Ok(_) => Ok(None),
        Err(_) => Err(ResourceError::NumaNode {
            path,
            value: text.trim().to_string(),
        }),
    }
}

/// One unit before replicas: what every device of it shares.
struct Base {
    unit: Unit,
    uuid: String,
    runtime_id: String,
    numa_node: Option<i64>,
    bus_id: String,
    memory_mib: Option<u64>,
    nodes: Vec<PathBuf>,
}

fn mib(bytes: u64) -> u64 {
    bytes / (1024 * 1024)
}

/// How one GPU is advertised.
enum Advertise {
    /// As a full GPU.
    Whole,
    /// As its MIG devices; `mixed` names the resource after the profile.
    Mig { mixed: bool },
}

/// Whether MIG is on: NVML says so, or the GPU has MIG devices (procfs cannot tell
/// the mode, but MIG devices only exist in it).
fn mig_on(gpu: &Gpu) -> bool {
    gpu.mig_enabled == Some(true) || !gpu.mig_devices.is_empty()
}

/// Applies the MIG strategy to every GPU, checking what NVIDIA's `single` strategy
/// checks: one MIG mode on the whole node, MIG devices on every MIG-enabled GPU, and
/// one profile.
fn advertise<'g>(
    gpus: &[&'g Gpu],
    strategy: MigStrategy,
) -> Result<Vec<(&'g Gpu, Advertise)>, ResourceError> {
    match strategy {
        MigStrategy::None => Ok(gpus.iter().map(|g| (*g, Advertise::Whole)).collect()),
        MigStrategy::Mixed => Ok(gpus
            .iter()
            .filter_map(|g| {
                if !mig_on(g) {
                    return Some((*g, Advertise::Whole));
                }
                if g.mig_devices.is_empty() {
                    // NVIDIA's mixed strategy only warns about an empty MIG GPU: it
                    // adds no device, and the node still serves its other resources.
                    tracing::warn!(gpu = g.index, uuid = %g.uuid, "MIG is enabled but the GPU has no MIG devices; it is not advertised");
                    return None;
                }
                Some((*g, Advertise::Mig { mixed: true }))
            })
            .collect()),
        MigStrategy::Single => {
            let (on, off): (Vec<&Gpu>, Vec<&Gpu>) = gpus.iter().partition(|g| mig_on(g));
            if on.is_empty() {
                return Ok(off.into_iter().map(|g| (g, Advertise::Whole)).collect());
            }
            if !off.is_empty() {
                return Err(ResourceError::SingleMixedMigMode {
                    enabled: gpu_list(on.iter().copied()),
                    disabled: gpu_list(off.iter().copied()),
                });
            }
            let empty: Vec<&Gpu> = on
                .iter()
                .copied()
                .filter(|g| g.mig_devices.is_empty())
                .collect();
            if !empty.is_empty() {
                return Err(ResourceError::SingleEmptyGpu {
                    gpus: gpu_list(empty),
                });
            }
            let mut profiles: BTreeMap<&str, BTreeSet<u32>> = BTreeMap::new();
            for gpu in &on {
                for mig in &gpu.mig_devices {
                    profiles.entry(&mig.profile).or_default().insert(gpu.index);
                }
            }
            if profiles.len() > 1 {
                let mut text = String::new();
                for (i, (profile, gpus)) in profiles.iter().enumerate() {
                    let sep = if i == 0 { "" } else { ", " };
                    let list: Vec<String> = gpus.iter().map(u32::to_string).collect();
                    let _ = write!(text, "{sep}{profile} on GPUs {}", list.join(" "));
                }
                return Err(ResourceError::SingleMixedProfiles { profiles: text });
            }
            Ok(on
                .into_iter()
                .map(|g| (g, Advertise::Mig { mixed: false }))
                .collect())
        }
    }
}

fn gpu_list<'g>(gpus: impl IntoIterator<Item = &'g Gpu>) -> String {
    let list: Vec<String> = gpus
        .into_iter()
        .map(|g| format!("{} ({})", g.index, g.uuid))
        .collect();
    list.join(", ")
}

/// `nvidia.com/mig-<profile>`, with NVIDIA's `+` → `.` (`1g.10gb+me` →
/// `mig-1g.10gb.me`); the result must be a valid Kubernetes extended resource name.
fn mig_resource_name(gpu: &Gpu, mig: &MigDevice) -> Result<String, ResourceError> {
    let profile = mig.profile.replace('+', ".");
    let valid = !profile.is_empty()
        && profile.len() <= 59
        && profile
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        && profile
            .chars()
            .last()
            .is_some_and(|c| c.is_ascii_alphanumeric());
    if !valid {
        return Err(ResourceError::InvalidProfile {
            gpu: gpu.index,
            uuid: mig.uuid.clone(),
            profile: mig.profile.clone(),
        });
    }
    Ok(format!("{MIG_RESOURCE_PREFIX}{profile}"))
}

/// The GPU instance's and compute instance's `access` capability nodes, named in
/// `mig-minors` by the parent's device minor as the runtime's discovery reads them.
fn mig_cap_nodes(
    dev_root: &Path,
    gpu: &Gpu,
    mig: &MigDevice,
    minors: &HashMap<&str, u32>,
) -> Result<Vec<PathBuf>, ResourceError> {
    let gi = format!("gpu{}/gi{}/access", gpu.minor, mig.gpu_instance_id);
    let ci = format!(
        "gpu{}/gi{}/ci{}/access",
        gpu.minor, mig.gpu_instance_id, mig.compute_instance_id
    );
    let caps_dir = CAPS_DIR.trim_start_matches('/');
    [gi, ci]
        .into_iter()
        .map(|name| match minors.get(name.as_str()) {
            Some(minor) => Ok(dev_root.join(format!("{caps_dir}/nvidia-cap{minor}"))),
            None => Err(ResourceError::MigMinors {
                name,
                uuid: mig.uuid.clone(),
            }),
        })
        .collect()
}

/// Turns a group of units into a resource, with `replicas` devices per unit when
/// time-slicing or MPS names the resource (and the `.shared` name with
/// `renameByDefault`): both kinds of sharing advertise the same replicas.
fn expand(name: String, bases: Vec<Base>, settings: &Settings) -> Resource {
    let shared = settings
        .sharing
        .as_ref()
        .and_then(|sharing| sharing.replicas(&name).map(|replicas| (sharing, replicas)));
    let Some((sharing, replicas)) = shared else {
        let devices = bases
            .into_iter()
            .map(|b| Device {
                id: b.runtime_id.clone(),
                unit: b.unit,
                replica: None,
                uuid: b.uuid,
                runtime_id: b.runtime_id,
                numa_node: b.numa_node,
                bus_id: b.bus_id,
                memory_mib: b.memory_mib,
                nodes: b.nodes,
            })
            .collect();
        return Resource {
            name,
            devices,
            replicas: None,
            sharing: None,
            fail_requests_greater_than_one: false,
        };
    };
    let mut devices = Vec::with_capacity(bases.len() * replicas as usize);
    for b in &bases {
        for n in 0..replicas {
            devices.push(Device {
                id: format!("{}{REPLICA_SEPARATOR}{n}", b.runtime_id),
                unit: b.unit,
                replica: Some(n),
                uuid: b.uuid.clone(),
                runtime_id: b.runtime_id.clone(),
                numa_node: b.numa_node,
                bus_id: b.bus_id.clone(),
                memory_mib: b.memory_mib,
                nodes: b.nodes.clone(),
            });
        }
    }
    let name = if sharing.rename_by_default {
        format!("{name}{SHARED_SUFFIX}")
    } else {
        name
    };
    Resource {
        name,
        devices,
        replicas: Some(replicas),
        sharing: Some(sharing.strategy),
        fail_requests_greater_than_one: sharing.fail_requests_greater_than_one,
    }
}

/// Two devices with one ID would be one device to kubelet (two GPUs reporting one
/// UUID is a broken inventory); refuse rather than advertise fewer than we have.
fn check_unique(resource: &Resource) -> Result<(), ResourceError> {
    let mut seen: HashMap<&str, &Device> = HashMap::with_capacity(resource.devices.len());
    for device in &resource.devices {
        if let Some(first) = seen.insert(&device.id, device) {
            return Err(ResourceError::DuplicateId {
                resource: resource.name.clone(),
                id: device.id.clone(),
                first: describe(first.unit),
                second: describe(device.unit),
            });
        }
    }
    Ok(())
}

fn describe(unit: Unit) -> String {
    match unit.mig {
        None => format!("GPU {}", unit.gpu),
        Some(m) => format!("MIG device {}:{m}", unit.gpu),
    }
}

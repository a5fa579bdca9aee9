// SPDX-License-Identifier: Apache-2.0
//! `Allocate`: the device IDs kubelet chose for one container → what the container
//! gets, shaped by the device-list strategies exactly as NVIDIA's plugin shapes it
//! (env var, `/dev/null` volume mounts, CDI annotations, CRI CDI devices, device
//! specs), plus, for an MPS-shared resource, the daemon's pipe directory, shm and
//! limits, and NVIDIA's extras (GDS, MOFED, GDRCopy, IMEX channels). Pure: the only
//! I/O is a `stat` of the optional control nodes when `pass-device-specs` is on.
//!
//! The result is plain data; the server turns it into the kubelet's protobuf
//! `ContainerAllocateResponse`. This module knows nothing of gRPC.

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::{DeviceListStrategy, Settings};
use crate::imex;
use crate::mps::{self, Limits};
use crate::resources::{Device, Resource, ResourceIndex, Unit};
use nvshim::discover::table::CONTROL_NODE;
use nvshim::request::{
    ENV_VISIBLE_DEVICES, VOLUME_MOUNT_IMEX_PREFIX, VOLUME_MOUNT_ROOT, VOLUME_MOUNT_SOURCE,
};

/// The vendor and class of the CDI devices NVIDIA's plugin generates its spec for:
/// names are `k8s.device-plugin.nvidia.com/gpu=<runtime id>` for GPUs and MIG devices
/// alike.
pub const CDI_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
/// The plugin name in the CDI annotation key `<prefix>nvidia-device-plugin_<uid>`.
pub const CDI_ANNOTATION_PLUGIN: &str = "nvidia-device-plugin";
/// The control nodes passed with `pass-device-specs`, in this order, each only when
/// it exists: `nvidia-uvm*` appear once the UVM module is loaded and `nvidia-modeset`
/// only with the modeset module, and a device spec whose host path is missing would
/// fail the container's creation.
pub const CONTROL_NODES: [&str; 4] = [
    CONTROL_NODE,
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];
/// The permissions of every device spec.
pub const DEVICE_PERMISSIONS: &str = "rw";
/// The env vars NVIDIA's plugin sets to `enabled` for `--gdrcopy-enabled`,
/// `--gds-enabled` and `--mofed-enabled`, and the one that lists the IMEX channels
/// (envvar strategy).
pub const ENV_GDRCOPY: &str = "NVIDIA_GDRCOPY";
pub const ENV_GDS: &str = "NVIDIA_GDS";
pub const ENV_MOFED: &str = "NVIDIA_MOFED";
pub const ENV_IMEX_CHANNELS: &str = "NVIDIA_IMEX_CHANNELS";
const ENABLED: &str = "enabled";
/// `NVIDIA_VISIBLE_DEVICES` for "no device by this variable" (only CDI allocates).
pub const VOID: &str = "void";

/// What one container gets, mirroring the kubelet's `ContainerAllocateResponse`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerAllocation {
    pub envs: BTreeMap<String, String>,
    pub mounts: Vec<AllocatedMount>,
    pub devices: Vec<AllocatedDeviceSpec>,
    pub annotations: BTreeMap<String, String>,
    /// Fully qualified CDI device names.
    pub cdi_devices: Vec<String>,
}

/// The kubelet's `Mount`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedMount {
    pub container_path: String,
    pub host_path: String,
    pub read_only: bool,
}

/// The kubelet's `DeviceSpec`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AllocatedDeviceSpec {
    pub container_path: String,
    pub host_path: String,
    pub permissions: String,
}

/// Some IDs, for an error message: the first few and how many there were in all.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct IdList {
    /// The first [`IdList::SHOWN`] IDs.
    pub shown: Vec<String>,
    /// How many IDs there were.
    pub total: usize,
}

impl IdList {
    /// How many IDs an error message quotes.
    pub const SHOWN: usize = 5;

    pub fn push(&mut self, id: &str) {
        if self.shown.len() < Self::SHOWN {
            self.shown.push(id.to_string());
        }
        self.total += 1;
    }

    pub fn is_empty(&self) -> bool {
        self.total == 0
    }

    /// The list of the first IDs of a resource: its valid set, for a message.
    pub fn of(resource: &Resource) -> IdList {
        let mut list = IdList::default();
        for device in &resource.devices {
            list.push(&device.id);
        }
        list
    }
}

impl fmt::Display for IdList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.total == 0 {
            return f.write_str("none");
        }
        for (i, id) in self.shown.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{id:?}")?;
        }
        let more = self.total - self.shown.len();
        if more > 0 {
            write!(f, " and {more} more")?;
        }
        Ok(())
    }
}

/// Why an `Allocate` or `GetPreferredAllocation` request is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocateError {
    #[error("invalid request for {resource}: no device ids")]
    EmptyRequest { resource: String },
    #[error("invalid request for {resource}: unknown device ids {ids} (known: {known})")]
    UnknownDevices {
        resource: String,
        ids: IdList,
        known: IdList,
    },
    #[error("invalid request for {resource}: device ids given more than once: {ids}")]
    DuplicateDevices { resource: String, ids: IdList },
    #[error("invalid request for {resource}: unhealthy devices {ids}")]
    Unhealthy { resource: String, ids: IdList },
    // NVIDIA's wording, which operators search for.
    #[error(
        "invalid request for {resource}: maximum request size for shared resources is 1; \
         found {requested}"
    )]
    SharedRequestTooLarge { resource: String, requested: usize },
    /// `sharing.mps` without `--mps-root` (which resolving the settings rules out).
    #[error("cannot allocate {resource}: it is shared with MPS but no MPS root is set")]
    NoMpsRoot { resource: String },
    #[error("invalid preferred allocation request for {resource}: allocation size 0")]
    ZeroSize { resource: String },
    #[error(
        "not enough available devices to satisfy allocation for {resource}: \
         {size} requested, {available} available"
    )]
    NotEnoughAvailable {
        resource: String,
        size: usize,
        available: usize,
    },
    #[error(
        "invalid preferred allocation request for {resource}: must-include device ids \
         {ids} are not among the available ones"
    )]
    MustIncludeNotAvailable { resource: String, ids: IdList },
    #[error(
        "invalid preferred allocation request for {resource}: {must_include} must-include \
         devices exceed the allocation size {size}"
    )]
    MustIncludeTooMany {
        resource: String,
        must_include: usize,
        size: usize,
    },
}

/// Maps request IDs to device positions, refusing unknown IDs. The position comes
/// from the index only if the device there really has the ID, so an index built
/// for another resource cannot point at the wrong device.
pub(crate) fn positions(
    resource: &Resource,
    index: &ResourceIndex,
    ids: &[String],
    unknown: &mut IdList,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(ids.len());
    for id in ids {
        match index
            .position(id)
            .filter(|p| resource.devices.get(*p).is_some_and(|d| &d.id == id))
        {
            Some(p) => out.push(p),
            None => unknown.push(id),
        }
    }
    out
}

/// Answers one container's `Allocate` request.
///
/// The runtime ids (what `NVIDIA_VISIBLE_DEVICES` and the CDI names carry) are the
/// requested devices' units, each once, in **unit order** (the resource's device
/// order: GPU index, then MIG index), whatever the request order. NVIDIA's plugin
/// keeps request order for UUIDs and a random order for indices; a stable order
/// makes a container's GPU numbering reproducible.
///
/// `healthy` is asked once per requested unit (the server passes the health
/// board's `is_healthy`).
pub fn allocate(
    resource: &Resource,
    index: &ResourceIndex,
    ids: &[String],
    settings: &Settings,
    healthy: &dyn Fn(Unit) -> bool,
) -> Result<ContainerAllocation, AllocateError> {
    let units = validate(resource, index, ids, healthy)?;
    let runtime_ids: Vec<&str> = units.iter().map(|d| d.runtime_id.as_str()).collect();
    let mut out = ContainerAllocation::default();
    let strategies = &settings.device_list_strategies;
    let has = |s: DeviceListStrategy| strategies.contains(&s);

    // The same order of steps as NVIDIA's getAllocateResponse.
    if has(DeviceListStrategy::CdiAnnotations) || has(DeviceListStrategy::CdiCri) {
        let names: Vec<String> = runtime_ids
            .iter()
            .map(|id| format!("{CDI_KIND}={id}"))
            .collect();
        if has(DeviceListStrategy::CdiAnnotations) {
            let key = format!(
                "{}{CDI_ANNOTATION_PLUGIN}_{}",
                settings.cdi_annotation_prefix,
                response_uid(&resource.name, &runtime_ids)
            );
            out.annotations.insert(key, names.join(","));
        }
        if has(DeviceListStrategy::CdiCri) {
            out.cdi_devices = names;
        }
    }
    if resource.is_mps() {
        let root = settings
            .mps_root
            .as_deref()
            .ok_or_else(|| AllocateError::NoMpsRoot {
                resource: resource.name.clone(),
            })?;
        add_mps(&mut out, resource, root, &units);
    }
    // NVIDIA's plugin sets these whatever the strategies; the runtime on the node
    // injects the class's devices. (Its CDI names `…/gds=all` etc. need a spec for the
    // class, which this plugin does not write.)
    let classes = &settings.device_classes;
    for (on, name) in [
        (classes.gdrcopy, ENV_GDRCOPY),
        (classes.gds, ENV_GDS),
        (classes.mofed, ENV_MOFED),
    ] {
        if on {
            out.envs.insert(name.to_string(), ENABLED.to_string());
        }
    }
    let only_cdi = strategies.iter().all(|s| {
        matches!(
            s,
            DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri
        )
    });
    if only_cdi {
        // NVIDIA's plugin stops here: the CDI spec carries the device nodes, so
        // pass-device-specs is ignored. It sets no NVIDIA_VISIBLE_DEVICES either, and then the
        // image's value (every CUDA image's "all") reaches the container: containerd puts the
        // CDI spec's "void" after it, but CRI-O puts the image's after the spec's, and the
        // runtime (ours, NVIDIA's) takes the last one, so with the env var accepted a pod of
        // the nvidia runtime class got every GPU on CRI-O (seen on the live cluster). A
        // container env from kubelet comes first everywhere and keeps the image's out.
        out.envs
            .insert(ENV_VISIBLE_DEVICES.to_string(), VOID.to_string());
        return Ok(out);
    }
    let channels = &settings.imex.channel_ids;
    if has(DeviceListStrategy::Envvar) {
        out.envs
            .insert(ENV_VISIBLE_DEVICES.to_string(), runtime_ids.join(","));
        if !channels.is_empty() {
            let ids: Vec<String> = channels.iter().map(u32::to_string).collect();
            out.envs
                .insert(ENV_IMEX_CHANNELS.to_string(), ids.join(","));
        }
    }
    if has(DeviceListStrategy::VolumeMounts) {
        out.envs.insert(
            ENV_VISIBLE_DEVICES.to_string(),
            VOLUME_MOUNT_ROOT.to_string(),
        );
        out.mounts
            .extend(runtime_ids.iter().map(|id| AllocatedMount {
                container_path: format!("{VOLUME_MOUNT_ROOT}/{id}"),
                host_path: VOLUME_MOUNT_SOURCE.to_string(),
                read_only: false,
            }));
        out.mounts.extend(channels.iter().map(|id| AllocatedMount {
            container_path: format!("{VOLUME_MOUNT_ROOT}/{VOLUME_MOUNT_IMEX_PREFIX}{id}"),
            host_path: VOLUME_MOUNT_SOURCE.to_string(),
            read_only: false,
        }));
    }
    if settings.pass_device_specs {
        out.devices = device_specs(&settings.dev_root, &units);
        out.devices.extend(channels.iter().map(|id| {
            let path = imex::channel_path(*id);
            AllocatedDeviceSpec {
                host_path: settings
                    .dev_root
                    .join(path.trim_start_matches('/'))
                    .display()
                    .to_string(),
                container_path: path,
                permissions: DEVICE_PERMISSIONS.to_string(),
            }
        }));
    }
    Ok(out)
}

/// The MPS part, as NVIDIA's plugin adds it (the pipe directory env and the pipe and
/// shm mounts), plus the replica's limits as env: the daemon sets them as its
/// defaults, but a client's own env is what holds when the daemon was started
/// without them (restarted by hand, an older daemon). The container numbers its GPUs
/// from 0 in `units` order, which is what the memory limit's keys are.
fn add_mps(out: &mut ContainerAllocation, resource: &Resource, root: &Path, units: &[&Device]) {
    let container_pipe = mps::pipe_dir(Path::new(mps::CONTAINER_ROOT), &resource.name);
    out.envs.insert(
        mps::ENV_PIPE_DIRECTORY.to_string(),
        container_pipe.display().to_string(),
    );
    let limits = Limits::new(resource.replicas.unwrap_or(1), units);
    out.envs.insert(
        mps::ENV_ACTIVE_THREAD_PERCENTAGE.to_string(),
        limits.active_thread_percentage.to_string(),
    );
    if !limits.pinned_mem_mib.is_empty() {
        out.envs.insert(
            mps::ENV_PINNED_DEVICE_MEM_LIMIT.to_string(),
            limits.pinned_env(),
        );
    }
    let mount = |container: PathBuf, host: PathBuf| AllocatedMount {
        container_path: container.display().to_string(),
        host_path: host.display().to_string(),
        read_only: false,
    };
    out.mounts.push(mount(
        container_pipe.clone(),
        mps::pipe_dir(root, &resource.name),
    ));
    out.mounts.push(mount(
        PathBuf::from(mps::CONTAINER_SHM),
        root.join(mps::SHM_DIR),
    ));
}

/// Checks the request and returns one device per requested unit, in unit order.
fn validate<'r>(
    resource: &'r Resource,
    index: &ResourceIndex,
    ids: &[String],
    healthy: &dyn Fn(Unit) -> bool,
) -> Result<Vec<&'r Device>, AllocateError> {
    let name = || resource.name.clone();
    if ids.is_empty() {
        return Err(AllocateError::EmptyRequest { resource: name() });
    }
    let mut unknown = IdList::default();
    let mut positions = positions(resource, index, ids, &mut unknown);
    if !unknown.is_empty() {
        return Err(AllocateError::UnknownDevices {
            resource: name(),
            ids: unknown,
            known: IdList::of(resource),
        });
    }
    positions.sort_unstable();
    let mut duplicates = IdList::default();
    for pair in positions.windows(2) {
        if pair[0] == pair[1] {
            duplicates.push(&resource.devices[pair[0]].id);
        }
    }
    if !duplicates.is_empty() {
        return Err(AllocateError::DuplicateDevices {
            resource: name(),
            ids: duplicates,
        });
    }
    if resource.fail_requests_greater_than_one && ids.len() > 1 {
        return Err(AllocateError::SharedRequestTooLarge {
            resource: name(),
            requested: ids.len(),
        });
    }
    let mut seen = HashSet::new();
    let units: Vec<&Device> = positions
        .iter()
        .map(|p| &resource.devices[*p])
        .filter(|d| seen.insert(d.unit))
        .collect();
    let sick: HashSet<Unit> = units
        .iter()
        .map(|d| d.unit)
        .filter(|u| !healthy(*u))
        .collect();
    if !sick.is_empty() {
        let mut ids = IdList::default();
        for p in &positions {
            let device = &resource.devices[*p];
            if sick.contains(&device.unit) {
                ids.push(&device.id);
            }
        }
        return Err(AllocateError::Unhealthy {
            resource: name(),
            ids,
        });
    }
    Ok(units)
}

/// The control nodes that exist under the dev root, then each unit's nodes, each
/// path once. Host paths are under the dev root, container paths are the same
/// paths without it.
///
/// NVIDIA's plugin stats the control nodes in its own container's `/dev`; this one
/// stats them where the device spec's host path points, which is the same place
/// when the dev root is `/` and the right place when it is not.
fn device_specs(dev_root: &Path, units: &[&Device]) -> Vec<AllocatedDeviceSpec> {
    let mut seen = HashSet::new();
    let mut specs = Vec::new();
    let mut push = |container: String, host: String| {
        if seen.insert(container.clone()) {
            specs.push(AllocatedDeviceSpec {
                container_path: container,
                host_path: host,
                permissions: DEVICE_PERMISSIONS.to_string(),
            });
        }
    };
    for node in CONTROL_NODES {
        let host = dev_root.join(node.trim_start_matches('/'));
        if host.symlink_metadata().is_ok() {
            push(node.to_string(), host.display().to_string());
        }
    }
    for device in units {
        for host in &device.nodes {
            let container = match host.strip_prefix(dev_root) {
                Ok(rel) => Path::new("/").join(rel),
                Err(_) => host.clone(),
            };
            push(container.display().to_string(), host.display().to_string());
        }
    }
    specs
}

/// The `<uid>` of the CDI annotation key. NVIDIA's plugin uses a random UUID per
/// response; the key only has to be a valid annotation name that does not collide
/// within one container, so this one is derived from the resource and the runtime
/// ids (128-bit FNV-1a, in UUID form), which keeps responses reproducible.
fn response_uid(resource: &str, runtime_ids: &[&str]) -> String {
    const OFFSET: u128 = 0x6c62_272e_07bb_0142_62b8_2175_6295_c58d;
    const PRIME: u128 = 0x0000_0000_0100_0000_0000_0000_0000_013b;
    let mut hash = OFFSET;
    let bytes = resource.bytes().chain(
        runtime_ids
            .iter()
            .flat_map(|id| b"\0".iter().copied().chain(id.bytes())),
    );
    for byte in bytes {
        hash ^= u128::from(byte);
        hash = hash.wrapping_mul(PRIME);
    }
    let hex = format!("{hash:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
#[path = "allocate_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "allocate_mps_tests.rs"]
mod mps_tests;

#[cfg(test)]
#[path = "allocate_proptests.rs"]
mod proptests;

// SPDX-License-Identifier: Apache-2.0
//! What the plugin advertises: resources (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, …)
//! and their devices, built once from the inventory and the settings by [`build`].
//!
//! A device's kubelet ID is what kubelet checkpoints, so it follows NVIDIA's plugin
//! exactly: the GPU or MIG UUID (or index, with `device-id-strategy=index`), with
//! `::<n>` appended for time-sliced and MPS replicas. This module only describes devices; it
//! never decides what a container gets (that is `allocate`) and never talks gRPC.

mod build;
#[cfg(test)]
pub(crate) mod fixtures;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::path::PathBuf;

use serde::Serialize;

use crate::config::SharingStrategy;

pub use build::{ResourceError, build, build_with_mig_minors, read_numa_node};

/// The resource full GPUs (and, with the `single` MIG strategy, MIG devices) are
/// advertised as.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
/// Prefix of the per-profile resources of the `mixed` MIG strategy.
pub const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";
/// Appended to a shared resource's name with `renameByDefault: true`.
pub const SHARED_SUFFIX: &str = ".shared";
/// Separates a replica's base ID from its number: `GPU-…::3`.
pub const REPLICA_SEPARATOR: &str = "::";

/// The physical thing a device stands for: a whole GPU or one MIG device on it.
/// Health is tracked per unit; replicas of a unit share its health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Unit {
    /// The parent GPU's index (PCI order, NVML's index).
    pub gpu: u32,
    /// The MIG device's index on that GPU, for MIG units.
    pub mig: Option<u32>,
}

/// One device as kubelet sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Device {
    /// The kubelet device ID: `GPU-…`, `MIG-…`, `3`, `3:1`, with `::<n>` for replicas.
    pub id: String,
    pub unit: Unit,
    /// The replica number for shared (time-sliced or MPS) devices.
    pub replica: Option<u32>,
    /// The GPU or MIG device UUID.
    pub uuid: String,
    /// What `NVIDIA_VISIBLE_DEVICES` names for this device under the configured id
    /// strategy: the UUID, or `3` / `3:1`.
    pub runtime_id: String,
    /// The PCI NUMA node of the (parent) GPU, when sysfs gives one ≥ 0.
    pub numa_node: Option<i64>,
    /// The (parent) GPU's PCI bus id in sysfs form.
    pub bus_id: String,
    /// The GPU's (or MIG device's) memory in MiB, when the inventory knows it: MPS
    /// splits it between the replicas.
    pub memory_mib: Option<u64>,
    /// Host paths of the device nodes this device needs besides the control nodes
    /// (`/dev/nvidia3`, and the MIG caps nodes), under the dev root.
    pub nodes: Vec<PathBuf>,
}

/// One advertised resource: its own socket, registration and device list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Resource {
    /// `nvidia.com/gpu`, `nvidia.com/gpu.shared`, `nvidia.com/mig-1g.10gb`, …
    pub name: String,
    /// Devices in a stable order (GPU index, MIG index, replica).
    pub devices: Vec<Device>,
    /// Replicas per unit, when the resource is shared.
    pub replicas: Option<u32>,
    /// How the replicas share their unit, when the resource is shared.
    pub sharing: Option<SharingStrategy>,
    /// Reject a request for more than one device of a shared resource.
    pub fail_requests_greater_than_one: bool,
}

impl Resource {
    /// The socket file name kubelet dials back: `nvidia-gpu.sock` for
    /// `nvidia.com/gpu`, `nvidia-mig-1g.10gb.sock`, `nvidia-gpu.shared.sock`.
    pub fn endpoint(&self) -> String {
        let short = self.name.strip_prefix("nvidia.com/").unwrap_or(&self.name);
        format!("nvidia-{}.sock", short.replace('/', "-"))
    }

    /// Whether the resource's replicas share their GPUs through MPS.
    pub fn is_mps(&self) -> bool {
        self.sharing == Some(SharingStrategy::Mps)
    }

    /// The distinct units of this resource, in device (and so unit) order.
    pub fn units(&self) -> Vec<Unit> {
        let mut units: Vec<Unit> = self.devices.iter().map(|d| d.unit).collect();
        units.dedup();
        units
    }
}

/// A lookup from kubelet device ID to the device's position in
/// [`Resource::devices`]. Building it walks the device list once; the server builds
/// one per resource when it builds the resources and keeps it, so `Allocate` and
/// `GetPreferredAllocation` cost one hash lookup per requested ID.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ResourceIndex {
    by_id: HashMap<String, usize>,
}

impl ResourceIndex {
    /// Indexes a resource's devices. Should an ID repeat (which [`build`] rules
    /// out), the first device with it wins.
    pub fn new(resource: &Resource) -> Self {
        let mut by_id = HashMap::with_capacity(resource.devices.len());
        for (position, device) in resource.devices.iter().enumerate() {
            by_id.entry(device.id.clone()).or_insert(position);
        }
        Self { by_id }
    }

    /// The position in [`Resource::devices`] of the device with this kubelet ID.
    pub fn position(&self, id: &str) -> Option<usize> {
        self.by_id.get(id).copied()
    }

    /// How many IDs the index knows.
    pub fn len(&self) -> usize {
        self.by_id.len()
    }

    /// Whether the index knows no ID.
    pub fn is_empty(&self) -> bool {
        self.by_id.is_empty()
    }
}

//! What the plugin advertises: resources (`nvidia.com/gpu`, `nvidia.com/mig-1g.10gb`, …)
//! and their devices, built once from the inventory and the settings.
//!
//! A device's kubelet ID is what kubelet checkpoints, so it follows NVIDIA's plugin
//! exactly: the GPU or MIG UUID (or index, with `device-id-strategy=index`), with
//! `::<n>` appended for time-sliced replicas.

use std::path::PathBuf;

use serde::Serialize;

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
    /// The replica number for time-sliced devices.
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
    /// Time-slicing replicas per unit, when the resource is shared.
    pub replicas: Option<u32>,
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
}

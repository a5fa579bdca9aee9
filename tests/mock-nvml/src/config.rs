// SPDX-License-Identifier: Apache-2.0
//! The mock's JSON config (`$MOCK_NVML_CONFIG`). The testkit's `mock_config` module writes
//! it; unknown fields are rejected on both levels so a typo on either side shows up as a
//! failed `nvmlInit` instead of a silently different node.

use std::path::PathBuf;

use serde::Deserialize;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// What `nvmlSystemGetDriverVersion` reports, e.g. `550.54.15`.
    pub driver_version: String,
    /// What `nvmlSystemGetCudaDriverVersion` reports, e.g. `12040`.
    pub cuda_driver_version: i32,
    /// The directory holding `nvidia<minor>`; `$MOCK_NVML_DEV_ROOT` overrides it. Default `/dev`.
    #[serde(default)]
    pub dev_root: Option<PathBuf>,
    pub gpus: Vec<GpuConfig>,
    #[serde(default)]
    pub xid_events: Vec<XidEventConfig>,
    /// A file of `<uuid> <xid>` lines (and the other lines README.md lists); lines appended
    /// to it become events, or make a GPU disappear.
    #[serde(default)]
    pub event_file: Option<PathBuf>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GpuConfig {
    pub name: String,
    pub uuid: String,
    /// Any `domain:bus:device.function` spelling; reported as NVML writes it.
    pub bus_id: String,
    pub minor: u32,
    pub memory_total_bytes: u64,
    #[serde(default)]
    pub memory_used_bytes: u64,
    pub compute_capability: (i32, i32),
    pub mig_mode: bool,
    #[serde(default)]
    pub mig_devices: Vec<MigConfig>,
    /// The GPU's NVLinks, in link order; none means the GPU has no NVLink at all.
    #[serde(default)]
    pub nvlinks: Vec<NvLinkConfig>,
}

/// `count` consecutive links to the same remote device.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NvLinkConfig {
    /// The PCI address at the far end (another GPU, or an NVSwitch), any spelling.
    pub remote_bus_id: String,
    pub count: u32,
    /// Whether these links are up; default true.
    #[serde(default = "active_default")]
    pub active: bool,
}

fn active_default() -> bool {
    true
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigConfig {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
    pub memory_total_bytes: u64,
    /// e.g. `1g.10gb`; the device's name is `<gpu name> MIG <profile>`.
    pub profile: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct XidEventConfig {
    /// A GPU's UUID, or a MIG device's (the event then names its GPU and instance ids).
    pub gpu_uuid: String,
    pub xid: u64,
    /// Delivered once this long has passed since the event set was created.
    #[serde(default)]
    pub delay_ms: u64,
}

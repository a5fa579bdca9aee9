// SPDX-License-Identifier: Apache-2.0
//! The mock NVML's JSON config (`D/mock-nvml.json`), generated from the same [`NodeSpec`] as the
//! rest of the node. Field names and nesting are exactly what the mock accepts (it rejects unknown
//! fields), so this module is the testkit's half of that contract.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use crate::error::TestkitError;
use crate::files;
use crate::mock_telemetry::{MockMigTelemetry, MockTelemetry};
use crate::spec::NodeSpec;

/// The config file as the mock reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockConfig {
    pub driver_version: String,
    pub cuda_driver_version: u32,
    pub dev_root: String,
    pub gpus: Vec<MockGpu>,
    pub xid_events: Vec<MockXidEvent>,
    pub event_file: String,
    /// A WSL2 node (`SimNode::build_wsl`): every GPU visible while `dev_root/dxg` exists.
    /// Left out of the file when false, so other nodes' configs read exactly as before.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub wsl: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockGpu {
    pub name: String,
    pub uuid: String,
    /// NVML form: `00000000:07:00.0`.
    pub bus_id: String,
    pub minor: u32,
    pub memory_total_bytes: u64,
    pub memory_used_bytes: u64,
    pub compute_capability: [u32; 2],
    pub mig_mode: bool,
    pub mig_devices: Vec<MockMigDevice>,
    /// The GPU's NVLinks, in link order. Left out of the file when empty (a GPU without
    /// NVLink), so configs without links read exactly as before.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub nvlinks: Vec<MockNvLink>,
    /// Readings (the mock re-reads them when the file changes, so rewriting the config
    /// changes what a running process sees). `None` is written as `null`: the GPU then
    /// answers `NVML_ERROR_NOT_SUPPORTED` for that reading.
    pub utilization_gpu_percent: Option<u32>,
    pub utilization_memory_percent: Option<u32>,
    pub temperature_celsius: Option<u32>,
    pub power_milliwatts: Option<u32>,
    pub sm_clock_mhz: Option<u32>,
    /// The metrics exporter's readings; left out of the file when `None` (every one of
    /// them `NOT_SUPPORTED`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<MockTelemetry>,
    /// What gpu-feature-discovery's extra queries (fabric, MIG attributes) answer; left
    /// out of the file when `None` (both then answer `NOT_SUPPORTED`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gfd: Option<MockGfd>,
}

/// A GPU's NVLink fabric registration and its MIG profiles' attributes.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockGfd {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fabric: Option<MockFabric>,
    /// By MIG profile name (`1g.10gb`).
    pub mig_attributes: BTreeMap<String, MockMigAttributes>,
}

/// `nvmlGpuFabricInfo_t`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockFabric {
    /// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub cluster_uuid: String,
    pub clique_id: u32,
    /// `NVML_GPU_FABRIC_STATE_*` (3: completed).
    pub state: u8,
    /// The registration's `nvmlReturn_t` (0: success).
    pub status: u32,
}

/// `nvmlDeviceAttributes_t` of a MIG profile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct MockMigAttributes {
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub gpu_instance_slices: u32,
    pub compute_instance_slices: u32,
    pub memory_mib: u64,
}

/// What a node's GPUs read unless a test says otherwise: an idle A100 (the mock's own
/// defaults, spelled out so the file says what the GPUs read).
const IDLE_TEMPERATURE_CELSIUS: u32 = 35;
const IDLE_POWER_MILLIWATTS: u32 = 60_000;
const IDLE_SM_CLOCK_MHZ: u32 = 1410;

/// `count` consecutive NVLinks of a GPU to the device at `remote_bus_id`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockNvLink {
    /// NVML form: `00000000:0F:00.0`.
    pub remote_bus_id: String,
    pub count: u32,
    pub active: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockMigDevice {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
    pub memory_total_bytes: u64,
    pub profile: String,
    /// Memory use and GPM of the MIG device; left out of the file when `None`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<MockMigTelemetry>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MockXidEvent {
    pub gpu_uuid: String,
    pub xid: u64,
    pub delay_ms: u64,
}

impl MockConfig {
    /// The config for `spec` on a node whose dev root is `dev_root` and event file `event_file`.
    pub fn new(spec: &NodeSpec, dev_root: &Path, event_file: &Path) -> MockConfig {
        MockConfig {
            driver_version: spec.driver_version.clone(),
            cuda_driver_version: spec.cuda_driver_version,
            dev_root: dev_root.display().to_string(),
            gpus: spec
                .gpus
                .iter()
                .map(|gpu| MockGpu {
                    name: gpu.name.clone(),
                    uuid: gpu.uuid.clone(),
                    bus_id: gpu.nvml_bus_id(),
                    minor: gpu.minor,
                    memory_total_bytes: gpu.memory_bytes,
                    memory_used_bytes: 0,
                    compute_capability: [gpu.compute_capability.0, gpu.compute_capability.1],
                    mig_mode: !gpu.mig_devices.is_empty(),
                    mig_devices: gpu
                        .mig_devices
                        .iter()
                        .map(|mig| MockMigDevice {
                            gpu_instance_id: mig.gpu_instance_id,
                            compute_instance_id: mig.compute_instance_id,
                            uuid: mig.uuid.clone(),
                            memory_total_bytes: mig.memory_bytes,
                            profile: mig.profile.clone(),
                            telemetry: None,
                        })
                        .collect(),
                    nvlinks: Vec::new(),
                    utilization_gpu_percent: Some(0),
                    utilization_memory_percent: Some(0),
                    temperature_celsius: Some(IDLE_TEMPERATURE_CELSIUS),
                    power_milliwatts: Some(IDLE_POWER_MILLIWATTS),
                    sm_clock_mhz: Some(IDLE_SM_CLOCK_MHZ),
                    telemetry: None,
                    gfd: None,
                })
                .collect(),
            xid_events: spec
                .xid_events
                .iter()
                .map(|(gpu_uuid, xid, delay_ms)| MockXidEvent {
                    gpu_uuid: gpu_uuid.clone(),
                    xid: *xid,
                    delay_ms: *delay_ms,
                })
                .collect(),
            event_file: event_file.display().to_string(),
            wsl: false,
        }
    }

    /// Adds active NVLinks between GPU pairs: `(a, b, count)` gives GPUs `a` and `b` (positions
    /// in [`MockConfig::gpus`], which is PCI order) `count` links to each other, on both sides,
    /// after any links they already have. Nodes have no NVLink unless given some here.
    pub fn with_nvlinks(
        mut self,
        pairs: &[(usize, usize, u32)],
    ) -> Result<MockConfig, TestkitError> {
        for &(a, b, count) in pairs {
            let bus_id = |i: usize| match self.gpus.get(i) {
                Some(gpu) if a != b => Ok(gpu.bus_id.clone()),
                _ => Err(TestkitError::InvalidSpec {
                    what: format!(
                        "NVLink pair ({a}, {b}) does not name two of the {} GPUs",
                        self.gpus.len()
                    ),
                }),
            };
            let (bus_a, bus_b) = (bus_id(a)?, bus_id(b)?);
            for (from, remote_bus_id) in [(a, bus_b), (b, bus_a)] {
                self.gpus[from].nvlinks.push(MockNvLink {
                    remote_bus_id,
                    count,
                    active: true,
                });
            }
        }
        Ok(self)
    }

    /// Writes the config to `path` as the mock reads it (pretty JSON), replacing the file.
    pub fn write(&self, path: &Path) -> Result<(), TestkitError> {
        let mut json = serde_json::to_string_pretty(self).map_err(|source| TestkitError::Json {
            path: path.to_path_buf(),
            source,
        })?;
        json.push('\n');
        files::write(path, json, 0o644)
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The mock's JSON config (`$MOCK_NVML_CONFIG`). The testkit's `mock_config` module writes
//! it; unknown fields are rejected on both levels so a typo on either side shows up as a
//! failed `nvmlInit` instead of a silently different node.

use std::collections::BTreeMap;
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
    /// A WSL2 node: every GPU is visible while `<dev_root>/dxg` exists (there are no
    /// `nvidia<minor>` nodes there) and `nvmlDeviceGetMinorNumber` is
    /// `NVML_ERROR_NOT_SUPPORTED`, as WSL's NVML answers. Default false.
    #[serde(default)]
    pub wsl: bool,
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
    /// `nvmlDeviceGetBrand`'s `nvmlBrandType_t`; default: from the name (see
    /// [`GpuConfig::brand`]).
    #[serde(default)]
    pub brand: Option<u32>,
    pub mig_mode: bool,
    #[serde(default)]
    pub mig_devices: Vec<MigConfig>,
    /// The GPU's NVLinks, in link order; none means the GPU has no NVLink at all.
    #[serde(default)]
    pub nvlinks: Vec<NvLinkConfig>,
    /// `nvmlUtilization_t.gpu`, percent; default 0. This and the readings below are
    /// re-read when the config file changes; `null` makes the GPU answer
    /// `NVML_ERROR_NOT_SUPPORTED` for that reading, as a board without the sensor does.
    #[serde(default = "zero")]
    pub utilization_gpu_percent: Option<u32>,
    /// `nvmlUtilization_t.memory`, percent; default 0.
    #[serde(default = "zero")]
    pub utilization_memory_percent: Option<u32>,
    /// `nvmlDeviceGetTemperature` (GPU sensor), °C; default 35.
    #[serde(default = "temperature_default")]
    pub temperature_celsius: Option<u32>,
    /// `nvmlDeviceGetPowerUsage`, milliwatts; default 60000.
    #[serde(default = "power_default")]
    pub power_milliwatts: Option<u32>,
    /// `nvmlDeviceGetClockInfo` for the SM (and graphics) clock, MHz; default 1410.
    #[serde(default = "sm_clock_default")]
    pub sm_clock_mhz: Option<u32>,
    /// The metrics exporter's readings (`telemetry.rs`); none: all `NOT_SUPPORTED`.
    #[serde(default)]
    pub telemetry: Option<crate::telemetry::TelemetryConfig>,
    /// What gpu-feature-discovery's extra queries answer (fabric, MIG attributes);
    /// without it both answer `NOT_SUPPORTED`.
    #[serde(default)]
    pub gfd: Option<GfdConfig>,
}

/// A GPU's answers to the fabric and MIG attribute calls.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GfdConfig {
    /// `nvmlDeviceGetGpuFabricInfo`; none: `NOT_SUPPORTED`.
    #[serde(default)]
    pub fabric: Option<FabricConfig>,
    /// `nvmlDeviceGetAttributes_v2` of this GPU's MIG devices, by profile (`1g.10gb`); a
    /// profile not listed answers `NOT_SUPPORTED`.
    #[serde(default)]
    pub mig_attributes: BTreeMap<String, MigAttributesConfig>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FabricConfig {
    /// `xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` (hex, dashes optional).
    pub cluster_uuid: String,
    pub clique_id: u32,
    /// `NVML_GPU_FABRIC_STATE_*`; default 3, completed.
    #[serde(default = "fabric_completed")]
    pub state: u8,
    /// The registration's `nvmlReturn_t`; default 0, success.
    #[serde(default)]
    pub status: u32,
}

fn fabric_completed() -> u8 {
    3
}

impl FabricConfig {
    /// The UUID's 16 bytes; `None` when it is not 32 hex digits.
    pub fn cluster_uuid_bytes(&self) -> Option<[u8; 16]> {
        let hex: Vec<u8> = self.cluster_uuid.bytes().filter(|b| *b != b'-').collect();
        if hex.len() != 32 {
            return None;
        }
        let mut out = [0u8; 16];
        for (byte, pair) in out.iter_mut().zip(hex.chunks(2)) {
            *byte = u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok()?;
        }
        Some(out)
    }
}

/// `nvmlDeviceAttributes_t` of one MIG profile.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MigAttributesConfig {
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

fn zero() -> Option<u32> {
    Some(0)
}

fn temperature_default() -> Option<u32> {
    Some(35)
}

fn power_default() -> Option<u32> {
    Some(60_000)
}

fn sm_clock_default() -> Option<u32> {
    Some(1410)
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
    /// Memory use and GPM of the MIG device (`telemetry.rs`).
    #[serde(default)]
    pub telemetry: Option<crate::telemetry::MigTelemetryConfig>,
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

impl GpuConfig {
    /// The configured brand, else what current drivers report for the name: `Tesla …`
    /// 2, `Quadro …` 1, `… GeForce …` 5, `… TITAN …` 6, anything else 14 (NVIDIA).
    pub fn brand(&self) -> u32 {
        self.brand.unwrap_or_else(|| {
            let name = self.name.as_str();
            if name.starts_with("Tesla ") {
                2
            } else if name.starts_with("Quadro ") {
                1
            } else if name.contains("GeForce") {
                5
            } else if name.contains("TITAN") {
                6
            } else {
                14
            }
        })
    }
}

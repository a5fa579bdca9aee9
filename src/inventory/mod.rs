//! The node's GPUs, MIG devices and driver version: the first stage of the pipeline.
//!
//! Two backends fill the same [`Inventory`]: [`procfs`] reads `/proc/driver/nvidia`
//! (no library loaded, the runtime's fast path for full GPUs) and [`nvml`] asks the
//! driver through `libnvidia-ml.so.1` (MIG devices, memory, compute capability).
//! Both number GPUs in PCI bus order, which is NVML's order, and both write bus ids
//! in the sysfs form `0000:07:00.0`, so a request resolves the same either way.
//! Fields only NVML can know are `Option`s that procfs leaves `None`.

pub mod nvlink;
pub mod nvml;
pub mod procfs;
pub mod wsl;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::roots::Roots;

/// What the driver reports about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DriverInfo {
    /// The kernel module / user-space driver version, e.g. `550.54.15`.
    pub version: String,
    /// The CUDA driver API version, e.g. `12.4` (NVML only).
    pub cuda_version: Option<String>,
}

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Gpu {
    /// Position in PCI bus order (NVML's index).
    pub index: u32,
    /// The `N` of `/dev/nvidiaN`.
    pub minor: u32,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// PCI address in sysfs form, lowercase: `0000:07:00.0`.
    pub bus_id: String,
    /// Product name, e.g. `NVIDIA A100-SXM4-80GB`.
    pub name: String,
    /// Total framebuffer memory in bytes (NVML only).
    pub memory_bytes: Option<u64>,
    /// CUDA compute capability `major.minor`, e.g. `8.0` (NVML only).
    pub compute_capability: Option<String>,
    /// NVML's `nvmlBrandType_t` (2 Tesla, 14 NVIDIA, …; NVML only, and only where the
    /// driver answers `nvmlDeviceGetBrand`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub brand: Option<u32>,
    /// Whether MIG mode is on (NVML only; `None` when unknown or unsupported).
    pub mig_enabled: Option<bool>,
    /// The MIG devices carved out of this GPU, in NVML's enumeration order.
    pub mig_devices: Vec<MigDevice>,
}

/// One MIG device (a GPU instance + compute instance pair).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MigDevice {
    /// Enumeration index within the parent GPU: the `M` of `N:M`.
    pub index: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    pub memory_bytes: Option<u64>,
    /// Profile name, e.g. `1g.10gb`.
    pub profile: String,
}

/// Everything the later stages need to know about the node's GPUs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inventory {
    pub driver: DriverInfo,
    pub gpus: Vec<Gpu>,
}

/// Which backend fills the inventory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// procfs unless the request needs what only NVML knows (MIG devices).
    #[default]
    Auto,
    Procfs,
    Nvml,
}

impl std::str::FromStr for Backend {
    type Err = InventoryError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "procfs" => Ok(Self::Procfs),
            "nvml" => Ok(Self::Nvml),
            other => Err(InventoryError::UnknownBackend(other.to_string())),
        }
    }
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Procfs => "procfs",
            Self::Nvml => "nvml",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    #[error("unknown inventory backend {0:?} (valid: auto, procfs, nvml)")]
    UnknownBackend(String),
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {reason}")]
    Parse { path: PathBuf, reason: String },
    #[error("no NVIDIA driver found: {path} does not exist (is the nvidia kernel module loaded?)")]
    NoDriver { path: PathBuf },
    #[error(transparent)]
    Nvml(#[from] crate::nvml::NvmlError),
}

/// Where to find `libnvidia-ml.so.1` and which backend to use.
#[derive(Debug, Clone, Default)]
pub struct Source {
    pub backend: Backend,
    /// An explicit NVML library file (`--nvml-lib`); otherwise the driver root's
    /// `ld.so.cache` is searched, then the default loader path.
    pub nvml_library: Option<PathBuf>,
}

/// Loads the inventory with the chosen concrete backend. `Auto` is resolved by the
/// caller (the pipeline knows whether the request needs NVML); here it means procfs.
pub fn load(roots: &Roots, source: &Source) -> Result<Inventory, InventoryError> {
    match source.backend {
        Backend::Auto | Backend::Procfs => procfs::load(roots),
        Backend::Nvml => nvml::load(roots, source.nvml_library.as_deref()),
    }
}

/// The sysfs form of a PCI bus id; the request's device-id grammar owns it.
pub use crate::request::normalize_bus_id;

/// Sort key for PCI order: (domain, bus, device, function).
pub(crate) fn bus_order(bus_id: &str) -> (u32, u32, u32, u32) {
    let mut parts = bus_id
        .split([':', '.'])
        .map(|p| u32::from_str_radix(p, 16).unwrap_or(u32::MAX));
    (
        parts.next().unwrap_or(u32::MAX),
        parts.next().unwrap_or(u32::MAX),
        parts.next().unwrap_or(u32::MAX),
        parts.next().unwrap_or(u32::MAX),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_ids_normalise_to_the_sysfs_form() {
        let cases = [
            ("00000000:07:00.0", Some("0000:07:00.0")),
            ("0000:B1:00.0", Some("0000:b1:00.0")),
            ("0001:01:1F.7", Some("0001:01:1f.7")),
            ("0000:07:00", None),
            ("junk", None),
            ("0000:07:20.0", None),
        ];
        for (raw, want) in cases {
            assert_eq!(normalize_bus_id(raw).as_deref(), want, "case {raw}");
        }
    }

    #[test]
    fn pci_order_is_numeric() {
        let mut ids = vec![
            "0000:b1:00.0",
            "0000:07:00.0",
            "0001:00:00.0",
            "0000:0a:00.0",
        ];
        ids.sort_by_key(|b| bus_order(b));
        assert_eq!(
            ids,
            [
                "0000:07:00.0",
                "0000:0a:00.0",
                "0000:b1:00.0",
                "0001:00:00.0"
            ]
        );
    }
}

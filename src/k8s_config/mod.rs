// SPDX-License-Identifier: Apache-2.0
//! The config file NVIDIA's device plugin and gpu-feature-discovery share (`version: v1`,
//! YAML or JSON): its keys, its value types and what is wrong with a file. Both of our
//! readers use it: the device plugin (its own crate, which adds flags, env vars and the
//! precedence between them) and `nvshim labels` (the MIG strategy and sharing it labels).
//!
//! ```text
//! values    strategy names (case-sensitive, as NVIDIA's validation is), comma lists
//! file      the file → FileSettings (checked, errors with lines)
//! error     K8sConfigError: a bad value or a bad file, quoting it
//! ```
//!
//! Pure data and parsing; no file is read but the one [`load_file`] is given.

mod error;
mod file;
mod values;

pub use error::{BOOL_SPELLINGS, FileSpot, K8sConfigError};
pub use file::{FileSettings, GPU_RESOURCE, GfdFileSettings, load_file, parse_file};
pub use values::{parse_device_list_strategies, parse_device_list_strategy, parse_go_bool};

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MigStrategy {
    #[default]
    None,
    Single,
    Mixed,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceListStrategy {
    Envvar,
    VolumeMounts,
    CdiAnnotations,
    CdiCri,
}

/// How devices are found (`--device-discovery-strategy`, `flags.deviceDiscoveryStrategy`):
/// the NVIDIA names nvshim implements. `auto` is NVML here, as on any node without
/// Tegra's CSV files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DiscoveryStrategy {
    #[default]
    Auto,
    Nvml,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceIdStrategy {
    #[default]
    Uuid,
    Index,
}

/// How the replicas of a shared resource share their GPU: NVIDIA's two sharing kinds,
/// `sharing.timeSlicing` and `sharing.mps`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SharingStrategy {
    /// The GPU's own time-slicing: no memory or compute limits between replicas.
    TimeSlicing,
    /// One MPS control daemon per resource; each replica gets `100/replicas` % of the
    /// SMs and `memory/replicas` of the memory.
    Mps,
}

impl SharingStrategy {
    /// The config file key that selects it.
    pub const fn key(self) -> &'static str {
        match self {
            Self::TimeSlicing => "sharing.timeSlicing",
            Self::Mps => "sharing.mps",
        }
    }

    /// GFD's `gpu.sharing-strategy` value for it.
    pub const fn label(self) -> &'static str {
        match self {
            Self::TimeSlicing => "time-slicing",
            Self::Mps => "mps",
        }
    }
}

/// `sharing.timeSlicing` or `sharing.mps`: one shape for both, as in NVIDIA's schema.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Sharing {
    pub strategy: SharingStrategy,
    pub rename_by_default: bool,
    /// NVIDIA's default: `false` for time-slicing, `true` for MPS.
    pub fail_requests_greater_than_one: bool,
    /// Non-empty; each `replicas >= 2`.
    pub resources: Vec<SharedResource>,
}

impl Sharing {
    /// The replicas per unit of `resource`, when this sharing names it.
    pub fn replicas(&self, resource: &str) -> Option<u32> {
        self.resources
            .iter()
            .find(|r| r.name == resource)
            .map(|r| r.replicas)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SharedResource {
    /// The resource to share, e.g. `nvidia.com/gpu`.
    pub name: String,
    pub replicas: u32,
}

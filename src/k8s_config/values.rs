// SPDX-License-Identifier: Apache-2.0
//! The spellings of the config file's strategy values, which the device plugin's flags
//! and env vars share: NVIDIA's names (case-sensitive, as NVIDIA's validation is) and
//! comma lists. Pure string → value functions.

use std::fmt;
use std::str::FromStr;

use super::{DeviceIdStrategy, DeviceListStrategy, DiscoveryStrategy, K8sConfigError, MigStrategy};

impl MigStrategy {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Single => "single",
            Self::Mixed => "mixed",
        }
    }
}

impl FromStr for MigStrategy {
    type Err = K8sConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "single" => Ok(Self::Single),
            "mixed" => Ok(Self::Mixed),
            _ => Err(K8sConfigError::MigStrategy {
                value: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for MigStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DeviceListStrategy {
    /// Every strategy, in NVIDIA's order.
    pub const ALL: [Self; 4] = [
        Self::Envvar,
        Self::VolumeMounts,
        Self::CdiAnnotations,
        Self::CdiCri,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Envvar => "envvar",
            Self::VolumeMounts => "volume-mounts",
            Self::CdiAnnotations => "cdi-annotations",
            Self::CdiCri => "cdi-cri",
        }
    }

    /// Whether the strategy hands devices over as CDI names.
    pub const fn is_cdi(self) -> bool {
        matches!(self, Self::CdiAnnotations | Self::CdiCri)
    }
}

impl FromStr for DeviceListStrategy {
    type Err = K8sConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| K8sConfigError::DeviceListStrategy {
                value: s.to_owned(),
            })
    }
}

impl fmt::Display for DeviceListStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl DeviceIdStrategy {
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Uuid => "uuid",
            Self::Index => "index",
        }
    }
}

impl FromStr for DeviceIdStrategy {
    type Err = K8sConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uuid" => Ok(Self::Uuid),
            "index" => Ok(Self::Index),
            _ => Err(K8sConfigError::DeviceIdStrategy {
                value: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for DeviceIdStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A device list strategy, with the whitespace around a comma-list item trimmed.
pub fn parse_device_list_strategy(s: &str) -> Result<DeviceListStrategy, K8sConfigError> {
    s.trim().parse()
}

/// A comma list of device list strategies (`envvar,volume-mounts`), as in
/// `DEVICE_LIST_STRATEGY`; items are trimmed, order and duplicates kept.
pub fn parse_device_list_strategies(s: &str) -> Result<Vec<DeviceListStrategy>, K8sConfigError> {
    s.split(',').map(parse_device_list_strategy).collect()
}

impl DiscoveryStrategy {
    /// NVIDIA's device discovery strategies that nvshim does not implement yet:
    /// `tegra` (the plugin's and GFD's CSV-file discovery) and `vfio` (GFD's
    /// passthrough GPUs).
    pub const NOT_YET: [&'static str; 2] = ["tegra", "vfio"];

    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Nvml => "nvml",
        }
    }
}

/// `auto` or `nvml`; NVIDIA's other strategies ([`DiscoveryStrategy::NOT_YET`]) are an
/// error that says they are not supported yet, anything else an unknown strategy.
impl FromStr for DiscoveryStrategy {
    type Err = K8sConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "nvml" => Ok(Self::Nvml),
            _ if Self::NOT_YET.contains(&s) => Err(K8sConfigError::DiscoveryNotYet {
                value: s.to_owned(),
            }),
            _ => Err(K8sConfigError::DiscoveryStrategy {
                value: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for DiscoveryStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A boolean as Go's `strconv.ParseBool` reads it, which is what NVIDIA's flags and
/// env vars (the plugin's and GFD's) accept.
pub fn parse_go_bool(s: &str) -> Result<bool, K8sConfigError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(K8sConfigError::Bool {
            value: s.to_owned(),
        }),
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The spellings of the plugin's scalar settings, shared by flags, env vars and the
//! config file: NVIDIA's strategy names (case-sensitive, as NVIDIA's validation is),
//! Go's boolean spellings, comma lists. Pure string → value functions.

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::str::FromStr;

use super::{DeviceIdStrategy, DeviceListStrategy, MigStrategy, PluginConfigError};

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
    type Err = PluginConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(Self::None),
            "single" => Ok(Self::Single),
            "mixed" => Ok(Self::Mixed),
            _ => Err(PluginConfigError::MigStrategy {
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
    type Err = PluginConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|strategy| strategy.as_str() == s)
            .ok_or_else(|| PluginConfigError::DeviceListStrategy {
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
    type Err = PluginConfigError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "uuid" => Ok(Self::Uuid),
            "index" => Ok(Self::Index),
            _ => Err(PluginConfigError::DeviceIdStrategy {
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

/// A boolean as Go's `strconv.ParseBool` reads it, which is what NVIDIA's flags and
/// env vars accept.
pub fn parse_bool(s: &str) -> Result<bool, PluginConfigError> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(PluginConfigError::Bool {
            value: s.to_owned(),
        }),
    }
}

/// A device list strategy, with the whitespace around a comma-list item trimmed.
pub(super) fn parse_device_list_strategy(s: &str) -> Result<DeviceListStrategy, PluginConfigError> {
    s.trim().parse()
}

/// A comma list of device list strategies (`envvar,volume-mounts`), as in
/// `DEVICE_LIST_STRATEGY`; items are trimmed, order and duplicates kept.
pub(super) fn parse_device_list_strategies(
    s: &str,
) -> Result<Vec<DeviceListStrategy>, PluginConfigError> {
    s.split(',').map(parse_device_list_strategy).collect()
}

/// Drops repeats, keeping each strategy where it was first given.
pub(super) fn dedup_strategies(strategies: &[DeviceListStrategy]) -> Vec<DeviceListStrategy> {
    let mut out = Vec::with_capacity(strategies.len());
    for &strategy in strategies {
        if !out.contains(&strategy) {
            out.push(strategy);
        }
    }
    out
}

/// A listening address: `IP:PORT`, `[IPv6]:PORT`, or `:PORT` for every IPv4 interface
/// (Go's spelling, which Prometheus exporters' `--web.listen-address` flags use).
pub fn parse_listen_addr(s: &str) -> Result<SocketAddr, PluginConfigError> {
    let error = |source| PluginConfigError::ListenAddress {
        value: s.to_owned(),
        source,
    };
    match s.strip_prefix(':') {
        Some(port) => format!("{}:{port}", Ipv4Addr::UNSPECIFIED)
            .parse()
            .map_err(error),
        None => s.parse().map_err(error),
    }
}

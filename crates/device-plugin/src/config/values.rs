// SPDX-License-Identifier: Apache-2.0
//! The spellings of the plugin's flag and env var values beyond the config file's own
//! (which are `nvshim::k8s_config`'s): Go's boolean spellings, listening addresses.
//! Pure string → value functions.

use std::net::{Ipv4Addr, SocketAddr};

use super::{DeviceListStrategy, PluginConfigError};

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

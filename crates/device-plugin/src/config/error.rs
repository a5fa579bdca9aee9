// SPDX-License-Identifier: Apache-2.0
//! [`PluginConfigError`]: everything that can be wrong with the plugin's flags, env vars
//! and config file (the file's own errors are `nvshim::k8s_config`'s, wrapped). Each variant quotes the bad value and, where there is one, the valid
//! set; file errors carry the file path and the line of the offending node.

use std::path::PathBuf;

use nvshim::k8s_config::{FileSpot, K8sConfigError};

/// Go's `strconv.ParseBool` spellings, which NVIDIA's flags and env vars accept.
pub const BOOL_SPELLINGS: &str = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False";

/// Why the plugin's settings could not be resolved.
#[derive(Debug, thiserror::Error)]
pub enum PluginConfigError {
    #[error("{value:?} is not a boolean (valid: {BOOL_SPELLINGS})")]
    Bool { value: String },
    #[error("invalid XID {value:?} (valid: {keywords} or decimal XID numbers, comma-separated)")]
    Xid {
        value: String,
        keywords: &'static str,
    },
    #[error("invalid address {value:?}: {source} (want IP:PORT, e.g. 0.0.0.0:8080)")]
    Address {
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
    #[error("invalid listen address {value:?}: {source} (want IP:PORT or :PORT, e.g. :9400)")]
    ListenAddress {
        value: String,
        #[source]
        source: std::net::AddrParseError,
    },
    /// An env var whose value is bad; the source says why.
    #[error("{name}: {source}")]
    Env {
        name: &'static str,
        #[source]
        source: Box<PluginConfigError>,
    },
    #[error(
        "{origin}: the CDI hook path {path:?} must be absolute: container engines run it on \
         the host, outside any search path"
    )]
    RelativeHookPath { origin: &'static str, path: PathBuf },
    /// One of NVIDIA's features nvshim does not implement yet, switched on by a flag
    /// (`origin` is `--flag`) or an env var (`origin` is its name).
    #[error("{origin}={value:?}: nvshim does not support {feature} yet")]
    Unsupported {
        origin: String,
        value: String,
        feature: &'static str,
    },
    /// A value of a flag or env var outside NVIDIA's own set.
    #[error("{origin}: invalid value {value:?} (valid: {valid})")]
    Invalid {
        origin: String,
        value: String,
        valid: &'static str,
    },
    /// `sharing.mps` without a root for the daemons' pipes; `at` is where `sharing.mps` is.
    #[error(
        "{at}: sharing.mps needs an MPS root: set --mps-root, MPS_ROOT or flags.mpsRoot (NVIDIA's Helm chart uses /run/nvidia/mps)"
    )]
    MpsRootMissing { at: FileSpot },
    #[error("{name}: {value:?} is not an absolute path")]
    MpsRootRelativeArg { name: &'static str, value: String },
    /// `sharing.mps` with the `mixed` MIG strategy, which NVIDIA's plugin refuses too.
    #[error(
        "{at}: sharing.mps cannot be used with mig-strategy=mixed (NVIDIA's plugin refuses it too; use mig-strategy none)"
    )]
    MpsMixedMig { at: FileSpot },
    /// A bad value of the config file's types, or a bad config file.
    #[error(transparent)]
    File(#[from] K8sConfigError),
}

impl PluginConfigError {
    /// Wraps a value error with the env var (or flag) that carried it.
    pub(super) fn in_env(self, name: &'static str) -> Self {
        Self::Env {
            name,
            source: Box::new(self),
        }
    }
}

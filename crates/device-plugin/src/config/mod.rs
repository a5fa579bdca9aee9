//! The plugin's settings: NVIDIA's flags, env vars and YAML config file (`version: v1`),
//! resolved once with the precedence flag > env > file > default into an immutable
//! [`Settings`]. Unlike NVIDIA's plugin, unknown keys and bad values are errors, and so
//! are NVIDIA features nvshim does not implement (CDI feature flags, Tegra, …).
//!
//! ```text
//! args      PluginArgs: the command line (clap) and the env var names
//! values    Go's boolean spellings, listening addresses
//! resolve   flags > env > file > default → Settings; DP_*_HEALTHCHECKS → HealthChecks
//! extras    GDS, MOFED, GDRCopy and the IMEX channels
//! ```
//!
//! The config file itself (`version: v1`, its value types and errors) is
//! `nvshim::k8s_config`, which `nvshim labels` reads too; it is re-exported here.
//!
//! This module reads the environment only through the lookup it is given (or in
//! [`resolve_from_process`]) and reads no file but the config file.

mod args;
mod error;
mod extras;
mod resolve;
mod values;

#[cfg(test)]
mod env_tests;
#[cfg(test)]
mod file_tests;
#[cfg(test)]
mod flags_tests;
#[cfg(test)]
mod mps_tests;
#[cfg(test)]
mod proptests;
#[cfg(test)]
mod tests;

pub use args::*;
pub use error::{BOOL_SPELLINGS, PluginConfigError};
pub use extras::{DeviceClasses, Imex};
// The config file's format, shared with `nvshim labels`, is the core library's.
pub use nvshim::k8s_config::{
    DeviceIdStrategy, DeviceListStrategy, FileSettings, FileSpot, GPU_RESOURCE, K8sConfigError,
    MigStrategy, SharedResource, Sharing, SharingStrategy, load_file, parse_file,
};
pub use resolve::{EnvLookup, health_checks, resolve, resolve_from_process};
pub use values::{parse_bool, parse_listen_addr};

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Serialize;

/// Default kubelet registration socket.
pub const KUBELET_SOCKET: &str = "/var/lib/kubelet/device-plugins/kubelet.sock";
/// Default directory for our own sockets.
pub const DEVICE_PLUGIN_DIR: &str = "/var/lib/kubelet/device-plugins";
/// Default kubelet pod-resources socket, which the metrics ask which pod holds a GPU.
pub const POD_RESOURCES_SOCKET: &str = "/var/lib/kubelet/pod-resources/kubelet.sock";
/// Where CDI consumers look for specs that change at run time; NVIDIA's plugin writes
/// its spec here.
pub const CDI_SPEC_DIR: &str = "/var/run/cdi";
/// The file NVIDIA's plugin writes its spec to (`<vendor>-<class>.json` of
/// `allocate::CDI_KIND`), in [`CDI_SPEC_DIR`].
pub const CDI_SPEC_FILE: &str = "k8s.device-plugin.nvidia.com-gpu.json";
/// NVIDIA's default `containerDriverRoot`: where its Helm chart mounts the host's
/// driver root into the plugin's container.
pub const CONTAINER_DRIVER_ROOT: &str = "/driver-root";
/// Where packages install the CDI hook binary on the host.
pub const CDI_HOOK_DIR: &str = "/usr/bin";

/// The hook binary our CDI specs run (`nvidia-ctk hook link-driver …`) when not told:
/// NVIDIA's default, `/usr/bin/nvidia-ctk`, which our packages install as a name of
/// `nvshim`.
pub fn default_cdi_hook_path() -> PathBuf {
    Path::new(CDI_HOOK_DIR).join(nvshim::hook_contract::CTK_BINARY)
}
/// The XIDs NVIDIA's plugin treats as application errors, not GPU faults.
pub const DEFAULT_IGNORED_XIDS: [u64; 6] = [13, 31, 43, 45, 68, 109];

/// Which XIDs mark a device unhealthy (`DP_DISABLE_HEALTHCHECKS`,
/// `DP_ENABLE_HEALTHCHECKS`). An XID is fatal when
/// `enable_all || enabled.contains(xid) || (!disable_all && !ignored.contains(xid))`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HealthChecks {
    /// `DP_DISABLE_HEALTHCHECKS=all` (or `xids`).
    pub disable_all: bool,
    /// [`DEFAULT_IGNORED_XIDS`] plus the numbers listed in `DP_DISABLE_HEALTHCHECKS`.
    pub ignored: BTreeSet<u64>,
    /// `DP_ENABLE_HEALTHCHECKS=all`.
    pub enable_all: bool,
    /// Numbers listed in `DP_ENABLE_HEALTHCHECKS`: always fatal.
    pub enabled: BTreeSet<u64>,
}

impl Default for HealthChecks {
    fn default() -> Self {
        Self {
            disable_all: false,
            ignored: DEFAULT_IGNORED_XIDS.into_iter().collect(),
            enable_all: false,
            enabled: BTreeSet::new(),
        }
    }
}

impl Settings {
    /// Whether a `cdi-*` device-list strategy is on: then the plugin writes a CDI spec.
    pub fn uses_cdi(&self) -> bool {
        self.device_list_strategies.iter().any(|s| {
            matches!(
                s,
                DeviceListStrategy::CdiAnnotations | DeviceListStrategy::CdiCri
            )
        })
    }
}

impl HealthChecks {
    /// Whether an XID marks its device unhealthy.
    pub fn is_fatal(&self, xid: u64) -> bool {
        self.enable_all
            || self.enabled.contains(&xid)
            || (!self.disable_all && !self.ignored.contains(&xid))
    }
}

/// Everything the plugin runs with, resolved once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Settings {
    pub mig_strategy: MigStrategy,
    pub fail_on_init_error: bool,
    /// `--nvidia-driver-root`, default `/`.
    pub driver_root: PathBuf,
    /// `--dev-root`; falls back to the driver root.
    pub dev_root: PathBuf,
    pub pass_device_specs: bool,
    /// Non-empty, no duplicates, in the order given.
    pub device_list_strategies: Vec<DeviceListStrategy>,
    pub device_id_strategy: DeviceIdStrategy,
    /// `--cdi-annotation-prefix`, default `cdi.k8s.io/`.
    pub cdi_annotation_prefix: String,
    /// `--container-driver-root`: where this process sees the host's driver root,
    /// when not at the driver root's own path (`None`: NVIDIA's [`CONTAINER_DRIVER_ROOT`]
    /// when that exists, else the driver root; the node decides, see `cdi_spec`).
    pub container_driver_root: Option<PathBuf>,
    /// `--cdi-spec-dir`: where the CDI spec of the `cdi-*` strategies is written.
    pub cdi_spec_dir: PathBuf,
    /// `--nvidia-cdi-hook-path`: the hook binary the spec's `createContainer` hook
    /// runs, a host path.
    pub cdi_hook_path: PathBuf,
    /// `--cdi-disable-hooks`: NVIDIA's hook names (or `all`) left out of the spec.
    pub cdi_disable_hooks: Vec<String>,
    /// `--kubelet-socket`; `None` (given as `""`) serves without registering.
    pub kubelet_socket: Option<PathBuf>,
    /// Where our own sockets go: `--socket-dir`, default the kubelet socket's directory.
    pub socket_dir: PathBuf,
    /// `sharing.timeSlicing` or `sharing.mps`.
    pub sharing: Option<Sharing>,
    /// `--mps-root`: the host directory of the MPS daemons' pipes, logs and shm;
    /// required (and only used) with `sharing.mps`.
    pub mps_root: Option<PathBuf>,
    pub health_checks: HealthChecks,
    /// `--health-addr`: serve `/healthz` and `/readyz` here (off when `None`).
    pub health_addr: Option<SocketAddr>,
    /// `--metrics-addr`: serve Prometheus `/metrics` here (off when `None`).
    pub metrics_addr: Option<SocketAddr>,
    /// `--metrics-names`: dcgm-exporter's names (the default) or ours.
    pub metrics_names: MetricsNames,
    /// `--metrics-collectors`: the DCGM fields to serve (`None`: dcgm-exporter's defaults).
    pub metrics_collectors: Option<PathBuf>,
    /// `--pod-resources-socket`: kubelet's pod-resources API, for the metrics' pod labels
    /// (`None`, given as `""`: no pod labels).
    pub pod_resources_socket: Option<PathBuf>,
    /// `--nvml-lib`: an explicit `libnvidia-ml.so.1`.
    pub nvml_library: Option<PathBuf>,
    /// The config file the settings came from, if any (re-read on SIGHUP).
    pub config_file: Option<PathBuf>,
    /// `--gds-enabled`, `--mofed-enabled`, `--gdrcopy-enabled`.
    pub device_classes: DeviceClasses,
    /// `--imex-channel-ids`, `--imex-required`.
    pub imex: Imex,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            mig_strategy: MigStrategy::None,
            fail_on_init_error: true,
            driver_root: PathBuf::from("/"),
            dev_root: PathBuf::from("/"),
            pass_device_specs: false,
            device_list_strategies: vec![DeviceListStrategy::Envvar],
            device_id_strategy: DeviceIdStrategy::Uuid,
            cdi_annotation_prefix: "cdi.k8s.io/".to_string(),
            container_driver_root: None,
            cdi_spec_dir: PathBuf::from(CDI_SPEC_DIR),
            cdi_hook_path: default_cdi_hook_path(),
            cdi_disable_hooks: Vec::new(),
            kubelet_socket: Some(PathBuf::from(KUBELET_SOCKET)),
            socket_dir: PathBuf::from(DEVICE_PLUGIN_DIR),
            sharing: None,
            mps_root: None,
            health_checks: HealthChecks::default(),
            health_addr: None,
            metrics_addr: None,
            metrics_names: MetricsNames::default(),
            metrics_collectors: None,
            pod_resources_socket: Some(PathBuf::from(POD_RESOURCES_SOCKET)),
            nvml_library: None,
            config_file: None,
            device_classes: DeviceClasses::default(),
            imex: Imex::default(),
        }
    }
}

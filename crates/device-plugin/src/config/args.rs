// SPDX-License-Identifier: Apache-2.0
//! [`PluginArgs`]: the `nvidia-device-plugin` command line, with NVIDIA's flag names and
//! aliases, plus ours. Only what was given on the command line is here: every setting is
//! an `Option` without a clap default, and env vars are read by [`super::resolve`]
//! through an injected lookup (not clap's `env`), so precedence is decided in one place
//! and tests never touch the process environment.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::Parser;
use clap::builder::{OsStringValueParser, TypedValueParser};

use nvshim::k8s_config::parse_device_list_strategy;

use super::values::{parse_bool, parse_listen_addr};
use super::{DeviceIdStrategy, DeviceListStrategy, MigStrategy, PluginConfigError};

/// `--mig-strategy`.
pub const ENV_MIG_STRATEGY: &str = "MIG_STRATEGY";
/// `--fail-on-init-error`.
pub const ENV_FAIL_ON_INIT_ERROR: &str = "FAIL_ON_INIT_ERROR";
/// `--nvidia-driver-root`.
pub const ENV_NVIDIA_DRIVER_ROOT: &str = "NVIDIA_DRIVER_ROOT";
/// `--dev-root`.
pub const ENV_NVIDIA_DEV_ROOT: &str = "NVIDIA_DEV_ROOT";
/// `--pass-device-specs`.
pub const ENV_PASS_DEVICE_SPECS: &str = "PASS_DEVICE_SPECS";
/// `--device-list-strategy`.
pub const ENV_DEVICE_LIST_STRATEGY: &str = "DEVICE_LIST_STRATEGY";
/// `--device-id-strategy`.
pub const ENV_DEVICE_ID_STRATEGY: &str = "DEVICE_ID_STRATEGY";
/// `--cdi-annotation-prefix`.
pub const ENV_CDI_ANNOTATION_PREFIX: &str = "CDI_ANNOTATION_PREFIX";
/// `--kubelet-socket`.
pub const ENV_KUBELET_SOCKET: &str = "KUBELET_SOCKET";
/// `--config-file`.
pub const ENV_CONFIG_FILE: &str = "CONFIG_FILE";
/// `--mps-root`.
pub const ENV_MPS_ROOT: &str = "MPS_ROOT";
/// `--container-driver-root`, NVIDIA's name (the first one set wins).
pub const ENV_DRIVER_ROOT_CTR_PATH: &str = "DRIVER_ROOT_CTR_PATH";
/// `--container-driver-root`, NVIDIA's other name.
pub const ENV_CONTAINER_DRIVER_ROOT: &str = "CONTAINER_DRIVER_ROOT";
/// `--cdi-spec-dir` (ours).
pub const ENV_CDI_SPEC_DIR: &str = "NVSHIM_CDI_SPEC_DIR";
/// `--nvidia-cdi-hook-path`, NVIDIA's name (the first one set wins).
pub const ENV_NVIDIA_CDI_HOOK_PATH: &str = "NVIDIA_CDI_HOOK_PATH";
/// `--nvidia-cdi-hook-path`, NVIDIA's older name.
pub const ENV_NVIDIA_CTK_PATH: &str = "NVIDIA_CTK_PATH";
/// `--nvidia-cdi-hook-path`, our name from before we took NVIDIA's.
pub const ENV_CDI_HOOK_PATH: &str = "NVSHIM_CDI_HOOK_PATH";
/// `--socket-dir` (ours).
pub const ENV_SOCKET_DIR: &str = "NVSHIM_SOCKET_DIR";
/// `--health-addr` (ours).
pub const ENV_HEALTH_ADDR: &str = "NVSHIM_HEALTH_ADDR";
/// `--metrics-addr` (ours).
pub const ENV_METRICS_ADDR: &str = "NVSHIM_METRICS_ADDR";
/// `--metrics-names` (ours).
pub const ENV_METRICS_NAMES: &str = "NVSHIM_METRICS_NAMES";
/// `--metrics-collectors` (ours; dcgm-exporter's `-f` file format).
pub const ENV_METRICS_COLLECTORS: &str = "NVSHIM_METRICS_COLLECTORS";
/// `--pod-resources-socket` (ours).
pub const ENV_POD_RESOURCES_SOCKET: &str = "NVSHIM_POD_RESOURCES_SOCKET";
/// `--nvml-lib` (ours).
pub const ENV_NVML_LIB: &str = "NVSHIM_NVML_LIB";
/// `--log-level` (ours).
pub const ENV_LOG_LEVEL: &str = "NVSHIM_LOG_LEVEL";
/// XIDs that no longer mark a device unhealthy (`all`/`xids`, or a comma list).
pub const ENV_DISABLE_HEALTHCHECKS: &str = "DP_DISABLE_HEALTHCHECKS";
/// XIDs that always mark a device unhealthy (`all`, or a comma list).
pub const ENV_ENABLE_HEALTHCHECKS: &str = "DP_ENABLE_HEALTHCHECKS";
/// NVIDIA's GPUDirect RDMA copy (GDRCopy) switch.
pub const ENV_GDRCOPY_ENABLED: &str = "GDRCOPY_ENABLED";
/// NVIDIA's GPUDirect Storage switch.
pub const ENV_GDS_ENABLED: &str = "GDS_ENABLED";
/// NVIDIA's MOFED switch.
pub const ENV_MOFED_ENABLED: &str = "MOFED_ENABLED";
/// NVIDIA's IMEX channel list (none, or 0).
pub const ENV_IMEX_CHANNEL_IDS: &str = "IMEX_CHANNEL_IDS";
/// NVIDIA's IMEX switch: the listed channels must exist.
pub const ENV_IMEX_REQUIRED: &str = "IMEX_REQUIRED";
/// NVIDIA's discovery switch (`auto|nvml|tegra`); nvshim accepts `auto` and `nvml`.
pub const ENV_DEVICE_DISCOVERY_STRATEGY: &str = "DEVICE_DISCOVERY_STRATEGY";
/// NVIDIA's CDI generator feature flags; nvshim has none, so rejects a non-empty list.
pub const ENV_CDI_FEATURE_FLAGS: &str = "CDI_FEATURE_FLAGS";
/// Hooks to leave out of the CDI spec (`all`, or names).
pub const ENV_CDI_DISABLE_HOOKS: &str = "CDI_DISABLE_HOOKS";
/// How replicas and MIG devices are picked (`distributed|packed`); nvshim does `distributed`.
pub const ENV_SHARED_DEVICES_ALLOCATION_POLICY: &str = "SHARED_DEVICES_ALLOCATION_POLICY";

/// The `nvidia-device-plugin` command line. `None` means "not on the command line";
/// [`super::resolve`] then looks at the env var named in each flag's help, then the
/// config file, then the default.
#[derive(Debug, Clone, Default, PartialEq, Eq, Parser)]
#[command(
    name = "nvidia-device-plugin",
    version,
    disable_version_flag = true,
    about = "Kubernetes device plugin for NVIDIA GPUs (nvshim)"
)]
pub struct PluginArgs {
    /// Print the version (NVIDIA's plugin spells it -v)
    #[arg(short = 'v', short_alias = 'V', long, action = clap::ArgAction::Version)]
    pub version: Option<bool>,

    /// How MIG devices are advertised: none, single or mixed [env: MIG_STRATEGY] [default: none]
    #[arg(long, global = true, value_name = "STRATEGY")]
    pub mig_strategy: Option<MigStrategy>,

    /// Exit when NVML cannot start (=false: serve no devices instead) [env: FAIL_ON_INIT_ERROR] [default: true]
    #[arg(
        global = true,
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
    )]
    pub fail_on_init_error: Option<bool>,

    /// Root of the driver's files on the host [env: NVIDIA_DRIVER_ROOT] [default: /]
    #[arg(
        global = true,
        long = "nvidia-driver-root",
        visible_alias = "driver-root",
        value_name = "PATH",
        value_parser = path_parser(),
    )]
    pub driver_root: Option<PathBuf>,

    /// Root under which dev/nvidia* live [env: NVIDIA_DEV_ROOT] [default: the driver root]
    #[arg(
        global = true,
        long = "dev-root",
        visible_alias = "nvidia-dev-root",
        value_name = "PATH",
        value_parser = path_parser(),
    )]
    pub dev_root: Option<PathBuf>,

    /// Also pass the device nodes in Allocate responses [env: PASS_DEVICE_SPECS] [default: false]
    #[arg(
        global = true,
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
    )]
    pub pass_device_specs: Option<bool>,

    /// How devices reach the container: envvar, volume-mounts, cdi-annotations, cdi-cri;
    /// repeatable and comma-separated [env: DEVICE_LIST_STRATEGY] [default: envvar]
    #[arg(
        global = true,
        long,
        value_name = "STRATEGY",
        value_delimiter = ',',
        value_parser = parse_device_list_strategy,
        action = clap::ArgAction::Append,
    )]
    pub device_list_strategy: Option<Vec<DeviceListStrategy>>,

    /// How devices are named to the runtime: uuid or index [env: DEVICE_ID_STRATEGY] [default: uuid]
    #[arg(long, global = true, value_name = "STRATEGY")]
    pub device_id_strategy: Option<DeviceIdStrategy>,

    /// Prefix of the CDI annotation keys [env: CDI_ANNOTATION_PREFIX] [default: cdi.k8s.io/]
    #[arg(long, global = true, value_name = "PREFIX")]
    pub cdi_annotation_prefix: Option<String>,

    /// Where this container sees the host's driver root: the driver is read there, and the
    /// CDI spec names the same files under the driver root
    /// [env: DRIVER_ROOT_CTR_PATH, CONTAINER_DRIVER_ROOT]
    /// [default: /driver-root if it exists, else the driver root itself]
    #[arg(
        long = "container-driver-root",
        visible_alias = "driver-root-ctr-path",
        value_name = "PATH",
        value_parser = path_parser(),
    )]
    pub container_driver_root: Option<PathBuf>,

    /// The kubelet's registration socket; "" serves without registering
    /// [env: KUBELET_SOCKET] [default: /var/lib/kubelet/device-plugins/kubelet.sock]
    #[arg(long, global = true, value_name = "PATH", value_parser = path_parser())]
    pub kubelet_socket: Option<PathBuf>,

    /// NVIDIA's YAML (or JSON) config file, `version: v1` [env: CONFIG_FILE]
    #[arg(long, global = true, value_name = "PATH", value_parser = path_parser())]
    pub config_file: Option<PathBuf>,

    /// Host directory of the MPS daemons' pipes, logs and shm; needed with sharing.mps
    /// [env: MPS_ROOT] (NVIDIA's Helm chart: /run/nvidia/mps)
    #[arg(long, global = true, value_name = "PATH", value_parser = path_parser())]
    pub mps_root: Option<PathBuf>,

    /// Directory for our gRPC sockets [env: NVSHIM_SOCKET_DIR]
    /// [default: the kubelet socket's directory, else /var/lib/kubelet/device-plugins]
    #[arg(long, global = true, value_name = "DIR", value_parser = path_parser())]
    pub socket_dir: Option<PathBuf>,

    /// Directory for the CDI spec of the cdi-* strategies [env: NVSHIM_CDI_SPEC_DIR]
    /// [default: /var/run/cdi]
    #[arg(long, value_name = "DIR", value_parser = path_parser())]
    pub cdi_spec_dir: Option<PathBuf>,

    /// The hook binary the CDI spec runs, a host path: nvidia-ctk (runs `hook <stage>`),
    /// nvidia-cdi-hook, nvidia-container-runtime-hook or nvshim
    /// [env: NVIDIA_CDI_HOOK_PATH, NVIDIA_CTK_PATH, NVSHIM_CDI_HOOK_PATH]
    /// [default: /usr/bin/nvidia-ctk]
    #[arg(
        long = "nvidia-cdi-hook-path",
        visible_aliases = ["nvidia-ctk-path", "cdi-hook-path"],
        value_name = "PATH",
        value_parser = path_parser(),
    )]
    pub cdi_hook_path: Option<PathBuf>,

    /// NVIDIA's CDI hooks to leave out of the spec: disable-device-node-modification or
    /// all (the driver's links and linker cache stay); repeatable and comma-separated
    /// [env: CDI_DISABLE_HOOKS] [default: none]
    #[arg(
        long,
        global = true,
        value_name = "HOOK",
        value_delimiter = ',',
        action = clap::ArgAction::Append,
    )]
    pub cdi_disable_hooks: Option<Vec<String>>,

    /// NVIDIA's CDI generator feature flags: none is supported yet, so any is an error
    /// [env: CDI_FEATURE_FLAGS] [default: none]
    #[arg(
        long,
        global = true,
        value_name = "FLAG",
        value_delimiter = ',',
        action = clap::ArgAction::Append,
    )]
    pub cdi_feature_flags: Option<Vec<String>>,

    /// How devices are found: auto or nvml (NVIDIA's tegra is not supported yet)
    /// [env: DEVICE_DISCOVERY_STRATEGY] [default: auto]
    #[arg(long, global = true, value_name = "STRATEGY")]
    pub device_discovery_strategy: Option<String>,

    /// How replicas and MIG devices are picked: distributed (NVIDIA's packed is not
    /// supported yet) [env: SHARED_DEVICES_ALLOCATION_POLICY] [default: distributed]
    #[arg(long, global = true, value_name = "POLICY")]
    pub shared_devices_allocation_policy: Option<String>,

    /// Give containers GDRCopy (NVIDIA_GDRCOPY=enabled) [env: GDRCOPY_ENABLED]
    /// [default: false]
    #[arg(
        global = true,
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
    )]
    pub gdrcopy_enabled: Option<bool>,

    /// Give containers GPUDirect Storage (NVIDIA_GDS=enabled) [env: GDS_ENABLED]
    /// [default: false]
    #[arg(
        global = true,
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
    )]
    pub gds_enabled: Option<bool>,

    /// Give containers the MOFED devices (NVIDIA_MOFED=enabled) [env: MOFED_ENABLED]
    /// [default: false]
    #[arg(
        global = true,
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
    )]
    pub mofed_enabled: Option<bool>,

    /// IMEX channels to give containers: none or 0 (NVIDIA's rule); repeatable and
    /// comma-separated [env: IMEX_CHANNEL_IDS] [default: none]
    #[arg(
        long,
        global = true,
        value_name = "ID",
        value_delimiter = ',',
        action = clap::ArgAction::Append,
    )]
    pub imex_channel_ids: Option<Vec<i64>>,

    /// Fail the start when a listed IMEX channel does not exist (else it is left out)
    /// [env: IMEX_REQUIRED] [default: false]
    #[arg(
        global = true,
        long,
        value_name = "BOOL",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        value_parser = parse_bool,
    )]
    pub imex_required: Option<bool>,

    /// Serve /healthz and /readyz on this IP:PORT [env: NVSHIM_HEALTH_ADDR] [default: off]
    #[arg(long, global = true, value_name = "IP:PORT")]
    pub health_addr: Option<SocketAddr>,

    /// Serve Prometheus /metrics on this IP:PORT (:PORT: every interface)
    /// [env: NVSHIM_METRICS_ADDR] [default: off]
    #[arg(long, global = true, value_name = "[IP]:PORT", value_parser = parse_listen_addr)]
    pub metrics_addr: Option<SocketAddr>,

    /// The GPU metric names: dcgm (dcgm-exporter's DCGM_FI_*, Prometheus text 0.0.4) or
    /// nvshim (our nvshim_gpu_*, OpenMetrics) [env: NVSHIM_METRICS_NAMES] [default: dcgm]
    #[arg(long, global = true, value_name = "dcgm|nvshim", value_parser = parse_metrics_names)]
    pub metrics_names: Option<MetricsNames>,

    /// The DCGM fields to serve, in dcgm-exporter's collectors CSV format
    /// [env: NVSHIM_METRICS_COLLECTORS] [default: dcgm-exporter's default counters]
    #[arg(long, global = true, value_name = "PATH", value_parser = path_parser())]
    pub metrics_collectors: Option<PathBuf>,

    /// Kubelet's pod-resources socket, for the pod labels of GPU metrics; "" for none
    /// [env: NVSHIM_POD_RESOURCES_SOCKET] [default: /var/lib/kubelet/pod-resources/kubelet.sock]
    #[arg(long, global = true, value_name = "PATH", value_parser = path_parser())]
    pub pod_resources_socket: Option<PathBuf>,

    /// The libnvidia-ml.so.1 to load [env: NVSHIM_NVML_LIB] [default: found under the driver root]
    #[arg(long, global = true, value_name = "PATH", value_parser = path_parser())]
    pub nvml_lib: Option<PathBuf>,

    /// Log filter, e.g. info or nvshim=debug [env: NVSHIM_LOG_LEVEL]
    #[arg(long, global = true, value_name = "FILTER")]
    pub log_level: Option<String>,

    /// Without a subcommand: serve the device plugin.
    #[command(subcommand)]
    pub command: Option<PluginCommand>,
}

/// The other roles of the binary. Every flag is global (before or after the
/// subcommand), and flags and env vars mean the same for each role, so all roles read
/// one config the same way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::Subcommand)]
pub enum PluginCommand {
    /// Run an MPS control daemon per resource shared with sharing.mps (NVIDIA's
    /// mps-control-daemon), supervise them, stop them on SIGTERM/SIGINT
    MpsControlDaemon,
}

impl PluginArgs {
    /// The log filter: `--log-level`, else `NVSHIM_LOG_LEVEL` (an empty value is unset).
    /// The binary applies it; it is not part of [`super::Settings`].
    pub fn log_level(&self, env: &dyn Fn(&str) -> Option<String>) -> Option<String> {
        self.log_level
            .clone()
            .or_else(|| env(ENV_LOG_LEVEL))
            .filter(|level| !level.is_empty())
    }
}

/// Paths as given, including the empty one (clap's own `PathBuf` parser rejects `""`,
/// which `--kubelet-socket` needs); [`super::resolve`] decides what empty means.
fn path_parser() -> impl TypedValueParser<Value = PathBuf> {
    OsStringValueParser::new().map(PathBuf::from)
}

/// Which names the GPU metrics go by.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum MetricsNames {
    /// dcgm-exporter's `DCGM_FI_*` families and labels, in the Prometheus text format
    /// 0.0.4, so NVIDIA's dashboards and alert rules work unchanged.
    #[default]
    Dcgm,
    /// Our `nvshim_gpu_*` gauges, in OpenMetrics.
    Nvshim,
}

impl MetricsNames {
    const VALID: &'static str = "dcgm, nvshim";
}

/// `--metrics-names` and `NVSHIM_METRICS_NAMES`.
pub fn parse_metrics_names(value: &str) -> Result<MetricsNames, PluginConfigError> {
    match value.trim().to_ascii_lowercase().as_str() {
        "dcgm" => Ok(MetricsNames::Dcgm),
        "nvshim" => Ok(MetricsNames::Nvshim),
        _ => Err(PluginConfigError::Invalid {
            origin: "--metrics-names".to_owned(),
            value: value.to_owned(),
            valid: MetricsNames::VALID,
        }),
    }
}

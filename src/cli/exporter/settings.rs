// SPDX-License-Identifier: Apache-2.0
//! `nvshim exporter`'s command line: dcgm-exporter's flags and short names, each also read
//! from dcgm-exporter's environment variable (a flag wins over its variable).

use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Args, ValueEnum};

use crate::kubelet::pod_resources::DEFAULT_SOCKET;

/// dcgm-exporter's default listen address.
pub const DEFAULT_ADDRESS: &str = ":9400";
/// dcgm-exporter's default collect interval, in milliseconds.
pub const DEFAULT_INTERVAL_MS: u64 = 30_000;

/// The environment variables, as dcgm-exporter names them.
pub mod env {
    pub const COLLECTORS: &str = "DCGM_EXPORTER_COLLECTORS";
    pub const LISTEN: &str = "DCGM_EXPORTER_LISTEN";
    pub const INTERVAL: &str = "DCGM_EXPORTER_INTERVAL";
    pub const KUBERNETES: &str = "DCGM_EXPORTER_KUBERNETES";
    pub const GPU_ID_TYPE: &str = "DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE";
    pub const POD_RESOURCES_SOCKET: &str = "DCGM_POD_RESOURCES_KUBELET_SOCKET";
    pub const VIRTUAL_GPUS: &str = "KUBERNETES_VIRTUAL_GPUS";
    pub const RESOURCE_NAMES: &str = "NVIDIA_RESOURCE_NAMES";
    pub const NO_HOSTNAME: &str = "DCGM_EXPORTER_NO_HOSTNAME";
    pub const WEB_CONFIG_FILE: &str = "DCGM_EXPORTER_WEB_CONFIG_FILE";
}

/// How kubelet names the GPUs it lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum GpuIdType {
    /// By UUID (or index), as NVIDIA's device plugin and ours advertise them.
    Uid,
    /// As `nvidia<minor>` (GKE's device plugin).
    DeviceName,
}

#[derive(Debug, Clone, Default, Args)]
pub struct ExporterArgs {
    /// The DCGM fields to serve, in dcgm-exporter's collectors CSV
    /// [env: DCGM_EXPORTER_COLLECTORS] [default: dcgm-exporter's default counters, built in]
    #[arg(short = 'f', long = "collectors", value_name = "PATH")]
    pub collectors: Option<PathBuf>,
    /// Listen on [IP]:PORT (":PORT": every interface) [env: DCGM_EXPORTER_LISTEN]
    /// [default: :9400]
    #[arg(short = 'a', long = "address", value_name = "[IP]:PORT")]
    pub address: Option<String>,
    /// Serve readings at most this many milliseconds old [env: DCGM_EXPORTER_INTERVAL]
    /// [default: 30000]
    #[arg(short = 'c', long = "collect-interval", value_name = "MS")]
    pub collect_interval: Option<u64>,
    /// Label each GPU's series with the pod and container holding it, from kubelet's
    /// pod-resources API [env: DCGM_EXPORTER_KUBERNETES]
    #[arg(short = 'k', long, action = ArgAction::SetTrue)]
    pub kubernetes: bool,
    /// How kubelet names GPUs (uid, device-name); both are recognised either way
    /// [env: DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE] [default: uid]
    #[arg(long, value_name = "TYPE")]
    pub kubernetes_gpu_id_type: Option<GpuIdType>,
    /// Kubelet's pod-resources socket [env: DCGM_POD_RESOURCES_KUBELET_SOCKET]
    /// [default: /var/lib/kubelet/pod-resources/kubelet.sock]
    #[arg(long, value_name = "PATH")]
    pub pod_resources_kubelet_socket: Option<PathBuf>,
    /// Shared GPUs (time-slicing, MPS) get one series per holder with a vgpu label; always
    /// on, accepted for dcgm-exporter's command lines [env: KUBERNETES_VIRTUAL_GPUS]
    #[arg(long, action = ArgAction::SetTrue)]
    pub kubernetes_virtual_gpus: bool,
    /// Resource names besides nvidia.com/* whose devices are GPUs, comma-separated
    /// [env: NVIDIA_RESOURCE_NAMES]
    #[arg(long, value_name = "NAMES", value_delimiter = ',')]
    pub nvidia_resource_names: Vec<String>,
    /// Leave the Hostname label off [env: DCGM_EXPORTER_NO_HOSTNAME]
    #[arg(short = 'n', long, action = ArgAction::SetTrue)]
    pub no_hostname: bool,
    /// dcgm-exporter's TLS and basic-auth web config: not supported, refused
    /// [env: DCGM_EXPORTER_WEB_CONFIG_FILE]
    #[arg(long, value_name = "PATH")]
    pub web_config_file: Option<PathBuf>,
}

/// The resolved command line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub collectors: Option<PathBuf>,
    pub address: String,
    pub collect_interval: Duration,
    pub kubernetes: bool,
    pub gpu_id_type: GpuIdType,
    pub pod_resources_socket: PathBuf,
    pub resource_names: Vec<String>,
    pub no_hostname: bool,
}

impl Settings {
    /// Flags first, then dcgm-exporter's variables from `env`, then its defaults. Errors
    /// name the flag or variable, the value and what is valid.
    pub fn resolve(
        args: &ExporterArgs,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Settings, String> {
        let var = |name: &str| env(name).filter(|value| !value.trim().is_empty());
        let flag = |set: bool, name: &str| -> Result<bool, String> {
            if set {
                return Ok(true);
            }
            var(name).map_or(Ok(false), |value| parse_bool(name, &value))
        };
        if let Some(path) = args
            .web_config_file
            .clone()
            .or_else(|| var(env::WEB_CONFIG_FILE).map(PathBuf::from))
        {
            return Err(format!(
                "--web-config-file {}: TLS and basic auth are not supported; serve on \
                 127.0.0.1 behind a proxy that adds them, or leave {} unset",
                path.display(),
                env::WEB_CONFIG_FILE
            ));
        }
        let collect_interval = match args.collect_interval {
            Some(ms) => ms,
            None => match var(env::INTERVAL) {
                Some(value) => value.trim().parse().map_err(|_| {
                    format!(
                        "{}={value:?}: not a whole number of milliseconds (e.g. 30000)",
                        env::INTERVAL
                    )
                })?,
                None => DEFAULT_INTERVAL_MS,
            },
        };
        let gpu_id_type = match args.kubernetes_gpu_id_type {
            Some(kind) => kind,
            None => match var(env::GPU_ID_TYPE) {
                Some(value) => GpuIdType::from_str(value.trim(), true).map_err(|_| {
                    format!("{}={value:?}: valid: uid, device-name", env::GPU_ID_TYPE)
                })?,
                None => GpuIdType::Uid,
            },
        };
        let resource_names = if args.nvidia_resource_names.is_empty() {
            var(env::RESOURCE_NAMES)
                .map(|value| {
                    value
                        .split(',')
                        .map(|name| name.trim().to_owned())
                        .filter(|name| !name.is_empty())
                        .collect()
                })
                .unwrap_or_default()
        } else {
            args.nvidia_resource_names.clone()
        };
        // Accepted for dcgm-exporter's command lines; what it asks for is always on.
        flag(args.kubernetes_virtual_gpus, env::VIRTUAL_GPUS)?;
        Ok(Settings {
            collectors: args
                .collectors
                .clone()
                .or_else(|| var(env::COLLECTORS).map(PathBuf::from)),
            address: args
                .address
                .clone()
                .or_else(|| var(env::LISTEN))
                .unwrap_or_else(|| DEFAULT_ADDRESS.to_owned()),
            collect_interval: Duration::from_millis(collect_interval),
            kubernetes: flag(args.kubernetes, env::KUBERNETES)?,
            gpu_id_type,
            pod_resources_socket: args
                .pod_resources_kubelet_socket
                .clone()
                .or_else(|| var(env::POD_RESOURCES_SOCKET).map(PathBuf::from))
                .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET)),
            resource_names,
            no_hostname: flag(args.no_hostname, env::NO_HOSTNAME)?,
        })
    }
}

/// A boolean variable as Go's `strconv.ParseBool` (dcgm-exporter's flags library) reads it.
fn parse_bool(name: &str, value: &str) -> Result<bool, String> {
    match value.trim() {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!(
            "{name}={value:?}: not a boolean (valid: true, false, 1, 0, t, f)"
        )),
    }
}

#[cfg(test)]
#[path = "settings_tests.rs"]
mod tests;

// SPDX-License-Identifier: Apache-2.0
//! gpu-feature-discovery's command line on `nvshim labels`: [`LabelsArgs`] takes GFD's
//! flags (v0.17–v0.20) under GFD's names, with our older names as aliases, and
//! [`resolve`] reads GFD's env vars (`GFD_*`, and the shared names such as
//! `MIG_STRATEGY`) and the `flags.gfd.*` keys of the config file, with the precedence
//! flag > env > file > default, into one immutable [`Resolved`].
//!
//! What GFD does and nvshim does not do yet is refused by name rather than ignored: a
//! `--kubeconfig` for the NodeFeature output (the in-cluster config only) and the
//! `tegra`/`vfio` discovery strategies. `--node-name` and `--namespace` serve the
//! NodeFeature output only, as in GFD.
//!
//! Pure: the environment comes in as a lookup, the config file as parsed settings.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use clap::builder::{OsStringValueParser, TypedValueParser};

use super::feature_discovery::GFD_OUTPUT;
use super::{DEFAULT_OUTPUT, LabelsError, MACHINE_TYPE_FILE, parse_interval};
use crate::k8s_config::{DiscoveryStrategy, FileSettings, MigStrategy, Sharing, parse_go_bool};

/// GFD's relabelling period when it loops and is given none.
pub const DEFAULT_SLEEP_INTERVAL: Duration = Duration::from_secs(60);

/// Every GFD env var `nvshim labels` reads, first name first where GFD has two.
pub mod env {
    pub const OUTPUT_FILE: &str = "GFD_OUTPUT_FILE";
    pub const ONESHOT: &str = "GFD_ONESHOT";
    pub const SLEEP_INTERVAL: &str = "GFD_SLEEP_INTERVAL";
    pub const NO_TIMESTAMP: &str = "GFD_NO_TIMESTAMP";
    pub const MIG_STRATEGY: [&str; 2] = ["GFD_MIG_STRATEGY", "MIG_STRATEGY"];
    pub const FAIL_ON_INIT_ERROR: [&str; 2] = ["GFD_FAIL_ON_INIT_ERROR", "FAIL_ON_INIT_ERROR"];
    pub const CONFIG_FILE: [&str; 2] = ["GFD_CONFIG_FILE", "CONFIG_FILE"];
    pub const MACHINE_TYPE_FILE: &str = "GFD_MACHINE_TYPE_FILE";
    pub const USE_NODE_FEATURE_API: [&str; 2] =
        ["GFD_USE_NODE_FEATURE_API", "USE_NODE_FEATURE_API"];
    pub const DEVICE_DISCOVERY_STRATEGY: &str = "DEVICE_DISCOVERY_STRATEGY";
    pub const DRIVER_ROOT_CTR_PATH: [&str; 2] = ["DRIVER_ROOT_CTR_PATH", "CONTAINER_DRIVER_ROOT"];
    pub const KUBECONFIG: &str = "KUBECONFIG";
    pub const NODE_NAME: &str = "NODE_NAME";
    pub const NAMESPACE: &str = "NAMESPACE";
}

#[derive(Debug, Clone, Default, Args)]
pub struct LabelsArgs {
    /// The NFD local feature file to write ("-" or "": stdout) [env: GFD_OUTPUT_FILE]
    /// [default: /etc/kubernetes/node-feature-discovery/features.d/nvshim]
    #[arg(
        long = "output-file",
        short = 'o',
        visible_alias = "output",
        value_name = "FILE",
        value_parser = any_path()
    )]
    pub output: Option<PathBuf>,
    /// Label once and exit [env: GFD_ONESHOT] [default: once unless an interval is
    /// given; =false without one: every 60s, as GFD]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub oneshot: Option<bool>,
    /// Relabel every DURATION (e.g. 60s, 5m, 1h30m) until SIGTERM or SIGINT, rewriting
    /// the file only when a label changed [env: GFD_SLEEP_INTERVAL]
    #[arg(long = "sleep-interval", visible_alias = "interval", value_name = "DURATION",
          value_parser = parse_interval)]
    pub interval: Option<Duration>,
    /// Leave out the nvidia.com/gfd.timestamp label (then the file changes only when the
    /// node does) [env: GFD_NO_TIMESTAMP] [default: false, as GFD]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub no_timestamp: Option<bool>,
    /// How the device plugin advertises MIG devices: none, single or mixed
    /// [env: GFD_MIG_STRATEGY, MIG_STRATEGY] [default: the config file's
    /// flags.migStrategy, else none]
    #[arg(long, value_name = "STRATEGY")]
    pub mig_strategy: Option<MigStrategy>,
    /// Fail when the GPUs cannot be read (=false: log it and carry on)
    /// [env: GFD_FAIL_ON_INIT_ERROR, FAIL_ON_INIT_ERROR] [default: true]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub fail_on_init_error: Option<bool>,
    /// The device plugin's config file (version: v1), for flags.migStrategy, flags.gfd.*
    /// and sharing.timeSlicing or sharing.mps [env: GFD_CONFIG_FILE, CONFIG_FILE]
    #[arg(long = "config-file", visible_alias = "config", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The file holding the machine's model, for nvidia.com/gpu.machine
    /// [env: GFD_MACHINE_TYPE_FILE] [default: /sys/class/dmi/id/product_name]
    #[arg(long, value_name = "FILE")]
    pub machine_type_file: Option<PathBuf>,
    /// Publish the labels as NFD's NodeFeature object (nvidia-features-for-<node>) through
    /// the API server, with the pod's in-cluster config, instead of the feature file
    /// [env: GFD_USE_NODE_FEATURE_API, USE_NODE_FEATURE_API] [default: false]
    #[arg(long, value_name = "BOOL", num_args = 0..=1, require_equals = true,
          default_missing_value = "true", value_parser = parse_go_bool)]
    pub use_node_feature_api: Option<bool>,
    /// How GPUs are found: auto (the --backend) or nvml; GFD's tegra and vfio are not
    /// supported yet [env: DEVICE_DISCOVERY_STRATEGY] [default: auto]
    #[arg(long, value_name = "STRATEGY")]
    pub device_discovery_strategy: Option<String>,
    /// Where this container sees the host's driver root; read instead of --driver-root
    /// [env: DRIVER_ROOT_CTR_PATH, CONTAINER_DRIVER_ROOT]
    #[arg(
        long = "driver-root-ctr-path",
        visible_alias = "container-driver-root",
        value_name = "PATH"
    )]
    pub driver_root_ctr_path: Option<PathBuf>,
    /// A kubeconfig for the NodeFeature API: not supported, the in-cluster config only
    /// (an error when set with --use-node-feature-api) [env: KUBECONFIG]
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
    /// Accepted, no effect: nvshim makes two or three requests a round [env: KUBE_API_QPS]
    #[arg(long, value_name = "QPS")]
    pub kube_api_qps: Option<f64>,
    /// Accepted, no effect [env: KUBE_API_BURST]
    #[arg(long, value_name = "BURST")]
    pub kube_api_burst: Option<u32>,
    /// The NodeFeature object's namespace [env: NAMESPACE] [default: the service
    /// account's namespace, else default]
    #[arg(long, value_name = "NAMESPACE")]
    pub namespace: Option<String>,
    /// The node the NodeFeature object describes; required with --use-node-feature-api
    /// [env: NODE_NAME]
    #[arg(long, value_name = "NAME")]
    pub node_name: Option<String>,
    /// Accepted, no effect [env: POD_NAME]
    #[arg(long, value_name = "NAME")]
    pub pod_name: Option<String>,
    /// GFD's defaults (loop every 60s, write `features.d/gfd`) instead of ours (once,
    /// `features.d/nvshim`): set under the `gpu-feature-discovery` name.
    #[arg(skip)]
    pub gfd_defaults: bool,
}

/// Paths as given, the empty one included (GFD's stdout); clap's own rejects `""`.
fn any_path() -> impl TypedValueParser<Value = PathBuf> {
    OsStringValueParser::new().map(PathBuf::from)
}

/// Where the labels go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    Stdout,
    File(PathBuf),
    /// NFD's NodeFeature object for `node`, through the API server; the namespace
    /// defaults to the service account's, else `default`.
    NodeFeature {
        node: String,
        namespace: Option<String>,
    },
}

/// Everything one `nvshim labels` run works with, resolved once.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    pub output: Output,
    /// `None`: label once and exit.
    pub interval: Option<Duration>,
    pub fail_on_init_error: bool,
    pub mig_strategy: MigStrategy,
    pub sharing: Option<Sharing>,
    pub machine_type_file: PathBuf,
    /// `--device-discovery-strategy nvml`: NVML only, whatever `--backend` says.
    pub nvml_only: bool,
    /// Read the driver here instead of at `--driver-root`.
    pub driver_root: Option<PathBuf>,
    /// Write `nvidia.com/gfd.timestamp` (GFD's default; `--no-timestamp` turns it off).
    pub timestamp: bool,
}

/// The config file `args` or the environment name, if any.
pub fn config_file(args: &LabelsArgs, env: &dyn Fn(&str) -> Option<String>) -> Option<PathBuf> {
    args.config
        .clone()
        .or_else(|| first(env, &env::CONFIG_FILE).map(PathBuf::from))
        .filter(|p| !p.as_os_str().is_empty())
}

/// Flags > env > file > default. Every env var read is checked, even one a flag
/// overrides, as GFD's CLI library does.
pub fn resolve(
    args: &LabelsArgs,
    env: &dyn Fn(&str) -> Option<String>,
    file: &FileSettings,
) -> Result<Resolved, LabelsError> {
    let gfd = &file.gfd;
    let bool_env = |name: &'static str| -> Result<Option<bool>, LabelsError> {
        env(name)
            .filter(|v| !v.is_empty())
            .map(|v| parse_go_bool(&v).map_err(|source| LabelsError::Env { name, source }))
            .transpose()
    };
    let bool_envs = |names: &[&'static str; 2]| -> Result<Option<bool>, LabelsError> {
        let a = bool_env(names[0])?;
        let b = bool_env(names[1])?;
        Ok(a.or(b))
    };

    let use_nfd_api = args
        .use_node_feature_api
        .or(bool_envs(&env::USE_NODE_FEATURE_API)?)
        .or(gfd.use_node_feature_api)
        .unwrap_or(false);
    let node_feature = if use_nfd_api {
        let kubeconfig = args.kubeconfig.clone().or_else(|| {
            env(env::KUBECONFIG)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        });
        if let Some(path) = kubeconfig {
            return Err(LabelsError::Kubeconfig(path));
        }
        let node = args
            .node_name
            .clone()
            .or_else(|| env(env::NODE_NAME))
            .filter(|v| !v.is_empty())
            .ok_or(LabelsError::NodeName)?;
        let namespace = args
            .namespace
            .clone()
            .or_else(|| env(env::NAMESPACE))
            .filter(|v| !v.is_empty());
        Some(Output::NodeFeature { node, namespace })
    } else {
        None
    };

    let strategy = match &args.device_discovery_strategy {
        Some(s) => Some(s.clone()),
        None => env(env::DEVICE_DISCOVERY_STRATEGY).filter(|s| !s.is_empty()),
    };
    let discovery = match strategy {
        Some(s) => s.parse().map_err(LabelsError::Discovery)?,
        None => file.discovery.unwrap_or_default(),
    };

    let mut mig_env = None;
    for name in env::MIG_STRATEGY {
        if let Some(value) = env(name).filter(|v| !v.is_empty()) {
            let parsed: MigStrategy = value
                .parse()
                .map_err(|source| LabelsError::Env { name, source })?;
            mig_env = mig_env.or(Some(parsed));
        }
    }

    let oneshot = args.oneshot.or(bool_env(env::ONESHOT)?).or(gfd.oneshot);
    let no_timestamp = args
        .no_timestamp
        .or(bool_env(env::NO_TIMESTAMP)?)
        .or(gfd.no_timestamp)
        .unwrap_or(false);
    let interval_env = env(env::SLEEP_INTERVAL)
        .filter(|v| !v.is_empty())
        .map(|v| parse_interval(&v).map_err(|e| e.in_origin(env::SLEEP_INTERVAL)))
        .transpose()?;
    let interval_file = gfd
        .sleep_interval
        .as_deref()
        .map(|v| parse_interval(v).map_err(|e| e.in_origin("flags.gfd.sleepInterval")))
        .transpose()?;
    let interval = args.interval.or(interval_env).or(interval_file);
    let interval = match (oneshot, interval) {
        (Some(true), _) => None,
        (_, Some(every)) => Some(every),
        // GFD loops by default; nvshim labels once unless asked to loop, and an explicit
        // "not oneshot" is that ask.
        (Some(false), None) => Some(DEFAULT_SLEEP_INTERVAL),
        (None, None) if args.gfd_defaults => Some(DEFAULT_SLEEP_INTERVAL),
        (None, None) => None,
    };

    let output = args
        .output
        .clone()
        .or_else(|| env(env::OUTPUT_FILE).map(PathBuf::from))
        .or_else(|| gfd.output_file.clone())
        .unwrap_or_else(|| {
            PathBuf::from(if args.gfd_defaults {
                GFD_OUTPUT
            } else {
                DEFAULT_OUTPUT
            })
        });
    // GFD writes to stdout for an empty output file; `-` is our spelling.
    let output = if let Some(node_feature) = node_feature {
        node_feature
    } else if output.as_os_str().is_empty() || output.as_os_str() == "-" {
        Output::Stdout
    } else {
        Output::File(output)
    };

    Ok(Resolved {
        output,
        interval,
        fail_on_init_error: args
            .fail_on_init_error
            .or(bool_envs(&env::FAIL_ON_INIT_ERROR)?)
            .or(file.fail_on_init_error)
            .unwrap_or(true),
        mig_strategy: args
            .mig_strategy
            .or(mig_env)
            .or(file.mig_strategy)
            .unwrap_or_default(),
        sharing: file.sharing.clone(),
        machine_type_file: args
            .machine_type_file
            .clone()
            .or_else(|| {
                env(env::MACHINE_TYPE_FILE)
                    .filter(|v| !v.is_empty())
                    .map(PathBuf::from)
            })
            .or_else(|| gfd.machine_type_file.clone())
            .unwrap_or_else(|| PathBuf::from(MACHINE_TYPE_FILE)),
        nvml_only: discovery == DiscoveryStrategy::Nvml,
        driver_root: args
            .driver_root_ctr_path
            .clone()
            .or_else(|| first(env, &env::DRIVER_ROOT_CTR_PATH).map(PathBuf::from))
            .filter(|p| !p.as_os_str().is_empty()),
        timestamp: !no_timestamp,
    })
}

/// The first of `names` set to a non-empty value.
fn first(env: &dyn Fn(&str) -> Option<String>, names: &[&str]) -> Option<String> {
    names
        .iter()
        .find_map(|name| env(name).filter(|v| !v.is_empty()))
}

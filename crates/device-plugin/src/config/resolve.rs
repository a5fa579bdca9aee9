// SPDX-License-Identifier: Apache-2.0
//! [`resolve`]: flags > env > file > default, once, into [`Settings`].
//!
//! Like NVIDIA's plugin, a flag and its env var name the same setting and the flag wins;
//! the config file (`--config-file`, else `CONFIG_FILE`) fills what neither set. Every
//! env var we read is checked even when a flag overrides it, as NVIDIA's CLI library
//! does. An empty env var or flag value for a path or a string means "not set", except
//! `KUBELET_SOCKET`/`--kubelet-socket`, where `""` means "do not register". The
//! environment comes in as a lookup function, so this module never reads the process
//! environment itself (except in [`resolve_from_process`]).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::args::{
    ENV_CDI_ANNOTATION_PREFIX, ENV_CDI_DISABLE_HOOKS, ENV_CDI_FEATURE_FLAGS, ENV_CDI_HOOK_PATH,
    ENV_CDI_SPEC_DIR, ENV_CONFIG_FILE, ENV_CONTAINER_DRIVER_ROOT, ENV_DEVICE_DISCOVERY_STRATEGY,
    ENV_DEVICE_ID_STRATEGY, ENV_DEVICE_LIST_STRATEGY, ENV_DISABLE_HEALTHCHECKS,
    ENV_DRIVER_ROOT_CTR_PATH, ENV_ENABLE_HEALTHCHECKS, ENV_FAIL_ON_INIT_ERROR, ENV_HEALTH_ADDR,
    ENV_KUBELET_SOCKET, ENV_METRICS_ADDR, ENV_METRICS_COLLECTORS, ENV_METRICS_NAMES,
    ENV_MIG_STRATEGY, ENV_MPS_ROOT, ENV_NVIDIA_CDI_HOOK_PATH, ENV_NVIDIA_CTK_PATH,
    ENV_NVIDIA_DEV_ROOT, ENV_NVIDIA_DRIVER_ROOT, ENV_NVML_LIB, ENV_PASS_DEVICE_SPECS,
    ENV_POD_RESOURCES_SOCKET, ENV_SHARED_DEVICES_ALLOCATION_POLICY, ENV_SOCKET_DIR,
    parse_metrics_names,
};
use super::extras;
use nvshim::hook_contract::{ALL_HOOKS, DISABLE_DEVICE_NODE_MODIFICATION};
use nvshim::k8s_config::{
    DiscoveryStrategy, FileSettings, FileSpot, K8sConfigError, load_file,
    parse_device_list_strategies,
};

use super::values::{dedup_strategies, parse_bool, parse_listen_addr};
use super::{
    DEVICE_PLUGIN_DIR, DeviceIdStrategy, DeviceListStrategy, HealthChecks, KUBELET_SOCKET,
    MigStrategy, POD_RESOURCES_SOCKET, PluginArgs, PluginConfigError, Settings, SharingStrategy,
};

/// An env lookup: `Some(value)` when the variable is set (possibly to `""`).
pub type EnvLookup<'a> = &'a dyn Fn(&str) -> Option<String>;

/// Resolves the plugin's settings from the command line, the environment (through
/// `env`) and the config file it names.
pub fn resolve(args: &PluginArgs, env: EnvLookup<'_>) -> Result<Settings, PluginConfigError> {
    let config_file = non_empty_path(args.config_file.clone())
        .or_else(|| non_empty_path(env(ENV_CONFIG_FILE).map(PathBuf::from)));
    let file = match &config_file {
        Some(path) => load_file(path)?,
        None => FileSettings::default(),
    };
    merge(args, env, &file, config_file)
}

/// [`resolve`] with the process environment (a variable that is not UTF-8 counts as
/// unset).
pub fn resolve_from_process(args: &PluginArgs) -> Result<Settings, PluginConfigError> {
    resolve(args, &|name| std::env::var(name).ok())
}

/// The precedence itself, given a parsed config file (`config_file` is where it came
/// from, recorded in the settings).
pub(super) fn merge(
    args: &PluginArgs,
    env: EnvLookup<'_>,
    file: &FileSettings,
    config_file: Option<PathBuf>,
) -> Result<Settings, PluginConfigError> {
    let defaults = Settings::default();
    let env = Env(env);
    reject_unsupported(args, &env)?;
    let (device_classes, imex) = extras::resolve(args, &env, file)?;
    let cdi_disable_hooks = cdi_disable_hooks(args, &env)?;

    let mig_strategy: Option<MigStrategy> = env.parsed(ENV_MIG_STRATEGY)?;
    let fail_on_init_error = env.bool(ENV_FAIL_ON_INIT_ERROR)?;
    let pass_device_specs = env.bool(ENV_PASS_DEVICE_SPECS)?;
    let device_id_strategy: Option<DeviceIdStrategy> = env.parsed(ENV_DEVICE_ID_STRATEGY)?;
    let strategies = env.strategies()?;
    let health_addr = env.address(ENV_HEALTH_ADDR)?;
    let metrics_addr = env.listen_address(ENV_METRICS_ADDR)?;
    let metrics_names = env.0(ENV_METRICS_NAMES)
        .map(|value| parse_metrics_names(&value).map_err(|e| e.in_env(ENV_METRICS_NAMES)))
        .transpose()?;
    let health_checks = health_checks(env.0)?;

    let driver_root = non_empty_path(args.driver_root.clone())
        .or_else(|| env.path(ENV_NVIDIA_DRIVER_ROOT))
        .or_else(|| file.driver_root.clone())
        .unwrap_or(defaults.driver_root);
    let dev_root = non_empty_path(args.dev_root.clone())
        .or_else(|| env.path(ENV_NVIDIA_DEV_ROOT))
        .or_else(|| file.dev_root.clone())
        .unwrap_or_else(|| driver_root.clone());

    let device_list_strategies = match &args.device_list_strategy {
        Some(given) if given.is_empty() => {
            return Err(K8sConfigError::NoDeviceListStrategy {
                origin: "--device-list-strategy".to_owned(),
            }
            .into());
        }
        Some(given) => given.clone(),
        None => strategies
            .or_else(|| file.device_list_strategies.clone())
            .unwrap_or(defaults.device_list_strategies),
    };

    // `""` is meaningful here: serve without registering.
    let kubelet_socket = args
        .kubelet_socket
        .clone()
        .or_else(|| env.0(ENV_KUBELET_SOCKET).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(KUBELET_SOCKET));
    let kubelet_socket = non_empty_path(Some(kubelet_socket));
    // `""` turns the pod labels off, as for the kubelet socket.
    let pod_resources_socket = args
        .pod_resources_socket
        .clone()
        .or_else(|| env.0(ENV_POD_RESOURCES_SOCKET).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(POD_RESOURCES_SOCKET));
    let pod_resources_socket = non_empty_path(Some(pod_resources_socket));
    let mps_root = match non_empty_path(args.mps_root.clone()) {
        Some(root) => Some(absolute(root, "--mps-root")?),
        None => env
            .path(ENV_MPS_ROOT)
            .map(|root| absolute(root, ENV_MPS_ROOT))
            .transpose()?,
    }
    .or_else(|| file.mps_root.clone());
    let container_driver_root = non_empty_path(args.container_driver_root.clone())
        .or_else(|| env.path(ENV_DRIVER_ROOT_CTR_PATH))
        .or_else(|| env.path(ENV_CONTAINER_DRIVER_ROOT))
        .or_else(|| file.container_driver_root.clone());
    let cdi_spec_dir = non_empty_path(args.cdi_spec_dir.clone())
        .or_else(|| env.path(ENV_CDI_SPEC_DIR))
        .unwrap_or(defaults.cdi_spec_dir);
    let (origin, cdi_hook_path) = non_empty_path(args.cdi_hook_path.clone())
        .map(|path| ("--nvidia-cdi-hook-path", path))
        .or_else(|| {
            [
                ENV_NVIDIA_CDI_HOOK_PATH,
                ENV_NVIDIA_CTK_PATH,
                ENV_CDI_HOOK_PATH,
            ]
            .into_iter()
            .find_map(|name| env.path(name).map(|path| (name, path)))
        })
        .or_else(|| {
            file.cdi_hook_path
                .clone()
                .map(|path| ("flags.plugin.nvidiaCTKPath", path))
        })
        .unwrap_or(("the default", defaults.cdi_hook_path));
    if !cdi_hook_path.is_absolute() {
        return Err(PluginConfigError::RelativeHookPath {
            origin,
            path: cdi_hook_path,
        });
    }
    let socket_dir = non_empty_path(args.socket_dir.clone())
        .or_else(|| env.path(ENV_SOCKET_DIR))
        .unwrap_or_else(|| default_socket_dir(kubelet_socket.as_deref()));

    let settings = Settings {
        mig_strategy: args
            .mig_strategy
            .or(mig_strategy)
            .or(file.mig_strategy)
            .unwrap_or(defaults.mig_strategy),
        fail_on_init_error: args
            .fail_on_init_error
            .or(fail_on_init_error)
            .or(file.fail_on_init_error)
            .unwrap_or(defaults.fail_on_init_error),
        driver_root,
        dev_root,
        pass_device_specs: args
            .pass_device_specs
            .or(pass_device_specs)
            .or(file.pass_device_specs)
            .unwrap_or(defaults.pass_device_specs),
        device_list_strategies: dedup_strategies(&device_list_strategies),
        device_id_strategy: args
            .device_id_strategy
            .or(device_id_strategy)
            .or(file.device_id_strategy)
            .unwrap_or(defaults.device_id_strategy),
        cdi_annotation_prefix: args
            .cdi_annotation_prefix
            .clone()
            .filter(|p| !p.is_empty())
            .or_else(|| env.string(ENV_CDI_ANNOTATION_PREFIX))
            .or_else(|| file.cdi_annotation_prefix.clone())
            .unwrap_or(defaults.cdi_annotation_prefix),
        container_driver_root,
        cdi_spec_dir,
        cdi_hook_path,
        cdi_disable_hooks,
        kubelet_socket,
        socket_dir,
        sharing: file.sharing.clone(),
        mps_root,
        health_checks,
        health_addr: args.health_addr.or(health_addr),
        metrics_addr: args.metrics_addr.or(metrics_addr),
        metrics_names: args.metrics_names.or(metrics_names).unwrap_or_default(),
        metrics_collectors: non_empty_path(args.metrics_collectors.clone())
            .or_else(|| env.path(ENV_METRICS_COLLECTORS)),
        pod_resources_socket,
        nvml_library: non_empty_path(args.nvml_lib.clone()).or_else(|| env.path(ENV_NVML_LIB)),
        config_file,
        device_classes,
        imex,
    };
    check_mps(&settings, file.sharing_at.as_ref())?;
    extras::check_imex_transport(&settings.imex, &settings.device_list_strategies)?;
    Ok(settings)
}

/// What MPS needs from the other settings, checked once they are all known (the MIG
/// strategy and the root may come from a flag): a root for the daemons' pipes, and
/// whole GPUs (NVIDIA's plugin refuses `mixed` with MPS as well). MIG devices on the
/// node are refused later, by `resources::build`, which sees the inventory.
fn check_mps(settings: &Settings, at: Option<&FileSpot>) -> Result<(), PluginConfigError> {
    let Some(sharing) = &settings.sharing else {
        return Ok(());
    };
    if sharing.strategy != SharingStrategy::Mps {
        return Ok(());
    }
    let at = at.cloned().unwrap_or_else(|| FileSpot {
        path: settings.config_file.clone().unwrap_or_default(),
        line: 0,
    });
    if settings.mig_strategy == MigStrategy::Mixed {
        return Err(PluginConfigError::MpsMixedMig { at });
    }
    if settings.mps_root.is_none() {
        return Err(PluginConfigError::MpsRootMissing { at });
    }
    Ok(())
}

/// An MPS root given on the command line or in the environment must be absolute: the
/// daemon and the plugin run in different containers.
fn absolute(path: PathBuf, name: &'static str) -> Result<PathBuf, PluginConfigError> {
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(PluginConfigError::MpsRootRelativeArg {
            name,
            value: path.display().to_string(),
        })
    }
}

/// Where our sockets go when not told: beside the kubelet's socket, or kubelet's
/// device-plugin directory when not registering.
fn default_socket_dir(kubelet_socket: Option<&Path>) -> PathBuf {
    match kubelet_socket.and_then(Path::parent) {
        Some(dir) if dir.as_os_str().is_empty() => PathBuf::from("."),
        Some(dir) => dir.to_owned(),
        None => PathBuf::from(DEVICE_PLUGIN_DIR),
    }
}

/// `DP_DISABLE_HEALTHCHECKS` and `DP_ENABLE_HEALTHCHECKS`, as NVIDIA reads them
/// (comma lists, items trimmed, `all` anywhere in the list meaning all), except that a
/// malformed item is an error where NVIDIA logs and skips it.
pub fn health_checks(env: EnvLookup<'_>) -> Result<HealthChecks, PluginConfigError> {
    let mut checks = HealthChecks::default();
    if let Some(value) = env(ENV_DISABLE_HEALTHCHECKS) {
        for item in xid_items(&value) {
            match item {
                "all" | "xids" => checks.disable_all = true,
                _ => {
                    checks.ignored.insert(
                        xid(item, "all, xids").map_err(|e| e.in_env(ENV_DISABLE_HEALTHCHECKS))?,
                    );
                }
            }
        }
    }
    if let Some(value) = env(ENV_ENABLE_HEALTHCHECKS) {
        for item in xid_items(&value) {
            match item {
                "all" => checks.enable_all = true,
                _ => {
                    checks
                        .enabled
                        .insert(xid(item, "all").map_err(|e| e.in_env(ENV_ENABLE_HEALTHCHECKS))?);
                }
            }
        }
    }
    Ok(checks)
}

fn xid_items(value: &str) -> impl Iterator<Item = &str> {
    value
        .split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
}

fn xid(item: &str, keywords: &'static str) -> Result<u64, PluginConfigError> {
    // `u64::from_str` takes a leading `+`; NVIDIA's ParseUint does not.
    if !item.bytes().all(|b| b.is_ascii_digit()) {
        return Err(PluginConfigError::Xid {
            value: item.to_owned(),
            keywords,
        });
    }
    item.parse().map_err(|_| PluginConfigError::Xid {
        value: item.to_owned(),
        keywords,
    })
}

/// NVIDIA's switches for features nvshim does not implement yet: an error rather than
/// a silently ignored request. NVIDIA's plugin also fails at start, whatever
/// `--fail-on-init-error` says, when its flags do not validate.
fn reject_unsupported(args: &PluginArgs, env: &Env<'_>) -> Result<(), PluginConfigError> {
    let env_flags = env.list(ENV_CDI_FEATURE_FLAGS);
    let (origin, flags) = match &args.cdi_feature_flags {
        Some(flags) => ("--cdi-feature-flags", flags.clone()),
        None => (ENV_CDI_FEATURE_FLAGS, env_flags),
    };
    let flags: Vec<String> = flags.into_iter().filter(|f| !f.is_empty()).collect();
    if !flags.is_empty() {
        return Err(PluginConfigError::Unsupported {
            origin: origin.to_owned(),
            value: flags.join(","),
            feature: "NVIDIA's CDI feature flags",
        });
    }
    let env_strategy = env.string(ENV_DEVICE_DISCOVERY_STRATEGY);
    let (origin, strategy) = match &args.device_discovery_strategy {
        Some(strategy) => ("--device-discovery-strategy", Some(strategy.clone())),
        None => (ENV_DEVICE_DISCOVERY_STRATEGY, env_strategy),
    };
    if let Some(strategy) = strategy {
        strategy
            .parse::<DiscoveryStrategy>()
            .map_err(|e| PluginConfigError::from(e).in_env(origin))?;
    }
    let env_policy = env.string(ENV_SHARED_DEVICES_ALLOCATION_POLICY);
    let (origin, policy) = match &args.shared_devices_allocation_policy {
        Some(policy) => ("--shared-devices-allocation-policy", Some(policy.clone())),
        None => (ENV_SHARED_DEVICES_ALLOCATION_POLICY, env_policy),
    };
    match policy.as_deref() {
        None | Some("distributed") => {}
        Some("packed") => {
            return Err(PluginConfigError::Unsupported {
                origin: origin.to_owned(),
                value: "packed".to_owned(),
                feature: "the packed allocation policy",
            });
        }
        Some(other) => {
            return Err(PluginConfigError::Invalid {
                origin: origin.to_owned(),
                value: other.to_owned(),
                valid: "distributed, packed",
            });
        }
    }
    Ok(())
}

/// `--cdi-disable-hooks` / `CDI_DISABLE_HOOKS`: the hooks of NVIDIA's that nvshim's spec
/// can leave out. Its one optional hook is `disable-device-node-modification`; `all`
/// leaves that out too, and keeps `link-driver` (the driver's links and linker cache,
/// NVIDIA's `create-symlinks` and `update-ldcache`), which containers cannot do
/// without, as `nvshim cdi generate --disable-hook all` does.
fn cdi_disable_hooks(args: &PluginArgs, env: &Env<'_>) -> Result<Vec<String>, PluginConfigError> {
    let env_hooks = env.list(ENV_CDI_DISABLE_HOOKS);
    let (origin, hooks) = match &args.cdi_disable_hooks {
        Some(hooks) => ("--cdi-disable-hooks", hooks.clone()),
        None => (ENV_CDI_DISABLE_HOOKS, env_hooks),
    };
    let hooks: Vec<String> = hooks.into_iter().filter(|h| !h.is_empty()).collect();
    for hook in &hooks {
        if hook != DISABLE_DEVICE_NODE_MODIFICATION && hook != ALL_HOOKS {
            return Err(PluginConfigError::Unsupported {
                origin: origin.to_owned(),
                value: hook.clone(),
                feature: "leaving out hooks other than disable-device-node-modification (or all)",
            });
        }
    }
    Ok(hooks)
}

/// Typed reads of env vars; each error names the variable.
pub(super) struct Env<'a>(pub(super) EnvLookup<'a>);

impl Env<'_> {
    fn string(&self, name: &str) -> Option<String> {
        self.0(name).filter(|value| !value.is_empty())
    }

    fn path(&self, name: &str) -> Option<PathBuf> {
        self.string(name).map(PathBuf::from)
    }

    pub(super) fn bool(&self, name: &'static str) -> Result<Option<bool>, PluginConfigError> {
        self.0(name)
            .map(|value| parse_bool(&value).map_err(|e| e.in_env(name)))
            .transpose()
    }

    /// A comma list, items trimmed; unset or empty is no item.
    fn list(&self, name: &str) -> Vec<String> {
        self.string(name)
            .map(|value| {
                value
                    .split(',')
                    .map(|item| item.trim().to_owned())
                    .filter(|item| !item.is_empty())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// A comma list of integers (NVIDIA's `IntSlice`).
    pub(super) fn ints(&self, name: &'static str) -> Result<Option<Vec<i64>>, PluginConfigError> {
        let items = self.list(name);
        if items.is_empty() {
            return Ok(None);
        }
        items
            .into_iter()
            .map(|item| {
                item.parse().map_err(|_| PluginConfigError::Invalid {
                    origin: name.to_owned(),
                    value: item,
                    valid: "comma-separated integers",
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Some)
    }

    fn parsed<T>(&self, name: &'static str) -> Result<Option<T>, PluginConfigError>
    where
        T: std::str::FromStr<Err = K8sConfigError>,
    {
        self.0(name)
            .map(|value| {
                value
                    .parse()
                    .map_err(|e: K8sConfigError| PluginConfigError::from(e).in_env(name))
            })
            .transpose()
    }

    fn strategies(&self) -> Result<Option<Vec<DeviceListStrategy>>, PluginConfigError> {
        let Some(value) = self.0(ENV_DEVICE_LIST_STRATEGY) else {
            return Ok(None);
        };
        if value.trim().is_empty() {
            return Err(K8sConfigError::NoDeviceListStrategy {
                origin: ENV_DEVICE_LIST_STRATEGY.to_owned(),
            }
            .into());
        }
        parse_device_list_strategies(&value)
            .map(Some)
            .map_err(|e| PluginConfigError::from(e).in_env(ENV_DEVICE_LIST_STRATEGY))
    }

    fn listen_address(&self, name: &'static str) -> Result<Option<SocketAddr>, PluginConfigError> {
        self.string(name)
            .map(|value| parse_listen_addr(&value).map_err(|e| e.in_env(name)))
            .transpose()
    }

    fn address(&self, name: &'static str) -> Result<Option<SocketAddr>, PluginConfigError> {
        self.string(name)
            .map(|value| {
                value
                    .parse()
                    .map_err(|source| PluginConfigError::Address { value, source }.in_env(name))
            })
            .transpose()
    }
}

fn non_empty_path(path: Option<PathBuf>) -> Option<PathBuf> {
    path.filter(|p| !p.as_os_str().is_empty())
}

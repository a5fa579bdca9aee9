// SPDX-License-Identifier: Apache-2.0
//! `nvshim install` / `nvshim uninstall` flags, and their resolution into [`Settings`]:
//! flag > environment variable (NVIDIA's installer's names, first set one wins) >
//! default. clap reads one variable per flag, and NVIDIA's installer reads several
//! (`RUNTIME_CONFIG`, `CONTAINERD_CONFIG`, `DOCKER_CONFIG`), so the variables are looked
//! up here, through a lookup the caller passes in (tests pass a table).

use std::path::{Path, PathBuf};

use clap::{Args, ValueEnum};

use super::InstallError;
use crate::cli::configure::{self, EngineKind};
use crate::config::Config;
use crate::request::{KEY_ACCEPT_ENVVAR_UNPRIVILEGED, KEY_ACCEPT_VOLUME_MOUNTS};

/// NVIDIA's toolkit directory (its installer's `--toolkit-install-dir` plus `toolkit`).
pub const DEFAULT_TOOLKIT_DIR: &str = "/usr/local/nvidia/toolkit";
/// The marker NVIDIA's validator writes once the toolkit works; the device plugin's
/// init container waits for it.
pub const DEFAULT_READY_FILE: &str = "/run/nvidia/validations/toolkit-ready";
/// Written by the daemon in its own filesystem once *its* install is done, for the
/// DaemonSet's readiness probe. The host's ready file cannot serve: during a rolling update
/// the old pod's file is still there, so the new pod would be ready before it installed,
/// and the old pod's undo would race the new pod's install (two engine restarts, and a
/// moment with no runtime registered).
pub const POD_READY_FILE: &str = "/run/nvshim-installer.ready";
pub const DOCKER_SOCKET: &str = "/var/run/docker.sock";
pub const CONTAINERD_SOCKET: &str = "/run/containerd/containerd.sock";
pub const CRIO_SOCKET: &str = "/var/run/crio/crio.sock";

/// Environment variables, in the order they are read (NVIDIA's installer's names).
pub const ENV_HOST_ROOT: &[&str] = &["HOST_ROOT_MOUNT", "HOST_ROOT"];
pub const ENV_TOOLKIT_INSTALL_DIR: &[&str] = &["TOOLKIT_INSTALL_DIR", "ROOT"];
pub const ENV_RUNTIME: &[&str] = &["RUNTIME"];
pub const ENV_RUNTIME_NAME: &[&str] = &[
    "NVIDIA_RUNTIME_NAME",
    "CONTAINERD_RUNTIME_CLASS",
    "DOCKER_RUNTIME_NAME",
];
pub const ENV_CONFIG: &[&str] = &["RUNTIME_CONFIG", "CONTAINERD_CONFIG", "DOCKER_CONFIG"];
pub const ENV_DROP_IN: &[&str] = &["RUNTIME_DROP_IN_CONFIG_HOST_PATH", "RUNTIME_DROP_IN_CONFIG"];
pub const ENV_SOCKET: &[&str] = &["RUNTIME_SOCKET", "CONTAINERD_SOCKET", "DOCKER_SOCKET"];
pub const ENV_RESTART_MODE: &[&str] = &["RUNTIME_RESTART_MODE", "RESTART_MODE"];
pub const ENV_SET_AS_DEFAULT: &[&str] = &[
    "NVIDIA_RUNTIME_SET_AS_DEFAULT",
    "CONTAINERD_SET_AS_DEFAULT",
    "DOCKER_SET_AS_DEFAULT",
];
pub const ENV_CDI: &[&str] = &["CDI_ENABLED", "RUNTIME_ENABLE_CDI"];
pub const ENV_DRIVER_ROOT: &[&str] = &["NVIDIA_DRIVER_ROOT", "DRIVER_ROOT"];
pub const ENV_DEV_ROOT: &[&str] = &["NVIDIA_DEV_ROOT", "DEV_ROOT"];
pub const ENV_NO_DAEMON: &[&str] = &["NO_DAEMON"];
pub const ENV_SOURCE_DIR: &[&str] = &["NVSHIM_SOURCE_DIR"];
pub const ENV_READY_FILE: &[&str] = &["TOOLKIT_READY_FILE"];
pub const ENV_ACCEPT_ENVVAR_UNPRIVILEGED: &[&str] =
    &["ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED"];
pub const ENV_ACCEPT_VOLUME_MOUNTS: &[&str] = &["ACCEPT_NVIDIA_VISIBLE_DEVICES_AS_VOLUME_MOUNTS"];
pub const ENV_CRIO_CONFIG_MODE: &[&str] = &["CRIO_CONFIG_MODE"];
pub const ENV_CRIO_HOOKS_DIR: &[&str] = &["CRIO_HOOKS_DIR"];
pub const ENV_CRIO_HOOK_FILENAME: &[&str] = &["CRIO_HOOK_FILENAME"];
/// NVIDIA's installer's CRI-O hook file, with `--config-mode hook`.
pub const DEFAULT_CRIO_HOOKS_DIR: &str = "/usr/share/containers/oci/hooks.d";
pub const DEFAULT_CRIO_HOOK_FILENAME: &str = "oci-nvidia-hook.json";

/// How the engine is made to read its new config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RestartMode {
    /// SIGHUP to the process serving the engine's socket (docker reloads its runtimes;
    /// containerd, as with NVIDIA's installer, is left to its service manager).
    Signal,
    /// `systemctl restart <engine>` on the host (chrooted into the host root).
    Systemd,
    /// Leave the engine alone.
    None,
}

/// The engine flag's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum RuntimeKind {
    Docker,
    Containerd,
    Crio,
}

impl From<RuntimeKind> for EngineKind {
    fn from(kind: RuntimeKind) -> Self {
        match kind {
            RuntimeKind::Docker => EngineKind::Docker,
            RuntimeKind::Containerd => EngineKind::Containerd,
            RuntimeKind::Crio => EngineKind::Crio,
        }
    }
}

/// Where the host is and where the toolkit goes: shared by install and uninstall.
#[derive(Debug, Clone, Args)]
pub struct PlaceArgs {
    /// Where the host's `/` is mounted in this container (every other path is a host path).
    #[arg(long, value_name = "DIR")]
    pub host_root: Option<PathBuf>,
    /// The toolkit directory on the host.
    #[arg(long, value_name = "DIR")]
    pub toolkit_dir: Option<PathBuf>,
    /// NVIDIA's name: the toolkit goes to `<DIR>/toolkit` (used when --toolkit-dir is not given).
    #[arg(long, value_name = "DIR", alias = "root")]
    pub toolkit_install_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    #[command(flatten)]
    pub place: PlaceArgs,
    /// The container engine to configure.
    #[arg(long, short = 'r', value_enum)]
    pub runtime: Option<RuntimeKind>,
    /// The name the engine knows the runtime by.
    #[arg(long, value_name = "NAME", aliases = ["nvidia-runtime-name", "runtime-class"])]
    pub runtime_name: Option<String>,
    /// The engine's config file on the host.
    #[arg(long, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// The drop-in file on the host (containerd, CRI-O); an empty value edits --config.
    #[arg(long, value_name = "PATH")]
    pub drop_in_config: Option<String>,
    /// The engine's socket on the host (for --restart-mode signal).
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
    /// How to make the engine read its new config.
    #[arg(long, value_enum)]
    pub restart_mode: Option<RestartMode>,
    /// Make the runtime the engine's default.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub set_as_default: Option<String>,
    /// Switch on the engine's CDI support.
    #[arg(long, alias = "enable-cdi-in-runtime", num_args = 0..=1,
          default_missing_value = "true", value_name = "BOOL")]
    pub cdi_enabled: Option<String>,
    /// Where the binaries to install are (default: the directory of this executable).
    #[arg(long, value_name = "DIR")]
    pub source_dir: Option<PathBuf>,
    /// The readiness marker on the host, written once the engine runs the new config.
    #[arg(long, value_name = "PATH")]
    pub ready_file: Option<PathBuf>,
    /// Install and exit instead of waiting for SIGTERM to undo the install.
    #[arg(long, short = 'n', num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub no_daemon: Option<String>,
    /// Written to config.toml's key of the same name: whether `NVIDIA_VISIBLE_DEVICES`
    /// requests count for containers without `CAP_SYS_ADMIN`.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub accept_nvidia_visible_devices_envvar_when_unprivileged: Option<String>,
    /// Written to config.toml's key of the same name: whether `/dev/null` mounts under
    /// `/var/run/nvidia-container-devices` request devices.
    #[arg(long, num_args = 0..=1, default_missing_value = "true", value_name = "BOOL")]
    pub accept_nvidia_visible_devices_as_volume_mounts: Option<String>,
    /// CRI-O: `config` registers the runtime in CRI-O's config; `hook` writes the OCI
    /// prestart hook file into --hooks-dir instead (NVIDIA's deprecated mode).
    #[arg(long, value_name = "MODE")]
    pub config_mode: Option<String>,
    /// CRI-O's hooks directory on the host (with --config-mode hook).
    #[arg(long, value_name = "DIR")]
    pub hooks_dir: Option<PathBuf>,
    /// The hook file's name in --hooks-dir.
    #[arg(long, value_name = "NAME")]
    pub hook_filename: Option<String>,
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    #[command(flatten)]
    pub place: PlaceArgs,
    /// Override the restart mode the install recorded.
    #[arg(long, value_enum)]
    pub restart_mode: Option<RestartMode>,
    /// Override the engine socket the install recorded.
    #[arg(long, value_name = "PATH")]
    pub socket: Option<PathBuf>,
}

/// Where: the host root and the toolkit directory (a host path).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    pub host_root: PathBuf,
    pub toolkit_dir: PathBuf,
}

impl Place {
    /// A host path as seen from here.
    pub fn host(&self, path: &Path) -> PathBuf {
        configure::under_root(&self.host_root, path)
    }
}

/// Everything an install needs, resolved once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub place: Place,
    pub engine: EngineKind,
    pub runtime_name: String,
    /// Host paths.
    pub config: PathBuf,
    pub drop_in: Option<PathBuf>,
    pub socket: PathBuf,
    pub restart: RestartMode,
    pub set_as_default: bool,
    pub cdi: bool,
    /// Host paths written into config.toml.
    pub driver_root: PathBuf,
    pub dev_root: Option<PathBuf>,
    /// A path here (in the installer's container), not a host path.
    pub source_dir: PathBuf,
    pub ready_file: PathBuf,
    pub daemon: bool,
    /// config.toml's `accept-nvidia-visible-devices-envvar-when-unprivileged`.
    pub accept_envvar_unprivileged: bool,
    /// config.toml's `accept-nvidia-visible-devices-as-volume-mounts`.
    pub accept_volume_mounts: bool,
    /// CRI-O with `--config-mode hook`: the hook file (a host path) written instead of
    /// registering the runtime in the engine's config.
    pub oci_hook: Option<PathBuf>,
}

/// The first non-empty variable of `names`, with its name.
fn first_env(
    env: &dyn Fn(&str) -> Option<String>,
    names: &[&'static str],
) -> Option<(&'static str, String)> {
    names
        .iter()
        .find_map(|n| env(n).filter(|v| !v.is_empty()).map(|v| (*n, v)))
}

/// A boolean as a flag value or variable: `true`/`false`, `1`/`0`, `yes`/`no`.
fn boolean(what: &str, value: &str) -> Result<bool, InstallError> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "1" | "yes" | "on" => Ok(true),
        "false" | "0" | "no" | "off" => Ok(false),
        _ => Err(InstallError::BadValue {
            what: what.to_owned(),
            value: value.to_owned(),
            valid: "true, false, 1, 0, yes, no",
        }),
    }
}

fn flag_or_env_bool(
    env: &dyn Fn(&str) -> Option<String>,
    flag: Option<&str>,
    flag_name: &str,
    names: &[&'static str],
    default: bool,
) -> Result<bool, InstallError> {
    match (flag, first_env(env, names)) {
        (Some(v), _) => boolean(&format!("--{flag_name}"), v),
        (None, Some((name, v))) => boolean(name, &v),
        (None, None) => Ok(default),
    }
}

fn absolute(what: &str, path: PathBuf) -> Result<PathBuf, InstallError> {
    if path.is_absolute() {
        Ok(path)
    } else {
        Err(InstallError::NotAbsolute {
            what: what.to_owned(),
            path,
        })
    }
}

fn path_of(
    env: &dyn Fn(&str) -> Option<String>,
    flag: Option<&PathBuf>,
    names: &[&'static str],
) -> Option<PathBuf> {
    flag.cloned()
        .or_else(|| first_env(env, names).map(|(_, v)| PathBuf::from(v)))
}

impl PlaceArgs {
    pub fn resolve(&self, env: &dyn Fn(&str) -> Option<String>) -> Result<Place, InstallError> {
        let host_root = path_of(env, self.host_root.as_ref(), ENV_HOST_ROOT)
            .unwrap_or_else(|| PathBuf::from("/"));
        let host_root = absolute("--host-root", host_root)?;
        if !host_root.is_dir() {
            return Err(InstallError::HostRoot { path: host_root });
        }
        let toolkit_dir = match (
            &self.toolkit_dir,
            path_of(
                env,
                self.toolkit_install_dir.as_ref(),
                ENV_TOOLKIT_INSTALL_DIR,
            ),
        ) {
            (Some(dir), _) => dir.clone(),
            (None, Some(parent)) => parent.join("toolkit"),
            (None, None) => PathBuf::from(DEFAULT_TOOLKIT_DIR),
        };
        let toolkit_dir = absolute("--toolkit-dir", toolkit_dir)?;
        if toolkit_dir == Path::new("/") {
            return Err(InstallError::BadValue {
                what: "--toolkit-dir".to_owned(),
                value: "/".to_owned(),
                valid: "a directory of its own, like /usr/local/nvidia/toolkit",
            });
        }
        Ok(Place {
            host_root,
            toolkit_dir,
        })
    }
}

impl InstallArgs {
    /// Flags over variables over defaults. `driver_root`/`dev_root` are the global
    /// `--driver-root`/`--dev-root` (already holding `NVIDIA_DRIVER_ROOT`/`NVIDIA_DEV_ROOT`);
    /// `exe_dir` is the default source directory.
    pub fn resolve(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        driver_root: Option<&PathBuf>,
        dev_root: Option<&PathBuf>,
        exe_dir: &Path,
    ) -> Result<Settings, InstallError> {
        let place = self.place.resolve(env)?;
        let engine: EngineKind = match (self.runtime, first_env(env, ENV_RUNTIME)) {
            (Some(kind), _) => kind.into(),
            (None, Some((name, value))) => match RuntimeKind::from_str(&value, true) {
                Ok(kind) => kind.into(),
                Err(_) => {
                    return Err(InstallError::BadValue {
                        what: name.to_owned(),
                        value,
                        valid: "docker, containerd, crio",
                    });
                }
            },
            (None, None) => return Err(InstallError::NoRuntime),
        };
        let runtime_name = self
            .runtime_name
            .clone()
            .or_else(|| first_env(env, ENV_RUNTIME_NAME).map(|(_, v)| v))
            .unwrap_or_else(|| configure::DEFAULT_RUNTIME_NAME.to_owned());
        if runtime_name.is_empty()
            || !runtime_name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(InstallError::BadValue {
                what: "--runtime-name".to_owned(),
                value: runtime_name,
                valid: "a non-empty name of letters, digits, '-', '_', '.'",
            });
        }
        let config = path_of(env, self.config.as_ref(), ENV_CONFIG).unwrap_or_else(|| {
            PathBuf::from(match engine {
                EngineKind::Docker => configure::DOCKER_CONFIG,
                EngineKind::Containerd => configure::CONTAINERD_CONFIG,
                EngineKind::Crio => configure::CRIO_CONFIG,
            })
        });
        let config = absolute("--config", config)?;
        // An empty value (flag or variable) means no drop-in, as with NVIDIA's installer,
        // so the variables are read set-or-not here, not non-empty.
        let drop_in_given = self
            .drop_in_config
            .as_ref()
            .map(PathBuf::from)
            .or_else(|| ENV_DROP_IN.iter().find_map(|n| env(n)).map(PathBuf::from));
        let drop_in = match (drop_in_given, engine) {
            (Some(d), _) if d.as_os_str().is_empty() => None,
            (None, EngineKind::Docker) => None,
            (Some(d), EngineKind::Docker) => {
                return Err(InstallError::BadValue {
                    what: "--drop-in-config".to_owned(),
                    value: d.display().to_string(),
                    valid: "nothing for docker, which has one config file",
                });
            }
            (None, EngineKind::Containerd) => Some(PathBuf::from(configure::CONTAINERD_DROP_IN)),
            (None, EngineKind::Crio) => Some(PathBuf::from(configure::CRIO_DROP_IN)),
            (Some(d), _) => Some(absolute("--drop-in-config", d)?),
        };
        let socket = path_of(env, self.socket.as_ref(), ENV_SOCKET).unwrap_or_else(|| {
            PathBuf::from(match engine {
                EngineKind::Docker => DOCKER_SOCKET,
                EngineKind::Containerd => CONTAINERD_SOCKET,
                EngineKind::Crio => CRIO_SOCKET,
            })
        });
        let socket = absolute("--socket", socket)?;
        let restart = match (self.restart_mode, first_env(env, ENV_RESTART_MODE)) {
            (Some(mode), _) => mode,
            (None, Some((name, value))) => {
                RestartMode::from_str(&value, true).map_err(|_| InstallError::BadValue {
                    what: name.to_owned(),
                    value,
                    valid: "signal, systemd, none",
                })?
            }
            // NVIDIA's per-engine defaults: CRI-O does not reload runtimes on a signal.
            (None, None) => match engine {
                EngineKind::Crio => RestartMode::Systemd,
                _ => RestartMode::Signal,
            },
        };
        let oci_hook = self.oci_hook(env, engine)?;
        if restart == RestartMode::Signal && engine == EngineKind::Crio {
            return Err(InstallError::BadValue {
                what: "--restart-mode".to_owned(),
                value: "signal".to_owned(),
                valid: "systemd or none for CRI-O, which takes neither a new runtime nor a new hook on a signal",
            });
        }
        let set_as_default = flag_or_env_bool(
            env,
            self.set_as_default.as_deref(),
            "set-as-default",
            ENV_SET_AS_DEFAULT,
            false,
        )?;
        let cdi = flag_or_env_bool(
            env,
            self.cdi_enabled.as_deref(),
            "cdi-enabled",
            ENV_CDI,
            false,
        )?;
        let daemon = !flag_or_env_bool(
            env,
            self.no_daemon.as_deref(),
            "no-daemon",
            ENV_NO_DAEMON,
            false,
        )?;
        // NVIDIA's installer names these flags after the config.toml keys they set, and
        // always writes both keys; unset, they keep config.toml's defaults.
        let defaults = Config::default();
        let accept_envvar_unprivileged = flag_or_env_bool(
            env,
            self.accept_nvidia_visible_devices_envvar_when_unprivileged
                .as_deref(),
            KEY_ACCEPT_ENVVAR_UNPRIVILEGED,
            ENV_ACCEPT_ENVVAR_UNPRIVILEGED,
            defaults.accept_nvidia_visible_devices_envvar_when_unprivileged,
        )?;
        let accept_volume_mounts = flag_or_env_bool(
            env,
            self.accept_nvidia_visible_devices_as_volume_mounts
                .as_deref(),
            KEY_ACCEPT_VOLUME_MOUNTS,
            ENV_ACCEPT_VOLUME_MOUNTS,
            defaults.accept_nvidia_visible_devices_as_volume_mounts,
        )?;
        let driver_root = driver_root
            .cloned()
            .or_else(|| first_env(env, ENV_DRIVER_ROOT).map(|(_, v)| PathBuf::from(v)))
            .unwrap_or_else(|| PathBuf::from("/"));
        let driver_root = absolute("--driver-root", driver_root)?;
        let dev_root = dev_root
            .cloned()
            .or_else(|| first_env(env, ENV_DEV_ROOT).map(|(_, v)| PathBuf::from(v)));
        let dev_root = dev_root.map(|d| absolute("--dev-root", d)).transpose()?;
        let source_dir = path_of(env, self.source_dir.as_ref(), ENV_SOURCE_DIR)
            .unwrap_or_else(|| exe_dir.to_path_buf());
        let ready_file = path_of(env, self.ready_file.as_ref(), ENV_READY_FILE)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_READY_FILE));
        let ready_file = absolute("--ready-file", ready_file)?;
        Ok(Settings {
            place,
            engine,
            runtime_name,
            config,
            drop_in,
            socket,
            restart,
            set_as_default,
            cdi,
            driver_root,
            dev_root,
            source_dir,
            ready_file,
            daemon,
            accept_envvar_unprivileged,
            accept_volume_mounts,
            oci_hook,
        })
    }

    /// With `--config-mode hook` (CRI-O only, as NVIDIA's installer has it), the hook file:
    /// `--hooks-dir` joined with `--hook-filename`.
    fn oci_hook(
        &self,
        env: &dyn Fn(&str) -> Option<String>,
        engine: EngineKind,
    ) -> Result<Option<PathBuf>, InstallError> {
        let mode = match (
            self.config_mode.clone(),
            first_env(env, ENV_CRIO_CONFIG_MODE),
        ) {
            (Some(v), _) => Some(("--config-mode", v)),
            (None, given) => given,
        };
        match mode {
            None => return Ok(None),
            Some((_, v)) if v == "config" => return Ok(None),
            Some((_, v)) if v == "hook" && engine == EngineKind::Crio => {}
            Some((what, value)) if value == "hook" => {
                return Err(InstallError::BadValue {
                    what: what.to_owned(),
                    value,
                    valid: "config for docker and containerd (the hook mode is CRI-O's)",
                });
            }
            Some((what, value)) => {
                return Err(InstallError::BadValue {
                    what: what.to_owned(),
                    value,
                    valid: "config, hook",
                });
            }
        }
        let dir = path_of(env, self.hooks_dir.as_ref(), ENV_CRIO_HOOKS_DIR)
            .unwrap_or_else(|| PathBuf::from(DEFAULT_CRIO_HOOKS_DIR));
        let dir = absolute("--hooks-dir", dir)?;
        let name = self
            .hook_filename
            .clone()
            .or_else(|| first_env(env, ENV_CRIO_HOOK_FILENAME).map(|(_, v)| v))
            .unwrap_or_else(|| DEFAULT_CRIO_HOOK_FILENAME.to_owned());
        if name.is_empty() || name.contains('/') || name == "." || name == ".." {
            return Err(InstallError::BadValue {
                what: "--hook-filename".to_owned(),
                value: name,
                valid: "a file name (no '/'), like oci-nvidia-hook.json",
            });
        }
        Ok(Some(dir.join(name)))
    }
}

//! `/etc/nvidia-container-runtime/config.toml`, typed: NVIDIA's keys, NVIDIA's defaults.
//!
//! Every front end reads this file once at start ([`load`]) and hands each stage the
//! slice it needs; the resulting [`Config`] is never mutated afterwards. Precedence is
//! flag > env > file > default: this module supplies the last two, the front ends
//! layer flags and env on top. The module reads no environment of its own (the lookups
//! are passed in), never logs, and never falls back to defaults on a file it cannot
//! parse: a bad file is a [`ConfigError`] carrying the path, line, column and key.
//!
//! # Where the file is
//! `$NVIDIA_CTK_CONFIG_FILE_PATH` if set and non-empty, else
//! `$XDG_CONFIG_HOME/nvidia-container-runtime/config.toml` if that is set and
//! non-empty, else `/etc/nvidia-container-runtime/config.toml` ([`locate`]), as in
//! NVIDIA's toolkit. A missing file at the XDG or `/etc` location means the defaults,
//! as in NVIDIA's runtime; a missing file named by `NVIDIA_CTK_CONFIG_FILE_PATH` is an
//! error, as in NVIDIA's hook, which loads a file named that way as required.
//!
//! The runtime and the hook ([`load_installed`]) look in one more place, between the
//! variables and `/etc`: `.config/nvidia-container-runtime/config.toml` in the directory
//! of the path they were started as (`argv[0]`, when absolute), which is where
//! `nvshim install` puts the file beside the binaries (NVIDIA's installer sets
//! `XDG_CONFIG_HOME` in wrapper scripts for the same effect; we need no wrapper). For a
//! package install that costs one failed `open` (`/usr/bin/.config/…`).
//!
//! # Unknown keys
//! NVIDIA's loader ignores keys it does not know, and configs written for other
//! toolkit versions carry keys we do not support. So an unknown key is not an error:
//! [`parse`] returns it as a dotted path (`nvidia-container-runtime.experimental`; a
//! key that is not a bare TOML key is quoted) for the binary to log as a warning, and
//! the rest of the file still applies. Known keys are strict: a wrong type or an enum
//! value outside the valid set is an error.
//!
//! # Checks beyond the types
//! - `supported-driver-capabilities` must parse as a capability list
//!   ([`DriverCapabilities`]); NVIDIA's hook panics on an unknown one instead.
//! - `nvidia-container-cli.ldconfig` must be a host path (`@/sbin/ldconfig`) unless
//!   `features.allow-ldconfig-from-container` is set; NVIDIA rejects the file the same
//!   way, because running an ldconfig from the image is CVE-2024-0136/0137's surface.
//!
//! # Keys of our own (NVIDIA's tools ignore them)
//! - `[nvshim] proc-root` (default `/`): the directory holding `proc/driver/nvidia`.
//! - `[nvshim] systemd-root` (default `/`): the directory holding `run/systemd`, where
//!   the prestart hook writes its device grants as scope drop-ins (`hook::systemd_scope`).
//! - `[nvshim] nvml-timeout` (default 10, in seconds; 0 waits forever): how long the
//!   runtime's NVML path may take to list the GPUs before the `create` fails.
//! - `[nvidia-container-cli] dev-root` (default: unset, meaning the driver root): where
//!   the device nodes are, for a driver container that does not carry `/dev`. NVIDIA's
//!   runtime uses `root` for both.
//!
//! # Where our defaults differ from NVIDIA's
//! - `nvidia-container-runtime.runtimes` is `["docker-runc", "runc", "crun"]`, where
//!   NVIDIA has had `["runc", "crun"]` since it dropped `docker-runc`: a host that
//!   still ships docker's renamed runc keeps working, and elsewhere the first entry
//!   simply does not exist and the next one is used.
//! - `nvidia-container-cli.ldconfig` is always `@/sbin/ldconfig`; NVIDIA rewrites it to
//!   `@/sbin/ldconfig.real` when that file exists, which we leave to the code that runs
//!   ldconfig (a default should not depend on the host it is computed on).
//! - `nvidia-container-cli.user` is always empty; NVIDIA makes it `root:video` on SUSE.
//!
//! NVIDIA's `nvidia-ctk config default` prints empty defaults as commented-out examples;
//! parsing that output gives exactly [`Config::default`] apart from `runtimes` (see
//! `tests/fixtures/config-toml/nvidia-default.toml`).

mod location;
mod sections;
mod values;

#[cfg(test)]
mod error_tests;
#[cfg(test)]
mod load_tests;
#[cfg(test)]
mod shipped_tests;
#[cfg(test)]
mod tests;

use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use toml::de::DeTable;

use crate::request::{DriverCapabilities, Quoted, RequestError};
use location::{dotted, key_at, line_column, value_span};

pub use location::Location;
pub use sections::{
    CdiMode, CliConfig, CsvMode, CtkConfig, Features, HookConfig, JitCdiMode, LegacyMode, Modes,
    NvshimConfig, RuntimeConfig,
};
pub use values::{CudaCompatMode, DriverMounts, LogLevel, Mode, UnknownValue};

/// Names the config file, overriding every other location.
pub const ENV_CONFIG_FILE_PATH: &str = "NVIDIA_CTK_CONFIG_FILE_PATH";
/// Replaces `/etc` as the directory the config file is looked up under.
pub const ENV_XDG_CONFIG_HOME: &str = "XDG_CONFIG_HOME";
/// The config file's path under `/etc` or `$XDG_CONFIG_HOME`.
pub const RELATIVE_PATH: &str = "nvidia-container-runtime/config.toml";
/// The config file when neither variable is set.
pub const DEFAULT_PATH: &str = "/etc/nvidia-container-runtime/config.toml";

/// The whole config file. Field names are NVIDIA's keys (`kebab-case` in the file).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct Config {
    /// Skip the `NVIDIA_REQUIRE_*` checks for every container.
    pub disable_require: bool,
    /// Comma-separated env var names that take precedence over
    /// `NVIDIA_VISIBLE_DEVICES` (Docker Swarm generic resources); empty for none.
    pub swarm_resource: String,
    /// Whether env-var device requests count for containers without `CAP_SYS_ADMIN`.
    pub accept_nvidia_visible_devices_envvar_when_unprivileged: bool,
    /// Whether device requests may come as `/dev/null` mounts under
    /// `/var/run/nvidia-container-devices/`.
    pub accept_nvidia_visible_devices_as_volume_mounts: bool,
    /// The capabilities a container may get, as NVIDIA's comma list (or `all`); read
    /// it through [`Config::supported_capabilities`].
    pub supported_driver_capabilities: String,
    pub nvidia_container_cli: CliConfig,
    pub nvidia_container_runtime: RuntimeConfig,
    pub nvidia_container_runtime_hook: HookConfig,
    pub nvidia_ctk: CtkConfig,
    pub features: Features,
    /// Our own table; NVIDIA's tools ignore it.
    pub nvshim: NvshimConfig,
}

impl Default for Config {
    /// NVIDIA's defaults (`nvidia-ctk config default`), apart from the differences the
    /// module doc lists, plus ours. Every table's `Default` comes from here.
    fn default() -> Self {
        Self {
            disable_require: false,
            swarm_resource: String::new(),
            accept_nvidia_visible_devices_envvar_when_unprivileged: true,
            accept_nvidia_visible_devices_as_volume_mounts: false,
            supported_driver_capabilities: "compat32,compute,display,graphics,ngx,utility,video"
                .to_owned(),
            nvidia_container_cli: CliConfig {
                root: PathBuf::new(),
                path: PathBuf::new(),
                environment: Vec::new(),
                debug: PathBuf::new(),
                ldcache: PathBuf::new(),
                load_kmods: true,
                no_pivot: false,
                no_cgroups: false,
                user: String::new(),
                ldconfig: "@/sbin/ldconfig".to_owned(),
                dev_root: None,
            },
            nvidia_container_runtime: RuntimeConfig {
                debug: PathBuf::from("/dev/null"),
                log_level: LogLevel::Info,
                runtimes: vec![
                    "docker-runc".to_owned(),
                    "runc".to_owned(),
                    "crun".to_owned(),
                ],
                mode: Mode::Auto,
                modes: Modes {
                    cdi: CdiMode {
                        spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
                        default_kind: "nvidia.com/gpu".to_owned(),
                        annotation_prefixes: vec!["cdi.k8s.io/".to_owned()],
                    },
                    csv: CsvMode {
                        mount_spec_path: PathBuf::from(
                            "/etc/nvidia-container-runtime/host-files-for-container.d",
                        ),
                        compat_container_root: PathBuf::new(),
                    },
                    jit_cdi: JitCdiMode {
                        nvcdi_feature_flags: Vec::new(),
                        nvcdi_disable_hooks: Vec::new(),
                    },
                    legacy: LegacyMode {
                        cuda_compat_mode: CudaCompatMode::Ldconfig,
                    },
                },
            },
            nvidia_container_runtime_hook: HookConfig {
                path: PathBuf::from("nvidia-container-runtime-hook"),
                skip_mode_detection: false,
            },
            nvidia_ctk: CtkConfig {
                path: PathBuf::from("nvidia-ctk"),
            },
            features: Features {
                allow_cuda_compat_libs_from_container: false,
                allow_ldconfig_from_container: false,
                allow_unknown_oci_spec_fields: false,
                disable_cuda_compat_lib_hook: false,
                disable_imex_channel_creation: false,
                ignore_imex_channel_requests: false,
                no_additional_gids_for_device_nodes: false,
            },
            nvshim: NvshimConfig {
                proc_root: PathBuf::from("/"),
                systemd_root: PathBuf::from("/"),
                nvml_timeout: 10,
                driver_mounts: DriverMounts::Staged,
                driver_stage_dir: PathBuf::from("/run/nvshim/driver-stage"),
            },
        }
    }
}

impl Config {
    /// The driver root: `nvidia-container-cli.root`, where empty means `/`.
    pub fn driver_root(&self) -> PathBuf {
        non_empty(&self.nvidia_container_cli.root).unwrap_or_else(|| PathBuf::from("/"))
    }

    /// The dev root: `nvidia-container-cli.dev-root` if set and non-empty, else the
    /// driver root (what NVIDIA's runtime uses for both).
    pub fn dev_root(&self) -> PathBuf {
        self.nvidia_container_cli
            .dev_root
            .as_deref()
            .and_then(non_empty)
            .unwrap_or_else(|| self.driver_root())
    }

    /// `supported-driver-capabilities`, parsed. Unlike `NVIDIA_DRIVER_CAPABILITIES`, an
    /// empty value here means no capabilities at all, as in NVIDIA's hook.
    pub fn supported_capabilities(&self) -> Result<DriverCapabilities, ConfigError> {
        if self.supported_driver_capabilities.trim().is_empty() {
            return Ok(DriverCapabilities::EMPTY);
        }
        self.supported_driver_capabilities
            .parse()
            .map_err(ConfigError::Capabilities)
    }
}

fn non_empty(path: &Path) -> Option<PathBuf> {
    (!path.as_os_str().is_empty()).then(|| path.to_path_buf())
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "config file {} named by {ENV_CONFIG_FILE_PATH} does not exist",
        path.display()
    )]
    Missing { path: PathBuf },
    #[error("{at}: invalid TOML: {message}")]
    Syntax { at: Location, message: String },
    /// A known key with a value of the wrong type or outside its valid set. `key` is
    /// the dotted path, or `(top level)` if the value is not under one key.
    #[error("{at}: {key}: {message}")]
    Value {
        at: Location,
        key: String,
        message: String,
    },
    #[error("invalid supported-driver-capabilities")]
    Capabilities(#[source] RequestError),
}

/// A config as loaded by [`load`].
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub config: Config,
    /// The file read, or the one that would have been read.
    pub path: PathBuf,
    /// False when the file did not exist and the defaults apply.
    pub from_file: bool,
    /// Dotted paths of the keys we do not know (a whole unknown table is one entry),
    /// for the caller to log as warnings.
    pub unknown_keys: Vec<String>,
}

/// Where the config file is, given the environment lookups (see the module doc).
pub fn locate(env: impl Fn(&str) -> Option<String>) -> PathBuf {
    let set = |name| env(name).filter(|v: &String| !v.is_empty());
    if let Some(path) = set(ENV_CONFIG_FILE_PATH) {
        return PathBuf::from(path);
    }
    match set(ENV_XDG_CONFIG_HOME) {
        Some(dir) => Path::new(&dir).join(RELATIVE_PATH),
        None => PathBuf::from(DEFAULT_PATH),
    }
}

/// The directory, beside a binary, that holds `nvidia-container-runtime/config.toml`
/// for [`load_installed`].
pub const BESIDE_DIR: &str = ".config";

/// `<dir of argv0>/.config/nvidia-container-runtime/config.toml`, for an absolute
/// `argv0` (an engine starts the runtime by the path it was configured with).
pub fn beside(argv0: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let path = Path::new(argv0?);
    if !path.is_absolute() {
        return None;
    }
    Some(path.parent()?.join(BESIDE_DIR).join(RELATIVE_PATH))
}

/// [`load`] for the runtime and the hook: `NVIDIA_CTK_CONFIG_FILE_PATH`, then
/// `XDG_CONFIG_HOME`, then the file [`beside`] `argv0` if it exists, then `/etc`. An
/// `argv0` that is only a name (an OCI hook file's `args[0]`, `nvidia-container-runtime-hook`)
/// says nothing of where the binary is: the running executable's own path stands in for it
/// (in a toolkit directory `versions/<id>/.config` leads to the toolkit's config).
pub fn load_installed(
    env: impl Fn(&str) -> Option<String>,
    argv0: Option<&std::ffi::OsStr>,
) -> Result<Loaded, ConfigError> {
    load_installed_from(env, argv0, || std::env::current_exe().ok())
}

/// [`load_installed`] with the executable's path from `exe` (asked only when `argv0` is not
/// absolute).
pub fn load_installed_from(
    env: impl Fn(&str) -> Option<String>,
    argv0: Option<&std::ffi::OsStr>,
    exe: impl FnOnce() -> Option<PathBuf>,
) -> Result<Loaded, ConfigError> {
    let set = |name| env(name).is_some_and(|v: String| !v.is_empty());
    if set(ENV_CONFIG_FILE_PATH) || set(ENV_XDG_CONFIG_HOME) {
        return load(env);
    }
    let absolute = argv0.is_some_and(|a| Path::new(a).is_absolute());
    let path = if absolute {
        beside(argv0)
    } else {
        exe().and_then(|e| beside(Some(e.as_os_str())))
    };
    let Some(path) = path else {
        return load(env);
    };
    match crate::files::read_to_string(&path) {
        Ok(text) => parsed(&text, path),
        Err(e) if e.kind() == io::ErrorKind::NotFound => load(env),
        Err(source) => Err(ConfigError::Read { path, source }),
    }
}

/// The config read from `path` (its text).
fn parsed(text: &str, path: PathBuf) -> Result<Loaded, ConfigError> {
    let (config, unknown_keys) = parse(text, &path)?;
    Ok(Loaded {
        config,
        path,
        from_file: true,
        unknown_keys,
    })
}

/// Finds ([`locate`]), reads and parses the config file. A missing file means the
/// defaults, unless `NVIDIA_CTK_CONFIG_FILE_PATH` named it.
pub fn load(env: impl Fn(&str) -> Option<String>) -> Result<Loaded, ConfigError> {
    let named = env(ENV_CONFIG_FILE_PATH).is_some_and(|v| !v.is_empty());
    let path = locate(&env);
    match crate::files::read_to_string(&path) {
        Ok(text) => parsed(&text, path),
        Err(e) if e.kind() == io::ErrorKind::NotFound && named => {
            Err(ConfigError::Missing { path })
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Loaded {
            config: Config::default(),
            path,
            from_file: false,
            unknown_keys: Vec::new(),
        }),
        Err(source) => Err(ConfigError::Read { path, source }),
    }
}

/// Parses config text; `path` is only used in errors. Returns the config and the dotted
/// paths of the keys it does not know. Pure.
pub fn parse(text: &str, path: &Path) -> Result<(Config, Vec<String>), ConfigError> {
    let at = |span: Option<Range<usize>>| {
        let (line, column) = span.map_or((0, 0), |s| line_column(text, s.start));
        Location {
            path: path.to_path_buf(),
            line,
            column,
        }
    };

    let doc = DeTable::parse(text).map_err(|e| ConfigError::Syntax {
        at: at(e.span()),
        message: e.message().trim().to_owned(),
    })?;

    let mut unknown_keys = Vec::new();
    let config: Config =
        serde_ignored::deserialize(toml::de::Deserializer::from(doc.clone()), |ignored| {
            unknown_keys.push(dotted(&ignored))
        })
        .map_err(|e| {
            let key = e.span().and_then(|s| key_at(doc.get_ref(), s.start));
            ConfigError::Value {
                at: at(e.span()),
                key: key.unwrap_or_else(|| "(top level)".to_owned()),
                message: e.message().trim().to_owned(),
            }
        })?;

    let invalid = |keys: &[&str], message: String| ConfigError::Value {
        at: at(value_span(doc.get_ref(), keys)),
        key: keys.join("."),
        message,
    };
    if let Err(ConfigError::Capabilities(e)) = config.supported_capabilities() {
        return Err(invalid(&["supported-driver-capabilities"], e.to_string()));
    }
    let cli = &config.nvidia_container_cli;
    if !cli.ldconfig.starts_with('@') && !config.features.allow_ldconfig_from_container {
        return Err(invalid(
            &["nvidia-container-cli", "ldconfig"],
            format!(
                "{} is not a host path (no leading '@'); an ldconfig inside the container \
                 needs features.allow-ldconfig-from-container = true",
                Quoted::new(&cli.ldconfig)
            ),
        ));
    }
    Ok((config, unknown_keys))
}

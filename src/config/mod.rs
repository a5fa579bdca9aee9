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
//! - `[nvshim] hook-path` (default `/usr/bin/nvshim`): the binary that the
//!   `createContainer` hooks we generate run.
//! - `[nvshim] proc-root` (default `/`): the directory holding `proc/driver/nvidia`.
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

#[cfg(test)]
mod tests;

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};
use toml::de::{DeTable, DeValue};

use crate::request::{DriverCapabilities, Quoted, RequestError};

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

/// `[nvidia-container-cli]`: the driver root and the legacy hook's CLI options.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct CliConfig {
    /// The driver root (e.g. `/run/nvidia/driver`); empty means `/`. See
    /// [`Config::driver_root`].
    pub root: PathBuf,
    /// `nvidia-container-cli` itself; empty means search `PATH`.
    pub path: PathBuf,
    /// Extra `K=V` entries for the CLI's environment.
    pub environment: Vec<String>,
    /// The CLI's log file (`--debug`); empty for none.
    pub debug: PathBuf,
    /// The host `ld.so.cache` to read (`--ldcache`); empty for the default.
    pub ldcache: PathBuf,
    /// Load the kernel modules before use (`--load-kmods`).
    pub load_kmods: bool,
    /// `--no-pivot`.
    pub no_pivot: bool,
    /// Leave the container's device cgroup alone (`--no-cgroups`); needed rootless.
    pub no_cgroups: bool,
    /// `--user`; empty for none.
    pub user: String,
    /// The ldconfig to run: `@` + a host path, or (only with
    /// `features.allow-ldconfig-from-container`) a path in the container.
    pub ldconfig: String,
    /// Ours: where the device nodes are, if not under the driver root. See
    /// [`Config::dev_root`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev_root: Option<PathBuf>,
}

/// `[nvidia-container-runtime]`: the runtime shim.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct RuntimeConfig {
    /// The runtime's log file.
    pub debug: PathBuf,
    pub log_level: LogLevel,
    /// Candidates for the low-level runtime, names looked up in `PATH` or absolute
    /// paths; the first that exists wins.
    pub runtimes: Vec<String>,
    pub mode: Mode,
    pub modes: Modes,
}

/// `[nvidia-container-runtime.modes]`: per-mode settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct Modes {
    pub cdi: CdiMode,
    pub csv: CsvMode,
    pub jit_cdi: JitCdiMode,
    pub legacy: LegacyMode,
}

/// `[nvidia-container-runtime.modes.cdi]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct CdiMode {
    /// Where CDI specs are looked up.
    pub spec_dirs: Vec<PathBuf>,
    /// The kind put in front of an unqualified device id (`0` → `nvidia.com/gpu=0`).
    pub default_kind: String,
    /// Annotation key prefixes whose values are CDI device names.
    pub annotation_prefixes: Vec<String>,
}

/// `[nvidia-container-runtime.modes.csv]` (Tegra).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct CsvMode {
    /// The directory of CSV mount specs.
    pub mount_spec_path: PathBuf,
    /// An alternative CUDA compat directory; empty for none.
    pub compat_container_root: PathBuf,
}

/// `[nvidia-container-runtime.modes.jit-cdi]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct JitCdiMode {
    /// NVIDIA's `nvcdi` feature flags, kept as strings: NVIDIA adds new ones often.
    pub nvcdi_feature_flags: Vec<String>,
    /// Names of generated hooks to leave out, or `all`.
    pub nvcdi_disable_hooks: Vec<String>,
}

/// `[nvidia-container-runtime.modes.legacy]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct LegacyMode {
    pub cuda_compat_mode: CudaCompatMode,
}

/// `[nvidia-container-runtime-hook]`: the legacy prestart hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct HookConfig {
    /// The hook binary: an absolute path, or a name looked up in `PATH`.
    pub path: PathBuf,
    /// Let the hook run whatever mode is configured (no "--gpus needs legacy" check).
    pub skip_mode_detection: bool,
}

/// `[nvidia-ctk]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct CtkConfig {
    /// The binary NVIDIA's runtime puts into the hooks it generates.
    pub path: PathBuf,
}

/// `[features]`: opt-ins, all off by default. Several restore behaviour that a CVE fix
/// removed; their docs say which.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct Features {
    /// Mount CUDA compat libraries from the image over the host's (CVE-2024-0132,
    /// CVE-2025-23359 surface).
    pub allow_cuda_compat_libs_from_container: bool,
    /// Accept an `nvidia-container-cli.ldconfig` inside the container
    /// (CVE-2024-0136/0137 surface).
    pub allow_ldconfig_from_container: bool,
    /// Accept unknown fields in a bundle's `config.json`.
    pub allow_unknown_oci_spec_fields: bool,
    /// Skip the `enable-cuda-compat` hook (the published CVE-2025-23266 mitigation).
    pub disable_cuda_compat_lib_hook: bool,
    /// Do not create the IMEX channel nodes a container asks for.
    pub disable_imex_channel_creation: bool,
    /// Ignore `NVIDIA_IMEX_CHANNELS` and IMEX volume-mount requests.
    pub ignore_imex_channel_requests: bool,
    /// Do not add a device node's group to `process.user.additionalGids`.
    pub no_additional_gids_for_device_nodes: bool,
}

/// `[nvshim]`: our own settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct NvshimConfig {
    /// The binary our generated `createContainer` hooks run.
    pub hook_path: PathBuf,
    /// The directory holding `proc/driver/nvidia` (default `/`; a test node or a
    /// driver container with its own view of the host's proc sets it).
    pub proc_root: PathBuf,
}

impl Default for Config {
    /// NVIDIA's defaults (`nvidia-ctk config default`), apart from the differences the
    /// module doc lists, plus ours. Every other `Default` in this module comes from here.
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
                hook_path: PathBuf::from("/usr/bin/nvshim"),
                proc_root: PathBuf::from("/"),
            },
        }
    }
}

// The tables' defaults are slices of the one above, so that a table present in the
// file with only some of its keys gets the same values as a table left out.
impl Default for CliConfig {
    fn default() -> Self {
        Config::default().nvidia_container_cli
    }
}
impl Default for RuntimeConfig {
    fn default() -> Self {
        Config::default().nvidia_container_runtime
    }
}
impl Default for Modes {
    fn default() -> Self {
        RuntimeConfig::default().modes
    }
}
impl Default for CdiMode {
    fn default() -> Self {
        Modes::default().cdi
    }
}
impl Default for CsvMode {
    fn default() -> Self {
        Modes::default().csv
    }
}
impl Default for JitCdiMode {
    fn default() -> Self {
        Modes::default().jit_cdi
    }
}
impl Default for LegacyMode {
    fn default() -> Self {
        Modes::default().legacy
    }
}
impl Default for HookConfig {
    fn default() -> Self {
        Config::default().nvidia_container_runtime_hook
    }
}
impl Default for CtkConfig {
    fn default() -> Self {
        Config::default().nvidia_ctk
    }
}
impl Default for Features {
    fn default() -> Self {
        Config::default().features
    }
}
impl Default for NvshimConfig {
    fn default() -> Self {
        Config::default().nvshim
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

/// A config value that is not one of the valid words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {value} (valid: {})", valid.join(", "))]
pub struct UnknownValue {
    pub value: Quoted,
    pub valid: &'static [&'static str],
}

/// An enum spelled as one of a fixed set of words in the file.
trait Words: Sized + Copy + PartialEq + 'static {
    /// Every accepted spelling; the first one listed for a value is how it is written.
    const WORDS: &'static [(&'static str, Self)];
    /// The spellings, in the same order, for error messages.
    const VALID: &'static [&'static str];
    /// Whether upper case is accepted too.
    const ANY_CASE: bool = false;

    fn word(self) -> &'static str {
        Self::WORDS
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("", |(w, _)| w)
    }

    fn from_word(word: &str) -> Result<Self, UnknownValue> {
        Self::WORDS
            .iter()
            .find(|(w, _)| {
                if Self::ANY_CASE {
                    w.eq_ignore_ascii_case(word)
                } else {
                    *w == word
                }
            })
            .map(|(_, v)| *v)
            .ok_or_else(|| UnknownValue {
                value: Quoted::new(word),
                valid: Self::VALID,
            })
    }
}

/// Implements `as_str`, `FromStr`, `Display`, `Serialize` and `Deserialize` for a
/// [`Words`] enum; the deserialize error names the value and the valid set.
macro_rules! words_impls {
    ($ty:ty) => {
        impl $ty {
            /// How the value is written in the file.
            pub fn as_str(self) -> &'static str {
                self.word()
            }
        }
        impl FromStr for $ty {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::from_word(s)
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.word())
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.word())
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let word = String::deserialize(d)?;
                Self::from_word(&word).map_err(de::Error::custom)
            }
        }
    };
}

/// `nvidia-container-runtime.mode`: how a container's devices are injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Chosen per container and platform (NVIDIA's runtime: `cdi` for fully qualified
    /// CDI names, else `csv` on Tegra, else `jit-cdi`).
    Auto,
    /// A prestart hook that runs `nvidia-container-cli`.
    Legacy,
    /// Devices from CDI specs on disk.
    Cdi,
    /// CDI specs generated in memory for each container.
    JitCdi,
    /// Tegra/Jetson mount lists.
    Csv,
}

impl Words for Mode {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("legacy", Self::Legacy),
        ("cdi", Self::Cdi),
        ("jit-cdi", Self::JitCdi),
        ("csv", Self::Csv),
    ];
    const VALID: &'static [&'static str] = &["auto", "legacy", "cdi", "jit-cdi", "csv"];
}
words_impls!(Mode);

/// `nvidia-container-runtime.log-level`. NVIDIA's logger also accepts `warning`
/// (= `warn`) and `fatal` and `panic` (both = `error` here: we have no levels above
/// it), in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl Words for LogLevel {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("trace", Self::Trace),
        ("debug", Self::Debug),
        ("info", Self::Info),
        ("warn", Self::Warn),
        ("error", Self::Error),
        ("warning", Self::Warn),
        ("fatal", Self::Error),
        ("panic", Self::Error),
    ];
    const VALID: &'static [&'static str] = &[
        "trace", "debug", "info", "warn", "error", "warning", "fatal", "panic",
    ];
    const ANY_CASE: bool = true;
}
words_impls!(LogLevel);

impl From<LogLevel> for tracing::Level {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Trace => Self::TRACE,
            LogLevel::Debug => Self::DEBUG,
            LogLevel::Info => Self::INFO,
            LogLevel::Warn => Self::WARN,
            LogLevel::Error => Self::ERROR,
        }
    }
}

/// `nvidia-container-runtime.modes.legacy.cuda-compat-mode`: how the legacy path makes
/// an image's CUDA forward-compat libraries usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaCompatMode {
    /// Add the compat directory to the container's ldconfig run.
    Ldconfig,
    /// Bind-mount the compat libraries over the driver's.
    Mount,
    /// The `enable-cuda-compat` createContainer hook does it.
    Hook,
    /// Do nothing.
    Disabled,
}

impl Words for CudaCompatMode {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("ldconfig", Self::Ldconfig),
        ("mount", Self::Mount),
        ("hook", Self::Hook),
        ("disabled", Self::Disabled),
    ];
    const VALID: &'static [&'static str] = &["ldconfig", "mount", "hook", "disabled"];
}
words_impls!(CudaCompatMode);

/// A place in the config file: `path:line:column`, both 1-based, the column counted in
/// characters. Line 0 means the place is unknown (only the path is shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.path.display())
        } else {
            write!(f, "{}:{}:{}", self.path.display(), self.line, self.column)
        }
    }
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

/// Finds ([`locate`]), reads and parses the config file. A missing file means the
/// defaults, unless `NVIDIA_CTK_CONFIG_FILE_PATH` named it.
pub fn load(env: impl Fn(&str) -> Option<String>) -> Result<Loaded, ConfigError> {
    let named = env(ENV_CONFIG_FILE_PATH).is_some_and(|v| !v.is_empty());
    let path = locate(&env);
    match std::fs::read_to_string(&path) {
        Ok(text) => {
            let (config, unknown_keys) = parse(&text, &path)?;
            Ok(Loaded {
                config,
                path,
                from_file: true,
                unknown_keys,
            })
        }
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

/// 1-based line and column (in characters) of a byte offset.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = text.get(..end).unwrap_or_default();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before.get(line_start..).unwrap_or_default().chars().count() + 1;
    (line, column)
}

/// A key path as TOML would write it: bare keys as they are, others quoted.
fn dotted(path: &serde_ignored::Path<'_>) -> String {
    fn segments(path: &serde_ignored::Path<'_>, out: &mut Vec<String>) {
        use serde_ignored::Path as P;
        match path {
            P::Root => {}
            P::Map { parent, key } => {
                segments(parent, out);
                out.push(toml_key(key));
            }
            P::Seq { parent, index } => {
                segments(parent, out);
                out.push(index.to_string());
            }
            P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
                segments(parent, out)
            }
        }
    }
    let mut out = Vec::new();
    segments(path, &mut out);
    out.join(".")
}

fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// The span of the value at `keys`, if the file sets it.
fn value_span(doc: &DeTable<'_>, keys: &[&str]) -> Option<Range<usize>> {
    let (first, rest) = keys.split_first()?;
    let value = doc.iter().find(|(k, _)| k.get_ref() == first)?.1;
    if rest.is_empty() {
        return Some(value.span());
    }
    match value.get_ref() {
        DeValue::Table(table) => value_span(table, rest),
        _ => None,
    }
}

/// The dotted path of the innermost key whose key or value covers `offset`.
fn key_at(doc: &DeTable<'_>, offset: usize) -> Option<String> {
    fn walk(
        table: &DeTable<'_>,
        offset: usize,
        prefix: &mut Vec<String>,
        best: &mut Option<(usize, String)>,
    ) {
        for (key, value) in table {
            prefix.push(toml_key(key.get_ref()));
            let (k, v) = (key.span(), value.span());
            if covers(&k, offset) || covers(&v, offset) {
                let size = v.len();
                // Deeper keys come later and win ties.
                if best.as_ref().is_none_or(|(s, _)| size <= *s) {
                    *best = Some((size, prefix.join(".")));
                }
            }
            if let DeValue::Table(inner) = value.get_ref() {
                walk(inner, offset, prefix, best);
            }
            prefix.pop();
        }
    }
    fn covers(span: &Range<usize>, offset: usize) -> bool {
        span.contains(&offset) || (span.is_empty() && span.start == offset)
    }
    let mut best = None;
    walk(doc, offset, &mut Vec::new(), &mut best);
    best.map(|(_, key)| key)
}

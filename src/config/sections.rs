//! The config file's tables (`[nvidia-container-cli]`, `[nvidia-container-runtime]`,
//! …) as serde structs, one per table, with NVIDIA's key names.
//!
//! Every table's `Default` is a slice of [`Config::default`], the one place the
//! defaults are written.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::Config;
use super::values::{CudaCompatMode, DriverMounts, LogLevel, Mode};

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
    /// The directory holding `proc/driver/nvidia` (default `/`; a test node or a
    /// driver container with its own view of the host's proc sets it).
    pub proc_root: PathBuf,
    /// The directory holding systemd's `run/systemd` (default `/`; a test node sets
    /// it): where the prestart hook tells systemd its device grants.
    pub systemd_root: PathBuf,
    /// How many seconds `nvshim runtime` (the runtime's NVML path) waits for the driver to
    /// list the GPUs before it fails the `create` (default 10; 0 waits forever). A hung
    /// driver hangs every NVML call, and a runtime stuck in one would hang the engine's
    /// container start with no error at all.
    pub nvml_timeout: u64,
    /// How the runtime mounts the driver's read-only files: `staged` (default: one
    /// bind of a staging directory under `driver-stage-dir`, symlinks at the usual
    /// paths) or `per-file` (one bind mount each, as NVIDIA's runtime does).
    pub driver_mounts: DriverMounts,
    /// Where the runtime keeps its driver stages (default `/run/nvshim/driver-stage`).
    pub driver_stage_dir: PathBuf,
}

// The tables' defaults are slices of `Config::default()`, so that a table present in the
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

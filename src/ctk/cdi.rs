//! `nvidia-ctk cdi generate|list|transform root`: NVIDIA's flags, defaults and
//! environment variables on the same generator as `nvshim cdi` (`generate`,
//! `cli::cdi`).
//!
//! Specs written here run NVIDIA's hooks (`nvidia-cdi-hook create-symlinks`,
//! `update-ldcache`, …; the hook path is `--nvidia-cdi-hook-path`, default
//! `/usr/bin/nvidia-cdi-hook`), so tools that read specs see NVIDIA's form.

mod csv;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};

use super::GlobalArgs;
use crate::cdi::transform::{self, RelativeTo};
use crate::cli::CliError;
use crate::cli::cdi::{self as nvshim_cdi, Format};
use crate::config;
use crate::discover::csv::{CsvSource, PatternError};
use crate::generate::{self, NameStrategy, NvidiaHooks, Options};
use crate::hook_contract::{ALL_HOOKS, CDI_HOOK_BINARY, DISABLE_DEVICE_NODE_MODIFICATION};
use crate::inventory::{Backend, Source};
use crate::pipeline::{Context, NvmlAccess};
use crate::request::DriverCapabilities;
use crate::roots::Roots;

#[derive(Debug, Args)]
pub struct CdiArgs {
    #[command(subcommand)]
    pub command: CdiCommand,
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    /// Generate CDI specifications for use with CDI-enabled runtimes.
    Generate(Box<GenerateArgs>),
    /// List the available CDI devices.
    List(ListArgs),
    /// Apply a transform to a CDI specification.
    Transform(TransformArgs),
}

/// The discovery modes NVIDIA's `--mode` takes.
pub const MODES: [&str; 10] = [
    "auto",
    "nvml",
    "management",
    "wsl",
    "csv",
    "gds",
    "mofed",
    "gdrcopy",
    "nvswitch",
    "imex",
];

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// The file to write the spec to; empty: stdout.
    #[arg(long, env = "NVIDIA_CTK_CDI_OUTPUT_FILE_PATH")]
    pub output: Option<PathBuf>,
    /// yaml or json; overrides the output file's extension.
    #[arg(long, env = "NVIDIA_CTK_CDI_GENERATE_OUTPUT_FORMAT")]
    pub format: Option<String>,
    /// The discovery mode: auto, nvml, management, wsl, csv, or one device class: gds,
    /// mofed, gdrcopy, nvswitch, imex; auto is wsl on a WSL2 node and csv on Tegra.
    #[arg(
        long,
        visible_alias = "discovery-mode",
        default_value = "auto",
        env = "NVIDIA_CTK_CDI_GENERATE_MODE"
    )]
    pub mode: String,
    /// The root where /dev is located; default: the driver root (with neither flag,
    /// the config's nvidia-container-cli.dev-root, else its root).
    #[arg(long, env = "NVIDIA_CTK_DEV_ROOT")]
    pub dev_root: Option<PathBuf>,
    /// How devices are named: index, uuid, type-index. Repeat or comma-separate for
    /// several names per device.
    #[arg(
        long,
        value_delimiter = ',',
        default_values = ["index", "uuid"],
        env = "NVIDIA_CTK_CDI_GENERATE_DEVICE_NAME_STRATEGIES"
    )]
    pub device_name_strategy: Vec<String>,
    /// The driver root; default: the config's nvidia-container-cli.root, else /.
    #[arg(long, env = "NVIDIA_CTK_DRIVER_ROOT")]
    pub driver_root: Option<PathBuf>,
    /// Library search paths for CSV mode (ignored: our CSV paths are absolute).
    #[arg(
        long,
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_LIBRARY_SEARCH_PATHS"
    )]
    pub library_search_path: Vec<String>,
    /// Config file search paths for the graphics files; not supported yet.
    #[arg(
        long,
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_CONFIG_SEARCH_PATHS"
    )]
    pub config_search_path: Vec<String>,
    /// The hook binary the spec's hooks run (absolute, or a name looked up in PATH).
    #[arg(
        long,
        visible_alias = "nvidia-ctk-path",
        env = "NVIDIA_CTK_CDI_HOOK_PATH"
    )]
    pub nvidia_cdi_hook_path: Option<String>,
    /// Written into the update-ldcache hook's --ldconfig-path (our hook runs no
    /// ldconfig).
    #[arg(long, env = "NVIDIA_CTK_CDI_GENERATE_LDCONFIG_PATH")]
    pub ldconfig_path: Option<String>,
    /// The vendor of the device kind.
    #[arg(
        long,
        visible_alias = "cdi-vendor",
        default_value = "nvidia.com",
        env = "NVIDIA_CTK_CDI_GENERATE_VENDOR"
    )]
    pub vendor: String,
    /// The class of the device kind.
    #[arg(
        long,
        visible_alias = "cdi-class",
        default_value = "gpu",
        env = "NVIDIA_CTK_CDI_GENERATE_CLASS"
    )]
    pub class: String,
    /// CSV files for CSV mode (Tegra); default: the base files (devices.csv,
    /// drivers.csv, l4t.csv) of the config's modes.csv.mount-spec-path.
    #[arg(
        long = "csv.file",
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_CSV_FILES"
    )]
    pub csv_file: Vec<String>,
    /// Patterns of CSV mode's `sym` entries to leave out: the whole path, or the file
    /// name for `**/<pattern>`.
    #[arg(
        long = "csv.ignore-pattern",
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_CSV_IGNORE_PATTERNS"
    )]
    pub csv_ignore_pattern: Vec<String>,
    /// A hook to leave out (repeatable); `all` leaves out every hook.
    #[arg(
        long,
        visible_alias = "disable-hooks",
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_DISABLED_HOOKS"
    )]
    pub disable_hook: Vec<String>,
    /// A hook to add that is off by default (chmod) or disabled; overrides
    /// --disable-hook.
    #[arg(
        long,
        visible_alias = "enable-hooks",
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_ENABLED_HOOKS"
    )]
    pub enable_hook: Vec<String>,
    /// NVIDIA's generation feature flags; none is supported yet.
    #[arg(
        long,
        visible_alias = "feature-flags",
        value_delimiter = ',',
        env = "NVIDIA_CTK_CDI_GENERATE_FEATURE_FLAGS"
    )]
    pub feature_flag: Vec<String>,
    /// Leave out the `all` device.
    #[arg(long, env = "NVIDIA_CTK_CDI_GENERATE_NO_ALL_DEVICE")]
    pub no_all_device: bool,
    /// Only these devices (indices, `GPU:MIG` indices or UUIDs); default all.
    #[arg(
        long,
        visible_aliases = ["device-ids", "device", "devices"],
        value_delimiter = ',',
        default_values = ["all"],
        env = "NVIDIA_CTK_CDI_GENERATE_DEVICE_IDS"
    )]
    pub device_id: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// A directory to search for spec files; repeatable. Default: /etc/cdi and
    /// /var/run/cdi.
    #[arg(long, value_delimiter = ',')]
    pub spec_dir: Vec<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TransformArgs {
    #[command(subcommand)]
    pub command: TransformCommand,
}

#[derive(Debug, Subcommand)]
pub enum TransformCommand {
    /// Apply a root transform to a CDI specification.
    Root(RootArgs),
}

#[derive(Debug, Args)]
pub struct RootArgs {
    /// The root to be transformed.
    #[arg(long, default_value = "")]
    pub from: String,
    /// The replacement root.
    #[arg(long, default_value = "")]
    pub to: String,
    /// Whether host or container paths move: host or container.
    #[arg(long, default_value = "host")]
    pub relative_to: String,
    /// The spec to read; `-`: stdin.
    #[arg(long, default_value = "-")]
    pub input: String,
    /// The file to write; empty: stdout.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error(transparent)]
    Cli(#[from] CliError),
    #[error("invalid output format {0:?} (valid: yaml, json)")]
    Format(String),
    #[error("invalid discovery mode {mode:?} (valid: {})", MODES.join(", "))]
    Mode { mode: String },
    #[error(
        "discovery mode {0:?} is not supported yet (supported: auto, nvml, management, wsl, \
         csv, gds, mofed, gdrcopy, nvswitch, imex)"
    )]
    UnsupportedMode(String),
    #[error("{0}")]
    Unsupported(String),
    #[error("unknown hook {name:?} for --{flag} (valid: {})", valid_hooks(flag))]
    Hook { flag: &'static str, name: String },
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error("cannot read the CDI spec {from}: {source}")]
    Input {
        from: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the CDI spec {from} does not parse: {reason}")]
    Parse { from: String, reason: String },
    #[error(transparent)]
    Transform(#[from] TransformError),
    #[error(transparent)]
    Class(#[from] classes::ClassSpecError),
    #[error(
        "--mode wsl needs a WSL2 node: a character device {dxg} and no {proc_driver} \
         (the dev root and proc root say where to look)"
    )]
    NotWsl { dxg: String, proc_driver: String },
    #[error("invalid --csv.ignore-pattern {pattern:?}: {source}")]
    IgnorePattern {
        pattern: String,
        #[source]
        source: PatternError,
    },
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TransformError(String);

fn valid_hooks(flag: &str) -> String {
    let mut names: Vec<&str> = NvidiaHooks::NAMES.to_vec();
    if flag == "disable-hook" {
        names.push(ALL_HOOKS);
    }
    names.join(", ")
}

pub fn run(global: &GlobalArgs, args: &CdiArgs, out: &mut dyn Write) -> Result<(), CdiError> {
    match &args.command {
        CdiCommand::Generate(a) => generate_spec(global, a, out),
        CdiCommand::List(a) => Ok(nvshim_cdi::list(&a.spec_dir, out)?),
        CdiCommand::Transform(t) => match &t.command {
            TransformCommand::Root(a) => transform_root(a, out),
        },
    }
}

fn generate_spec(
    global: &GlobalArgs,
    a: &GenerateArgs,
    out: &mut dyn Write,
) -> Result<(), CdiError> {
    let plan = GeneratePlan::from_args(global, a)?;
    if let Some(mode) = classes::ClassMode::parse(&a.mode.to_ascii_lowercase()) {
        let spec = classes::generate(
            mode,
            &plan.ctx.roots,
            &a.vendor,
            &a.class,
            plan.options.all_device,
            &a.device_id,
        )?;
        let output = a.output.as_deref().filter(|p| !p.as_os_str().is_empty());
        return Ok(nvshim_cdi::emit(&spec, output, plan.format, out)?);
    }
    let spec = match &plan.csv {
        Some(source) => generate::csv::generate(&plan.ctx, &plan.options, &plan.nvidia, source),
        None => generate::generate_with(&plan.ctx, &plan.options, &plan.nvidia),
    }
    .map_err(CliError::from)?;
    let output = a.output.as_deref().filter(|p| !p.as_os_str().is_empty());
    Ok(nvshim_cdi::emit(&spec, output, plan.format, out)?)
}

/// What `generate` turns NVIDIA's flags into.
struct GeneratePlan {
    ctx: Context,
    options: Options,
    nvidia: NvidiaHooks,
    format: Option<Format>,
    /// `--mode csv`: the CSV files and ignore patterns.
    csv: Option<CsvSource>,
}

impl GeneratePlan {
    fn from_args(global: &GlobalArgs, a: &GenerateArgs) -> Result<Self, CdiError> {
        let mode = a.mode.to_ascii_lowercase();
        let backend = match mode.as_str() {
            // `wsl`: what `auto` finds on a WSL2 node, checked below.
            "auto" | "management" | "wsl" | "csv" => Backend::Auto,
            "nvml" => Backend::Nvml,
            m if classes::ClassMode::parse(m).is_some() => Backend::Auto,
            m if MODES.contains(&m) => return Err(CdiError::UnsupportedMode(m.to_owned())),
            _ => {
                return Err(CdiError::Mode {
                    mode: a.mode.clone(),
                });
            }
        };
        let format = match a.format.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => None,
            Some("yaml") => Some(Format::Yaml),
            Some("json") => Some(Format::Json),
            Some(_) => return Err(CdiError::Format(a.format.clone().unwrap_or_default())),
        };
        let unsupported = |what: &str| Err(CdiError::Unsupported(what.to_owned()));
        if !a.config_search_path.is_empty() {
            return unsupported(
                "--config-search-path is not supported yet: the graphics config files are looked up in /etc, /usr/local/share and /usr/share under the driver root",
            );
        }
        if let Some(flag) = a.feature_flag.first() {
            return Err(CdiError::Unsupported(format!(
                "feature flag {flag:?} is not supported yet (no --feature-flag is)"
            )));
        }
        if a.device_id.iter().any(|d| d == "none") {
            return unsupported("--device-id none (a spec with no devices) is not supported yet");
        }
        let mut strategies = a
            .device_name_strategy
            .iter()
            .map(|s| s.parse::<NameStrategy>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(CliError::from)?;
        if mode == "management" {
            // NVIDIA's management spec has the `all` device alone.
            strategies.clear();
        }
        let only = only_devices(&a.device_id, &strategies);

        let mut options = Options {
            kind: format!("{}/{}", a.vendor, a.class),
            strategies,
            all_device: !a.no_all_device,
            hook_path: hook_path(a.nvidia_cdi_hook_path.as_deref()),
            capabilities: DriverCapabilities::all(),
            cover_params: true,
            only,
            hook_argv0: None,
        };
        let mut nvidia = NvidiaHooks {
            ldconfig_path: a.ldconfig_path.clone().filter(|p| !p.is_empty()),
            ..NvidiaHooks::default()
        };
        for name in &a.disable_hook {
            match name.as_str() {
                ALL_HOOKS => {
                    options.cover_params = false;
                    for n in NvidiaHooks::NAMES {
                        nvidia.set(n, false);
                    }
                }
                DISABLE_DEVICE_NODE_MODIFICATION => options.cover_params = false,
                n if nvidia.set(n, false) => {}
                n => return Err(hook_error("disable-hook", n)),
            }
        }
        for name in &a.enable_hook {
            match name.as_str() {
                DISABLE_DEVICE_NODE_MODIFICATION => options.cover_params = true,
                n if nvidia.set(n, true) => {}
                n => return Err(hook_error("enable-hook", n)),
            }
        }

        let loaded = config::load(|key| match (&global.config, key) {
            (Some(path), config::ENV_CONFIG_FILE_PATH) => Some(path.display().to_string()),
            _ => std::env::var(key).ok(),
        })?;
        let driver = a
            .driver_root
            .clone()
            .unwrap_or_else(|| loaded.config.driver_root());
        // NVIDIA's rule: the dev root defaults to the driver root; with neither flag,
        // both come from the config (ours may set `dev-root` apart).
        let dev = match (&a.dev_root, &a.driver_root) {
            (Some(dev), _) => dev.clone(),
            (None, Some(driver)) => driver.clone(),
            (None, None) => loaded.config.dev_root(),
        };
        let ctx = Context {
            roots: Roots {
                driver,
                dev,
                proc: loaded.config.nvshim.proc_root.clone(),
            },
            source: Source {
                backend,
                nvml_library: None,
            },
            nvml: NvmlAccess::InProcess,
            ..Default::default()
        };
        if mode == "wsl" && !crate::inventory::wsl::detect(&ctx.roots) {
            return Err(CdiError::NotWsl {
                dxg: ctx.roots.dev.join("dev/dxg").display().to_string(),
                proc_driver: ctx
                    .roots
                    .proc
                    .join("proc/driver/nvidia")
                    .display()
                    .to_string(),
            });
        }
        // NVIDIA's `auto` is csv on a Tegra host (go-nvlib's platform check).
        let tegra = || crate::discover::csv::is_tegra(&ctx.roots);
        let csv = (mode == "csv" || (mode == "auto" && tegra()))
            .then(|| csv::source(a, &loaded.config))
            .transpose()?;
        Ok(Self {
            ctx,
            options,
            nvidia,
            format,
            csv,
        })
    }
}

fn hook_error(flag: &'static str, name: &str) -> CdiError {
    CdiError::Hook {
        flag,
        name: name.to_owned(),
    }
}

/// `--device-id` as device names for the strategies: `all` is every device; an index
/// (`0`, `0:1`) also selects its type-index name (`gpu0`, `mig0:1`); a UUID selects
/// the device under the uuid strategy.
fn only_devices(
    ids: &[String],
    strategies: &[NameStrategy],
) -> Option<std::collections::BTreeSet<String>> {
    if ids.is_empty() || ids.iter().any(|d| d == "all") {
        return None;
    }
    let mut names = std::collections::BTreeSet::new();
    for id in ids {
        names.insert(id.clone());
        if strategies.contains(&NameStrategy::TypeIndex) {
            if id.chars().all(|c| c.is_ascii_digit()) {
                names.insert(format!("gpu{id}"));
            } else if id.split_once(':').is_some_and(|(g, m)| {
                [g, m]
                    .iter()
                    .all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
            }) {
                names.insert(format!("mig{id}"));
            }
        }
    }
    Some(names)
}

/// `--nvidia-cdi-hook-path`: an absolute path as it is; a bare name (`nvidia-ctk`) is
/// looked up in `PATH`, then `/usr/bin`; none: `/usr/bin/nvidia-cdi-hook`.
fn hook_path(value: Option<&str>) -> String {
    let name = match value.filter(|v| !v.is_empty()) {
        None => return format!("/usr/bin/{CDI_HOOK_BINARY}"),
        Some(v) if v.starts_with('/') => return v.to_owned(),
        Some(v) => v,
    };
    let found = std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|dir| dir.join(name))
            .find(|p| p.is_absolute() && p.is_file())
    });
    found.map_or_else(|| format!("/usr/bin/{name}"), |p| p.display().to_string())
}

fn transform_root(a: &RootArgs, out: &mut dyn Write) -> Result<(), CdiError> {
    let relative_to: RelativeTo = a
        .relative_to
        .parse()
        .map_err(|e: String| CdiError::Transform(TransformError(e)))?;
    let (bytes, from) = if a.input == "-" || a.input.is_empty() {
        let mut bytes = Vec::new();
        std::io::stdin()
            .take(crate::cdi::spec::MAX_SPEC_SIZE as u64 + 1)
            .read_to_end(&mut bytes)
            .map_err(|source| CdiError::Input {
                from: "stdin".into(),
                source,
            })?;
        (bytes, "stdin".to_owned())
    } else {
        let bytes = std::fs::read(&a.input).map_err(|source| CdiError::Input {
            from: a.input.clone(),
            source,
        })?;
        (bytes, a.input.clone())
    };
    let json_input = bytes.iter().find(|b| !b.is_ascii_whitespace()) == Some(&b'{');
    let mut spec: serde_json::Value = if json_input {
        serde_json::from_slice(&bytes).map_err(|e| CdiError::Parse {
            from: from.clone(),
            reason: e.to_string(),
        })?
    } else {
        serde_saphyr::from_slice(&bytes).map_err(|e| CdiError::Parse {
            from: from.clone(),
            reason: e.to_string(),
        })?
    };
    transform::root(&mut spec, &a.from, &a.to, relative_to);
    let output = a.output.as_deref().filter(|p| !p.as_os_str().is_empty());
    let json = match output.and_then(Path::extension).and_then(|e| e.to_str()) {
        Some("json") => true,
        Some("yaml" | "yml") => false,
        _ => json_input,
    };
    let bytes = if json {
        let mut b = serde_json::to_vec_pretty(&spec).unwrap_or_default();
        b.push(b'\n');
        b
    } else {
        serde_saphyr::to_string(&spec)
            .map_err(|e| CdiError::Transform(TransformError(e.to_string())))?
            .into_bytes()
    };
    match output {
        None => out
            .write_all(&bytes)
            .map_err(|e| CdiError::Cli(CliError::Output(e)))?,
        Some(path) => nvshim_cdi::write_file(path, &bytes)?,
    }
    Ok(())
}

mod classes;

#[cfg(test)]
mod tests;

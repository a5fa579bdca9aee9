//! `nvidia-ctk runtime configure`: NVIDIA's flags, defaults and messages on the configure flow
//! `nvshim configure` runs (`cli::configure::{plan, commit}`).
//!
//! NVIDIA's defaults differ from `nvshim configure`'s: containerd and CRI-O get a drop-in
//! (`/etc/containerd/conf.d/99-nvidia.toml`, imported from config.toml;
//! `/etc/crio/crio.conf.d/99-nvidia.toml`) unless `--drop-in-config=""`, docker gets
//! `"path": "nvidia-container-runtime"` (looked up on `PATH` by dockerd), and `--dry-run`
//! prints the resulting config instead of a diff. Flags whose value NVIDIA ignores with a
//! warning (`--config-mode` it does not know, `--cdi.enabled` for CRI-O, `--executable-path`
//! and `--config-source=command` for docker) warn here too. Like NVIDIA's urfave flags, the
//! boolean flags take an optional `=true`/`=false`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::builder::BoolishValueParser;
use clap::{Args, Subcommand, ValueEnum};

use super::GlobalArgs;
use crate::cli::configure::{
    self, ConfigureError, EngineKind, Outcome, Request, Source, SourceKind, oci_hook,
};

/// NVIDIA's default `--nvidia-runtime-path`: a bare name, made absolute for containerd and
/// CRI-O (docker looks it up on its `PATH`).
const RUNTIME_EXECUTABLE: &str = "nvidia-container-runtime";

#[derive(Debug, Args)]
pub struct RuntimeArgs {
    #[command(subcommand)]
    pub command: RuntimeCommand,
}

#[derive(Debug, Subcommand)]
pub enum RuntimeCommand {
    /// Add a runtime to the specified container engine.
    Configure(ConfigureArgs),
}

/// The engines `--runtime` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Runtime {
    Docker,
    Containerd,
    Crio,
}

#[derive(Debug, Args)]
pub struct ConfigureArgs {
    /// Update the runtime configuration as required but don't write changes to disk; print the
    /// resulting config instead.
    #[arg(long, num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub dry_run: bool,
    /// The target runtime engine.
    #[arg(long, value_enum, default_value = "docker")]
    pub runtime: Runtime,
    /// Path to the config file for the target runtime (default: /etc/docker/daemon.json,
    /// /etc/containerd/config.toml, /etc/crio/crio.conf).
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Path to the NVIDIA-specific config file to create instead of modifying the main config
    /// (default: /etc/containerd/conf.d/99-nvidia.toml, /etc/crio/crio.conf.d/99-nvidia.toml,
    /// none for docker); "" edits the main config.
    #[arg(long)]
    pub drop_in_config: Option<String>,
    /// The runtime binary `--config-source=command` runs to read the current config.
    #[arg(long)]
    pub executable_path: Option<PathBuf>,
    /// config-file (default), or oci-hook: write the OCI hook file instead (deprecated by
    /// NVIDIA).
    #[arg(long)]
    pub config_mode: Option<String>,
    /// Where the current config is read from.
    #[arg(long, value_enum, default_value = "file")]
    pub config_source: SourceKind,
    /// With --config-mode=oci-hook: the hook file to write (default: print it).
    #[arg(long)]
    pub oci_hook_path: Option<PathBuf>,
    /// The name of the NVIDIA runtime that will be added.
    #[arg(long, visible_alias = "runtime-name", default_value = configure::DEFAULT_RUNTIME_NAME)]
    pub nvidia_runtime_name: String,
    /// The path to the NVIDIA runtime executable.
    #[arg(long, visible_alias = "runtime-path", default_value = RUNTIME_EXECUTABLE)]
    pub nvidia_runtime_path: String,
    /// The path to the NVIDIA Container Runtime hook executable (--config-mode=oci-hook).
    #[arg(long, default_value = oci_hook::DEFAULT_HOOK_PATH)]
    pub nvidia_runtime_hook_path: String,
    /// Set the NVIDIA runtime as the default runtime.
    #[arg(long, visible_alias = "set-as-default", num_args = 0..=1, require_equals = true,
          default_value = "false", default_missing_value = "true",
          value_parser = BoolishValueParser::new())]
    pub nvidia_set_as_default: bool,
    /// Enable CDI in the configured runtime (docker `features.cdi`, containerd `enable_cdi`).
    #[arg(long = "cdi.enabled", visible_aliases = ["cdi.enable", "enable-cdi", "cdi-enabled"],
          num_args = 0..=1, require_equals = true, default_value = "false",
          default_missing_value = "true", value_parser = BoolishValueParser::new())]
    pub cdi_enabled: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Configure(#[from] ConfigureError),
    #[error("the {what} {path:?} is not an absolute path")]
    NotAbsolute { what: &'static str, path: String },
    #[error("runtime docker does not support drop-in configs (got --drop-in-config={0:?})")]
    DockerDropIn(String),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// How `--config-mode` reads: NVIDIA's names, anything else ignored with a warning.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    ConfigFile,
    OciHook,
}

pub fn run(
    global: &GlobalArgs,
    args: &RuntimeArgs,
    out: &mut dyn Write,
) -> Result<(), RuntimeError> {
    match &args.command {
        RuntimeCommand::Configure(a) => configure(global, a, out),
    }
}

fn configure(
    global: &GlobalArgs,
    args: &ConfigureArgs,
    out: &mut dyn Write,
) -> Result<(), RuntimeError> {
    let mut warnings = Vec::new();
    let mode = match args.config_mode.as_deref() {
        Some("oci-hook" | "hook") => Mode::OciHook,
        None | Some("" | "config-file" | "config") => Mode::ConfigFile,
        Some(other) => {
            warnings.push(format!(
                "ignoring unsupported --config-mode {other:?} (valid: config-file, config, oci-hook, hook)"
            ));
            Mode::ConfigFile
        }
    };
    if mode == Mode::OciHook {
        warn(
            global,
            &["the oci-hook config mode is deprecated".to_owned()],
        );
        return write_hook(args, out);
    }
    let request = request(args, &mut warnings)?;
    warn(global, &warnings);
    let plan = configure::plan(&request)?;
    warn(global, &plan.notes);
    if args.dry_run {
        // NVIDIA's --dry-run: the config it would save, on stdout.
        if let Some(change) = plan.changes.first() {
            let text = match &change.outcome {
                Outcome::Remove => "",
                _ => change.new_text().or(change.old_text()).unwrap_or(""),
            };
            out.write_all(text.as_bytes())?;
        }
        return Ok(());
    }
    let done = configure::commit(&plan)?;
    if !global.quiet {
        for file in &done {
            eprintln!("INFO: Wrote updated config to {}", file.file.display());
        }
        if done.is_empty() {
            if let Some(change) = plan.changes.first() {
                eprintln!("INFO: {} already up to date", change.file.display());
            }
        } else {
            eprintln!(
                "INFO: It is recommended that {} daemon be restarted.",
                plan.engine.unit()
            );
        }
    }
    Ok(())
}

/// The request NVIDIA's flags describe, after NVIDIA's defaults and checks.
fn request(args: &ConfigureArgs, warnings: &mut Vec<String>) -> Result<Request, RuntimeError> {
    let engine = match args.runtime {
        Runtime::Docker => EngineKind::Docker,
        Runtime::Containerd => EngineKind::Containerd,
        Runtime::Crio => EngineKind::Crio,
    };
    let mut path = args.nvidia_runtime_path.clone();
    if engine != EngineKind::Docker {
        if path == RUNTIME_EXECUTABLE {
            path = configure::DEFAULT_RUNTIME_PATH.to_owned();
        }
        absolute("NVIDIA runtime path", &path)?;
    }
    let mut cdi = args.cdi_enabled;
    if cdi && engine == EngineKind::Crio {
        warnings.push("ignoring --cdi.enabled for crio: CRI-O enables CDI itself".to_owned());
        cdi = false;
    }
    let mut source = match args.config_source {
        SourceKind::File => Source::File,
        SourceKind::Command => Source::Command {
            executable: args.executable_path.clone(),
        },
    };
    if engine == EngineKind::Docker {
        if let Some(exe) = &args.executable_path {
            warnings.push(format!(
                "ignoring --executable-path={} for docker",
                exe.display()
            ));
        }
        if source != Source::File {
            warnings
                .push("a command config source is not supported for docker; using file".to_owned());
            source = Source::File;
        }
    }
    let config = args.config.clone().unwrap_or_else(|| {
        PathBuf::from(match engine {
            EngineKind::Docker => configure::DOCKER_CONFIG,
            EngineKind::Containerd => configure::CONTAINERD_CONFIG,
            EngineKind::Crio => configure::CRIO_CONFIG,
        })
    });
    let drop_in = match (args.drop_in_config.as_deref(), engine) {
        (None, EngineKind::Docker) | (Some(""), _) => None,
        (None, EngineKind::Containerd) => Some(configure::CONTAINERD_DROP_IN.to_owned()),
        (None, EngineKind::Crio) => Some(configure::CRIO_DROP_IN.to_owned()),
        (Some(d), EngineKind::Docker) => return Err(RuntimeError::DockerDropIn(d.to_owned())),
        (Some(d), _) => Some(d.to_owned()),
    };
    if let Some(d) = &drop_in {
        absolute("drop-in-config path", d)?;
    }
    Ok(Request {
        engine,
        config,
        drop_in: drop_in.map(PathBuf::from),
        source,
        name: args.nvidia_runtime_name.clone(),
        path,
        set_as_default: args.nvidia_set_as_default,
        cdi,
        undo: false,
        host_root: PathBuf::from("/"),
    })
}

fn absolute(what: &'static str, path: &str) -> Result<(), RuntimeError> {
    if Path::new(path).is_absolute() {
        Ok(())
    } else {
        Err(RuntimeError::NotAbsolute {
            what,
            path: path.to_owned(),
        })
    }
}

/// `--config-mode=oci-hook`: the hook file to `--oci-hook-path`, or stdout (also with
/// `--dry-run`).
fn write_hook(args: &ConfigureArgs, out: &mut dyn Write) -> Result<(), RuntimeError> {
    let hook = &args.nvidia_runtime_hook_path;
    absolute("NVIDIA runtime hook path", hook)?;
    let json = oci_hook::hook_json(hook);
    match &args.oci_hook_path {
        Some(file) if !args.dry_run => {
            let file = crate::files::write::resolve(file);
            let existing = crate::files::write::read(&file).map_err(ConfigureError::from)?;
            crate::files::write::replace(&file, json.as_bytes(), existing.as_ref(), false)
                .map_err(ConfigureError::from)?;
        }
        _ => out.write_all(json.as_bytes())?,
    }
    Ok(())
}

fn warn(global: &GlobalArgs, lines: &[String]) {
    if global.quiet {
        return;
    }
    for line in lines {
        eprintln!("WARNING: {line}");
    }
}

//! `nvshim configure docker|containerd|crio`: registers the NVIDIA runtime in a container
//! engine's config file (or a drop-in it imports), or takes it out again (`--undo`). The same
//! flow runs `nvidia-ctk runtime configure` (`crate::ctk::runtime`): [`plan`] turns a
//! [`Request`] into the files to change, [`commit`] writes them.
//!
//! Each engine module is a pure text transform (old file → new file) that keeps everything it
//! does not own: docker's other keys in their order, containerd's comments and unrelated tables.
//! This front end prints a diff, writes atomically with a backup (unless `--dry-run`), then
//! prints — or with `--restart` runs — the command that makes the engine read the file. A file
//! we cannot parse is refused and left byte-identical: an engine that cannot read its config
//! does not start.
//!
//! What we write matches `nvidia-ctk runtime configure`: the same keys and values, so tools that
//! look for NVIDIA's entries find ours. Where we differ (containerd's built-in `runc` declared
//! explicitly, an existing entry updated in place, a containerd drop-in that carries the CRI
//! plugin's settings) the engine module says why.

pub(crate) mod containerd;
pub(crate) mod crio;
mod diff;
mod docker;
pub mod oci_hook;
mod plan;
mod toml_tables;

#[cfg(test)]
mod containerd_tests;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus};

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Subcommand, ValueEnum};

use super::CliError;
use crate::files::write::{self, WriteError};

pub use plan::{
    Backups, Change, Committed, EngineKind, Plan, Request, Source, commit, commit_with, plan,
    resolve_under, under_root,
};

/// Where `nvidia-ctk` points engines by default: the NVIDIA runtime's install path.
pub const DEFAULT_RUNTIME_PATH: &str = "/usr/bin/nvidia-container-runtime";
/// The runtime name NVIDIA registers, and the one `docker run --runtime=nvidia` expects.
pub const DEFAULT_RUNTIME_NAME: &str = "nvidia";
pub const DOCKER_CONFIG: &str = "/etc/docker/daemon.json";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
/// NVIDIA's default containerd drop-in; `conf.d` is the directory containerd's docs name.
pub const CONTAINERD_DROP_IN: &str = "/etc/containerd/conf.d/99-nvidia.toml";
pub const CRIO_CONFIG: &str = "/etc/crio/crio.conf";
pub const CRIO_CONFIG_DIR: &str = "/etc/crio/crio.conf.d";
/// NVIDIA's default CRI-O drop-in (`crio.conf.d`: the directory CRI-O reads).
pub const CRIO_DROP_IN: &str = "/etc/crio/crio.conf.d/99-nvidia.toml";

#[derive(Debug, Args)]
pub struct ConfigureArgs {
    #[command(subcommand)]
    pub engine: Engine,
}

#[derive(Debug, Subcommand)]
pub enum Engine {
    /// Add the runtime to docker's daemon.json (`runtimes.<name>`, optionally `default-runtime`).
    Docker(DockerArgs),
    /// Add the runtime to containerd's config.toml (version 1, 2 or 3) for the CRI plugin, or
    /// to a drop-in it imports.
    Containerd(ContainerdArgs),
    /// Write a CRI-O drop-in (`99-nvidia.toml`) that registers the runtime.
    Crio(CrioArgs),
    /// Print (or write) the OCI hook file that podman and CRI-O read from `hooks.d`.
    OciHook(OciHookArgs),
}

#[derive(Debug, Args)]
pub struct DockerArgs {
    /// docker's config file; created (with its directory) if missing.
    #[arg(long, default_value = DOCKER_CONFIG)]
    pub config: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(Debug, Args)]
pub struct ContainerdArgs {
    /// containerd's config file; a missing one is created as a minimal version 2 config.
    #[arg(long, default_value = CONTAINERD_CONFIG)]
    pub config: PathBuf,
    /// Write the runtime to this drop-in and add its directory to the config's `imports`,
    /// instead of editing the config itself (nvidia-ctk's default: /etc/containerd/conf.d/99-nvidia.toml).
    #[arg(long)]
    pub drop_in_config: Option<PathBuf>,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(Debug, Args)]
pub struct CrioArgs {
    /// CRI-O's drop-in directory; the drop-in written there is `99-nvidia.toml`.
    #[arg(long, default_value = CRIO_CONFIG_DIR)]
    pub config_dir: PathBuf,
    /// CRI-O's main config, read for the runtime the new one copies its settings from.
    #[arg(long, default_value = CRIO_CONFIG)]
    pub config: PathBuf,
    /// Edit --config itself instead of writing the drop-in.
    #[arg(long)]
    pub in_place: bool,
    #[command(flatten)]
    pub source: SourceArgs,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(Debug, Args)]
pub struct OciHookArgs {
    /// The hook binary the file runs (absolute).
    #[arg(long, default_value = oci_hook::DEFAULT_HOOK_PATH)]
    pub hook_path: PathBuf,
    /// Write the file here (atomically) instead of printing it.
    #[arg(long)]
    pub output: Option<PathBuf>,
}

/// `file` or `command`: where the engine's current settings are read from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SourceKind {
    File,
    Command,
}

#[derive(Debug, Clone, Args)]
pub struct SourceArgs {
    /// Read the engine's current settings from its config file, or ask the engine
    /// (`containerd config dump`, `crio status config`).
    #[arg(long, value_enum, default_value = "file")]
    pub config_source: SourceKind,
    /// The engine binary `--config-source=command` runs (default: from PATH).
    #[arg(long)]
    pub executable_path: Option<PathBuf>,
}

impl SourceArgs {
    pub fn source(&self) -> Source {
        match self.config_source {
            SourceKind::File => Source::File,
            SourceKind::Command => Source::Command {
                executable: self.executable_path.clone(),
            },
        }
    }
}

/// What to register, and how to go about it; shared by the three engines.
#[derive(Debug, Clone, Args)]
pub struct RuntimeArgs {
    /// The name the engine knows the runtime by (`docker run --runtime=<name>`, a RuntimeClass handler).
    #[arg(long, alias = "nvidia-runtime-name", default_value = DEFAULT_RUNTIME_NAME,
          value_parser = NonEmptyStringValueParser::new())]
    pub runtime_name: String,
    /// The runtime executable the engine runs instead of runc.
    #[arg(long, alias = "nvidia-runtime-path", default_value = DEFAULT_RUNTIME_PATH,
          value_parser = NonEmptyStringValueParser::new(), conflicts_with = "undo")]
    pub runtime_path: String,
    /// Also make it the engine's default runtime.
    #[arg(long, alias = "nvidia-set-as-default", conflicts_with = "undo")]
    pub set_as_default: bool,
    /// Switch on the engine's CDI support too (docker `features.cdi`, containerd `enable_cdi`;
    /// CRI-O has it on already).
    #[arg(long, visible_alias = "enable-cdi", conflicts_with = "undo")]
    pub cdi_enabled: bool,
    /// Print the change as a diff and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove what configure added: the runtime entry (or the drop-in), and the default if it
    /// names the runtime.
    #[arg(long)]
    pub undo: bool,
    /// Restart the engine afterwards (`systemctl restart <engine>`); otherwise only print the command.
    #[arg(long)]
    pub restart: bool,
}

/// The edit an engine module makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action<'a> {
    /// Register `name` → `path` (replacing an entry of that name), make it the default if
    /// asked, and switch on the engine's CDI support if asked.
    Add {
        name: &'a str,
        path: &'a str,
        set_as_default: bool,
        cdi: bool,
    },
    /// Take out the entry `name`, and the default if it names it.
    Remove { name: &'a str },
}

/// What an engine module wants done with its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The file already says what was asked (or, for `--undo`, holds nothing of ours).
    Unchanged,
    /// Replace (or create) the file with this text.
    Write(String),
    /// Delete the file (a drop-in on `--undo`).
    Remove,
}

/// An engine module's answer: the outcome plus remarks for the user (printed as `note:` lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Edited {
    pub outcome: Outcome,
    pub notes: Vec<String>,
}

impl Edited {
    fn new(outcome: Outcome) -> Edited {
        Edited {
            outcome,
            notes: Vec::new(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigureError {
    /// Reading, backing up, writing or removing the engine's file (`files::write`).
    #[error(transparent)]
    File(#[from] WriteError),
    #[error(
        "{path} is not valid JSON: {reason} at line {line}, column {column}; fix it first, nothing was changed"
    )]
    InvalidJson {
        path: PathBuf,
        reason: String,
        line: usize,
        column: usize,
    },
    #[error(
        "{path} holds {found} at the top level, but docker reads an object ({{…}}); nothing was changed"
    )]
    JsonNotObject { path: PathBuf, found: &'static str },
    #[error("{path}: \"{key}\" is {found}, expected {expected}; nothing was changed")]
    JsonType {
        path: PathBuf,
        key: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error(
        "{path} is not valid TOML: {reason} at line {line}, column {column}; fix it first, nothing was changed"
    )]
    InvalidToml {
        path: PathBuf,
        reason: String,
        line: usize,
        column: usize,
    },
    #[error("{path}: `{key}` is {found}, expected {expected}; nothing was changed")]
    TomlType {
        path: PathBuf,
        key: String,
        found: &'static str,
        expected: &'static str,
    },
    #[error(
        "{path}: unsupported containerd config version {version} (supported: 1, 2, 3); nothing was changed"
    )]
    ContainerdVersion { path: PathBuf, version: String },
    #[error("cannot read {engine}'s config from the engine (--config-source=command): {reason}")]
    ConfigSource {
        engine: &'static str,
        reason: String,
    },
    #[error("{engine} takes no drop-in config (asked for {path}); it has one config file")]
    DropInUnsupported { engine: &'static str, path: PathBuf },
    #[error("{what} {path:?} is not an absolute path")]
    RelativePath { what: &'static str, path: String },
    #[error("cannot run `{command}`: {source}")]
    RestartSpawn {
        command: String,
        #[source]
        source: io::Error,
    },
    #[error(
        "`{command}` failed ({status}); the new config is in place, restart the engine by hand"
    )]
    RestartFailed { command: String, status: ExitStatus },
}

impl RuntimeArgs {
    fn request(&self, engine: EngineKind, config: PathBuf) -> Request {
        Request {
            engine,
            config,
            drop_in: None,
            source: Source::File,
            name: self.runtime_name.clone(),
            path: self.runtime_path.clone(),
            set_as_default: self.set_as_default,
            cdi: self.cdi_enabled,
            undo: self.undo,
            host_root: PathBuf::from("/"),
        }
    }
}

pub fn run(args: &ConfigureArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (request, runtime) = match &args.engine {
        Engine::Docker(a) => (
            a.runtime.request(EngineKind::Docker, a.config.clone()),
            &a.runtime,
        ),
        Engine::Containerd(a) => {
            let mut request = a.runtime.request(EngineKind::Containerd, a.config.clone());
            request.drop_in = a.drop_in_config.clone();
            request.source = a.source.source();
            (request, &a.runtime)
        }
        Engine::Crio(a) => {
            let mut request = a.runtime.request(EngineKind::Crio, a.config.clone());
            if !a.in_place {
                request.drop_in = Some(a.config_dir.join(crio::DROP_IN));
            }
            request.source = a.source.source();
            (request, &a.runtime)
        }
        Engine::OciHook(a) => return oci_hook_run(a, out),
    };
    configure(&request, runtime, out)
}

fn oci_hook_run(args: &OciHookArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let hook = args.hook_path.display().to_string();
    if !args.hook_path.is_absolute() {
        return Err(ConfigureError::RelativePath {
            what: "--hook-path",
            path: hook,
        }
        .into());
    }
    let json = oci_hook::hook_json(&hook);
    match &args.output {
        None => out.write_all(json.as_bytes())?,
        Some(file) => {
            let file = write::resolve(file);
            let existing = write::read(&file)?;
            write::replace(&file, json.as_bytes(), existing.as_ref(), false)?;
            writeln!(out, "wrote {}", file.display())?;
        }
    }
    Ok(())
}

fn configure(request: &Request, args: &RuntimeArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let plan = plan::plan(request)?;
    for note in &plan.notes {
        writeln!(out, "note: {note}")?;
    }
    if plan.is_empty() {
        let what = if request.undo {
            format!("holds nothing of runtime \"{}\"", request.name)
        } else {
            format!("already registers runtime \"{}\" as asked", request.name)
        };
        let first = plan.changes.first();
        let shown = match first {
            Some(c) if c.old_text().is_some() => c.file.display().to_string(),
            Some(c) => format!("{} (missing)", c.file.display()),
            None => request.config.display().to_string(),
        };
        writeln!(out, "{shown} {what}: nothing to do")?;
        return Ok(());
    }
    for change in &plan.changes {
        if matches!(change.outcome, Outcome::Unchanged) {
            continue;
        }
        let old_label = match change.old_text() {
            Some(_) => change.file.display().to_string(),
            None => "/dev/null".to_owned(),
        };
        let new_label = match change.outcome {
            Outcome::Remove => "/dev/null".to_owned(),
            _ => change.file.display().to_string(),
        };
        let old = change.old_text().unwrap_or("");
        let new = change.new_text().unwrap_or("");
        out.write_all(diff::unified(old, new, &old_label, &new_label).as_bytes())?;
    }

    let unit = plan.engine.unit();
    let restart = format!("systemctl restart {unit}");
    if args.dry_run {
        for change in &plan.changes {
            if !matches!(change.outcome, Outcome::Unchanged) {
                writeln!(out, "dry run: {} left as it is", change.file.display())?;
            }
        }
        if args.restart {
            writeln!(out, "dry run: would run `{restart}`")?;
        }
        return Ok(());
    }

    for done in plan::commit(&plan)? {
        match (&done.backup, done.removed) {
            (_, true) => writeln!(out, "removed {}", done.file.display())?,
            (Some(b), false) => writeln!(
                out,
                "wrote {} (the previous version is in {})",
                done.file.display(),
                b.display()
            )?,
            (None, false) => writeln!(out, "wrote {}", done.file.display())?,
        }
    }

    if args.restart {
        writeln!(out, "running `{restart}`")?;
        out.flush()?;
        run_restart(unit, &restart)?;
    } else {
        writeln!(
            out,
            "{} reads this file only when it starts: run `{restart}` to apply",
            plan.engine.display()
        )?;
    }
    Ok(())
}

fn run_restart(unit: &str, command: &str) -> Result<(), ConfigureError> {
    let status = Command::new("systemctl")
        .args(["restart", unit])
        .status()
        .map_err(|source| ConfigureError::RestartSpawn {
            command: command.to_owned(),
            source,
        })?;
    if !status.success() {
        return Err(ConfigureError::RestartFailed {
            command: command.to_owned(),
            status,
        });
    }
    Ok(())
}

//! `nvshim configure docker|containerd|crio`: registers the NVIDIA runtime in a container
//! engine's config file, or takes it out again (`--undo`).
//!
//! Each engine module is a pure text transform (old file → new file) that keeps everything it
//! does not own: docker's other keys in their order, containerd's comments and unrelated tables.
//! This module runs the one flow around them: read, transform, print a diff, write atomically
//! with a backup (unless `--dry-run`), then print — or with `--restart` run — the command that
//! makes the engine read the file. A file we cannot parse is refused and left byte-identical:
//! an engine that cannot read its config does not start.
//!
//! What we write matches `nvidia-ctk runtime configure`: the same keys and values, so tools that
//! look for NVIDIA's entries find ours. Where we differ (containerd's built-in `runc` declared
//! explicitly, an existing entry updated in place) the engine module says why.

pub(crate) mod containerd;
pub(crate) mod crio;
mod diff;
mod docker;

#[cfg(test)]
mod containerd_tests;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus};

use clap::builder::NonEmptyStringValueParser;
use clap::{Args, Subcommand};

use super::CliError;
use crate::files::write::{self, WriteError};

/// Where `nvidia-ctk` points engines by default: the NVIDIA runtime's install path.
pub const DEFAULT_RUNTIME_PATH: &str = "/usr/bin/nvidia-container-runtime";
/// The runtime name NVIDIA registers, and the one `docker run --runtime=nvidia` expects.
pub const DEFAULT_RUNTIME_NAME: &str = "nvidia";
pub const DOCKER_CONFIG: &str = "/etc/docker/daemon.json";
pub const CONTAINERD_CONFIG: &str = "/etc/containerd/config.toml";
pub const CRIO_CONFIG_DIR: &str = "/etc/crio/crio.conf.d";

#[derive(Debug, Args)]
pub struct ConfigureArgs {
    #[command(subcommand)]
    pub engine: Engine,
}

#[derive(Debug, Subcommand)]
pub enum Engine {
    /// Add the runtime to docker's daemon.json (`runtimes.<name>`, optionally `default-runtime`).
    Docker(DockerArgs),
    /// Add the runtime to containerd's config.toml (version 2 or 3) for the CRI plugin.
    Containerd(ContainerdArgs),
    /// Write a CRI-O drop-in (`99-nvidia.toml`) that registers the runtime.
    Crio(CrioArgs),
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
    #[command(flatten)]
    pub runtime: RuntimeArgs,
}

#[derive(Debug, Args)]
pub struct CrioArgs {
    /// CRI-O's drop-in directory; the drop-in written there is `99-nvidia.toml`.
    #[arg(long, default_value = CRIO_CONFIG_DIR)]
    pub config_dir: PathBuf,
    #[command(flatten)]
    pub runtime: RuntimeArgs,
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
    #[arg(long, conflicts_with = "undo")]
    pub set_as_default: bool,
    /// Print the change as a diff and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Remove what configure added: the runtime entry, and the default if it names the runtime.
    #[arg(long)]
    pub undo: bool,
    /// Restart the engine afterwards (`systemctl restart <engine>`); otherwise only print the command.
    #[arg(long)]
    pub restart: bool,
}

impl RuntimeArgs {
    fn action(&self) -> Action<'_> {
        if self.undo {
            Action::Remove {
                name: &self.runtime_name,
            }
        } else {
            Action::Add {
                name: &self.runtime_name,
                path: &self.runtime_path,
                set_as_default: self.set_as_default,
            }
        }
    }
}

/// The edit an engine module makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action<'a> {
    /// Register `name` → `path` (replacing an entry of that name), and make it the default if asked.
    Add {
        name: &'a str,
        path: &'a str,
        set_as_default: bool,
    },
    /// Take out the entry `name`, and the default if it names it.
    Remove { name: &'a str },
}

/// What an engine module wants done with its file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// The file already says what was asked (or, for `--undo`, holds nothing of ours).
    Unchanged,
    /// Replace (or create) the file with this text.
    Write(String),
    /// Delete the file (CRI-O's drop-in on `--undo`).
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
        "{path} is a containerd config version 1 ({why}); nvshim edits versions 2 and 3 only: \
         convert it first (containerd 2.x: `containerd config migrate`; containerd 1.x: \
         compare with `containerd config default`, which prints version 2), nothing was changed"
    )]
    ContainerdV1 { path: PathBuf, why: &'static str },
    #[error(
        "{path}: unsupported containerd config version {version} (supported: 2, 3); nothing was changed"
    )]
    ContainerdVersion { path: PathBuf, version: String },
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

/// One engine, resolved: which file, what it is called, how to restart it.
struct Target<'a> {
    /// The engine as the user knows it (`docker`, `containerd`, `CRI-O`).
    engine: &'static str,
    /// Its systemd unit.
    unit: &'static str,
    file: PathBuf,
    /// Whether a `<file>.bak` is kept. Not for CRI-O: it reads every file in its drop-in
    /// directory, so a backup there would be loaded too.
    backup: bool,
    args: &'a RuntimeArgs,
}

pub fn run(args: &ConfigureArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let target = match &args.engine {
        Engine::Docker(a) => Target {
            engine: "docker",
            unit: "docker",
            file: a.config.clone(),
            backup: true,
            args: &a.runtime,
        },
        Engine::Containerd(a) => Target {
            engine: "containerd",
            unit: "containerd",
            file: a.config.clone(),
            backup: true,
            args: &a.runtime,
        },
        Engine::Crio(a) => Target {
            engine: "CRI-O",
            unit: "crio",
            file: a.config_dir.join(crio::DROP_IN),
            backup: false,
            args: &a.runtime,
        },
    };
    configure(&target, &args.engine, out)
}

fn configure(target: &Target<'_>, engine: &Engine, out: &mut dyn Write) -> Result<(), CliError> {
    let args = target.args;
    let file = write::resolve(&target.file);
    let existing = write::read(&file)?;
    let old = existing.as_ref().map(|e| e.text.as_str());
    let action = args.action();
    let edited = match engine {
        Engine::Docker(_) => docker::edit(old, &file, action)?,
        Engine::Containerd(_) => containerd::edit(old, &file, action)?,
        Engine::Crio(_) => crio::edit(old, action),
    };
    let mut notes = edited.notes;
    if let Action::Add { path, .. } = action
        && Path::new(path).is_absolute()
        && !Path::new(path).exists()
    {
        notes.push(format!(
            "{path} does not exist (yet): {} will fail to start containers with this runtime until it does",
            target.engine
        ));
    }
    for note in &notes {
        writeln!(out, "note: {note}")?;
    }

    let new = match &edited.outcome {
        Outcome::Unchanged => {
            let what = match action {
                Action::Add { name, .. } => {
                    format!("already registers runtime \"{name}\" as asked")
                }
                Action::Remove { name } => format!("holds nothing of runtime \"{name}\""),
            };
            let shown = if existing.is_some() {
                file.display().to_string()
            } else {
                format!("{} (missing)", file.display())
            };
            writeln!(out, "{shown} {what}: nothing to do")?;
            return Ok(());
        }
        Outcome::Write(text) => text.as_str(),
        Outcome::Remove => "",
    };
    let old_label = match existing {
        Some(_) => file.display().to_string(),
        None => "/dev/null".to_owned(),
    };
    let new_label = match edited.outcome {
        Outcome::Remove => "/dev/null".to_owned(),
        _ => file.display().to_string(),
    };
    out.write_all(diff::unified(old.unwrap_or(""), new, &old_label, &new_label).as_bytes())?;

    let restart = format!("systemctl restart {}", target.unit);
    if args.dry_run {
        writeln!(out, "dry run: {} left as it is", file.display())?;
        if args.restart {
            writeln!(out, "dry run: would run `{restart}`")?;
        }
        return Ok(());
    }

    match &edited.outcome {
        Outcome::Write(text) => {
            let backup = write::replace(&file, text.as_bytes(), existing.as_ref(), target.backup)?;
            match backup {
                Some(b) => writeln!(
                    out,
                    "wrote {} (the previous version is in {})",
                    file.display(),
                    b.display()
                )?,
                None => writeln!(out, "wrote {}", file.display())?,
            }
        }
        Outcome::Remove => {
            write::remove(&file)?;
            writeln!(out, "removed {}", file.display())?;
        }
        Outcome::Unchanged => {}
    }

    if args.restart {
        writeln!(out, "running `{restart}`")?;
        out.flush()?;
        run_restart(target.unit, &restart)?;
    } else {
        writeln!(
            out,
            "{} reads this file only when it starts: run `{restart}` to apply",
            target.engine
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

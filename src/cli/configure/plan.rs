//! The one configure flow both front ends run (`nvshim configure`, `nvidia-ctk runtime
//! configure`): a [`Request`] is turned into a [`Plan`] — which files change and how, read and
//! computed but nothing written — and [`commit`] writes it. Each front end prints the plan its
//! own way (a diff, or NVIDIA's `--dry-run` output) between the two.
//!
//! Where the engine's current settings come from is the [`Source`]: the config file, or (as
//! `nvidia-ctk --config-source=command` does) the engine's own view of its merged config,
//! `containerd config dump` or `crio status config`.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Action, ConfigureError, Outcome, containerd, crio, docker};
use crate::files::write::{self, Existing};

/// The container engines configure knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    Docker,
    Containerd,
    Crio,
}

impl EngineKind {
    /// The engine as the user knows it.
    pub fn display(self) -> &'static str {
        match self {
            EngineKind::Docker => "docker",
            EngineKind::Containerd => "containerd",
            EngineKind::Crio => "CRI-O",
        }
    }

    /// Its systemd unit.
    pub fn unit(self) -> &'static str {
        match self {
            EngineKind::Docker => "docker",
            EngineKind::Containerd => "containerd",
            EngineKind::Crio => "crio",
        }
    }
}

/// Where the engine's current settings are read from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Source {
    /// The config file (`Request::config`).
    #[default]
    File,
    /// The engine's merged config as its binary prints it (`executable`, else `containerd` /
    /// `crio` from `PATH`).
    Command { executable: Option<PathBuf> },
}

/// What to configure, resolved by a front end.
#[derive(Debug, Clone)]
pub struct Request {
    pub engine: EngineKind,
    /// The engine's main config file.
    pub config: PathBuf,
    /// Write the runtime to this drop-in instead of `config` (containerd, CRI-O).
    pub drop_in: Option<PathBuf>,
    pub source: Source,
    pub name: String,
    pub path: String,
    pub set_as_default: bool,
    /// Switch on the engine's CDI support (docker `features.cdi`, containerd `enable_cdi`).
    pub cdi: bool,
    /// Take out what configure added instead.
    pub undo: bool,
    /// Where the host's `/` is (`/` but for `nvshim install` in a container): `config`,
    /// `drop_in` and `path` are host paths, read and written under this root, and what is
    /// written into the files (an `imports` pattern) names host paths.
    pub host_root: PathBuf,
}

impl Request {
    fn action(&self) -> Action<'_> {
        if self.undo {
            Action::Remove { name: &self.name }
        } else {
            Action::Add {
                name: &self.name,
                path: &self.path,
                set_as_default: self.set_as_default,
                cdi: self.cdi,
            }
        }
    }
}

/// One file of a plan.
#[derive(Debug)]
pub struct Change {
    /// The file, symlinks resolved (the link itself stays).
    pub file: PathBuf,
    existing: Option<Existing>,
    pub outcome: Outcome,
    /// Whether a `<file>.bak` is kept. Not for drop-ins: the engine loads every file of a
    /// drop-in directory, a backup there included.
    backup: bool,
}

impl Change {
    fn new(file: PathBuf, existing: Option<Existing>, outcome: Outcome, backup: bool) -> Change {
        // A transform that computed the text the file already has changes nothing.
        let outcome = match outcome {
            Outcome::Write(text) if existing.as_ref().is_some_and(|e| e.text == text) => {
                Outcome::Unchanged
            }
            other => other,
        };
        Change {
            file,
            existing,
            outcome,
            backup,
        }
    }

    /// The file's text now; `None` when it does not exist.
    pub fn old_text(&self) -> Option<&str> {
        self.existing.as_ref().map(|e| e.text.as_str())
    }

    /// The file's text after the change; `None` when the change removes it or leaves it.
    pub fn new_text(&self) -> Option<&str> {
        match &self.outcome {
            Outcome::Write(text) => Some(text),
            _ => None,
        }
    }
}

/// What configure would do: the files it changes (the one holding the runtime first), and
/// remarks for the user.
#[derive(Debug)]
pub struct Plan {
    pub engine: EngineKind,
    pub changes: Vec<Change>,
    pub notes: Vec<String>,
}

impl Plan {
    /// True when no file changes.
    pub fn is_empty(&self) -> bool {
        self.changes
            .iter()
            .all(|c| matches!(c.outcome, Outcome::Unchanged))
    }
}

/// A file [`commit`] wrote or removed.
#[derive(Debug)]
pub struct Committed {
    pub file: PathBuf,
    /// Where the previous version was kept.
    pub backup: Option<PathBuf>,
    pub removed: bool,
}

/// Reads what `request` needs and computes every file's new content; writes nothing.
pub fn plan(request: &Request) -> Result<Plan, ConfigureError> {
    let action = request.action();
    let config = resolve_under(&request.host_root, &request.config);
    let existing = write::read(&config)?;
    let mut notes = Vec::new();
    let mut changes = Vec::new();
    match request.engine {
        EngineKind::Docker => {
            if let Some(d) = &request.drop_in {
                return Err(ConfigureError::DropInUnsupported {
                    engine: "docker",
                    path: d.clone(),
                });
            }
            let old = existing.as_ref().map(|e| e.text.as_str());
            let edited = docker::edit(old, &config, action)?;
            notes.extend(edited.notes);
            changes.push(Change::new(config, existing, edited.outcome, true));
        }
        EngineKind::Containerd => {
            containerd_plan(request, config, existing, &mut changes, &mut notes)?;
        }
        EngineKind::Crio => {
            let (source, label) = source_text(request, existing.as_ref(), &config)?;
            match &request.drop_in {
                Some(d) => {
                    let file = resolve_under(&request.host_root, d);
                    let old = write::read(&file)?;
                    let text = old.as_ref().map(|e| e.text.as_str());
                    let edited = crio::drop_in(source.as_deref(), &label, text, action)?;
                    changes.push(Change::new(file, old, edited.outcome, false));
                }
                None => {
                    let base = in_place_base(request, existing.as_ref(), source);
                    let edited = crio::edit(base.as_deref(), &config, action)?;
                    changes.push(Change::new(config, existing, edited.outcome, true));
                }
            }
        }
    }
    if let Action::Add { path, .. } = action
        && Path::new(path).is_absolute()
        && !under_root(&request.host_root, Path::new(path)).exists()
    {
        notes.push(format!(
            "{path} does not exist (yet): {} will fail to start containers with this runtime until it does",
            request.engine.display()
        ));
    }
    Ok(Plan {
        engine: request.engine,
        changes,
        notes,
    })
}

fn containerd_plan(
    request: &Request,
    config: PathBuf,
    existing: Option<Existing>,
    changes: &mut Vec<Change>,
    notes: &mut Vec<String>,
) -> Result<(), ConfigureError> {
    let action = request.action();
    let (source, label) = source_text(request, existing.as_ref(), &config)?;
    let schema = containerd::schema(source.as_deref(), &label)?;
    let drop_in = match (&request.drop_in, schema) {
        (Some(d), containerd::Schema::V1) => {
            notes.push(format!(
                "{} is a version 1 config, which takes no drop-ins: editing it in place instead of writing {}",
                label.display(),
                d.display()
            ));
            None
        }
        (d, _) => d.as_ref(),
    };
    let Some(drop_in) = drop_in else {
        let base = in_place_base(request, existing.as_ref(), source);
        let edited = containerd::edit(base.as_deref(), &config, action)?;
        notes.extend(edited.notes);
        changes.push(Change::new(config, existing, edited.outcome, true));
        return Ok(());
    };
    let file = resolve_under(&request.host_root, drop_in);
    let old = write::read(&file)?;
    // The pattern containerd reads names the host's path, not ours under the host root.
    let pattern = containerd::import_pattern(&host_view(&request.host_root, &file));
    let top = existing.as_ref().map(|e| e.text.as_str());
    if request.undo {
        let outcome = if old.is_some() {
            Outcome::Remove
        } else {
            Outcome::Unchanged
        };
        // The import stays while another file there still needs it.
        let others = other_toml_files(&file);
        let import = if others {
            Outcome::Unchanged
        } else {
            containerd::remove_import(top, &config, &pattern)?.outcome
        };
        changes.push(Change::new(file, old, outcome, false));
        changes.push(Change::new(config, existing, import, true));
        return Ok(());
    }
    let text = old.as_ref().map(|e| e.text.as_str());
    let dumped = matches!(request.source, Source::Command { .. });
    // The drop-in's header comment names the file it took the CRI settings from: as the
    // host's admin reads it, not as this process sees it under the host root.
    let host_label = host_view(&request.host_root, &label);
    let edited = containerd::drop_in(source.as_deref(), &host_label, dumped, text, &file, action)?;
    notes.extend(edited.notes);
    let import = containerd::add_import(top, &config, &pattern, schema.version())?;
    changes.push(Change::new(file, old, edited.outcome, false));
    changes.push(Change::new(config, existing, import.outcome, true));
    Ok(())
}

/// `path` as the host names it: without the `root` prefix it has here (unchanged when it is
/// not under `root`, e.g. a command's label).
fn host_view(root: &Path, path: &Path) -> PathBuf {
    path.strip_prefix(root)
        .map_or_else(|_| path.to_path_buf(), |rel| Path::new("/").join(rel))
}

/// The text an in-place edit starts from: the engine's dump with `--config-source=command`
/// (NVIDIA writes the dumped config back), the file otherwise and for `--undo`.
fn in_place_base(
    request: &Request,
    existing: Option<&Existing>,
    source: Option<String>,
) -> Option<String> {
    match request.source {
        Source::Command { .. } if !request.undo => source,
        _ => existing.map(|e| e.text.clone()),
    }
}

/// Whether the drop-in's directory holds `.toml` files besides the drop-in.
fn other_toml_files(drop_in: &Path) -> bool {
    let (Some(dir), Some(name)) = (drop_in.parent(), drop_in.file_name()) else {
        return false;
    };
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name();
            n != name && Path::new(&n).extension().is_some_and(|x| x == "toml")
        })
    })
}

/// The engine's current settings as text, with what to call them in messages.
fn source_text(
    request: &Request,
    existing: Option<&Existing>,
    config: &Path,
) -> Result<(Option<String>, PathBuf), ConfigureError> {
    let Source::Command { executable } = &request.source else {
        return Ok((existing.map(|e| e.text.clone()), config.to_path_buf()));
    };
    let exe = |default: &str| {
        executable
            .as_ref()
            .map_or_else(|| default.to_owned(), |p| p.display().to_string())
    };
    let attempts: Vec<Vec<String>> = match request.engine {
        EngineKind::Containerd => vec![vec![
            exe("containerd"),
            "--config".to_owned(),
            config.display().to_string(),
            "config".to_owned(),
            "dump".to_owned(),
        ]],
        // NVIDIA's order: `crio status config`, then the older `crio-status config`.
        EngineKind::Crio => vec![
            vec![exe("crio"), "status".to_owned(), "config".to_owned()],
            vec!["crio-status".to_owned(), "config".to_owned()],
        ],
        EngineKind::Docker => return Ok((existing.map(|e| e.text.clone()), config.into())),
    };
    let mut failures = Vec::new();
    for argv in &attempts {
        let shown = argv.join(" ");
        match run_source(argv) {
            Ok(text) => return Ok((Some(text), PathBuf::from(format!("`{shown}`")))),
            Err(why) => failures.push(format!("`{shown}`: {why}")),
        }
    }
    Err(ConfigureError::ConfigSource {
        engine: request.engine.display(),
        reason: failures.join("; "),
    })
}

fn run_source(argv: &[String]) -> Result<String, String> {
    let (program, args) = argv.split_first().ok_or("no command")?;
    let out = Command::new(program)
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let last = stderr.lines().last().unwrap_or("").trim();
        return Err(format!("{} ({last})", out.status));
    }
    String::from_utf8(out.stdout).map_err(|_| "printed something that is not UTF-8".to_owned())
}

/// `path` (a host path) as seen from here: under `root`.
pub fn under_root(root: &Path, path: &Path) -> PathBuf {
    match path.strip_prefix("/") {
        Ok(rel) => root.join(rel),
        Err(_) => root.join(path),
    }
}

/// How many symlinks [`resolve_under`] follows before it gives up and uses the path as is.
const MAX_LINKS: usize = 40;

/// The file the host path `path` names under `root`, its symlinks followed as the host
/// would follow them: an absolute target is a host path too, so it stays under `root`
/// (`canonicalize` here would leave the host root). With `root` = `/` this is
/// [`write::resolve`].
pub fn resolve_under(root: &Path, path: &Path) -> PathBuf {
    if root == Path::new("/") {
        return write::resolve(path);
    }
    let mut host = path.to_path_buf();
    for _ in 0..MAX_LINKS {
        let here = under_root(root, &host);
        let Ok(target) = std::fs::read_link(&here) else {
            return here;
        };
        host = if target.is_absolute() {
            target
        } else {
            host.parent().unwrap_or(Path::new("/")).join(target)
        };
    }
    under_root(root, &host)
}

/// Writes (or removes) every changed file of `plan`, atomically, in order, keeping a
/// `<file>.bak` of a main config it replaces.
pub fn commit(plan: &Plan) -> Result<Vec<Committed>, ConfigureError> {
    commit_with(plan, Backups::Keep)
}

/// Whether [`commit_with`] keeps a `<file>.bak` of the main config files it replaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backups {
    Keep,
    /// None: `nvshim install` keeps the original bytes in its own state file, and must
    /// leave nothing behind after its undo.
    Skip,
}

/// [`commit`], with or without backups.
pub fn commit_with(plan: &Plan, backups: Backups) -> Result<Vec<Committed>, ConfigureError> {
    let mut done = Vec::new();
    for change in &plan.changes {
        match &change.outcome {
            Outcome::Unchanged => {}
            Outcome::Write(text) => {
                let backup = write::replace(
                    &change.file,
                    text.as_bytes(),
                    change.existing.as_ref(),
                    change.backup && backups == Backups::Keep,
                )?;
                done.push(Committed {
                    file: change.file.clone(),
                    backup,
                    removed: false,
                });
            }
            Outcome::Remove => {
                write::remove(&change.file)?;
                done.push(Committed {
                    file: change.file.clone(),
                    backup: None,
                    removed: true,
                });
            }
        }
    }
    Ok(done)
}

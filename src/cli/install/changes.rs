// SPDX-License-Identifier: Apache-2.0
//! The text files an install writes on the host (the engine's config and drop-in,
//! config.toml, the ready file): each change is recorded in the [`State`] before it is
//! made, and undone from the record: a file that still holds what the install wrote gets
//! its original bytes back (or goes, if it did not exist); an engine file someone edited
//! since gets `nvshim configure --undo`'s transform instead, and the undo says so.

use std::path::{Path, PathBuf};

use super::args::Place;
use super::layout::create_dirs;
use super::state::State;
use super::{InstallError, save_state};
use crate::cli::configure::{self, Backups, EngineKind, Outcome, Request, Source};
use crate::files::write;

/// The host path of `here` (a path under the host root).
pub fn host_path(place: &Place, here: &Path) -> PathBuf {
    super::layout::on_host(&place.host_root, here)
}

/// The configure request for the engine the state names.
pub fn engine_request(place: &Place, state: &State, undo: bool) -> Result<Request, InstallError> {
    let engine = match state.engine.as_str() {
        "docker" => EngineKind::Docker,
        "containerd" => EngineKind::Containerd,
        "crio" => EngineKind::Crio,
        other => {
            return Err(InstallError::BadValue {
                what: "the state file's engine".to_owned(),
                value: other.to_owned(),
                valid: "docker, containerd, crio",
            });
        }
    };
    Ok(Request {
        engine,
        config: state.config.clone(),
        drop_in: state.drop_in.clone(),
        source: Source::File,
        name: state.runtime_name.clone(),
        path: state.runtime_path.display().to_string(),
        set_as_default: state.set_as_default,
        cdi: state.cdi,
        undo,
        host_root: place.host_root.clone(),
    })
}

/// Registers the runtime with the engine: plans the change, records it, writes it (no
/// `.bak`: the state file holds the originals). Returns configure's notes and whether
/// a file changed.
pub fn configure_engine(
    place: &Place,
    state: &mut State,
    state_file: &Path,
) -> Result<(Vec<String>, bool), InstallError> {
    let request = engine_request(place, state, false)?;
    let plan = configure::plan(&request)?;
    if plan.is_empty() {
        return Ok((plan.notes, false));
    }
    for change in &plan.changes {
        if matches!(change.outcome, Outcome::Unchanged) {
            continue;
        }
        if let (Some(dir), Outcome::Write(_)) = (change.file.parent(), &change.outcome) {
            create_dirs(&place.host_root, dir, state)?;
        }
        let host = host_path(place, &change.file);
        state.record(&host, change.old_text(), change.new_text());
        mark_engine(state, &host);
    }
    save_state(state_file, state)?;
    configure::commit_with(&plan, Backups::Skip)?;
    Ok((plan.notes, true))
}

fn mark_engine(state: &mut State, host: &Path) {
    if !state.engine_files.iter().any(|f| f == host) {
        state.engine_files.push(host.to_path_buf());
    }
}

/// Writes `text` to the host file `host` (creating its directories), recorded first.
pub fn write_recorded(
    place: &Place,
    state: &mut State,
    state_file: &Path,
    host: &Path,
    text: &str,
) -> Result<bool, InstallError> {
    let here = place.host(host);
    let existing = write::read(&here)?;
    if existing.as_ref().is_some_and(|e| e.text == text) && state.file(host).is_some() {
        return Ok(false);
    }
    if let Some(dir) = here.parent() {
        create_dirs(&place.host_root, dir, state)?;
    }
    state.record(host, existing.as_ref().map(|e| e.text.as_str()), Some(text));
    save_state(state_file, state)?;
    write::replace(&here, text.as_bytes(), existing.as_ref(), false)?;
    Ok(true)
}

/// What undoing the files did.
#[derive(Debug, Default)]
pub struct Undone {
    /// Remarks for the user (files edited since, left or transformed).
    pub notes: Vec<String>,
    /// Whether an engine file changed (the engine then needs a restart).
    pub engine_changed: bool,
}

/// Puts every recorded file back, the last recorded (the ready file) first.
pub fn undo_files(place: &Place, state: &State) -> Result<Undone, InstallError> {
    let mut undone = Undone::default();
    let mut edited_engine = false;
    for record in state.files.iter().rev() {
        let here = place.host(&record.path);
        let current = write::read(&here)?;
        let is_engine = state.engine_files.contains(&record.path);
        let untouched = current.as_ref().map(|e| e.text.as_str()) == record.written.as_deref();
        if !untouched {
            if is_engine {
                edited_engine = true;
            } else {
                undone.notes.push(format!(
                    "{} was changed since the install: left as it is",
                    record.path.display()
                ));
            }
            continue;
        }
        match (&record.original, &current) {
            (Some(original), _) => {
                write::replace(&here, original.as_bytes(), current.as_ref(), false)?;
            }
            (None, Some(_)) => write::remove(&here)?,
            (None, None) => {}
        }
        undone.engine_changed |= is_engine;
    }
    if edited_engine {
        let request = engine_request(place, state, true)?;
        let plan = configure::plan(&request)?;
        undone.notes.push(format!(
            "{}'s config was edited since the install: took runtime \"{}\" out of it instead of restoring its bytes",
            plan.engine.display(),
            state.runtime_name
        ));
        undone.notes.extend(plan.notes.iter().cloned());
        if !plan.is_empty() {
            configure::commit_with(&plan, Backups::Skip)?;
            undone.engine_changed = true;
        }
    }
    Ok(undone)
}

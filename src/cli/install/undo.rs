// SPDX-License-Identifier: Apache-2.0
//! The undo of an install (the daemon's on SIGTERM, and `nvshim uninstall`): every recorded
//! file back, the engine restarted if its config changed, and the binaries gone once no
//! container runs through them any more ([`drain`]); with CRI-O, whose containers are
//! stopped only through the runtime they were created with, that wait comes first.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::state::{self, State};
use super::{
    InstallError, Place, RestartMode, changes, drain, engine_name, layout, restart, save_state,
    state_file,
};
use crate::cli::configure::EngineKind;

/// What the undo may change of the recorded way to restart the engine, and where it looks
/// for the host's processes (CRI-O's container monitors; default `/proc`).
#[derive(Debug, Clone, Default)]
pub struct RestartOverride {
    pub mode: Option<RestartMode>,
    pub socket: Option<PathBuf>,
    pub proc: Option<PathBuf>,
}

/// Undoes the install at `place`: every recorded file back, the engine restarted if its
/// config changed, the binaries and directories gone. `owner`: only if the record is
/// still this install's (the daemon); returns `None` then when another owns it.
///
/// Before the binaries go, it waits until no container's shim runs them any more
/// ([`drain`]), for at most `drain_bound` from the start of the undo; containers still
/// there then keep the binaries, and a record of them only.
pub fn uninstall(
    place: &Place,
    owner: Option<&str>,
    overrides: &RestartOverride,
    drain_bound: Duration,
) -> Result<Option<Vec<String>>, InstallError> {
    let deadline = Instant::now() + drain_bound;
    let file = state_file(place);
    let Some(state) = state::load(&file)? else {
        return Ok(Some(vec![format!(
            "nothing to undo: no install record {}",
            changes::host_path(place, &file).display()
        )]));
    };
    if let Some(me) = owner
        && state.owner != me
    {
        return Ok(None);
    }
    let mut lines = Vec::new();
    // A new install during a wait (the chart installed again) owns the record, and what it
    // names, from then on.
    let mut taken_over = || match state::load(&file) {
        Ok(Some(now)) => now.owner != state.owner,
        Ok(None) => true,
        // An unreadable record is nobody else's: the wait goes on.
        Err(_) => false,
    };
    // CRI-O stops a container only through the runtime handler it was created with: its
    // containers of the runtime must go before the handler does.
    if registers_crio_runtime(&state) {
        let proc = overrides.proc.as_deref().unwrap_or(Path::new(PROC));
        match drain::wait_for(
            &mut || drain::conmon_holders(proc, &place.toolkit_dir),
            &place.toolkit_dir,
            deadline,
            &mut taken_over,
        ) {
            drain::Drained::Gone { held: 0, .. } => {}
            drain::Drained::Gone { held, waited } => lines.push(format!(
                "waited {:.1}s for {held} CRI-O container(s) of runtime \"{}\" to go before removing it",
                waited.as_secs_f64(),
                state.runtime_name
            )),
            drain::Drained::Held(ids) => {
                lines.push(format!(
                    "note: {} CRI-O container(s) still run through runtime \"{}\" ({}): left the install as it is (CRI-O stops a container only through the runtime it was created with); once they are gone, `{}/nvshim uninstall` undoes it",
                    ids.len(),
                    state.runtime_name,
                    ids[..ids.len().min(IDS_SHOWN)].join(", "),
                    place.toolkit_dir.display()
                ));
                return Ok(Some(lines));
            }
            drain::Drained::TakenOver => {
                lines.push(format!(
                    "another install took over {} during the undo: leaving everything to it",
                    place.toolkit_dir.display()
                ));
                return Ok(Some(lines));
            }
        }
    }
    let undone = changes::undo_files(place, &state)?;
    lines.extend(undone.notes.iter().map(|n| format!("note: {n}")));
    if undone.engine_changed {
        let request = changes::engine_request(place, &state, true)?;
        let socket = overrides.socket.as_ref().unwrap_or(&state.socket);
        let socket = restart::socket_here(&place.host_root, socket);
        let mode = overrides.mode.unwrap_or(state.restart);
        lines.push(restart::restart(
            request.engine,
            mode,
            &socket,
            &place.host_root,
            None,
        )?);
    }
    // The engine no longer starts containers with the runtime; the ones it started
    // still need its binaries to be stopped.
    let sockets = [state.socket.as_path()]
        .into_iter()
        .chain(overrides.socket.as_deref());
    match drain::wait(
        &place.host_root,
        &place.toolkit_dir,
        &drain::task_dirs(sockets),
        deadline,
        &mut taken_over,
    ) {
        drain::Drained::Gone { held: 0, .. } => {}
        drain::Drained::Gone { held, waited } => lines.push(format!(
            "waited {:.1}s for {held} container(s) that ran through the runtime to go",
            waited.as_secs_f64()
        )),
        drain::Drained::Held(ids) => {
            keep_binaries(place, &file, &state, &ids, &mut lines)?;
            return Ok(Some(lines));
        }
        drain::Drained::TakenOver => {
            lines.push(format!(
                "another install took over {} during the undo: leaving the binaries to it",
                place.toolkit_dir.display()
            ));
            return Ok(Some(lines));
        }
    }
    let toolkit = place.host(&place.toolkit_dir);
    layout::remove(&place.host_root, &toolkit, &state)?;
    std::fs::remove_file(&file).map_err(|source| InstallError::Io {
        what: "remove",
        path: file.clone(),
        source,
    })?;
    for dir in state.dirs.iter().rev() {
        match std::fs::remove_dir(place.host(dir)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => lines.push(format!("note: left {} ({e})", dir.display())),
        }
    }
    lines.push(format!("uninstalled from {}", place.toolkit_dir.display()));
    Ok(Some(lines))
}

/// Where the host's processes are: the installer pod has the host's PID namespace.
const PROC: &str = "/proc";

/// Whether the install registered a runtime with CRI-O (not only its OCI hook).
pub(super) fn registers_crio_runtime(state: &State) -> bool {
    state.engine == engine_name(EngineKind::Crio)
        && state
            .engine_files
            .iter()
            .any(|f| Some(f) == state.drop_in.as_ref() || *f == state.config)
}

/// How many container ids the undo names when they keep the binaries.
const IDS_SHOWN: usize = 3;

/// The end of an undo when containers (`ids`) still run the toolkit's binaries: the
/// binaries stay, with the files that were in their way still moved aside, and so does a
/// record of just those: no owner and no files (the undo has put them back), the
/// directories the install created that are not empty. A later `nvshim uninstall` finishes
/// the undo from it; a later install takes it over like any record, and records the
/// files afresh from the originals the undo put back.
fn keep_binaries(
    place: &Place,
    file: &Path,
    state: &State,
    ids: &[String],
    lines: &mut Vec<String>,
) -> Result<(), InstallError> {
    let mut left = State {
        owner: String::new(),
        files: Vec::new(),
        engine_files: Vec::new(),
        ..state.clone()
    };
    save_state(file, &left)?;
    let mut dirs = Vec::new();
    for dir in state.dirs.iter().rev() {
        match std::fs::remove_dir(place.host(dir)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => dirs.push(dir.clone()),
            Err(e) => {
                lines.push(format!("note: left {} ({e})", dir.display()));
                dirs.push(dir.clone());
            }
        }
    }
    dirs.reverse();
    if dirs != left.dirs {
        left.dirs = dirs;
        save_state(file, &left)?;
    }
    let mut shown = ids[..ids.len().min(IDS_SHOWN)].join(", ");
    if ids.len() > IDS_SHOWN {
        shown.push_str(", …");
    }
    let toolkit = place.toolkit_dir.display();
    lines.push(format!(
        "note: {} container(s) still run through the runtime in {toolkit} ({shown}): left its binaries; once they are gone, `{toolkit}/nvshim uninstall` takes them out (or remove the directory)",
        ids.len()
    ));
    lines.push(format!("uninstalled from {toolkit} but for its binaries"));
    Ok(())
}

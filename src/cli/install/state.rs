// SPDX-License-Identifier: Apache-2.0
//! The install's record, `<toolkit-dir>/.nvshim-install.json` on the host: who owns the
//! install (the last `nvshim install` to run), how the engine was configured, and for
//! every file the install changed its bytes before (or that it did not exist) and the
//! bytes written, so that the undo can put back exactly what was there. Written
//! atomically (`files::write`) before the changes it describes are made.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::InstallError;
use super::args::RestartMode;
use crate::files::write::{self, Durability};

/// The state file's name in the toolkit directory.
pub const STATE_FILE: &str = ".nvshim-install.json";
/// The state file's format; a file of another version is refused, not guessed at.
pub const STATE_VERSION: u32 = 1;

/// What the install did, in host paths.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct State {
    pub version: u32,
    /// The install that owns this record (`<pid>-<nanoseconds>`): an older daemon that
    /// finds another owner here leaves everything to it.
    pub owner: String,
    pub engine: String,
    pub runtime_name: String,
    pub runtime_path: PathBuf,
    pub config: PathBuf,
    pub drop_in: Option<PathBuf>,
    pub set_as_default: bool,
    pub cdi: bool,
    pub socket: PathBuf,
    pub restart: RestartMode,
    pub ready_file: PathBuf,
    /// Text files the install wrote (engine configs, the ready file, config.toml).
    pub files: Vec<FileRecord>,
    /// Which of `files` are the engine's (undone by configure's transform when edited since).
    #[serde(default)]
    pub engine_files: Vec<PathBuf>,
    /// Files that were in the way of the toolkit's names, moved aside to `saved-as`.
    pub saved: Vec<SavedFile>,
    /// Directories the install created, parents first.
    pub dirs: Vec<PathBuf>,
}

/// One file: what it held before the first install (`None`: it did not exist) and what
/// the last install wrote.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FileRecord {
    pub path: PathBuf,
    pub original: Option<String>,
    /// `None`: the install removed the file.
    pub written: Option<String>,
}

/// A file moved out of the way.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SavedFile {
    pub path: PathBuf,
    pub saved_as: PathBuf,
}

impl State {
    /// The record of `path`, if the install changed it.
    pub fn file(&self, path: &Path) -> Option<&FileRecord> {
        self.files.iter().find(|f| f.path == path)
    }

    /// Records that the install writes `written` to `path`, which holds `current` now:
    /// the first record of a file keeps its original for good.
    pub fn record(&mut self, path: &Path, current: Option<&str>, written: Option<&str>) {
        match self.files.iter_mut().find(|f| f.path == path) {
            Some(f) => f.written = written.map(str::to_owned),
            None => self.files.push(FileRecord {
                path: path.to_path_buf(),
                original: current.map(str::to_owned),
                written: written.map(str::to_owned),
            }),
        }
    }

    /// Records a directory the install creates (once).
    pub fn record_dir(&mut self, dir: &Path) {
        if !self.dirs.iter().any(|d| d == dir) {
            self.dirs.push(dir.to_path_buf());
        }
    }
}

/// A fresh owner id for this process.
pub fn new_owner() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos}", std::process::id())
}

/// The state file under the host root, or `None` when there is none.
pub fn load(file: &Path) -> Result<Option<State>, InstallError> {
    let text = match write::read(file) {
        Ok(Some(existing)) => existing.text,
        Ok(None) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let state: State = serde_json::from_str(&text).map_err(|e| InstallError::State {
        path: file.to_path_buf(),
        reason: e.to_string(),
    })?;
    if state.version != STATE_VERSION {
        return Err(InstallError::State {
            path: file.to_path_buf(),
            reason: format!(
                "version {} (this nvshim reads version {STATE_VERSION})",
                state.version
            ),
        });
    }
    Ok(Some(state))
}

/// Writes the state file atomically (its directory exists).
pub fn save(file: &Path, state: &State) -> Result<(), InstallError> {
    let mut text = serde_json::to_string_pretty(state).map_err(|e| InstallError::State {
        path: file.to_path_buf(),
        reason: e.to_string(),
    })?;
    text.push('\n');
    let name = file.file_name().map_or_else(
        || STATE_FILE.to_owned(),
        |n| n.to_string_lossy().into_owned(),
    );
    // It holds the engine configs' bytes: readable by root only.
    let owner = write::Owner {
        mode: 0o600,
        uid: nix::unistd::getuid().as_raw(),
        gid: nix::unistd::getgid().as_raw(),
    };
    write::write_via_temp(
        file,
        text.as_bytes(),
        Some(owner),
        Durability::Synced,
        write::temp_names(&name),
    )
    .map_err(|e| InstallError::Io {
        what: "write the install state",
        path: e.path,
        source: e.source,
    })
}

// SPDX-License-Identifier: Apache-2.0
//! [`Bundle`]: loading `config.json` and replacing it atomically (through the crate's
//! one atomic writer, `files::write`).

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::kill;
use nix::unistd::Pid;

use super::{BundleError, SpecDoc};
use crate::files::write::{self, Durability, Owner, TempWriteError};

/// The bundle's configuration file, named by the OCI runtime spec.
pub const CONFIG_FILE: &str = "config.json";

/// A bundle directory, holding `config.json` and (usually) the rootfs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bundle {
    pub dir: PathBuf,
}

/// A loaded `config.json` and the file's permissions, which [`Bundle::save`] gives the
/// replacement.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    pub doc: SpecDoc,
    /// Permission bits of the file (`st_mode & 0o7777`).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

impl Bundle {
    pub fn new(dir: impl Into<PathBuf>) -> Bundle {
        Bundle { dir: dir.into() }
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.join(CONFIG_FILE)
    }

    /// Reads and parses `config.json`, and records its mode and owner from the same open file.
    pub fn load(&self) -> Result<Loaded, BundleError> {
        let path = self.config_path();
        let read_error = |source| BundleError::Read {
            path: path.clone(),
            source,
        };
        // O_NONBLOCK: opening a FIFO to read waits for a writer, forever if none comes; it
        // is refused below instead, like a device (`/dev/zero` would never end). No effect
        // on reading a regular file.
        let mut file = crate::files::open(&path, OFlag::O_NONBLOCK).map_err(read_error)?;
        let meta = file.metadata().map_err(read_error)?;
        if !meta.is_file() {
            return Err(BundleError::NotRegular {
                path,
                found: file_kind(&meta.file_type()),
            });
        }
        // Sized from the fstat above (one byte more, for the read that sees the end).
        let capacity = usize::try_from(meta.len()).unwrap_or(0).saturating_add(1);
        let bytes = crate::files::read_all(&mut file, capacity).map_err(read_error)?;
        let doc = SpecDoc::parse_named(&bytes, &path.display().to_string())?;
        Ok(Loaded {
            doc,
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        })
    }

    /// Replaces `config.json` with `doc`, atomically ([`write::write_via_temp`]).
    ///
    /// Writes a new file next to it (created exclusively, never through a symlink, named
    /// `.config.json.nvshim-<pid>-<n>`), gives it the mode and owner recorded in `like`, and
    /// renames it over `config.json`. Readers see the old file or the new one, never a part.
    /// On an error before the rename the temp file is removed and `config.json` is untouched.
    /// A runtime killed (`kill -9`) between creating and renaming its temp file cannot
    /// remove it, so each save first removes the temp files of pids that no longer run.
    /// No fsync: runc reads the file at once, and a bundle does not outlive a crash of the
    /// host (its container is gone), so durability would buy nothing for its ~0.5 ms.
    /// A symlinked `config.json` is replaced by a regular file, not followed.
    pub fn save(&self, doc: &SpecDoc, like: &Loaded) -> Result<(), BundleError> {
        let bytes = doc.to_vec()?;
        remove_stale_temps(&self.dir);
        self.save_bytes(&bytes, like, write::temp_names(CONFIG_FILE))
    }

    /// [`Bundle::save`] with the temp-file names to try, in order; a name that exists is
    /// skipped (and left alone).
    pub(super) fn save_bytes(
        &self,
        bytes: &[u8],
        like: &Loaded,
        names: impl IntoIterator<Item = String>,
    ) -> Result<(), BundleError> {
        let owner = Owner {
            mode: like.mode,
            uid: like.uid,
            gid: like.gid,
        };
        write::write_via_temp(
            &self.config_path(),
            bytes,
            Some(owner),
            Durability::Unsynced,
            names,
        )
        .map_err(|TempWriteError { path, source }| BundleError::Write { path, source })
    }
}

/// Removes `.config.json.nvshim-<pid>-<n>` files in `dir` whose pid is not a running
/// process: what a runtime killed mid-save leaves. A live pid's file is left alone (two
/// creates of one bundle at once are the engine's mistake, but must not fail each other).
/// Best effort: a leftover costs disk space, not correctness.
fn remove_stale_temps(dir: &Path) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    let prefix = write::temp_prefix(CONFIG_FILE);
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(temp_pid)
        else {
            continue;
        };
        let running = !matches!(kill(Pid::from_raw(pid), None), Err(Errno::ESRCH));
        if !running && entry.file_type().is_ok_and(|t| t.is_file()) {
            let _ = fs::remove_file(entry.path());
        }
    }
}

/// The pid in a temp file's `<pid>-<n>` suffix; `None` unless both are plain numbers and
/// the pid is positive (0 and negatives name process groups to `kill`).
fn temp_pid(suffix: &str) -> Option<i32> {
    let (pid, n) = suffix.split_once('-')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if !digits(pid) || !digits(n) {
        return None;
    }
    pid.parse().ok().filter(|&pid| pid > 0)
}

/// What a file that is not a regular file is, for [`BundleError::NotRegular`].
fn file_kind(kind: &fs::FileType) -> &'static str {
    if kind.is_dir() {
        "a directory"
    } else if kind.is_fifo() {
        "a FIFO"
    } else if kind.is_char_device() {
        "a character device"
    } else if kind.is_block_device() {
        "a block device"
    } else if kind.is_socket() {
        "a socket"
    } else {
        "an unknown file type"
    }
}

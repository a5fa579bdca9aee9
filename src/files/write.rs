//! Reading and replacing a file others read (an engine's config, a CDI spec, a label
//! file) without ever leaving a half-written one: the crate's one atomic writer.
//!
//! A new version goes to a temp file in the same directory (so the rename stays on one file
//! system), gets the old file's mode and owner, is fsynced, and is renamed over the old one; the
//! directory is fsynced after. The previous version is first saved the same way as
//! `<file>.bak` (one backup, replaced by the next change: the diff we print says what changed).
//! A symlinked config is followed: the file it points to is replaced, the link stays.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt, fchown};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Why a file could not be read, replaced or removed; each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum WriteError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot create directory {path}: {source}")]
    CreateDir {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot save the previous {path} as {backup}: {source}; nothing was changed")]
    Backup {
        path: PathBuf,
        backup: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot remove {path}: {source}")]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Mode of a config file we create (what the engines' packages ship).
const NEW_FILE_MODE: u32 = 0o644;
/// Mode of a directory we create.
const NEW_DIR_MODE: u32 = 0o755;
/// Suffix of the backup kept beside the file.
pub const BACKUP_SUFFIX: &str = ".bak";
/// How many temp-file names to try before giving up.
const TEMP_ATTEMPTS: usize = 16;

static TEMP_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The file as it was: its text and what a replacement must keep.
#[derive(Debug, Clone)]
pub struct Existing {
    pub text: String,
    mode: u32,
    uid: u32,
    gid: u32,
}

/// The file that `path` names, following symlinks; `path` itself when it does not resolve
/// (missing, or a dangling link, which the rename then replaces).
pub fn resolve(path: &Path) -> PathBuf {
    match fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_symlink() => {
            fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf())
        }
        _ => path.to_path_buf(),
    }
}

/// The current file, or `None` if there is none.
pub fn read(path: &Path) -> Result<Option<Existing>, WriteError> {
    let err = |source| WriteError::Read {
        path: path.to_path_buf(),
        source,
    };
    let bytes = match fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let meta = fs::metadata(path).map_err(err)?;
    let text = String::from_utf8(bytes)
        .map_err(|e| err(io::Error::new(io::ErrorKind::InvalidData, e.utf8_error())))?;
    Ok(Some(Existing {
        text,
        mode: meta.mode() & 0o7777,
        uid: meta.uid(),
        gid: meta.gid(),
    }))
}

/// Replaces (or creates) `path` with `bytes`, saving `existing` as `<path>.bak` first when
/// `backup` is set; returns the backup's path if one was written. Missing parent directories
/// are created.
pub fn replace(
    path: &Path,
    bytes: &[u8],
    existing: Option<&Existing>,
    backup: bool,
) -> Result<Option<PathBuf>, WriteError> {
    let dir = parent(path);
    if !dir.is_dir() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(NEW_DIR_MODE)
            .create(&dir)
            .map_err(|source| WriteError::CreateDir {
                path: dir.clone(),
                source,
            })?;
    }
    let mut saved = None;
    if let (Some(old), true) = (existing, backup) {
        let bak = backup_path(path);
        atomic_write(&bak, old.text.as_bytes(), Some(old)).map_err(|source| {
            WriteError::Backup {
                path: path.to_path_buf(),
                backup: bak.clone(),
                source,
            }
        })?;
        saved = Some(bak);
    }
    atomic_write(path, bytes, existing).map_err(|source| WriteError::Write {
        path: path.to_path_buf(),
        source,
    })?;
    Ok(saved)
}

/// Deletes `path` (a file of ours) and syncs its directory.
pub fn remove(path: &Path) -> Result<(), WriteError> {
    fs::remove_file(path).map_err(|source| WriteError::Remove {
        path: path.to_path_buf(),
        source,
    })?;
    // Best effort: the file is gone either way.
    let _ = sync_dir(&parent(path));
    Ok(())
}

/// `<path>.bak`
pub fn backup_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(BACKUP_SUFFIX);
    PathBuf::from(name)
}

fn parent(path: &Path) -> PathBuf {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn atomic_write(path: &Path, bytes: &[u8], like: Option<&Existing>) -> io::Result<()> {
    let dir = parent(path);
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let (temp, file) = create_temp(&dir, &name)?;
    fill(file, bytes, like)?;
    fs::rename(&temp.path, path)?;
    temp.keep();
    sync_dir(&dir)
}

/// A temp file we created, removed on drop unless kept.
struct TempFile {
    path: PathBuf,
    remove: bool,
}

impl TempFile {
    fn keep(mut self) {
        self.remove = false;
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if self.remove {
            // Best effort: the error that brought us here is the one to report.
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// `.<name>.nvshim-<pid>-<n>` in `dir`, created exclusively (never through a symlink).
fn create_temp(dir: &Path, name: &str) -> io::Result<(TempFile, File)> {
    let pid = std::process::id();
    let mut last = None;
    for _ in 0..TEMP_ATTEMPTS {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!(".{name}.nvshim-{pid}-{n}"));
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        match opened {
            Ok(file) => return Ok((TempFile { path, remove: true }, file)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => return Err(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no temp-file name left to try")))
}

/// Writes `bytes`, gives the file `like`'s owner and mode (or ours and 0644), and fsyncs it.
fn fill(mut file: File, bytes: &[u8], like: Option<&Existing>) -> io::Result<()> {
    let mode = match like {
        Some(old) => {
            let meta = file.metadata()?;
            if (meta.uid(), meta.gid()) != (old.uid, old.gid) {
                fchown(&file, Some(old.uid), Some(old.gid))?;
            }
            old.mode
        }
        None => NEW_FILE_MODE,
    };
    // After the chown, which may clear set-id bits; and explicitly, since umask applied at open.
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    file.write_all(bytes)?;
    file.sync_all()
}

fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

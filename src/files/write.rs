//! Reading and replacing a file others read (an engine's config, a CDI spec, a label
//! file, a bundle's `config.json`) without ever leaving a half-written one: the crate's
//! one atomic writer.
//!
//! A new version goes to a temp file in the same directory (so the rename stays on one file
//! system), created exclusively and never through a symlink, gets the old file's mode and
//! owner, is fsynced, and is renamed over the old one; the directory is fsynced after
//! ([`write_via_temp`]). The previous version is first saved the same way as `<file>.bak`
//! (one backup, replaced by the next change: the diff we print says what changed). With
//! [`replace`], a symlinked config is followed (the caller [`resolve`]s it): the file it points
//! to is replaced, the link stays. A bundle's `config.json` skips the fsyncs
//! ([`Durability::Unsynced`]; see `bundle::Bundle::save`).

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

/// A failed [`write_via_temp`]: the file that failed (the temp file, or the target for
/// the rename) and why. The target is unchanged.
#[derive(Debug, thiserror::Error)]
#[error("cannot write {path}: {source}")]
pub struct TempWriteError {
    pub path: PathBuf,
    #[source]
    pub source: io::Error,
}

/// Mode of a config file we create (what the engines' packages ship).
const NEW_FILE_MODE: u32 = 0o644;
/// Mode of a directory we create.
const NEW_DIR_MODE: u32 = 0o755;
/// Suffix of the backup kept beside the file.
pub const BACKUP_SUFFIX: &str = ".bak";
/// How many temp-file names to try before giving up.
const TEMP_ATTEMPTS: usize = 16;

/// Numbers the temp files of this process, so that concurrent writes never pick the same name.
static TEMP_COUNTER: AtomicUsize = AtomicUsize::new(0);

/// The file as it was: its text and what a replacement must keep.
#[derive(Debug, Clone)]
pub struct Existing {
    pub text: String,
    owner: Owner,
}

/// The permission bits (`st_mode & 0o7777`) and owner a replacement gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Owner {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// Whether a replacement is made to survive a crash of the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The temp file is fsynced before the rename and the directory after: files that
    /// outlive a reboot (engine configs, CDI specs, label files).
    Synced,
    /// No fsync: a file read at once that does not outlive a crash of the host (a
    /// bundle's `config.json`, whose container is gone after one).
    Unsynced,
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
        owner: Owner {
            mode: meta.mode() & 0o7777,
            uid: meta.uid(),
            gid: meta.gid(),
        },
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

/// `path` replaced through a temp file, fsynced; any error names `path`.
fn atomic_write(path: &Path, bytes: &[u8], like: Option<&Existing>) -> io::Result<()> {
    let name = file_name(path);
    write_via_temp(
        path,
        bytes,
        like.map(|old| old.owner),
        Durability::Synced,
        temp_names(&name),
    )
    .map_err(|e| e.source)
}

/// Replaces (or creates) `path` with `bytes` through a temp file in its directory: the
/// first of `names` that does not exist yet (an existing name, a symlink included, is
/// skipped and left alone). The temp file gets `owner` (or ours and 0644) and is
/// renamed over `path`; with [`Durability::Synced`] it is fsynced first and the
/// directory after. Readers see the old file or the new one, never a part. On an error
/// the temp file is removed and `path` is untouched; the error names the file that
/// failed (the temp file, or `path` for the rename).
pub fn write_via_temp(
    path: &Path,
    bytes: &[u8],
    owner: Option<Owner>,
    durability: Durability,
    names: impl IntoIterator<Item = String>,
) -> Result<(), TempWriteError> {
    let failed = |path: &Path| {
        let path = path.to_path_buf();
        move |source| TempWriteError { path, source }
    };
    let dir = parent(path);
    let (temp, file) = create_temp(&dir, names)?;
    fill(file, bytes, owner, durability).map_err(failed(&temp.path))?;
    fs::rename(&temp.path, path).map_err(failed(path))?;
    temp.keep();
    if durability == Durability::Synced {
        sync_dir(&dir).map_err(failed(&dir))?;
    }
    Ok(())
}

/// The temp-file names [`replace`] tries for a file named `name`:
/// `.<name>.nvshim-<pid>-<n>` ([`temp_prefix`], then this process's id and a counter).
pub fn temp_names(name: &str) -> impl Iterator<Item = String> + use<> {
    let prefix = temp_prefix(name);
    let pid = std::process::id();
    (0..TEMP_ATTEMPTS).map(move |_| {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}{pid}-{n}")
    })
}

/// `.<name>.nvshim-`: how the temp files for a file named `name` begin (a process
/// killed mid-write leaves one; see `bundle`'s clean-up).
pub fn temp_prefix(name: &str) -> String {
    format!(".{name}.nvshim-")
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
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

/// Creates the first of `names` (in `dir`) that does not exist yet.
fn create_temp(
    dir: &Path,
    names: impl IntoIterator<Item = String>,
) -> Result<(TempFile, File), TempWriteError> {
    let mut last = None;
    for name in names {
        let path = dir.join(name);
        // create_new is O_CREAT|O_EXCL: an existing name, a symlink included, fails
        // instead of being opened; O_NOFOLLOW says the same for the final component, and
        // std adds O_CLOEXEC.
        let opened = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(&path);
        match opened {
            Ok(file) => return Ok((TempFile { path, remove: true }, file)),
            Err(source) if source.kind() == io::ErrorKind::AlreadyExists => {
                last = Some(TempWriteError { path, source });
            }
            Err(source) => return Err(TempWriteError { path, source }),
        }
    }
    Err(last.unwrap_or_else(|| TempWriteError {
        path: dir.to_path_buf(),
        source: io::Error::new(io::ErrorKind::InvalidInput, "no temp-file name to try"),
    }))
}

/// Gives the file `owner` (or ours and 0644), writes `bytes`, and fsyncs it when
/// `durability` says so.
fn fill(
    mut file: File,
    bytes: &[u8],
    owner: Option<Owner>,
    durability: Durability,
) -> io::Result<()> {
    let mode = match owner {
        Some(old) => {
            let meta = file.metadata()?;
            if (meta.uid(), meta.gid()) != (old.uid, old.gid) {
                fchown(&file, Some(old.uid), Some(old.gid))?;
            }
            old.mode & 0o7777
        }
        None => NEW_FILE_MODE,
    };
    // After the chown, which may clear set-id bits; and explicitly, since umask applied at open.
    file.set_permissions(fs::Permissions::from_mode(mode))?;
    // Blocks allocated up front (best effort: not every filesystem can): ext4 then has
    // no delayed allocation to flush when the rename replaces the file, about 40 µs on
    // a journaled ext4.
    let _ = nix::fcntl::fallocate(
        &file,
        nix::fcntl::FallocateFlags::empty(),
        0,
        i64::try_from(bytes.len()).unwrap_or(0),
    );
    file.write_all(bytes)?;
    if durability == Durability::Synced {
        file.sync_all()?;
    }
    Ok(())
}

/// Makes `dir`'s entries (a rename into it, a new file) durable.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    File::open(dir)?.sync_all()
}

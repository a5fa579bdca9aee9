//! The stage on the host: found and checked on every create, built under a lock when
//! missing, stale ones detached.
//!
//! ```text
//! <root>                 tmpfs, mode 0700, made private once: nothing mounted under
//!                        it propagates to the host's other namespaces
//! <root>/<key>/          tmpfs (mode 0755, read-only once built): the stage
//! <root>/<key>/<name>    an empty file with the host file bind-mounted on it,
//!                        read-only, nosuid, nodev
//! <root>/<key>/t/<path>  for each file's container path, a relative symlink to
//!                        `<name>`: a directory the image lacks can be one link
//! <root>/<key>.json      the host files and identities it was built from (for the
//!                        garbage collection; not visible in containers)
//! <root>.lock            flock'd while a stage is built or removed
//! ```
//!
//! A create trusts nothing it finds: each staged file must have the host file's device
//! and inode, or the stage is rebuilt. That also covers a mount namespace that sees
//! the directories but not the mounts. The garbage collection runs when a stage is
//! built: a stage whose host files changed (a driver upgrade) is detached (`MNT_DETACH`:
//! containers started from it keep their own copies) and its directory removed, so a
//! create that planned against it just before the upgrade fails loudly instead of
//! starting without its files.

use std::collections::BTreeMap;
use std::fs;
use std::io::ErrorKind;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, Flock, FlockArg, OFlag};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::stat::{self, FileStat, Mode};
use serde::{Deserialize, Serialize};

use super::{KeyedFile, Stage, TREE_DIR, eligible, key, layout};
use crate::cdi::Mount;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// This process may not mount (rootless, or a user namespace): per-file mounts.
    #[error("cannot mount the driver stage at {path}: not permitted")]
    NotPermitted { path: PathBuf },
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} changed while it was being staged")]
    Changed { path: PathBuf },
}

/// The identity a staged file must share with its host file, and what the key hashes.
fn identity(st: &FileStat) -> [u64; 6] {
    // The casts keep the bits; the values only feed a hash and equality.
    #[allow(clippy::cast_sign_loss)]
    [
        st.st_dev,
        st.st_ino,
        st.st_size as u64,
        st.st_mtime as u64,
        st.st_mtime_nsec as u64,
        st.st_ctime as u64,
    ]
}

/// What `<key>.json` records.
#[derive(Debug, Serialize, Deserialize)]
struct Sources {
    /// Host path and identity of each staged file.
    files: Vec<(PathBuf, [u64; 6])>,
}

struct Entry {
    host: PathBuf,
    rel: PathBuf,
    identity: [u64; 6],
    /// Its container paths (for the tree).
    containers: Vec<PathBuf>,
}

/// The stage for the eligible mounts among `mounts` (see [`super::eligible`]), under
/// `root`: checked if there, built if not. `Ok(None)` when no mount is eligible.
pub fn ensure(root: &Path, mounts: &[Mount]) -> Result<Option<Stage>, StageError> {
    let mut by_host: BTreeMap<PathBuf, Vec<PathBuf>> = BTreeMap::new();
    for mount in mounts.iter().filter(|m| eligible(m)) {
        by_host
            .entry(PathBuf::from(&mount.host_path))
            .or_default()
            .push(PathBuf::from(&mount.container_path));
    }
    let mut files: Vec<(PathBuf, [u64; 6])> = Vec::with_capacity(by_host.len());
    for host in by_host.keys() {
        match stat::stat(host) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFREG => {
                files.push((host.clone(), identity(&st)));
            }
            // Not a regular file (or gone): left to its own mount, which says why.
            _ => {}
        }
    }
    if files.is_empty() {
        return Ok(None);
    }
    let hosts: Vec<&Path> = files.iter().map(|(h, _)| h.as_path()).collect();
    let entries: Vec<Entry> = layout(&hosts)
        .into_iter()
        .zip(&files)
        .map(|(rel, (host, identity))| Entry {
            host: host.clone(),
            rel,
            identity: *identity,
            containers: by_host[host].clone(),
        })
        .collect();
    let key = key(entries.iter().map(|e| KeyedFile {
        host: &e.host,
        rel: &e.rel,
        containers: &e.containers,
        identity: e.identity,
    }));
    let dir = root.join(&key);
    let built = if matches(&dir, &entries) {
        false
    } else {
        build(root, &key, &entries)?;
        true
    };
    let mut links = BTreeMap::new();
    for e in &entries {
        for container in &e.containers {
            links.insert(container.clone(), e.rel.clone());
        }
    }
    Ok(Some(Stage {
        host_dir: dir,
        links,
        built,
    }))
}

/// Whether `dir` holds every entry as a mount of its host file (same device and inode).
fn matches(dir: &Path, entries: &[Entry]) -> bool {
    let Ok(fd) = fcntl::open(
        dir,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    entries.iter().all(|e| {
        stat::fstatat(&fd, e.rel.as_path(), AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| identity(&st)[..2] == e.identity[..2])
    })
}

fn io<'a, E: Into<std::io::Error>>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(E) -> StageError + 'a {
    move |e| StageError::Io {
        what,
        path: path.to_path_buf(),
        source: e.into(),
    }
}

/// [`io`] for `mount(2)`: no right to mount is [`StageError::NotPermitted`].
fn mount_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(Errno) -> StageError + 'a {
    move |e| match e {
        Errno::EPERM | Errno::EACCES => StageError::NotPermitted {
            path: path.to_path_buf(),
        },
        e => io(what, path)(e),
    }
}

/// The lock file beside `root`.
fn lock_path(root: &Path) -> PathBuf {
    let mut name = root.file_name().unwrap_or_default().to_os_string();
    name.push(".lock");
    root.with_file_name(name)
}

/// Builds `<root>/<key>` under the lock (unless another process did while we waited),
/// then removes stale stages.
fn build(root: &Path, key: &str, entries: &[Entry]) -> Result<(), StageError> {
    if let Some(parent) = root.parent() {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(parent)
            .map_err(io("create", parent))?;
    }
    let lock_path = lock_path(root);
    let file = fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(&lock_path)
        .map_err(io("open", &lock_path))?;
    let _lock =
        Flock::lock(file, FlockArg::LockExclusive).map_err(|(_, e)| io("lock", &lock_path)(e))?;
    ensure_root(root)?;
    let dir = root.join(key);
    if matches(&dir, entries) {
        return Ok(());
    }
    remove(root, key)?;
    if let Err(e) = populate(root, key, entries) {
        let _ = remove(root, key);
        return Err(e);
    }
    tracing::debug!(stage = %dir.display(), files = entries.len(), "driver stage built");
    collect_stale(root, key);
    Ok(())
}

/// Makes `root` a private tmpfs unless it is a mount point already.
fn ensure_root(root: &Path) -> Result<(), StageError> {
    match fs::DirBuilder::new().mode(0o700).create(root) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io("create", root)(e)),
    }
    if is_mount_point(root)? {
        return Ok(());
    }
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("nvshim-stage"),
        root,
        Some("tmpfs"),
        flags,
        Some("mode=0700,size=1m"),
    )
    .map_err(mount_err("mount a tmpfs on", root))?;
    mount(
        None::<&str>,
        root,
        None::<&str>,
        MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .map_err(mount_err("mount (make private)", root))?;
    Ok(())
}

/// Whether `path` is on another filesystem than its parent.
fn is_mount_point(path: &Path) -> Result<bool, StageError> {
    let own = stat::lstat(path).map_err(io("stat", path))?;
    let parent = path.parent().unwrap_or(Path::new("/"));
    let up = stat::stat(parent).map_err(io("stat", parent))?;
    Ok(own.st_dev != up.st_dev)
}

/// Fills a fresh `<root>/<key>`: a tmpfs, each entry bound on an empty file, the
/// sources written beside it, the tmpfs made read-only.
fn populate(root: &Path, key: &str, entries: &[Entry]) -> Result<(), StageError> {
    let dir = root.join(key);
    fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .map_err(io("create", &dir))?;
    let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    mount(
        Some("nvshim-driver"),
        &dir,
        Some("tmpfs"),
        flags,
        Some("mode=0755,size=64k"),
    )
    .map_err(mount_err("mount a tmpfs on", &dir))?;
    for e in entries {
        let target = dir.join(&e.rel);
        if let Some(parent) = target.parent().filter(|p| *p != dir) {
            fs::DirBuilder::new()
                .mode(0o755)
                .create(parent)
                .or_else(|e| match e.kind() {
                    ErrorKind::AlreadyExists => Ok(()),
                    _ => Err(e),
                })
                .map_err(io("create", parent))?;
        }
        // Made without opening it: a writable fd on the tmpfs, even one a forked child
        // holds for an instant, would make the read-only remount below fail (EBUSY).
        stat::mknod(
            &target,
            stat::SFlag::S_IFREG,
            Mode::from_bits_truncate(0o444),
            0,
        )
        .map_err(io("create", &target))?;
        bind_file(&e.host, &target, e.identity)?;
    }
    for e in entries {
        for container in &e.containers {
            tree_link(&dir, container, &e.rel)?;
        }
    }
    let sources = Sources {
        files: entries
            .iter()
            .map(|e| (e.host.clone(), e.identity))
            .collect(),
    };
    let record = root.join(format!("{key}.json"));
    let text = serde_json::to_vec(&sources).unwrap_or_default();
    fs::write(&record, text).map_err(io("write", &record))?;
    mount(
        None::<&str>,
        &dir,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | flags,
        None::<&str>,
    )
    .map_err(mount_err("mount (read-only)", &dir))?;
    Ok(())
}

/// `<dir>/t/<container>` → `<rel>` (relative, so that it resolves in the container's
/// view of the stage), with the directories above it.
fn tree_link(dir: &Path, container: &Path, rel: &Path) -> Result<(), StageError> {
    let inside = container.strip_prefix("/").unwrap_or(container);
    let link = dir.join(TREE_DIR).join(inside);
    let parent = link.parent().unwrap_or(dir);
    fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(parent)
        .map_err(io("create", parent))?;
    let depth = parent
        .strip_prefix(dir)
        .map_or(0, |p| p.components().count());
    let mut target = PathBuf::new();
    for _ in 0..depth {
        target.push("..");
    }
    target.push(rel);
    std::os::unix::fs::symlink(&target, &link).map_err(io("create", &link))
}

/// Binds the host file at `host` onto `target` read-only, nosuid, nodev, through an
/// fd whose identity was checked: the stage holds exactly the file that was hashed.
fn bind_file(host: &Path, target: &Path, want: [u64; 6]) -> Result<(), StageError> {
    let fd: OwnedFd = fcntl::open(host, OFlag::O_PATH | OFlag::O_CLOEXEC, Mode::empty())
        .map_err(io("open", host))?;
    let st = stat::fstat(&fd).map_err(io("stat", host))?;
    if identity(&st) != want || st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(StageError::Changed {
            path: host.to_path_buf(),
        });
    }
    let source = format!("/proc/self/fd/{}", fd.as_raw_fd());
    mount(
        Some(source.as_str()),
        target,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(mount_err("mount (bind)", target))?;
    let ro = MsFlags::MS_REMOUNT
        | MsFlags::MS_BIND
        | MsFlags::MS_RDONLY
        | MsFlags::MS_NOSUID
        | MsFlags::MS_NODEV;
    mount(None::<&str>, target, None::<&str>, ro, None::<&str>)
        .map_err(mount_err("mount (read-only)", target))?;
    Ok(())
}

/// Detaches and deletes `<root>/<key>` and its record, whatever state they are in.
fn remove(root: &Path, key: &str) -> Result<(), StageError> {
    let dir = root.join(key);
    // A stage is one tmpfs with its binds under it: one detach takes all of them.
    // Looping covers a stage mounted twice (a crash between two builds' steps).
    let mut detached = 0;
    while dir.exists() && is_mount_point(&dir)? && detached < 16 {
        umount2(&dir, MntFlags::MNT_DETACH).map_err(io("unmount", &dir))?;
        detached += 1;
    }
    match fs::remove_dir_all(&dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", &dir)(e)),
    }
    let record = root.join(format!("{key}.json"));
    match fs::remove_file(&record) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => return Err(io("remove", &record)(e)),
    }
    Ok(())
}

/// Removes every stage but `keep` whose host files are not what it holds any more
/// (or whose record is missing or unreadable). Errors are logged: a stale stage left
/// behind costs memory, not correctness.
fn collect_stale(root: &Path, keep: &str) {
    let Ok(dir) = fs::read_dir(root) else {
        return;
    };
    let mut keys: Vec<String> = dir
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .map(|name| {
            name.strip_suffix(".json")
                .map_or(name.clone(), str::to_owned)
        })
        .filter(|k| k != keep)
        .collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        if is_current(root, &key) {
            continue;
        }
        match remove(root, &key) {
            Ok(()) => {
                tracing::debug!(stage = %root.join(&key).display(), "stale driver stage removed")
            }
            Err(e) => tracing::warn!("cannot remove a stale driver stage: {e}"),
        }
    }
}

/// Whether the stage `key`'s record lists files whose host identity is unchanged.
fn is_current(root: &Path, key: &str) -> bool {
    let Ok(text) = fs::read(root.join(format!("{key}.json"))) else {
        return false;
    };
    let Ok(sources) = serde_json::from_slice::<Sources>(&text) else {
        return false;
    };
    root.join(key).is_dir()
        && sources
            .files
            .iter()
            .all(|(host, want)| stat::stat(host.as_path()).is_ok_and(|st| identity(&st) == *want))
}

//! Safe file access inside a container's root filesystem, from the host.
//!
//! The rootfs belongs to the image author: any directory in it may be a symlink to
//! `/`, `/etc` or `/proc/self/root`. So nothing here joins path strings. The rootfs
//! is held as an `O_PATH` directory fd and every path is resolved against it with
//! `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)`: absolute symlinks and `..`
//! stay inside the root, `/proc` magic links are refused. On kernels without
//! `openat2` (before 5.6), and for a lookup the kernel keeps asking to retry (a rename
//! or mount elsewhere on the host raced it), an equivalent walk does the same one
//! component at a time, each step relative to the previous directory's fd, never by
//! name from the top.
//!
//! New files are written to a fresh temporary name (`O_CREAT | O_EXCL |
//! O_NOFOLLOW`) in the already-resolved parent directory and renamed over the
//! target, so a reader never sees half a file and a planted symlink at the target
//! is replaced, not followed.

pub mod compat;
mod dir_links;
pub mod elf;
pub mod fdpath;
pub mod linker;

pub use dir_links::Placed;

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

/// Most symlinks followed while resolving one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// How many times `openat2` is asked before a lookup takes the walk instead.
const OPENAT2_TRIES: usize = 4;

/// Set once `openat2` answered `ENOSYS`: use the walk from then on.
static NO_OPENAT2: AtomicBool = AtomicBool::new(false);
/// Makes temporary names unique within the process.
static COUNTER: AtomicU64 = AtomicU64::new(0);

#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    #[error("cannot open the container rootfs {root}: {source}")]
    Root {
        root: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{path} in the container rootfs {root}: {source}")]
    Path {
        root: PathBuf,
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{path} in the container rootfs {root} is not a regular file")]
    NotAFile { root: PathBuf, path: PathBuf },
    #[error(
        "{path} in the container rootfs {root} leads to another filesystem (a mount such as \
         /proc or a volume, reached through the image's symlinks); nothing is written there"
    )]
    OtherMount { root: PathBuf, path: PathBuf },
    #[error("{path} in the container rootfs {root} is larger than {limit} bytes")]
    TooLarge {
        root: PathBuf,
        path: PathBuf,
        limit: u64,
    },
}

/// A container root filesystem, opened once.
#[derive(Debug)]
pub struct Rootfs {
    fd: OwnedFd,
    path: PathBuf,
    /// The root's `st_dev`: files we write must be on the rootfs's own filesystem.
    dev: u64,
}

impl Rootfs {
    /// Opens the rootfs directory. `path` itself comes from the engine (the spec's
    /// `root.path`), not from the image, so it is opened normally.
    pub fn open(path: &Path) -> Result<Rootfs, RootfsError> {
        let fd = fcntl::open(
            path,
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|source| RootfsError::Root {
            root: path.to_path_buf(),
            source,
        })?;
        let dev = stat::fstat(&fd)
            .map_err(|source| RootfsError::Root {
                root: path.to_path_buf(),
                source,
            })?
            .st_dev;
        Ok(Rootfs {
            fd,
            path: path.to_path_buf(),
            dev,
        })
    }

    /// Fails unless `dir` is on the rootfs's own filesystem. When the hook
    /// runs, runc has already mounted `/proc`, `/sys` and the container's volumes under
    /// the root; an image link such as `/etc -> /data` (a host volume) must not make us
    /// write there as host root. `RESOLVE_IN_ROOT` alone would allow it.
    fn on_root_fs(&self, dir: &OwnedFd, path: &Path) -> Result<(), RootfsError> {
        let st = stat::fstat(dir).map_err(|e| self.err(path, e))?;
        if st.st_dev == self.dev {
            Ok(())
        } else {
            Err(RootfsError::OtherMount {
                root: self.path.clone(),
                path: path.to_path_buf(),
            })
        }
    }

    /// Whether the directory opened is the host's root (`/` by any name: a symlink to
    /// it, enough `..`, a bind mount of it), by device and inode.
    pub fn is_host_root(&self) -> Result<bool, RootfsError> {
        let err = |source| RootfsError::Root {
            root: self.path.clone(),
            source,
        };
        let host = stat::stat("/").map_err(err)?;
        let root = stat::fstat(&self.fd).map_err(err)?;
        Ok((host.st_dev, host.st_ino) == (root.st_dev, root.st_ino))
    }

    /// The rootfs's host path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Reads the regular file at `path` (a container path), at most `limit` bytes.
    /// `Ok(None)` when it (or a directory on the way) does not exist.
    pub fn read(&self, path: &Path, limit: u64) -> Result<Option<Vec<u8>>, RootfsError> {
        // Resolved as O_PATH and checked before it is opened for reading: opening a
        // FIFO the image put there would block the runtime, and opening a device node
        // can have side effects.
        let fd = match self.resolve(path, OFlag::O_PATH, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) | Err(Errno::ENOTDIR) => return Ok(None),
            Err(source) => return Err(self.err(path, source)),
        };
        let st = stat::fstat(&fd).map_err(|e| self.err(path, e))?;
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
            return Err(RootfsError::NotAFile {
                root: self.path.clone(),
                path: path.to_path_buf(),
            });
        }
        // Reopening the O_PATH fd through /proc/self/fd opens exactly that inode.
        let fd = fcntl::open(
            format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)).as_str(),
            OFlag::O_RDONLY | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| self.err(path, e))?;
        let size = u64::try_from(st.st_size).unwrap_or(0).min(limit);
        let mut bytes = Vec::with_capacity(usize::try_from(size).unwrap_or(0) + 1);
        File::from(fd)
            .take(limit + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.err(path, io_errno(&e)))?;
        if bytes.len() as u64 > limit {
            return Err(RootfsError::TooLarge {
                root: self.path.clone(),
                path: path.to_path_buf(),
                limit,
            });
        }
        Ok(Some(bytes))
    }

    /// Replaces the file at `path` with `bytes` (mode `mode`) atomically, creating
    /// missing parent directories (mode 0755). A symlink at `path` is replaced, not
    /// followed.
    pub fn replace(&self, path: &Path, bytes: &[u8], mode: u32) -> Result<(), RootfsError> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(self.err(path, Errno::EINVAL));
        };
        let dir = self.ensure_dir_on_root(parent, true)?;
        self.on_root_fs(&dir, path)?;
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(
            ".nvshim-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        let mode = Mode::from_bits_truncate(mode);
        let fd = fcntl::openat(
            &dir,
            tmp.as_os_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            mode,
        )
        .map_err(|e| self.err(path, e))?;
        // Blocks allocated up front (best effort: not every filesystem can): ext4 then
        // has no delayed allocation to flush when the rename replaces a file, about
        // 40 µs per replaced file on a journaled ext4.
        let _ = fcntl::fallocate(
            &fd,
            fcntl::FallocateFlags::empty(),
            0,
            i64::try_from(bytes.len()).unwrap_or(0),
        );
        let written = stat::fchmod(&fd, mode)
            .and_then(|()| File::from(fd).write_all(bytes).map_err(|e| io_errno(&e)))
            .and_then(|()| fcntl::renameat(&dir, tmp.as_os_str(), &dir, name));
        if let Err(e) = written {
            let _ = unistd::unlinkat(&dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(self.err(path, e));
        }
        Ok(())
    }

    /// Makes `path` a symlink to `target` (the link's text, not resolved here),
    /// creating missing parent directories. An existing symlink or file at `path` is
    /// replaced atomically (a new link under a temporary name, then `renameat`); the
    /// same link already there is left alone; a directory is an error. Returns whether
    /// anything changed.
    pub fn symlink(&self, path: &Path, target: &str) -> Result<bool, RootfsError> {
        let mut dirs = LinkDirs::default();
        self.symlink_with(&mut dirs, path, target)
    }

    /// [`symlink`](Self::symlink) for many links: each parent directory is resolved
    /// (and checked to be on the rootfs's filesystem) once, not once per link. Returns
    /// how many links changed.
    pub fn symlinks<'a>(
        &self,
        links: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<usize, RootfsError> {
        let mut dirs = LinkDirs::default();
        let mut changed = 0;
        for (path, target) in links {
            let done = self.symlink_with(&mut dirs, path, target)?;
            tracing::debug!(path = %path.display(), target, changed = done, "symlink");
            changed += usize::from(done);
        }
        Ok(changed)
    }

    /// Makes each `path` a symlink to its `target` like [`symlinks`](Self::symlinks),
    /// except where the image has something other than a symlink at `path` (a file of
    /// its own, a directory): that is left alone and its path returned, for the caller
    /// to cover it another way (a bind mount, which hides it only while the container
    /// runs). An image's symlink there is replaced, as `symlinks` does.
    pub fn symlinks_beside_files<'a>(
        &self,
        links: impl IntoIterator<Item = (&'a Path, &'a str)>,
    ) -> Result<Vec<PathBuf>, RootfsError> {
        let mut dirs = LinkDirs::default();
        let mut occupied = Vec::new();
        for (path, target) in links {
            match self.link_with(&mut dirs, path, target, false)? {
                Linked::Occupied => occupied.push(path.to_path_buf()),
                done => tracing::debug!(path = %path.display(), target, ?done, "symlink"),
            }
        }
        Ok(occupied)
    }

    fn symlink_with(
        &self,
        dirs: &mut LinkDirs,
        path: &Path,
        target: &str,
    ) -> Result<bool, RootfsError> {
        match self.link_with(dirs, path, target, true)? {
            Linked::Created => Ok(true),
            Linked::Same => Ok(false),
            Linked::Occupied => Err(self.err(path, Errno::EISDIR)),
        }
    }

    /// One link; with `over_files`, a regular file (or other non-directory) at `path`
    /// is replaced, else it is [`Linked::Occupied`]. A directory is never replaced.
    fn link_with(
        &self,
        dirs: &mut LinkDirs,
        path: &Path,
        target: &str,
        over_files: bool,
    ) -> Result<Linked, RootfsError> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(self.err(path, Errno::EINVAL));
        };
        if dirs.last.as_ref().is_none_or(|(p, _)| p != parent) {
            let dir = self.ensure_dir_on_root(parent, true)?;
            self.on_root_fs(&dir, path)?;
            dirs.last = Some((parent.to_path_buf(), dir));
        }
        let Some((_, dir)) = &dirs.last else {
            return Err(self.err(path, Errno::EINVAL));
        };
        // The common case, a name the image does not have: one call, atomic by itself.
        match unistd::symlinkat(target, dir, name) {
            Ok(()) => return Ok(Linked::Created),
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(self.err(path, e)),
        }
        match stat::fstatat(dir, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFDIR => {
                if over_files {
                    return Err(self.err(path, Errno::EISDIR));
                }
                return Ok(Linked::Occupied);
            }
            Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                if fcntl::readlinkat(dir, name).is_ok_and(|t| t.as_bytes() == target.as_bytes()) {
                    return Ok(Linked::Same);
                }
            }
            Ok(_) if !over_files => return Ok(Linked::Occupied),
            Ok(_) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(self.err(path, e)),
        }
        let mut tmp = OsString::from(".");
        tmp.push(name);
        tmp.push(format!(
            ".nvshim-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        ));
        unistd::symlinkat(target, dir, tmp.as_os_str()).map_err(|e| self.err(path, e))?;
        if let Err(e) = fcntl::renameat(dir, tmp.as_os_str(), dir, name) {
            let _ = unistd::unlinkat(dir, tmp.as_os_str(), UnlinkatFlags::NoRemoveDir);
            return Err(self.err(path, e));
        }
        Ok(Linked::Created)
    }

    /// Opens the directory `path`, creating what is missing of it.
    fn ensure_dir(&self, path: &Path) -> Result<OwnedFd, RootfsError> {
        self.ensure_dir_on_root(path, false)
    }

    /// [`ensure_dir`](Self::ensure_dir); with `on_root`, no directory is created
    /// outside the rootfs's own filesystem (a volume an image link leads to): the
    /// callers that write only there fail before leaving anything behind.
    fn ensure_dir_on_root(&self, path: &Path, on_root: bool) -> Result<OwnedFd, RootfsError> {
        let flags = OFlag::O_PATH | OFlag::O_DIRECTORY;
        match self.resolve(path, flags, Mode::empty()) {
            Ok(fd) => return Ok(fd),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(self.err(path, e)),
        }
        let mut prefix = PathBuf::from("/");
        let mut dir = self.resolve(&prefix, flags, Mode::empty());
        for part in normal_components(path) {
            let parent = dir.map_err(|e| self.err(&prefix, e))?;
            prefix.push(part);
            if on_root {
                self.on_root_fs(&parent, &prefix)?;
            }
            match stat::mkdirat(&parent, part, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => {}
                Err(e) => return Err(self.err(&prefix, e)),
            }
            dir = self.resolve(&prefix, flags, Mode::empty());
        }
        dir.map_err(|e| self.err(path, e))
    }

    /// Opens `path` inside the root with `flags`.
    fn resolve(&self, path: &Path, flags: OFlag, mode: Mode) -> Result<OwnedFd, Errno> {
        let flags = flags | OFlag::O_CLOEXEC;
        let relative = relative(path);
        if !NO_OPENAT2.load(Ordering::Relaxed) {
            let how = OpenHow::new()
                .flags(flags)
                .mode(mode)
                .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
            // The kernel answers EAGAIN when any rename or mount on the system raced a
            // lookup that met `..`: retry a few times, then take the walk,
            // which gives the same answer and never asks to retry (a busy host mounts
            // and renames all the time).
            for _ in 0..OPENAT2_TRIES {
                match fcntl::openat2(&self.fd, relative.as_path(), how) {
                    Err(Errno::ENOSYS) => {
                        NO_OPENAT2.store(true, Ordering::Relaxed);
                        break;
                    }
                    Err(Errno::EAGAIN) => continue,
                    other => return other,
                }
            }
        }
        walk(self.fd.as_fd(), path, flags, mode)
    }

    fn err(&self, path: &Path, source: Errno) -> RootfsError {
        RootfsError::Path {
            root: self.path.clone(),
            path: path.to_path_buf(),
            source,
        }
    }
}

/// What one link did.
#[derive(Debug)]
enum Linked {
    /// Made (or an older link replaced).
    Created,
    /// The same link was there.
    Same,
    /// Something of the image's other than a symlink is there; left alone.
    Occupied,
}

/// The parent directory of the previous link (links come sorted by path, so a run of
/// links in one directory resolves it once).
#[derive(Default)]
struct LinkDirs {
    last: Option<(PathBuf, OwnedFd)>,
}

/// `path` without its leading `/` (`.` for the root itself).
fn relative(path: &Path) -> PathBuf {
    let rel: PathBuf = path
        .components()
        .filter(|c| !matches!(c, Component::RootDir | Component::Prefix(_)))
        .collect();
    if rel.as_os_str().is_empty() {
        PathBuf::from(".")
    } else {
        rel
    }
}

fn normal_components(path: &Path) -> impl Iterator<Item = &OsStr> {
    path.components().filter_map(|c| match c {
        Component::Normal(name) => Some(name),
        _ => None,
    })
}

fn io_errno(e: &std::io::Error) -> Errno {
    e.raw_os_error().map_or(Errno::EIO, Errno::from_raw)
}

/// `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` done by hand: one component at
/// a time, each opened `O_PATH | O_NOFOLLOW` relative to the previous one's fd;
/// symlinks are read and their text resolved the same way (absolute ones from the
/// root), `..` never climbs above the root, and the last component is opened with
/// `O_NOFOLLOW`, so swapping it for a symlink after the check fails instead of
/// escaping.
pub(crate) fn walk(
    root: BorrowedFd<'_>,
    path: &Path,
    flags: OFlag,
    mode: Mode,
) -> Result<OwnedFd, Errno> {
    let mut stack: Vec<OwnedFd> = Vec::new();
    let mut queue: Vec<OsString> = Vec::new();
    push_front(&mut queue, path.as_os_str().as_bytes(), &mut stack);
    let mut links = 0;
    while let Some(part) = queue.pop() {
        if part == ".." {
            stack.pop();
            continue;
        }
        let current = stack.last().map_or(root, |fd| fd.as_fd());
        let step = fcntl::openat(
            current,
            part.as_os_str(),
            OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        );
        let step = match step {
            Ok(fd) => fd,
            Err(Errno::ENOENT) if queue.is_empty() && flags.contains(OFlag::O_CREAT) => {
                return fcntl::openat(current, part.as_os_str(), flags | OFlag::O_NOFOLLOW, mode);
            }
            Err(e) => return Err(e),
        };
        let st = stat::fstatat(&step, "", AtFlags::AT_EMPTY_PATH)?;
        let kind = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT;
        if kind == SFlag::S_IFLNK {
            links += 1;
            if links > MAX_LINKS {
                return Err(Errno::ELOOP);
            }
            let target = fcntl::readlinkat(&step, "")?;
            push_front(&mut queue, target.as_bytes(), &mut stack);
            continue;
        }
        if queue.is_empty() {
            return fcntl::openat(current, part.as_os_str(), flags | OFlag::O_NOFOLLOW, mode);
        }
        if kind != SFlag::S_IFDIR {
            return Err(Errno::ENOTDIR);
        }
        stack.push(step);
    }
    // The path named the root itself (or climbed back to it).
    let current = stack.last().map_or(root, |fd| fd.as_fd());
    fcntl::openat(current, ".", flags, mode)
}

/// Queues `path`'s components to be walked next (the queue pops from the end). An
/// absolute path restarts from the root.
fn push_front(queue: &mut Vec<OsString>, path: &[u8], stack: &mut Vec<OwnedFd>) {
    if path.first() == Some(&b'/') {
        stack.clear();
    }
    let parts = path
        .split(|b| *b == b'/')
        .filter(|p| !p.is_empty() && *p != b".")
        .map(|p| OsStr::from_bytes(p).to_os_string());
    let parts: Vec<OsString> = parts.collect();
    queue.extend(parts.into_iter().rev());
}

#[cfg(test)]
mod tests;

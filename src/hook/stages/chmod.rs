//! `chmod --mode M --path P …`: file modes inside the container (NVIDIA's workaround
//! for old crun, which made `/dev/dri` 0700; off in NVIDIA's specs unless asked for).
//!
//! Each path is resolved inside the rootfs with no symlink allowed anywhere on the
//! way (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`): the spec names real paths
//! such as `/dev/dri`, and an image link must not turn the chmod onto a file the
//! container shares with the host. A missing path is skipped and a refusal by the
//! filesystem (`EPERM`, `EROFS`) is ignored, as NVIDIA's hook does.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat;

use crate::rootfs::Rootfs;

use super::{StageError, container_path};

/// Parses `--mode` (octal, e.g. `755`) and the `--path` values.
pub fn parse(mode: &str, paths: &[String]) -> Result<(u32, Vec<PathBuf>), StageError> {
    let bad = || StageError::Mode {
        value: mode.to_owned(),
    };
    let trimmed = mode.trim();
    if trimmed.is_empty() {
        return Err(bad());
    }
    let mode = u32::from_str_radix(trimmed, 8).map_err(|_| bad())?;
    if mode > 0o7777 {
        return Err(bad());
    }
    let paths = paths
        .iter()
        .map(|p| container_path(p).ok_or_else(|| StageError::RelativePath { value: p.clone() }))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((mode, paths))
}

/// Sets `mode` on each of `paths`; returns how many changed.
pub fn run(rootfs: &Rootfs, mode: u32, paths: &[PathBuf]) -> Result<usize, StageError> {
    let mut changed = 0;
    for path in paths {
        let err = |source| StageError::Path {
            root: rootfs.path().to_path_buf(),
            path: path.clone(),
            source,
        };
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_SYMLINKS);
        let relative = path.strip_prefix("/").unwrap_or(path);
        let relative = if relative.as_os_str().is_empty() {
            Path::new(".")
        } else {
            relative
        };
        let fd = match fcntl::openat2(rootfs.root_fd(), relative, how) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                tracing::debug!(path = %path.display(), "not in the container, skipped");
                continue;
            }
            Err(e) => return Err(err(e)),
        };
        let st = stat::fstat(&fd).map_err(err)?;
        if st.st_mode & 0o7777 == mode {
            continue;
        }
        // An O_PATH fd cannot be fchmod'ed; its /proc/self/fd entry names exactly that
        // inode (and it is not a symlink: none was allowed on the way).
        let proc_path = format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd));
        let set = std::fs::set_permissions(&proc_path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw));
        match set {
            Ok(()) => changed += 1,
            Err(e @ (Errno::EPERM | Errno::EROFS)) => {
                tracing::debug!(path = %path.display(), "chmod refused ({e}), ignored");
            }
            Err(e) => return Err(err(e)),
        }
    }
    Ok(changed)
}

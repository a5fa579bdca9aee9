//! `chmod --mode M --path P …`: file modes inside the container (NVIDIA's workaround
//! for old crun, which made `/dev/dri` 0700; off in NVIDIA's specs unless asked for).
//!
//! Each path is resolved inside the rootfs with no symlink allowed anywhere on the
//! way (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`): the spec names real paths
//! such as `/dev/dri`, and an image link must not turn the chmod onto a file the
//! container shares with the host. A missing path is skipped and a refusal by the
//! filesystem (`EPERM`, `EROFS`) is ignored, as NVIDIA's hook does. Stricter than
//! NVIDIA's: a file (not a directory) with more than one hard link is refused, since
//! its other name may be a host file's.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sys::stat;

use crate::rootfs::Rootfs;

use super::{StageError, container_path, open_no_symlinks};

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
        let fd = match open_no_symlinks(rootfs.root_fd(), path) {
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
        // A second name for a file that is not a directory may be a host file's (a
        // rootfs on the host's filesystem can hold a hard link to /etc/shadow): its
        // mode is the host's too. Directories cannot be hard-linked.
        if st.st_mode & libc::S_IFMT != libc::S_IFDIR && st.st_nlink > 1 {
            return Err(StageError::HardLink {
                root: rootfs.path().to_path_buf(),
                path: path.clone(),
                links: st.st_nlink,
            });
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

//! `disable-device-node-modification`: the container's `/proc/driver/nvidia/params`
//! with `ModifyDeviceFiles: 0`.
//!
//! With `ModifyDeviceFiles: 1` (the driver's default), NVML in a container creates
//! `/dev/nvidia<N>` for every GPU it finds missing, so a container given one GPU could
//! make the nodes of the others (whether it may open them is then up to the device
//! cgroup alone). NVIDIA's toolkit covers the file with a copy that says `0`; so do we.
//!
//! runc refuses OCI mounts under `/proc`, so this runs in the container's mount
//! namespace after runc mounted its `/proc`: as a `createContainer` hook for the
//! runtime and CDI specs, and inside the prestart hook. The copy lives on a private,
//! detached tmpfs (`fsopen`/`fsmount`, Linux 5.2): nothing is created in the rootfs or
//! on the host; the bind of the one file is attached read-only over the target, which
//! must be a regular file reached inside the rootfs with no symlink on the way (runc's
//! procfs there, normally; at worst a file of the image's own).

use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag, OpenHow, ResolveFlag};
use nix::mount::MsFlags;
use nix::sys::stat::Mode;

use crate::bundle::{self, Bundle, BundleError};
use crate::discover::params::{PARAMS, disabled};
use crate::hook_contract::ROOTFS_FLAG;

use super::{mounts, syscalls};

/// The params file is a few hundred bytes.
const MAX_PARAMS: u64 = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error("{ROOTFS_FLAG} {0:?} is not an absolute path (the container's rootfs on the host)")]
    RelativeRootfs(PathBuf),
    #[error("cannot open the container's rootfs {path}: {source}")]
    Root {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("the container's /{PARAMS} is not a regular file: refusing to cover it")]
    NotAFile,
    #[error("cannot cover the container's /{PARAMS} ({step}): {source}")]
    Mount {
        step: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cannot read the container's /{PARAMS}: {0}")]
    Read(#[source] std::io::Error),
}

/// The `createContainer` hook as CDI specs run it: finds the rootfs from the OCI state
/// (the bundle's `config.json`) and covers its params. Returns whether it covered
/// anything.
pub fn run(state: &[u8]) -> Result<bool, ParamsError> {
    let state = bundle::parse_state(state)?;
    let loaded = Bundle::new(&state.bundle).load()?;
    let root = loaded.doc.root_path().ok_or(ParamsError::NoRoot)?;
    run_at(&state.bundle.join(root))
}

/// The hook as the runtime adds it, with the rootfs's absolute path in its arguments
/// ([`ROOTFS_FLAG`]): the runtime wrote that spec itself, so neither the state on
/// stdin nor `config.json` needs reading. runc runs `createContainer` hooks before
/// `pivot_root`, where the rootfs is still at its host path.
pub fn run_at(rootfs: &Path) -> Result<bool, ParamsError> {
    if !rootfs.is_absolute() {
        return Err(ParamsError::RelativeRootfs(rootfs.to_path_buf()));
    }
    let dir = fcntl::open(
        rootfs,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| ParamsError::Root {
        path: rootfs.to_path_buf(),
        source,
    })?;
    cover(dir.as_fd())
}

/// Covers `<rootfs>/proc/driver/nvidia/params` when it says `ModifyDeviceFiles: 1`;
/// `Ok(false)` when the container has no such file (no driver loaded) or it already
/// says 0. Must run in the container's mount namespace, after its `/proc` is mounted.
pub fn cover(rootfs: BorrowedFd<'_>) -> Result<bool, ParamsError> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let target = match fcntl::openat2(rootfs, Path::new(PARAMS), how) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) => return Ok(false),
        Err(source) => {
            return Err(ParamsError::Mount {
                step: "open",
                source,
            });
        }
    };
    let st = nix::sys::stat::fstat(&target).map_err(|source| ParamsError::Mount {
        step: "stat",
        source,
    })?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(ParamsError::NotAFile);
    }
    let mut text = String::new();
    std::fs::File::open(format!("/proc/self/fd/{}", target.as_raw_fd()))
        .and_then(|f| f.take(MAX_PARAMS).read_to_string(&mut text))
        .map_err(ParamsError::Read)?;
    let Some(copy) = disabled(&text) else {
        return Ok(false);
    };
    let tree = copy_tree(copy.as_bytes())?;
    let step = |step| move |source| ParamsError::Mount { step, source };
    mounts::attach(tree.as_fd(), target.as_fd()).map_err(step("move_mount"))?;
    let flags = MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
    if let Err(source) = mounts::seal(tree.as_fd(), flags) {
        let _ = mounts::detach(tree.as_fd());
        return Err(ParamsError::Mount {
            step: "read-only remount",
            source,
        });
    }
    Ok(true)
}

/// A detached bind mount of a file holding `bytes`, on a new tmpfs that is attached
/// nowhere (it lives as long as the bind does).
fn copy_tree(bytes: &[u8]) -> Result<OwnedFd, ParamsError> {
    let step = |step| move |source| ParamsError::Mount { step, source };
    let context = syscalls::fsopen(c"tmpfs").map_err(step("fsopen tmpfs"))?;
    syscalls::fsconfig_create(context.as_fd()).map_err(step("fsconfig"))?;
    let attrs =
        syscalls::MOUNT_ATTR_NOSUID | syscalls::MOUNT_ATTR_NODEV | syscalls::MOUNT_ATTR_NOEXEC;
    let mnt = syscalls::fsmount(context.as_fd(), attrs).map_err(step("fsmount"))?;
    let file = fcntl::openat(
        &mnt,
        "params",
        OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC | OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(0o444),
    )
    .map_err(step("create the copy"))?;
    std::fs::File::from(file)
        .write_all(bytes)
        .map_err(|e| ParamsError::Mount {
            step: "write the copy",
            source: Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)),
        })?;
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    syscalls::open_tree(mnt.as_fd(), c"params", flags).map_err(step("open_tree"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_relative_rootfs_is_refused_before_anything_is_opened() {
        let err = run_at(Path::new("rootfs")).unwrap_err();
        assert!(matches!(err, ParamsError::RelativeRootfs(_)), "{err}");
        assert!(err.to_string().contains("not an absolute path"), "{err}");
    }

    #[test]
    fn a_rootfs_without_the_driver_params_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        assert!(!run_at(dir.path()).unwrap());
        let err = run_at(&dir.path().join("missing")).unwrap_err();
        assert!(matches!(err, ParamsError::Root { .. }), "{err}");
    }
}

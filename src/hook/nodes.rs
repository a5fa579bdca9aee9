//! Device nodes in the container's `/dev`, inside its mount namespace.
//!
//! Normally a `mknod` through the rootfs fd, with the host node's major, minor and
//! permission bits (runc's `/dev` is a tmpfs that exists only in the container's
//! namespace, which is why this runs after `setns`). A node on a filesystem mounted
//! inside a user namespace cannot be opened (`SB_I_NODEV`), and `mknod` may be
//! refused outright; then the host node itself is bind-mounted onto an empty file, as
//! runc does for such containers.

use std::os::fd::{AsFd, BorrowedFd};

use nix::errno::Errno;
use nix::mount::MsFlags;

use super::HookError;
use super::host::SourceNode;
use super::mounts;
use super::ns::{self, UserNamespace};
use crate::rootfs::fdpath::{Created, MountpointKind};
use crate::rootfs::{Rootfs, RootfsError};

/// What was done for one node.
#[derive(Debug)]
pub enum Made<'a> {
    /// A new node.
    Created(Created),
    /// The host node bind-mounted (with the mountpoint, if it was created).
    Mounted(BorrowedFd<'a>, Option<Created>),
    /// The same node was already there.
    Existing,
}

/// Puts `node` into the rootfs: `mknod`, or a bind mount when the container has its
/// own user namespace (`user`) or `mknod` is not permitted.
pub fn make<'a>(
    rootfs: &Rootfs,
    node: &'a SourceNode,
    user: Option<UserNamespace>,
) -> Result<Made<'a>, HookError> {
    if user.is_none() {
        match rootfs.char_device(&node.path, node.mode, node.rdev()) {
            Ok(Some(created)) => return Ok(Made::Created(created)),
            Ok(None) => return Ok(Made::Existing),
            Err(RootfsError::Path {
                source: Errno::EPERM,
                ..
            }) => {
                tracing::debug!(path = %node.path.display(), "mknod not permitted; bind-mounting the host node");
            }
            Err(e) => return Err(e.into()),
        }
    }
    let point = match (rootfs.mountpoint(&node.path, MountpointKind::File), user) {
        // runc's /dev tmpfs belongs to the container's user namespace: the mountpoint
        // must be created by an id it maps.
        (
            Err(RootfsError::Path {
                source: Errno::EOVERFLOW,
                ..
            }),
            Some(user),
        ) => ns::as_container_root(user, || rootfs.mountpoint(&node.path, MountpointKind::File))?,
        (point, _) => point?,
    };
    let step = |step: &'static str| {
        move |source| HookError::Mount {
            source_path: node.host.clone(),
            target: node.path.clone(),
            step,
            source,
        }
    };
    let tree = node.tree.as_fd();
    let undo = |mounted: bool| {
        if mounted {
            let _ = mounts::detach(tree);
        }
        if let Some(created) = &point.created {
            let _ = created.remove();
        }
    };
    if let Err(e) = mounts::attach(tree, point.fd.as_fd()) {
        undo(false);
        return Err(step("attach")(e));
    }
    if let Err(e) = mounts::seal(tree, MsFlags::MS_NOSUID | MsFlags::MS_NOEXEC) {
        undo(true);
        return Err(step("remount")(e));
    }
    Ok(Made::Mounted(tree, point.created))
}

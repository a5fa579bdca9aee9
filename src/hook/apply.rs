//! The hook's work inside the container's mount namespace, before runc's
//! `pivot_root`: the rootfs is reached at its path as runc mounted it there (the
//! bundle's `root.path`), and everything in it is resolved through one root fd
//! opened after `setns`, so the hook sees exactly the tree the container will see,
//! `/dev` tmpfs and all, and an overlay rootfs that exists only in this namespace
//! too. Nothing from the image is executed, and nothing is looked up by a path
//! string under the rootfs.
//!
//! Order: bind mounts (mountpoint created in the root, detached host clone attached,
//! remounted with its flags, made private), device nodes, then the driver's soname
//! links and the linker cache, written in place. If any step fails, the mounts, nodes
//! and mountpoints this step added are taken away again before the error is
//! returned (directories it created on the way stay); runc then fails the create.

use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;

use super::HookError;
use super::host::Sources;
use super::mounts;
use super::nodes::{self, Made};
use super::ns::UserNamespace;
use crate::discover::SymlinkEdit;
use crate::inventory::DriverInfo;
use crate::ldcache::Entry;
use crate::rootfs::fdpath::Created;
use crate::rootfs::linker::{self, Refresh};
use crate::rootfs::{Rootfs, compat};

/// What [`apply`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    pub mounts: usize,
    /// Nodes made with `mknod`.
    pub nodes_created: usize,
    /// Nodes bind-mounted from the host.
    pub nodes_mounted: usize,
    /// Nodes that were already there.
    pub nodes_existing: usize,
    /// Soname links created or replaced (the same link already there is not counted).
    pub symlinks: usize,
    pub ldcache: Refresh,
}

/// Steps to take back, newest last.
#[derive(Default)]
struct Undo<'a> {
    steps: Vec<Step<'a>>,
}

enum Step<'a> {
    Mount(BorrowedFd<'a>),
    Remove(Created),
}

impl Undo<'_> {
    fn run(self) {
        for step in self.steps.into_iter().rev() {
            match step {
                Step::Mount(tree) => {
                    if let Err(e) = mounts::detach(tree) {
                        tracing::warn!("undo: cannot detach a mount: {e}");
                    }
                }
                Step::Remove(created) => {
                    if let Err(e) = created.remove() {
                        tracing::warn!("undo: cannot remove a created mountpoint or node: {e}");
                    }
                }
            }
        }
    }
}

/// What goes into the rootfs besides the host sources: the driver's soname links and
/// the linker cache entries, from the plan.
#[derive(Debug, Clone, Copy)]
pub struct Files<'a> {
    pub symlinks: &'a [SymlinkEdit],
    pub ldcache: &'a [Entry],
    /// The host driver, when CUDA compat is on: the image's compat libraries then go
    /// ahead of `ldcache`'s where NVIDIA's rule says so.
    pub compat_host: Option<&'a DriverInfo>,
}

/// Applies `sources` and `files` to the rootfs at `rootfs_path` (as seen in the
/// current mount namespace). `user`: the container's own user namespace, if it has
/// one (device nodes are then bind-mounted, not made with `mknod`).
pub fn apply(
    rootfs_path: &Path,
    sources: &Sources,
    files: Files<'_>,
    user: Option<UserNamespace>,
) -> Result<Applied, HookError> {
    let rootfs = Rootfs::open(rootfs_path)?;
    let mut undo = Undo::default();
    let result = apply_with(&rootfs, sources, user, &mut undo).and_then(|mut applied| {
        // Last: links and a file rewrite in the rootfs. Not undone (a replaced link
        // cannot be put back), but nothing else is left behind when they fail.
        let prefer = match files.compat_host {
            Some(host) => compat::preferred(
                &rootfs,
                &host.version,
                host.cuda_version.as_deref(),
                files.ldcache,
            ),
            None => Vec::new(),
        };
        let (dev, rest) = super::stages::symlinks::split_dev(files.symlinks);
        let (links, ldcache) = linker::install(&rootfs, &rest, files.ldcache, &prefer)?;
        applied.symlinks += links;
        if !dev.is_empty() {
            applied.symlinks += super::stages::symlinks::run(&rootfs, &dev)?;
        }
        applied.ldcache = ldcache;
        Ok(applied)
    });
    if result.is_err() {
        undo.run();
    }
    result
}

fn apply_with<'a>(
    rootfs: &Rootfs,
    sources: &'a Sources,
    user: Option<UserNamespace>,
    undo: &mut Undo<'a>,
) -> Result<Applied, HookError> {
    let mut applied = Applied {
        mounts: 0,
        nodes_created: 0,
        nodes_mounted: 0,
        nodes_existing: 0,
        symlinks: 0,
        ldcache: Refresh::Unchanged,
    };
    for mount in &sources.mounts {
        let point = rootfs.mountpoint(&mount.target, mount.kind)?;
        if let Some(created) = point.created {
            undo.steps.push(Step::Remove(created));
        }
        let step = |step: &'static str| {
            move |source| HookError::Mount {
                source_path: mount.host.clone(),
                target: mount.target.clone(),
                step,
                source,
            }
        };
        let tree = mount.tree.as_fd();
        mounts::attach(tree, point.fd.as_fd()).map_err(step("attach"))?;
        undo.steps.push(Step::Mount(tree));
        mounts::seal(tree, mount.options.flags).map_err(step("remount"))?;
        tracing::debug!(target = %mount.target.display(), source = %mount.host.display(), "mounted");
        applied.mounts += 1;
    }
    for node in &sources.nodes {
        match nodes::make(rootfs, node, user)? {
            Made::Created(created) => {
                undo.steps.push(Step::Remove(created));
                applied.nodes_created += 1;
            }
            Made::Mounted(tree, created) => {
                if let Some(created) = created {
                    undo.steps.push(Step::Remove(created));
                }
                undo.steps.push(Step::Mount(tree));
                applied.nodes_mounted += 1;
            }
            Made::Existing => applied.nodes_existing += 1,
        }
        tracing::debug!(path = %node.path.display(), major = node.major, minor = node.minor, "device node");
    }
    Ok(applied)
}

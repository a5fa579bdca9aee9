//! `create-symlinks --link TARGET::LINK …`: symlinks in the container.
//!
//! Each link is made inside the rootfs ([`Rootfs::symlinks`]: the parent resolved in
//! the root and created if missing, the link made under a temporary name and renamed
//! into place; one already pointing at the target is left alone). The target is the
//! link's text and is not resolved, as with NVIDIA's hook.
//!
//! Links under `/dev` (NVIDIA's DRM `by-path` links) go to the container's `/dev`,
//! which runc has mounted as a tmpfs by the time the hook runs: that tmpfs is opened
//! inside the root (no symlink allowed on the way), checked to be a tmpfs, and used as
//! the root for those links, so they never land on another filesystem either.

use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::statfs;

use crate::discover::SymlinkEdit;
use crate::hook_contract;
use crate::rootfs::Rootfs;

use super::{StageError, open_no_symlinks};

const DEV: &str = "/dev";

/// Parses `--link` values (`TARGET::LINK`, LINK absolute with no `..`).
pub fn parse_links(values: &[String]) -> Result<Vec<SymlinkEdit>, hook_contract::ArgError> {
    values
        .iter()
        .map(|v| hook_contract::parse_link(v))
        .collect()
}

/// `links` split into those under `/dev` (the DRM `by-path` links: [`run`] puts them in
/// the container's `/dev` tmpfs, which the rootfs's own link making refuses as another
/// filesystem) and the rest.
pub fn split_dev(links: &[SymlinkEdit]) -> (Vec<SymlinkEdit>, Vec<SymlinkEdit>) {
    links.iter().cloned().partition(|l| l.path.starts_with(DEV))
}

/// Creates `links` in `rootfs`; returns how many changed.
pub fn run(rootfs: &Rootfs, links: &[SymlinkEdit]) -> Result<usize, StageError> {
    let dev_root = if links.iter().any(|l| l.path.starts_with(DEV)) {
        dev_rootfs(rootfs)?
    } else {
        None
    };
    let (dev, rest): (Vec<&SymlinkEdit>, Vec<&SymlinkEdit>) = links
        .iter()
        .partition(|l| dev_root.is_some() && l.path.starts_with(DEV));
    let mut rest: Vec<(&Path, &str)> = rest
        .iter()
        .map(|l| (l.path.as_path(), l.target.as_str()))
        .collect();
    rest.sort();
    let mut changed = rootfs.symlinks(rest)?;
    if let Some(dev_root) = dev_root {
        let mut inside: Vec<(PathBuf, &str)> = dev
            .iter()
            .filter_map(|l| {
                let rel = l.path.strip_prefix(DEV).ok()?;
                Some((Path::new("/").join(rel), l.target.as_str()))
            })
            .collect();
        inside.sort();
        changed += dev_root.symlinks(inside.iter().map(|(p, t)| (p.as_path(), *t)))?;
    }
    Ok(changed)
}

/// The container's `/dev` as a root of its own when it is a tmpfs (what runc mounts
/// there), found inside the rootfs with no symlink on the way; `None` when it is a
/// plain directory of the rootfs or an image's symlink (then the links go there like
/// any other, on the rootfs's filesystem only).
fn dev_rootfs(rootfs: &Rootfs) -> Result<Option<Rootfs>, StageError> {
    let err = |source| StageError::Path {
        root: rootfs.path().to_path_buf(),
        path: PathBuf::from(DEV),
        source,
    };
    // Only the rootfs's own `/dev` (what runc mounted there), never where an image
    // link named `/dev` leads: that can be a volume's tmpfs. Without one, the links
    // go through the rootfs, which keeps them on its own filesystem.
    let fd = match open_no_symlinks(rootfs.root_fd(), Path::new(DEV)) {
        Ok(fd) => fd,
        Err(Errno::ENOENT | Errno::ELOOP | Errno::ENOTDIR) => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let fs = statfs::fstatfs(&fd).map_err(err)?;
    if fs.filesystem_type() != statfs::TMPFS_MAGIC {
        return Ok(None);
    }
    let path = PathBuf::from(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ));
    Ok(Some(Rootfs::open(&path)?))
}

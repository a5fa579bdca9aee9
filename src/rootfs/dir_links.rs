//! Links whose directory the image lacks: the topmost missing directory becomes one
//! symlink into a tree the caller provides (the driver stage's `t/`), instead of a
//! chain of new directories and a link per file. On a disk filesystem a directory is
//! the dearest thing a create makes (an inode and a block): firmware's
//! `/lib/firmware/nvidia/<version>/` was three of them in most images.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, Mode};
use nix::unistd;

use super::{Rootfs, RootfsError};

/// What [`Rootfs::place_links`] did besides the links themselves.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Placed {
    /// Paths where the image has a file or directory of its own: left alone.
    pub occupied: Vec<PathBuf>,
    /// Missing directories made one symlink each (what `dir_link` named).
    pub dir_links: Vec<PathBuf>,
}

impl Rootfs {
    /// [`symlinks_beside_files`](Self::symlinks_beside_files), except that where a
    /// link's directory is missing from the image, the topmost missing directory `A`
    /// becomes a symlink to `dir_link(A)` when that gives a target (the caller answers
    /// only for directories where the target's tree holds exactly the links under
    /// `A`, and never for a directory below one it refuses), and the links under `A`
    /// are not made one by one. Two missing directories
    /// that are one place in the image (`/lib` and `/usr/lib` are often one) get no
    /// directory link.
    pub fn place_links(
        &self,
        links: &[(&Path, &str)],
        dir_link: &dyn Fn(&Path) -> Option<String>,
    ) -> Result<Placed, RootfsError> {
        let mut placed = Placed::default();
        let candidates = self.missing_tops(links, dir_link)?;
        for (top, target) in &candidates {
            if self.link_dir(top, target)? {
                tracing::debug!(path = %top.display(), target, "directory symlink");
                placed.dir_links.push(top.clone());
            }
        }
        let rest = links
            .iter()
            .filter(|(path, _)| !placed.dir_links.iter().any(|top| path.starts_with(top)))
            .map(|(path, target)| (*path, *target));
        placed.occupied = self.symlinks_beside_files(rest)?;
        Ok(placed)
    }

    /// The topmost missing directory above each link whose directory is missing, with
    /// its target, where `dir_link` gives one and no other candidate is the same place.
    fn missing_tops(
        &self,
        links: &[(&Path, &str)],
        dir_link: &dyn Fn(&Path) -> Option<String>,
    ) -> Result<BTreeMap<PathBuf, String>, RootfsError> {
        let parents: BTreeSet<&Path> = links.iter().filter_map(|(p, _)| p.parent()).collect();
        let mut tops: BTreeMap<PathBuf, String> = BTreeMap::new();
        for parent in parents {
            // No target for a directory means none for any directory above it (the
            // caller's answer narrows going down), so most parents cost no system call.
            if dir_link(parent).is_none()
                || tops.keys().any(|top| parent.starts_with(top))
                || self.exists(parent)?
            {
                continue;
            }
            let Some((top, link)) = self.topmost_missing(parent)? else {
                continue;
            };
            match (dir_link(&top), link) {
                // Missing, or this link already (a restarted container's rootfs).
                (Some(target), None) => {
                    tops.insert(top, target);
                }
                (Some(target), Some(text)) if text == target => {
                    tops.insert(top, target);
                }
                _ => {}
            }
        }
        // One place under two names: neither gets a link (the second would find the
        // first's link, dangling until the stage is mounted).
        let mut places: BTreeMap<(u64, u64, PathBuf), Vec<PathBuf>> = BTreeMap::new();
        for top in tops.keys() {
            let (Some(parent), Some(name)) = (top.parent(), top.file_name()) else {
                continue;
            };
            let dir = self.open_dir(parent)?;
            let st = stat::fstat(&dir).map_err(|e| self.err(parent, e))?;
            places
                .entry((st.st_dev, st.st_ino, PathBuf::from(name)))
                .or_default()
                .push(top.clone());
        }
        for same in places.values().filter(|v| v.len() > 1) {
            for top in same {
                tops.remove(top);
            }
        }
        Ok(tops)
    }

    /// Makes `top` (missing, its parent there) a symlink to `target`; `true` also when
    /// that link is there already, `false` when something else is (the caller then
    /// makes directories).
    fn link_dir(&self, top: &Path, target: &str) -> Result<bool, RootfsError> {
        let (Some(parent), Some(name)) = (top.parent(), top.file_name()) else {
            return Ok(false);
        };
        let dir = self.open_dir(parent)?;
        self.on_root_fs(&dir, parent)?;
        match unistd::symlinkat(target, &dir, name) {
            Ok(()) => Ok(true),
            Err(Errno::EEXIST) => Ok(fcntl::readlinkat(&dir, name)
                .is_ok_and(|text| text.as_encoded_bytes() == target.as_bytes())),
            Err(e) => Err(self.err(top, e)),
        }
    }

    /// The first directory from the root down to `path` that does not resolve, and
    /// the symlink's text when a symlink is there (`None`: every one resolves, or
    /// something other than a symlink is in the way).
    fn topmost_missing(
        &self,
        path: &Path,
    ) -> Result<Option<(PathBuf, Option<String>)>, RootfsError> {
        let mut prefix = PathBuf::from("/");
        for part in super::normal_components(path) {
            let parent = self.open_dir(&prefix)?;
            prefix.push(part);
            match stat::fstatat(&parent, part, AtFlags::AT_SYMLINK_NOFOLLOW) {
                Err(Errno::ENOENT) => return Ok(Some((prefix, None))),
                Err(e) => return Err(self.err(&prefix, e)),
                Ok(_) if self.exists(&prefix)? => {}
                Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFLNK => {
                    let text = fcntl::readlinkat(&parent, part)
                        .map_err(|e| self.err(&prefix, e))?
                        .to_string_lossy()
                        .into_owned();
                    return Ok(Some((prefix, Some(text))));
                }
                // A file in the way: let the usual path say what is wrong.
                Ok(_) => return Ok(None),
            }
        }
        Ok(None)
    }

    fn exists(&self, dir: &Path) -> Result<bool, RootfsError> {
        match self.resolve(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty()) {
            Ok(_) => Ok(true),
            Err(Errno::ENOENT | Errno::ENOTDIR) => Ok(false),
            Err(e) => Err(self.err(dir, e)),
        }
    }

    fn open_dir(&self, dir: &Path) -> Result<OwnedFd, RootfsError> {
        self.resolve(dir, OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
            .map_err(|e| self.err(dir, e))
    }
}

#[cfg(test)]
#[path = "dir_links_tests.rs"]
mod tests;

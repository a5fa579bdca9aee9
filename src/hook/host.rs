//! The host side of the hook, before `setns`: every file the container gets is opened
//! here, in the host's mount namespace, and cloned into a detached mount
//! ([`super::mounts::clone_tree`]).
//!
//! Sources are the plan's host paths (driver files, device nodes under the dev
//! root), never a path from the image. The last component is opened `O_NOFOLLOW` and
//! its type checked, so what gets mounted is exactly the file discovery found; a
//! device node must still have the major/minor the plan recorded.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, FileStat, Mode, SFlag};

use super::HookError;
use super::mounts::{self, MountOptions};
use crate::cdi::ContainerEdits;
use crate::rootfs::fdpath::MountpointKind;

/// A bind mount, ready to attach.
#[derive(Debug)]
pub struct SourceMount {
    /// The host file (for messages).
    pub host: PathBuf,
    /// Where it goes in the container.
    pub target: PathBuf,
    pub kind: MountpointKind,
    pub options: MountOptions,
    /// The detached clone of `host`.
    pub tree: OwnedFd,
}

/// A device node, ready to be made with `mknod` or, where that cannot work, attached
/// as a bind mount.
#[derive(Debug)]
pub struct SourceNode {
    pub host: PathBuf,
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
    /// Permission bits.
    pub mode: u32,
    /// The detached clone of `host`, for the bind-mount fallback.
    pub tree: OwnedFd,
}

impl SourceNode {
    pub fn rdev(&self) -> u64 {
        stat::makedev(u64::from(self.major), u64::from(self.minor))
    }
}

/// Everything the in-namespace step needs from the host.
#[derive(Debug, Default)]
pub struct Sources {
    pub mounts: Vec<SourceMount>,
    pub nodes: Vec<SourceNode>,
}

/// Opens and clones every source of `edits`.
pub fn open(edits: &ContainerEdits) -> Result<Sources, HookError> {
    let mut sources = Sources::default();
    for mount in &edits.mounts {
        let host = PathBuf::from(&mount.host_path);
        let options =
            mounts::parse_options(&mount.options).map_err(|option| HookError::MountOption {
                target: PathBuf::from(&mount.container_path),
                option,
            })?;
        let (fd, st) = open_nofollow(&host)?;
        let kind = match kind_of(&st) {
            SFlag::S_IFDIR => MountpointKind::Dir,
            SFlag::S_IFREG | SFlag::S_IFSOCK | SFlag::S_IFCHR => MountpointKind::File,
            other => {
                return Err(HookError::SourceKind {
                    path: host,
                    found: describe(other),
                });
            }
        };
        let tree = clone(&host, &fd, options.recursive)?;
        sources.mounts.push(SourceMount {
            target: PathBuf::from(&mount.container_path),
            host,
            kind,
            options,
            tree,
        });
    }
    for node in &edits.device_nodes {
        let path = PathBuf::from(&node.path);
        let host = node.host_path.as_ref().map_or(path.clone(), PathBuf::from);
        if node.kind.as_deref().is_some_and(|k| k != "c") {
            return Err(HookError::SourceKind {
                path: host,
                found: "not a character device in the plan",
            });
        }
        let (fd, st) = open_nofollow(&host)?;
        if kind_of(&st) != SFlag::S_IFCHR {
            return Err(HookError::SourceKind {
                path: host,
                found: describe(kind_of(&st)),
            });
        }
        let (major, minor) = (stat::major(st.st_rdev), stat::minor(st.st_rdev));
        let planned = (
            node.major.and_then(|m| u64::try_from(m).ok()),
            node.minor.and_then(|m| u64::try_from(m).ok()),
        );
        if planned != (Some(major), Some(minor)) {
            return Err(HookError::NodeChanged {
                path: host,
                planned: format!("{:?}:{:?}", node.major, node.minor),
                found: format!("{major}:{minor}"),
            });
        }
        let number = |n: u64| u32::try_from(n).map_err(|_| Errno::ERANGE);
        let (major, minor) = match (number(major), number(minor)) {
            (Ok(a), Ok(b)) => (a, b),
            (Err(source), _) | (_, Err(source)) => {
                return Err(HookError::Source { path: host, source });
            }
        };
        let tree = clone(&host, &fd, false)?;
        sources.nodes.push(SourceNode {
            mode: node.file_mode.unwrap_or(st.st_mode) & 0o7777,
            host,
            path,
            major,
            minor,
            tree,
        });
    }
    Ok(sources)
}

fn open_nofollow(path: &Path) -> Result<(OwnedFd, FileStat), HookError> {
    let err = |source| HookError::Source {
        path: path.to_path_buf(),
        source,
    };
    let fd = fcntl::open(
        path,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(err)?;
    let st = stat::fstat(&fd).map_err(err)?;
    Ok((fd, st))
}

fn clone(path: &Path, fd: &OwnedFd, recursive: bool) -> Result<OwnedFd, HookError> {
    mounts::clone_tree(fd.as_fd(), recursive).map_err(|source| HookError::Clone {
        path: path.to_path_buf(),
        source,
    })
}

fn kind_of(st: &FileStat) -> SFlag {
    SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT
}

fn describe(kind: SFlag) -> &'static str {
    match kind {
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFDIR => "a directory",
        SFlag::S_IFREG => "a regular file",
        SFlag::S_IFCHR => "a character device",
        SFlag::S_IFBLK => "a block device",
        SFlag::S_IFIFO => "a FIFO",
        SFlag::S_IFSOCK => "a socket",
        _ => "of an unknown type",
    }
}

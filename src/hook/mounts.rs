//! Bind mounts from the host into the container's mount namespace.
//!
//! A classic `mount(MS_BIND)` refuses a source that lives in another mount namespace
//! (`EINVAL`): once the hook has entered the container's namespace, an fd it opened
//! on the host cannot be bind-mounted. So each host source is cloned *before*
//! `setns` with `open_tree(OPEN_TREE_CLONE)` (Linux 5.2), which gives a detached
//! mount of exactly the file the host path named when the hook looked; after `setns`
//! that detached mount is attached onto the mountpoint fd with `move_mount`. Neither
//! side is ever named by a path the image controls. The attached mount is then
//! remounted with its flags and made private through `/proc/self/fd/N` of the same
//! fd, which refers to the mount itself.
//!
//! Nothing here resolves container paths: mountpoints come from
//! [`crate::rootfs::Rootfs::mountpoint`].

use std::ffi::c_uint;
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};

use super::syscalls;

/// How one bind mount is mounted, from its CDI/OCI options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountOptions {
    /// Per-mount flags set by the remount: some of `MS_RDONLY`, `MS_NOSUID`,
    /// `MS_NODEV`, `MS_NOEXEC`.
    pub flags: MsFlags,
    /// `rbind`: clone the submounts of the source too.
    pub recursive: bool,
}

/// Parses OCI mount options. Every mount is made private whatever they say (a mount
/// the hook adds must never propagate back to the host); an option outside the set
/// bind mounts use is returned as the error.
pub fn parse_options(options: &[String]) -> Result<MountOptions, String> {
    let mut parsed = MountOptions {
        flags: MsFlags::empty(),
        recursive: false,
    };
    for option in options {
        let (set, clear) = match option.as_str() {
            "ro" => (MsFlags::MS_RDONLY, MsFlags::empty()),
            "rw" => (MsFlags::empty(), MsFlags::MS_RDONLY),
            "nosuid" => (MsFlags::MS_NOSUID, MsFlags::empty()),
            "suid" => (MsFlags::empty(), MsFlags::MS_NOSUID),
            "nodev" => (MsFlags::MS_NODEV, MsFlags::empty()),
            "dev" => (MsFlags::empty(), MsFlags::MS_NODEV),
            "noexec" => (MsFlags::MS_NOEXEC, MsFlags::empty()),
            "exec" => (MsFlags::empty(), MsFlags::MS_NOEXEC),
            "bind" => {
                parsed.recursive = false;
                continue;
            }
            "rbind" => {
                parsed.recursive = true;
                continue;
            }
            "private" | "rprivate" => continue,
            other => return Err(other.to_string()),
        };
        parsed.flags = (parsed.flags | set) & !clear;
    }
    Ok(parsed)
}

/// Clones the mount at `source` (an `O_PATH` fd opened in the host's mount namespace)
/// into a new detached mount; dropping the returned fd before [`attach`] unmounts it.
pub fn clone_tree(source: BorrowedFd<'_>, recursive: bool) -> Result<OwnedFd, Errno> {
    let mut flags: c_uint = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    flags |= libc::AT_EMPTY_PATH as c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as c_uint;
    }
    syscalls::open_tree(source, c"", flags)
}

/// Attaches the detached mount `tree` onto `target` (an `O_PATH` fd of the mountpoint
/// in the current mount namespace).
pub fn attach(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), Errno> {
    syscalls::move_mount(tree, target)
}

/// Sets the per-mount flags of the attached mount `tree` (bind remount) and makes it,
/// and anything under it, private.
pub fn seal(tree: BorrowedFd<'_>, flags: MsFlags) -> Result<(), Errno> {
    let path = proc_path(tree);
    nix::mount::mount(
        None::<&str>,
        path.as_str(),
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_BIND | flags,
        None::<&str>,
    )?;
    nix::mount::mount(
        None::<&str>,
        path.as_str(),
        None::<&str>,
        MsFlags::MS_PRIVATE | MsFlags::MS_REC,
        None::<&str>,
    )
}

/// Detaches the attached mount `tree` again (undo after a later failure).
pub fn detach(tree: BorrowedFd<'_>) -> Result<(), Errno> {
    nix::mount::umount2(proc_path(tree).as_str(), MntFlags::MNT_DETACH)
}

fn proc_path(fd: BorrowedFd<'_>) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(list: &[&str]) -> Result<MountOptions, String> {
        parse_options(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn options_of_every_edit_kind() {
        use crate::edits::{IPC_DIR_OPTIONS, RO_OPTIONS, SOCKET_OPTIONS};
        let cases: [(&str, &[&str], MsFlags); 3] = [
            (
                "read-only file",
                RO_OPTIONS,
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
            ),
            (
                "socket",
                SOCKET_OPTIONS,
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            ),
            (
                "ipc dir",
                IPC_DIR_OPTIONS,
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
            ),
        ];
        for (case, list, want) in cases {
            let got = opts(list).unwrap();
            assert_eq!(got.flags, want, "{case}");
            assert!(!got.recursive, "{case}");
        }
    }

    #[test]
    fn later_options_win_and_unknown_ones_are_named() {
        assert_eq!(opts(&["ro", "rw"]).unwrap().flags, MsFlags::empty());
        assert!(opts(&["rbind"]).unwrap().recursive);
        assert_eq!(opts(&["ro", "shared"]), Err("shared".to_string()));
    }
}

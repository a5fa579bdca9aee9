//! File descriptors for paths inside the rootfs: what the prestart hook needs to put
//! mounts and device nodes into a container without ever naming a rootfs path as a
//! string.
//!
//! Every lookup goes through the root fd with the same confinement as the rest of
//! [`Rootfs`] (`openat2(RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS)` or the equivalent
//! walk). A missing last component is created with `O_EXCL`-like semantics in its
//! already-resolved parent (`mknodat`/`mkdirat` never follow a symlink at the name
//! they create), so an image cannot turn "create an empty mountpoint" into "create a
//! file on the host" (CVE-2024-0133). A symlink that already sits at the last
//! component is followed inside the root (as runc does for its own mount targets), but
//! a dangling one is refused rather than created through.

use std::ffi::{OsStr, OsString};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, Mode, SFlag};
use nix::sys::statfs;
use nix::unistd::{self, UnlinkatFlags};

use super::{Rootfs, RootfsError};

/// What a mountpoint must be: a file (for a file, socket or device bind mount) or a
/// directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountpointKind {
    File,
    Dir,
}

/// A resolved mountpoint inside the rootfs.
#[derive(Debug)]
pub struct Mountpoint {
    /// `O_PATH` fd of the file or directory to mount onto (use `/proc/self/fd/N`).
    pub fd: OwnedFd,
    /// Set when the mountpoint did not exist and was created here.
    pub created: Option<Created>,
}

/// An entry this module created, so that a failed operation can remove it again.
#[derive(Debug)]
pub struct Created {
    parent: OwnedFd,
    name: OsString,
    dir: bool,
}

impl Created {
    /// Removes the entry (an empty file, a device node or an empty directory).
    pub fn remove(&self) -> Result<(), Errno> {
        let flag = if self.dir {
            UnlinkatFlags::RemoveDir
        } else {
            UnlinkatFlags::NoRemoveDir
        };
        unistd::unlinkat(&self.parent, self.name.as_os_str(), flag)
    }
}

impl Rootfs {
    /// The `O_PATH` fd of the rootfs itself.
    pub fn root_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Opens the directory `path` (a container path) as `O_PATH`, creating missing
    /// components (mode 0755) inside the root.
    pub fn dir_fd(&self, path: &Path) -> Result<OwnedFd, RootfsError> {
        self.ensure_dir(path)
    }

    /// Resolves `path` inside the root, symlinks included (they stay in the root), and
    /// returns an `O_PATH` fd. `Ok(None)` when it does not exist.
    pub fn path_fd(&self, path: &Path) -> Result<Option<OwnedFd>, RootfsError> {
        match self.resolve(path, OFlag::O_PATH, Mode::empty()) {
            Ok(fd) => Ok(Some(fd)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(self.err(path, e)),
        }
    }

    /// Finds or creates the mountpoint `path` (a container path) of `kind`: missing
    /// parents become directories (0755), a missing last component an empty file
    /// (0644) or directory (0755), made in its resolved parent. Fails if what is there
    /// has the other kind, or is a dangling symlink.
    pub fn mountpoint(&self, path: &Path, kind: MountpointKind) -> Result<Mountpoint, RootfsError> {
        let (parent, name) = self.parent_and_name(path)?;
        let existing = stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW);
        let (fd, created) = match existing {
            Err(Errno::ENOENT) => {
                let dir = kind == MountpointKind::Dir;
                let made = if dir {
                    stat::mkdirat(&parent, name, Mode::from_bits_truncate(0o755))
                } else {
                    stat::mknodat(
                        &parent,
                        name,
                        SFlag::S_IFREG,
                        Mode::from_bits_truncate(0o644),
                        0,
                    )
                };
                made.map_err(|e| self.err(path, e))?;
                let fd = open_nofollow(&parent, name).map_err(|e| self.err(path, e))?;
                let created = Created {
                    parent,
                    name: name.to_os_string(),
                    dir,
                };
                (fd, Some(created))
            }
            Err(e) => return Err(self.err(path, e)),
            Ok(st) if file_type(st.st_mode) == SFlag::S_IFLNK => {
                // Followed inside the root; a dangling link is refused, not created through.
                let fd = self
                    .resolve(path, OFlag::O_PATH, Mode::empty())
                    .map_err(|e| self.err(path, e))?;
                (fd, None)
            }
            Ok(_) => (
                open_nofollow(&parent, name).map_err(|e| self.err(path, e))?,
                None,
            ),
        };
        // runc has mounted /proc, /sys and the cgroups under the root before the hook
        // runs; an image link must not make us mount driver files over those files.
        let fs = statfs::fstatfs(&fd).map_err(|e| self.err(path, e))?;
        let kernel_fs = [
            statfs::PROC_SUPER_MAGIC,
            statfs::SYSFS_MAGIC,
            statfs::CGROUP_SUPER_MAGIC,
            statfs::CGROUP2_SUPER_MAGIC,
        ];
        if kernel_fs.contains(&fs.filesystem_type()) {
            if let Some(created) = &created {
                let _ = created.remove();
            }
            return Err(RootfsError::OtherMount {
                root: self.path().to_path_buf(),
                path: path.to_path_buf(),
            });
        }
        let st = stat::fstat(&fd).map_err(|e| self.err(path, e))?;
        let is_dir = file_type(st.st_mode) == SFlag::S_IFDIR;
        match (kind, is_dir) {
            (MountpointKind::Dir, false) => Err(self.err(path, Errno::ENOTDIR)),
            (MountpointKind::File, true) => Err(self.err(path, Errno::EISDIR)),
            _ => Ok(Mountpoint { fd, created }),
        }
    }

    /// Creates the character device node `path` (a container path) with `mode` and
    /// `rdev` in its resolved parent (made if missing). `Ok(None)` when a character
    /// device with the same `rdev` is already there (runc made it from the spec, or a
    /// second run); any other file at `path` is an error (`EEXIST`).
    pub fn char_device(
        &self,
        path: &Path,
        mode: u32,
        rdev: u64,
    ) -> Result<Option<Created>, RootfsError> {
        let (parent, name) = self.parent_and_name(path)?;
        match stat::fstatat(&parent, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if file_type(st.st_mode) == SFlag::S_IFCHR && st.st_rdev == rdev => {
                return Ok(None);
            }
            Ok(_) => return Err(self.err(path, Errno::EEXIST)),
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(self.err(path, e)),
        }
        stat::mknodat(
            &parent,
            name,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(mode),
            rdev,
        )
        .map_err(|e| self.err(path, e))?;
        Ok(Some(Created {
            parent,
            name: name.to_os_string(),
            dir: false,
        }))
    }

    fn parent_and_name<'p>(&self, path: &'p Path) -> Result<(OwnedFd, &'p OsStr), RootfsError> {
        let (Some(parent), Some(name)) = (path.parent(), path.file_name()) else {
            return Err(self.err(path, Errno::EINVAL));
        };
        Ok((self.ensure_dir(parent)?, name))
    }
}

fn open_nofollow(dir: &OwnedFd, name: &OsStr) -> Result<OwnedFd, Errno> {
    fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
}

fn file_type(mode: u32) -> SFlag {
    SFlag::from_bits_truncate(mode) & SFlag::S_IFMT
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, symlink};
    use std::path::PathBuf;

    use super::*;

    fn setup() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let host = tmp.path().join("host");
        let root = tmp.path().join("rootfs");
        fs::create_dir_all(&host).unwrap();
        fs::create_dir_all(root.join("usr/lib")).unwrap();
        (tmp, host, root)
    }

    #[test]
    fn creates_missing_file_and_dir_mountpoints_and_removes_them() {
        let (_tmp, _host, root) = setup();
        let r = Rootfs::open(&root).unwrap();
        let file = r
            .mountpoint(Path::new("/usr/lib/x/libcuda.so.1"), MountpointKind::File)
            .unwrap();
        assert!(root.join("usr/lib/x/libcuda.so.1").is_file());
        let dir = r
            .mountpoint(Path::new("/tmp/nvidia-mps"), MountpointKind::Dir)
            .unwrap();
        assert!(root.join("tmp/nvidia-mps").is_dir());
        file.created.unwrap().remove().unwrap();
        dir.created.unwrap().remove().unwrap();
        assert!(!root.join("usr/lib/x/libcuda.so.1").exists());
        assert!(!root.join("tmp/nvidia-mps").exists());
        // An existing file is reused, not created.
        fs::write(root.join("usr/lib/present"), "").unwrap();
        let again = r
            .mountpoint(Path::new("/usr/lib/present"), MountpointKind::File)
            .unwrap();
        assert!(again.created.is_none());
    }

    #[test]
    fn symlinked_parents_and_targets_stay_in_the_root() {
        let (_tmp, host, root) = setup();
        // A parent that points at a host directory by its absolute path.
        symlink(&host, root.join("usr/lib/evil")).unwrap();
        let r = Rootfs::open(&root).unwrap();
        let got = r.mountpoint(
            Path::new("/usr/lib/evil/libcuda.so.1"),
            MountpointKind::File,
        );
        assert!(
            got.is_err(),
            "the in-root target of the link does not exist"
        );
        assert_eq!(
            fs::read_dir(&host).unwrap().count(),
            0,
            "nothing on the host"
        );

        // Once the in-root interpretation exists, the file lands there.
        fs::create_dir_all(root.join(host.strip_prefix("/").unwrap())).unwrap();
        r.mountpoint(
            Path::new("/usr/lib/evil/libcuda.so.1"),
            MountpointKind::File,
        )
        .unwrap();
        assert_eq!(
            fs::read_dir(&host).unwrap().count(),
            0,
            "nothing on the host"
        );
        assert!(
            root.join(host.strip_prefix("/").unwrap())
                .join("libcuda.so.1")
                .is_file()
        );

        // A dangling last-component link is refused, not created through.
        symlink(host.join("target"), root.join("usr/lib/dangling")).unwrap();
        assert!(
            r.mountpoint(Path::new("/usr/lib/dangling"), MountpointKind::File)
                .is_err()
        );
        assert!(!host.join("target").exists());
    }

    #[test]
    fn kind_mismatch_is_an_error() {
        let (_tmp, _host, root) = setup();
        let r = Rootfs::open(&root).unwrap();
        assert!(matches!(
            r.mountpoint(Path::new("/usr/lib"), MountpointKind::File),
            Err(RootfsError::Path {
                source: Errno::EISDIR,
                ..
            })
        ));
        fs::write(root.join("usr/f"), "").unwrap();
        assert!(matches!(
            r.mountpoint(Path::new("/usr/f"), MountpointKind::Dir),
            Err(RootfsError::Path {
                source: Errno::ENOTDIR,
                ..
            })
        ));
    }

    #[test]
    fn char_devices_are_made_once() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: mknod needs root");
            return;
        }
        let (_tmp, _host, root) = setup();
        let r = Rootfs::open(&root).unwrap();
        let rdev = stat::makedev(1, 3);
        let made = r
            .char_device(Path::new("/dev/nvidia-caps/x"), 0o666, rdev)
            .unwrap();
        assert!(made.is_some());
        let meta = fs::metadata(root.join("dev/nvidia-caps/x")).unwrap();
        assert!(meta.file_type().is_char_device());
        assert!(
            r.char_device(Path::new("/dev/nvidia-caps/x"), 0o666, rdev)
                .unwrap()
                .is_none()
        );
        assert!(
            r.char_device(Path::new("/dev/nvidia-caps/x"), 0o666, stat::makedev(1, 5))
                .is_err()
        );
        made.unwrap().remove().unwrap();
        assert!(!root.join("dev/nvidia-caps/x").exists());
    }
}

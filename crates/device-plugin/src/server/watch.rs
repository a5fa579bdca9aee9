//! Notices changes in the socket directories: kubelet re-creating `kubelet.sock` (a
//! kubelet restart) and our own sockets disappearing.
//!
//! inotify only says "something with this name changed"; it never decides anything.
//! The serving loop compares what is on disk with what it bound and registered
//! against (see [`FileId`]), so the events our own restarts cause (deleting and
//! re-binding our sockets) are harmless.

use std::ffi::OsString;
use std::io;
use std::os::fd::{AsFd, AsRawFd, RawFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};
use tokio::io::unix::AsyncFd;

/// Which file a path named when we looked: device, inode and change time. A socket
/// that is deleted and created again (by kubelet or by anyone) gets a new identity,
/// even when the filesystem hands the freed inode number straight back (tmpfs does),
/// because the new file's ctime differs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
    ctime: (i64, i64),
}

impl FileId {
    /// The identity of what `path` names now, `None` when nothing is there.
    pub(super) fn of(path: &Path) -> Option<Self> {
        std::fs::symlink_metadata(path).ok().map(|m| Self {
            dev: m.dev(),
            ino: m.ino(),
            ctime: (m.ctime(), m.ctime_nsec()),
        })
    }
}

/// `AsyncFd` wants `AsRawFd`; nix's `Inotify` only offers `AsFd`.
struct InotifyFd(Inotify);

impl AsRawFd for InotifyFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_fd().as_raw_fd()
    }
}

/// An inotify watch on one or more directories.
pub(super) struct DirWatch {
    fd: AsyncFd<InotifyFd>,
    /// The watched directories and their watch, `None` once the kernel dropped it
    /// (the directory was deleted or unmounted).
    dirs: Vec<(PathBuf, Option<WatchDescriptor>)>,
}

const FLAGS: AddWatchFlags = AddWatchFlags::IN_CREATE
    .union(AddWatchFlags::IN_DELETE)
    .union(AddWatchFlags::IN_MOVED_FROM)
    .union(AddWatchFlags::IN_MOVED_TO)
    .union(AddWatchFlags::IN_DELETE_SELF)
    .union(AddWatchFlags::IN_MOVE_SELF)
    .union(AddWatchFlags::IN_ONLYDIR);

/// What one batch of events touched.
#[derive(Debug, Default)]
pub(super) struct Touched {
    /// File names created in (or moved into) a watched directory.
    pub(super) created: Vec<OsString>,
    /// The kernel dropped events or a watch: look at everything.
    pub(super) everything: bool,
}

impl Touched {
    /// Whether a file with this name was created.
    pub(super) fn has_created(&self, name: &std::ffi::OsStr) -> bool {
        self.created.iter().any(|n| n == name)
    }
}

impl DirWatch {
    /// Watches each directory (duplicates are watched once). Fails when one cannot
    /// be watched, typically because it does not exist.
    pub(super) fn new(dirs: &[&Path]) -> Result<Self, (PathBuf, io::Error)> {
        let no_dir = |e: Errno| (PathBuf::new(), io::Error::from(e));
        let inotify =
            Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).map_err(no_dir)?;
        let mut watched: Vec<(PathBuf, Option<WatchDescriptor>)> = Vec::new();
        for dir in dirs {
            if watched.iter().any(|(d, _)| d == dir) {
                continue;
            }
            let wd = inotify
                .add_watch(*dir, FLAGS)
                .map_err(|e| (dir.to_path_buf(), io::Error::from(e)))?;
            watched.push((dir.to_path_buf(), Some(wd)));
        }
        // tokio deprecated the safe constructor (tokio#8587) because it cannot check
        // that `as_raw_fd` keeps naming one open descriptor; its replacement is
        // `unsafe`, which this module may not use. Here it holds: `InotifyFd` owns
        // the descriptor for the `AsyncFd`'s whole life and always returns it.
        #[allow(deprecated)]
        let fd = AsyncFd::new(InotifyFd(inotify)).map_err(|e| (PathBuf::new(), e))?;
        Ok(Self { fd, dirs: watched })
    }

    /// The directories this watch was made for.
    pub(super) fn dirs(&self) -> impl Iterator<Item = &Path> {
        self.dirs.iter().map(|(d, _)| d.as_path())
    }

    /// Waits for the next batch of events.
    pub(super) async fn changed(&mut self) -> io::Result<Touched> {
        loop {
            let mut ready = self.fd.readable().await?;
            match ready.get_inner().0.read_events() {
                Ok(events) => {
                    let mut touched = Touched::default();
                    for event in events {
                        if event.mask.intersects(
                            AddWatchFlags::IN_Q_OVERFLOW
                                | AddWatchFlags::IN_IGNORED
                                | AddWatchFlags::IN_DELETE_SELF
                                | AddWatchFlags::IN_MOVE_SELF,
                        ) {
                            touched.everything = true;
                        }
                        if event.mask.contains(AddWatchFlags::IN_IGNORED) {
                            for (_, wd) in &mut self.dirs {
                                if *wd == Some(event.wd) {
                                    *wd = None;
                                }
                            }
                        }
                        // Deletions need no name: the loop sees them by looking.
                        if let Some(name) = event.name
                            && event
                                .mask
                                .intersects(AddWatchFlags::IN_CREATE | AddWatchFlags::IN_MOVED_TO)
                        {
                            touched.created.push(name);
                        }
                    }
                    return Ok(touched);
                }
                Err(Errno::EAGAIN) => ready.clear_ready(),
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Watches again the directories whose watch the kernel dropped, when they exist
    /// again. Returns whether any watch was re-added.
    pub(super) fn rewatch(&mut self) -> bool {
        let mut added = false;
        for (dir, wd) in &mut self.dirs {
            if wd.is_none()
                && let Ok(new) = self.fd.get_ref().0.add_watch(dir.as_path(), FLAGS)
            {
                *wd = Some(new);
                added = true;
            }
        }
        added
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[tokio::test(flavor = "current_thread")]
    async fn reports_created_names() {
        let dir = tempfile::tempdir().unwrap();
        let mut watch = DirWatch::new(&[dir.path(), dir.path()]).unwrap();
        assert_eq!(
            watch.dirs().count(),
            1,
            "a directory given twice is watched once"
        );
        let file = dir.path().join("kubelet.sock");
        std::fs::write(&file, b"").unwrap();
        let id = FileId::of(&file).unwrap();
        let touched = watch.changed().await.unwrap();
        assert!(touched.has_created(std::ffi::OsStr::new("kubelet.sock")));
        assert_eq!(
            FileId::of(&file),
            Some(id),
            "an untouched file keeps its identity"
        );
        // A re-created file usually gets a new identity, but not always (an inode
        // reused within one clock tick looks the same), which is why the loop also
        // trusts the creation event.
        std::fs::remove_file(&file).unwrap();
        let touched = watch.changed().await.unwrap();
        assert!(touched.created.is_empty(), "a deletion is no creation");
        assert_eq!(FileId::of(&dir.path().join("missing")), None);
    }

    #[test]
    fn missing_directory_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        let (path, _) = DirWatch::new(&[missing.as_path()]).err().unwrap();
        assert_eq!(path, missing);
    }
}

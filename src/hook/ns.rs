//! Entering the container's mount namespace.
//!
//! `setns(CLONE_NEWNS)` fails with `EINVAL` for a thread whose `fs_struct` is shared
//! with another thread. The hook binary is single-threaded by construction (no async
//! runtime, no logging thread), and [`MountNamespace::enter`] also unshares
//! `CLONE_FS` first, so a thread started by a library cannot break it.
//!
//! The thread count and the namespace identities come from the `procfs` crate;
//! `uid_map`/`gid_map`, which it does not read, are parsed here.

use std::fs::File;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use nix::errno::Errno;
use nix::sched::CloneFlags;
use procfs::ProcError;
use procfs::process::{Namespace, Process};

use super::HookError;

/// The process's thread count: its tasks in `/proc/self/task`. (Counted rather than
/// read from `/proc/self/status`: procfs's parser of the whole status file costs the
/// static hook about 45 KiB.)
pub fn threads() -> Option<usize> {
    let tasks = Process::myself().and_then(|p| p.tasks()).ok()?;
    Some(tasks.filter(Result::is_ok).count())
}

/// The errno behind a procfs error (`EIO` where it has none).
fn errno_of(e: &ProcError) -> Errno {
    match e {
        ProcError::PermissionDenied(_) => Errno::EACCES,
        ProcError::NotFound(_) => Errno::ENOENT,
        ProcError::Io(e, _) => e.raw_os_error().map_or(Errno::EIO, Errno::from_raw),
        _ => Errno::EIO,
    }
}

/// Process `pid`'s (or our own, `None`) namespace of type `kind` (`mnt`, `user`).
fn namespace(pid: Option<i32>, kind: &str) -> Result<Namespace, ProcError> {
    let process = match pid {
        Some(pid) => Process::new(pid)?,
        None => Process::myself()?,
    };
    let mut all = process.namespaces()?;
    all.0
        .remove(std::ffi::OsStr::new(kind))
        .ok_or(ProcError::NotFound(None))
}

/// Fails unless this process has exactly one thread.
pub fn assert_single_threaded() -> Result<(), HookError> {
    match threads() {
        Some(1) => Ok(()),
        count => Err(HookError::Threads { count }),
    }
}

/// The container's mount namespace, opened on the host side.
pub struct MountNamespace {
    file: File,
    path: PathBuf,
}

impl MountNamespace {
    /// Opens `/proc/<pid>/ns/mnt`. Refuses our own namespace: a container being
    /// created has a new one, so a `pid` that shares ours (a wrong state, or the hook
    /// run by hand with pid 1) would have the hook mount into the host.
    pub fn open(pid: i32) -> Result<MountNamespace, HookError> {
        let path = PathBuf::from(format!("/proc/{pid}/ns/mnt"));
        let errno = |e: std::io::Error| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw);
        let file = File::open(&path).map_err(|e| HookError::Namespace {
            path: path.clone(),
            source: errno(e),
        })?;
        let theirs = file.metadata().map_err(|e| HookError::Namespace {
            path: path.clone(),
            source: errno(e),
        })?;
        let ours = namespace(None, "mnt").map_err(|e| HookError::Namespace {
            path: PathBuf::from("/proc/self/ns/mnt"),
            source: errno_of(&e),
        })?;
        if (ours.device_id, ours.identifier) == (theirs.dev(), theirs.ino()) {
            return Err(HookError::SameNamespace { pid });
        }
        Ok(MountNamespace { file, path })
    }

    /// Moves this thread into the namespace (its root and cwd become the namespace's
    /// root). The thread first gets an `fs_struct` of its own, so this works even if a
    /// library (NVML, on the paths that load it) has started threads: setns refuses
    /// only a shared one.
    pub fn enter(&self) -> Result<(), HookError> {
        let failed = |source| HookError::Namespace {
            path: self.path.clone(),
            source,
        };
        nix::sched::unshare(CloneFlags::CLONE_FS).map_err(failed)?;
        nix::sched::setns(&self.file, CloneFlags::CLONE_NEWNS).map_err(|source| {
            if source == Errno::EINVAL && threads() != Some(1) {
                // Still shared somehow: say why rather than a bare EINVAL.
                return match assert_single_threaded() {
                    Err(e) => e,
                    Ok(()) => failed(source),
                };
            }
            failed(source)
        })
    }
}

/// The host ids of a container's root, when the container has a user namespace of
/// its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UserNamespace {
    /// The host uid and gid that container uid 0 and gid 0 map to (`None`: unmapped).
    pub root_uid: Option<u32>,
    pub root_gid: Option<u32>,
}

/// The container `pid`'s user namespace, if it is not ours. Then device nodes made
/// with `mknod` on its `/dev` could not be opened and are bind-mounted instead, and
/// files on filesystems mounted inside it must be created with an id it maps.
pub fn user_namespace(pid: i32) -> Option<UserNamespace> {
    let ours = namespace(None, "user").ok()?;
    let theirs = namespace(Some(pid), "user").ok()?;
    if (ours.device_id, ours.identifier) == (theirs.device_id, theirs.identifier) {
        return None;
    }
    let root = |file: &str| {
        let map = std::fs::read_to_string(format!("/proc/{pid}/{file}")).ok()?;
        host_id_of_root(&map)
    };
    Some(UserNamespace {
        root_uid: root("uid_map"),
        root_gid: root("gid_map"),
    })
}

/// The host id that id 0 maps to in a `uid_map`/`gid_map` text.
fn host_id_of_root(map: &str) -> Option<u32> {
    map.lines().find_map(|line| {
        let mut fields = line.split_whitespace().map(|f| f.parse::<u32>().ok());
        let (inside, outside, count) = (fields.next()??, fields.next()??, fields.next()??);
        (inside == 0 && count > 0).then_some(outside)
    })
}

/// Runs `f` with the filesystem uid and gid set to `user`'s root (as far as mapped),
/// then puts ours back. For creating files on a filesystem mounted inside the
/// container's user namespace, where an unmapped owner (ours) is refused with
/// `EOVERFLOW`.
pub fn as_container_root<T>(user: UserNamespace, f: impl FnOnce() -> T) -> T {
    use nix::unistd::{Gid, Uid, setfsgid, setfsuid};
    let old_gid = user.root_gid.map(|g| setfsgid(Gid::from_raw(g)));
    let old_uid = user.root_uid.map(|u| setfsuid(Uid::from_raw(u)));
    let result = f();
    if let Some(uid) = old_uid {
        setfsuid(uid);
    }
    if let Some(gid) = old_gid {
        setfsgid(gid);
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_thread_count() {
        assert!(threads().is_some_and(|n| n >= 1));
        let before = threads().unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let extra = std::thread::spawn(move || rx.recv());
        assert!(
            threads().unwrap() > before.min(1),
            "one more thread is counted"
        );
        tx.send(()).unwrap();
        extra.join().unwrap().unwrap();
    }

    #[test]
    fn namespaces_of_ourselves_and_of_a_missing_process() {
        let ours = namespace(None, "mnt").unwrap();
        let meta = std::fs::metadata("/proc/self/ns/mnt").unwrap();
        assert_eq!((ours.device_id, ours.identifier), (meta.dev(), meta.ino()));
        assert!(namespace(None, "no-such-kind").is_err());
        assert_eq!(user_namespace(std::process::id() as i32), None);
        let err = MountNamespace::open(i32::MAX).err().unwrap();
        assert!(
            err.to_string()
                .contains(&format!("/proc/{}/ns/mnt", i32::MAX)),
            "{err}"
        );
    }

    #[test]
    fn finds_the_host_id_of_root() {
        for (case, map, want) in [
            (
                "one range",
                "         0     200000      65536\n",
                Some(200000),
            ),
            (
                "root in the second range",
                "1000 1000 1\n0 100000 1000\n",
                Some(100000),
            ),
            ("root unmapped", "1000 1000 1\n", None),
            ("empty", "", None),
        ] {
            assert_eq!(host_id_of_root(map), want, "{case}");
        }
    }
}

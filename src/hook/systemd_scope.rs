//! The prestart hook's device grants, told to systemd so that a `daemon-reload` keeps
//! them.
//!
//! With the systemd cgroup driver the container's cgroup is a transient scope
//! (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `libpod-<id>.scope`), and systemd
//! rebuilds its device policy from the scope's `DeviceAllow=` entries whenever it
//! re-applies the unit, `systemctl daemon-reload` above all. The hook's own grants
//! ([`super::cgroup`]) are not among them and are dropped then. So, after granting, the
//! hook writes those nodes as a drop-in beside the scope's transient unit file:
//! `<root>/run/systemd/transient/<scope>.d/90-nvshim-DeviceAllow.conf`, a `[Scope]`
//! section with one `DeviceAllow=/dev/char/<major>:<minor> rwm` per node, the lines
//! `systemctl set-property --runtime <scope> DeviceAllow=…` writes (systemd puts every
//! drop-in of a transient unit in that directory). systemd reads it at the next
//! reload, the very event that re-applies the policy, and deletes it with the unit.
//!
//! Nothing is done unless the cgroup's last component is a valid scope name
//! ([`scope_name`]) and `<root>/run/systemd/transient/<scope>` is a regular file (a unit
//! systemd made, not a cgroupfs-driver cgroup that happens to end in `.scope`). No
//! process is run and no D-Bus spoken. Everything under the transient directory is
//! reached through directory fds with `O_NOFOLLOW`; the file is made under a temp name
//! and renamed into place, mode 0644, owned by the hook (root).
//!
//! systemd deletes only the drop-ins it has loaded: a scope that ends before any reload
//! leaves ours behind. Each write therefore also removes ours from up to
//! [`SWEEP_MAX`] directories whose unit file is gone ([`sweep`]).

use std::ffi::{OsStr, OsString};
use std::fmt::Write as _;
use std::fs::File;
use std::io::Write;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, Mode, SFlag};
use nix::unistd::{self, UnlinkatFlags};

use super::cgroup::CharDevice;

/// systemd's transient units and their drop-in directories, under the root.
pub const TRANSIENT_DIR: &str = "run/systemd/transient";
/// Our drop-in: after `50-DeviceAllow.conf` (what `set-property` writes, starting with
/// a `DeviceAllow=` reset), so that a later `set-property` does not undo it.
pub const DROP_IN: &str = "90-nvshim-DeviceAllow.conf";
/// At most this many stale drop-ins are removed per hook run.
pub const SWEEP_MAX: usize = 16;

const DIR_FLAGS: OFlag = OFlag::O_RDONLY
    .union(OFlag::O_DIRECTORY)
    .union(OFlag::O_NOFOLLOW)
    .union(OFlag::O_CLOEXEC);

#[derive(Debug, thiserror::Error)]
#[error("cannot write systemd drop-in {path}: {source}")]
pub struct ScopeError {
    pub path: PathBuf,
    #[source]
    pub source: Errno,
}

/// The scope named by the last component of a cgroup directory, if it is one: a name
/// of `[A-Za-z0-9:_.@-]` ending in `.scope`, at most 255 bytes, not starting with `.`.
pub fn scope_name(cgroup_dir: &Path) -> Option<&str> {
    let name = cgroup_dir.file_name()?.to_str()?;
    valid_scope(name).then_some(name)
}

fn valid_scope(name: &str) -> bool {
    name.len() <= 255
        && name.ends_with(".scope")
        && !name.starts_with('.')
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b":_.@-".contains(&b))
}

/// The drop-in's text for `devices`.
pub fn drop_in_text(devices: &[CharDevice]) -> String {
    let mut text = String::from("# nvidia-container-runtime-hook's device grants\n[Scope]\n");
    for d in devices {
        let _ = writeln!(text, "DeviceAllow=/dev/char/{}:{} rwm", d.major, d.minor);
    }
    text
}

/// Writes the drop-in for `scope` under `root` (see the module docs) and sweeps stale
/// ones. `Ok(None)`: systemd has no transient unit of that name there.
pub fn persist(
    root: &Path,
    scope: &str,
    devices: &[CharDevice],
) -> Result<Option<PathBuf>, ScopeError> {
    let top = root.join(TRANSIENT_DIR);
    let Ok(transient) = fcntl::open(top.as_path(), DIR_FLAGS, Mode::empty()) else {
        return Ok(None);
    };
    let unit = stat::fstatat(&transient, OsStr::new(scope), AtFlags::AT_SYMLINK_NOFOLLOW);
    if !unit.is_ok_and(|s| SFlag::from_bits_truncate(s.st_mode) & SFlag::S_IFMT == SFlag::S_IFREG) {
        return Ok(None);
    }
    sweep(&top, &transient);
    let name = OsString::from(format!("{scope}.d"));
    let path = top.join(&name).join(DROP_IN);
    let failed = |source| ScopeError {
        path: path.clone(),
        source,
    };
    match stat::mkdirat(
        &transient,
        name.as_os_str(),
        Mode::from_bits_truncate(0o755),
    ) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(failed(e)),
    }
    let dir =
        fcntl::openat(&transient, name.as_os_str(), DIR_FLAGS, Mode::empty()).map_err(failed)?;
    let temp = OsString::from(format!(".{DROP_IN}.{}", std::process::id()));
    let _ = unistd::unlinkat(&dir, temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
    let mode = Mode::from_bits_truncate(0o644);
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW;
    let fd =
        fcntl::openat(&dir, temp.as_os_str(), flags | OFlag::O_CLOEXEC, mode).map_err(failed)?;
    // fchmod: the mode exactly, whatever the umask.
    let written = stat::fchmod(&fd, mode)
        .and_then(|()| {
            File::from(fd)
                .write_all(drop_in_text(devices).as_bytes())
                .map_err(|e| e.raw_os_error().map_or(Errno::EIO, Errno::from_raw))
        })
        .and_then(|()| fcntl::renameat(&dir, temp.as_os_str(), &dir, OsStr::new(DROP_IN)));
    if let Err(e) = written {
        let _ = unistd::unlinkat(&dir, temp.as_os_str(), UnlinkatFlags::NoRemoveDir);
        return Err(failed(e));
    }
    Ok(Some(path))
}

/// Removes our drop-in (and the directory, when that empties it) of up to
/// [`SWEEP_MAX`] scopes whose transient unit file is gone. Errors are ignored: the
/// next run tries again.
fn sweep(top: &Path, transient: &OwnedFd) {
    let Ok(entries) = std::fs::read_dir(top) else {
        return;
    };
    let mut left = SWEEP_MAX;
    for entry in entries.take(4096) {
        let Ok(entry) = entry else { continue };
        let name = entry.file_name();
        let Some(scope) = name.to_str().and_then(|n| n.strip_suffix(".d")) else {
            continue;
        };
        if left == 0 {
            break;
        }
        let unit = stat::fstatat(transient, OsStr::new(scope), AtFlags::AT_SYMLINK_NOFOLLOW);
        if !valid_scope(scope) || !matches!(unit, Err(Errno::ENOENT)) {
            continue;
        }
        let Ok(dir) = fcntl::openat(transient, name.as_os_str(), DIR_FLAGS, Mode::empty()) else {
            continue;
        };
        if unistd::unlinkat(&dir, OsStr::new(DROP_IN), UnlinkatFlags::NoRemoveDir).is_ok() {
            left -= 1;
            let _ = unistd::unlinkat(transient, name.as_os_str(), UnlinkatFlags::RemoveDir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn scope_names_are_checked_strictly() {
        for (name, ok) in [
            ("docker-0123abcdef.scope", true),
            ("cri-containerd-ab12.scope", true),
            ("libpod-ab12.scope", true),
            ("user@1000.scope", true),
            ("docker-0123abcdef", false),
            ("docker-0123.service", false),
            (".scope", false),
            ("..scope", false),
            ("a b.scope", false),
            ("a\\x2d.scope", false),
            ("é.scope", false),
        ] {
            assert_eq!(valid_scope(name), ok, "{name}");
        }
        assert_eq!(
            scope_name(Path::new("/sys/fs/cgroup/system.slice/docker-ab.scope")),
            Some("docker-ab.scope")
        );
        assert_eq!(scope_name(Path::new("/sys/fs/cgroup/docker/ab")), None);
        assert!(!valid_scope(&format!("{}.scope", "a".repeat(250))));
    }

    proptest::proptest! {
        /// Any accepted name is one plain file name.
        #[test]
        fn accepted_names_stay_one_component(name in "\\PC{0,40}") {
            if valid_scope(&name) {
                proptest::prop_assert!(!name.contains('/') && name != "..", "{name}");
            }
        }
    }

    fn devices() -> [CharDevice; 2] {
        [
            CharDevice {
                major: 195,
                minor: 1,
            },
            CharDevice {
                major: 511,
                minor: 0,
            },
        ]
    }

    #[test]
    fn writes_beside_a_transient_unit_only_and_sweeps_stale_ones() {
        let root = tempfile::tempdir().unwrap();
        let devs = devices();
        // No systemd run directory: nothing.
        assert!(
            persist(root.path(), "docker-a.scope", &devs)
                .unwrap()
                .is_none()
        );
        let top = root.path().join(TRANSIENT_DIR);
        fs::create_dir_all(&top).unwrap();
        // No unit of that name (a cgroupfs cgroup named like a scope): nothing.
        assert!(
            persist(root.path(), "docker-a.scope", &devs)
                .unwrap()
                .is_none()
        );
        assert!(!top.join("docker-a.scope.d").exists());

        // Stale: ours without a unit (swept), another's without a unit (left), ours
        // beside a live unit (left).
        for (scope, file) in [
            ("docker-dead.scope", DROP_IN),
            ("docker-other.scope", "50-DeviceAllow.conf"),
            ("docker-live.scope", DROP_IN),
        ] {
            fs::create_dir_all(top.join(format!("{scope}.d"))).unwrap();
            fs::write(top.join(format!("{scope}.d/{file}")), "x").unwrap();
        }
        fs::write(top.join("docker-live.scope"), "[Scope]\n").unwrap();
        fs::write(top.join("docker-a.scope"), "[Scope]\n").unwrap();

        let written = persist(root.path(), "docker-a.scope", &devs)
            .unwrap()
            .unwrap();
        assert_eq!(written, top.join("docker-a.scope.d").join(DROP_IN));
        assert_eq!(
            fs::read_to_string(&written).unwrap(),
            "# nvidia-container-runtime-hook's device grants\n[Scope]\n\
             DeviceAllow=/dev/char/195:1 rwm\nDeviceAllow=/dev/char/511:0 rwm\n"
        );
        let meta = fs::metadata(&written).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o644);
        assert!(!top.join("docker-dead.scope.d").exists(), "swept");
        assert!(
            top.join("docker-other.scope.d/50-DeviceAllow.conf")
                .exists()
        );
        assert!(top.join("docker-live.scope.d").join(DROP_IN).exists());
        // Written again (a second hook run): replaced, no temp file left.
        persist(root.path(), "docker-a.scope", &devs[..1]).unwrap();
        let names: Vec<_> = fs::read_dir(top.join("docker-a.scope.d"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [DROP_IN]);
    }

    #[test]
    fn never_writes_through_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let elsewhere = tempfile::tempdir().unwrap();
        let top = root.path().join(TRANSIENT_DIR);
        fs::create_dir_all(&top).unwrap();
        // A unit file that is a link, and a drop-in directory that is a link.
        std::os::unix::fs::symlink("/etc/hostname", top.join("docker-l.scope")).unwrap();
        assert!(
            persist(root.path(), "docker-l.scope", &devices())
                .unwrap()
                .is_none()
        );
        fs::write(top.join("docker-d.scope"), "[Scope]\n").unwrap();
        std::os::unix::fs::symlink(elsewhere.path(), top.join("docker-d.scope.d")).unwrap();
        let err = persist(root.path(), "docker-d.scope", &devices()).unwrap_err();
        assert_eq!(err.source, Errno::ENOTDIR, "{err}");
        assert_eq!(fs::read_dir(elsewhere.path()).unwrap().count(), 0);
    }
}

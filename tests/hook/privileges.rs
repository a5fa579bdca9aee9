//! Each hook stage's capability set (`hook::privileges`), against the real kernel: a
//! stage cannot do what it dropped (`mknod`, `mount`, `setns` fail with `EPERM`) and
//! can still do its own work.
//!
//! Capabilities are per thread, so each case applies the stage's set on a thread of
//! its own, after moving that thread into a mount namespace of its own (nothing it
//! mounts, or fails to, reaches the host or the other tests). The binaries apply the
//! same sets at stage entry; tests/hook_prestart.rs, tests/driver_params.rs and
//! tests/hook_engines.rs run the stages' real work under them.
//!
//! Needs root (`CAP_SYS_ADMIN`, `CAP_MKNOD`); without it the tests say so and pass,
//! except under `CI=true`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use caps::{CapSet, Capability};
use nix::errno::Errno;
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use nix::sys::stat::{Mode, SFlag};
use nvshim::hook::params;
use nvshim::hook::privileges::{self, Stage};

fn privileged() -> bool {
    let has = |cap| caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false);
    let ok = has(Capability::CAP_SYS_ADMIN) && has(Capability::CAP_MKNOD);
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: these tests need root"
        );
        eprintln!("skipped: needs root (CAP_SYS_ADMIN, CAP_MKNOD)");
    }
    ok
}

/// Runs `f` on a new thread that has a private mount namespace of its own and then
/// `stage`'s capabilities.
fn in_stage<T: Send + 'static>(stage: Stage, f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        nix::sched::unshare(CloneFlags::CLONE_NEWNS).unwrap();
        nix::mount::mount(
            None::<&str>,
            "/",
            None::<&str>,
            MsFlags::MS_PRIVATE | MsFlags::MS_REC,
            None::<&str>,
        )
        .unwrap();
        let restricted = privileges::restrict(stage).unwrap();
        assert_eq!(
            caps::read(None, CapSet::Effective).unwrap(),
            restricted.kept,
            "{stage:?}"
        );
        f()
    })
    .join()
    .unwrap()
}

fn mknod(dir: &Path) -> Result<(), Errno> {
    nix::sys::stat::mknod(
        &dir.join("null"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(1, 3),
    )
}

fn mount_tmpfs(dir: &Path) -> Result<(), Errno> {
    nix::mount::mount(
        Some("tmpfs"),
        dir,
        Some("tmpfs"),
        MsFlags::empty(),
        None::<&str>,
    )
}

/// `setns` into this thread's own mount namespace: the call the prestart hook makes
/// (a thread needs an `fs_struct` of its own first).
fn setns_own_mount_namespace() -> Result<(), Errno> {
    nix::sched::unshare(CloneFlags::CLONE_FS)?;
    let ns = fs::File::open("/proc/thread-self/ns/mnt").map_err(|_| Errno::EIO)?;
    nix::sched::setns(ns, CloneFlags::CLONE_NEWNS)
}

#[test]
fn link_driver_cannot_mknod_mount_or_setns_but_can_write_files() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (nod, mnt, setns, write, bounding) = in_stage(Stage::LinkDriver, move || {
        let write = std::os::unix::fs::symlink("libcuda.so.1", path.join("libcuda.so"))
            .and_then(|()| fs::write(path.join("ld.so.cache"), b"cache"));
        (
            mknod(&path),
            mount_tmpfs(&path),
            setns_own_mount_namespace(),
            write.is_ok(),
            caps::read(None, CapSet::Bounding).unwrap(),
        )
    });
    assert_eq!(nod, Err(Errno::EPERM), "mknod");
    assert_eq!(mnt, Err(Errno::EPERM), "mount");
    assert_eq!(setns, Err(Errno::EPERM), "setns");
    assert!(
        write,
        "the stage's own work: a symlink and a file in the rootfs"
    );
    assert!(
        !bounding.contains(&Capability::CAP_SYS_ADMIN)
            && !bounding.contains(&Capability::CAP_MKNOD),
        "dropped from the bounding set too: {bounding:?}"
    );
}

#[test]
fn disable_device_node_modification_covers_params_but_cannot_mknod_or_setns() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().to_path_buf();
    let driver = rootfs.join("proc/driver/nvidia");
    fs::create_dir_all(&driver).unwrap();
    fs::write(
        driver.join("params"),
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\n",
    )
    .unwrap();
    let (nod, setns, covered, seen) = in_stage(Stage::DisableDeviceNodeModification, move || {
        let covered = params::run_at(&rootfs).map_err(|e| e.to_string());
        let seen = fs::read_to_string(rootfs.join("proc/driver/nvidia/params")).unwrap();
        (mknod(&rootfs), setns_own_mount_namespace(), covered, seen)
    });
    assert_eq!(nod, Err(Errno::EPERM), "mknod");
    assert_eq!(setns, Err(Errno::EPERM), "setns (no CAP_SYS_CHROOT)");
    assert_eq!(covered, Ok(true), "the stage's own work: the cover");
    assert!(seen.contains("ModifyDeviceFiles: 0"), "{seen}");
    // The cover was mounted in the thread's own namespace: the host still sees 1.
    let host = fs::read_to_string(driver.join("params")).unwrap();
    assert!(host.contains("ModifyDeviceFiles: 1"), "{host}");
}

#[test]
fn prestart_can_setns_mount_and_mknod_but_keeps_nothing_else() {
    if !privileged() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().to_path_buf();
    let (nod, mnt, setns, effective, bounding) = in_stage(Stage::Prestart, move || {
        let nod = mknod(&path);
        let mnt = mount_tmpfs(&path);
        (
            nod,
            mnt,
            setns_own_mount_namespace(),
            caps::read(None, CapSet::Effective).unwrap(),
            caps::read(None, CapSet::Bounding).unwrap(),
        )
    });
    assert_eq!(
        (nod, mnt, setns),
        (Ok(()), Ok(()), Ok(())),
        "mknod, mount, setns"
    );
    assert!(
        fs::symlink_metadata(dir.path().join("null"))
            .unwrap()
            .file_type()
            .is_char_device(),
        "the node was made on the host's tempdir (the tmpfs went with the thread's namespace)"
    );
    for dropped in [
        Capability::CAP_SYS_MODULE,
        Capability::CAP_SYS_RAWIO,
        Capability::CAP_SETPCAP,
        Capability::CAP_NET_RAW,
        Capability::CAP_SYS_BOOT,
    ] {
        assert!(!effective.contains(&dropped), "effective keeps {dropped}");
        assert!(!bounding.contains(&dropped), "bounding keeps {dropped}");
    }
}

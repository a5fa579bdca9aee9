//! Hostile images against the stages: what an image can put in its rootfs (hard links,
//! device nodes swapped in, huge config files) must not reach the host.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::*;

/// A bundle in `dir` whose config.json names `rootfs` (created), and its OCI state.
fn bundle(dir: &Path) -> Vec<u8> {
    fs::create_dir_all(dir.join("rootfs")).unwrap();
    fs::write(
        dir.join("config.json"),
        r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#,
    )
    .unwrap();
    format!(
        r#"{{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"{}"}}"#,
        dir.display()
    )
    .into_bytes()
}

fn mode_of(path: &Path) -> u32 {
    fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

/// A rootfs on the host's filesystem can hold a hard link to a host file (a plain
/// directory rootfs, or a bundle a user made): chmod must not change the host file's
/// mode through it, and the error names the path.
#[test]
fn chmod_refuses_a_hard_link_that_may_be_a_host_file() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let host = tmp.path().join("shadow");
    fs::write(&host, b"root:x:0").unwrap();
    fs::set_permissions(&host, fs::Permissions::from_mode(0o600)).unwrap();
    fs::create_dir_all(root.join("dev/dri")).unwrap();
    fs::hard_link(&host, root.join("dev/dri/card0")).unwrap();
    let rootfs = open_rootfs(&state).unwrap();

    let (mode, paths) = chmod::parse("666", &["/dev/dri/card0".to_owned()]).unwrap();
    let err = chmod::run(&rootfs, mode, &paths).unwrap_err().to_string();
    assert!(err.contains("/dev/dri/card0"), "{err}");
    assert!(err.contains("hard link"), "{err}");
    assert_eq!(mode_of(&host), 0o600);

    // A file of the image's own (one link) and a directory still change.
    fs::remove_file(root.join("dev/dri/card0")).unwrap();
    fs::write(root.join("dev/dri/card0"), b"").unwrap();
    fs::set_permissions(root.join("dev/dri"), fs::Permissions::from_mode(0o700)).unwrap();
    let (mode, paths) = chmod::parse("755", &["/dev/dri".into(), "/dev/dri/card0".into()]).unwrap();
    assert_eq!(chmod::run(&rootfs, mode, &paths).unwrap(), 2);
    assert_eq!(mode_of(&root.join("dev/dri")), 0o755);
    assert_eq!(mode_of(&host), 0o600);
}

/// The walk chmod uses where the kernel has no `openat2` (before 5.6) refuses a
/// symlink anywhere on the way, as `RESOLVE_NO_SYMLINKS` does, and finds real paths.
#[test]
fn the_no_symlink_walk_refuses_every_link() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("file"), b"").unwrap();
    fs::create_dir_all(root.join("dev/dri")).unwrap();
    fs::write(root.join("dev/dri/card0"), b"").unwrap();
    symlink(&host, root.join("etc")).unwrap();
    symlink("card0", root.join("dev/dri/card1")).unwrap();
    symlink("/dev", root.join("devlink")).unwrap();
    let rootfs = open_rootfs(&state).unwrap();
    let walk = |p: &str| walk_no_symlinks(rootfs.root_fd(), Path::new(p));

    let found = walk("/dev/dri/card0").unwrap();
    let st = nix::sys::stat::fstat(&found).unwrap();
    assert_eq!(
        st.st_ino,
        fs::metadata(root.join("dev/dri/card0")).unwrap().ino()
    );
    assert!(walk("/dev/dri").is_ok());
    assert!(walk("/").is_ok());
    for bad in ["/etc/file", "/etc", "/dev/dri/card1", "/devlink/dri"] {
        assert_eq!(walk(bad).unwrap_err(), Errno::ELOOP, "{bad}");
    }
    assert_eq!(walk("/dev/nope").unwrap_err(), Errno::ENOENT);
    assert_eq!(walk("/dev/dri/card0/x").unwrap_err(), Errno::ENOTDIR);
}

/// An image file is opened only once it is known to be a regular file: between the
/// check and the open, another container sharing the directory (a volume) could swap
/// in a device node, whose open alone can act (a watchdog starts counting down). A
/// FIFO stands in for the device: a thread keeps exchanging it with the library while
/// `update-ldcache` and `enable-cuda-compat` read the directory, and inotify reports
/// any open of the FIFO's inode (`O_PATH` opens are not reported since Linux 6.5).
#[test]
fn image_files_swapped_for_a_device_are_never_opened() {
    use nix::fcntl::{RenameFlags, renameat2};
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    use std::sync::atomic::{AtomicBool, Ordering};

    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let lib = root.join("usr/lib64");
    let compat_dir = root.join("usr/local/cuda/compat");
    fs::create_dir_all(&lib).unwrap();
    fs::create_dir_all(&compat_dir).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("etc/ld.so.cache"), b"").unwrap();
    let note = elf::tiny_with_note(compat::NOTE_SECTION, "NVIDIA Corporation", b"{}");
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
    let mut pairs = Vec::new();
    for (dir, name, bytes) in [
        (
            &lib,
            "libx.so.1",
            elf::tiny_so("libx.so.1", elf::NATIVE_MACHINE),
        ),
        (&compat_dir, "libcuda.so.560.1", note),
    ] {
        fs::write(dir.join(name), bytes).unwrap();
        let fifo = dir.join("device");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        inotify.add_watch(&fifo, AddWatchFlags::IN_OPEN).unwrap();
        pairs.push((dir.clone(), name));
    }
    // Kernels before 6.5 report O_PATH opens too: there, an O_PATH look at the FIFO
    // cannot be told from an open, and the check below would fail on a safe hook.
    let probe = nix::fcntl::open(
        &compat_dir.join("device"),
        nix::fcntl::OFlag::O_PATH,
        nix::sys::stat::Mode::empty(),
    )
    .unwrap();
    drop(probe);
    if inotify.read_events().is_ok_and(|e| !e.is_empty()) {
        eprintln!("this kernel reports O_PATH opens to inotify: cannot check");
        return;
    }
    let rootfs = open_rootfs(&state).unwrap();
    let stop = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let dirs: Vec<_> = pairs
                .iter()
                .map(|(d, n)| (fs::File::open(d).unwrap(), *n))
                .collect();
            while !stop.load(Ordering::Relaxed) {
                for (dir, name) in &dirs {
                    let _ = renameat2(dir, *name, dir, "device", RenameFlags::RENAME_EXCHANGE);
                }
            }
        });
        for _ in 0..3000 {
            let _ = ldcache::run(&rootfs, &[PathBuf::from("/usr/lib64")]);
            let _ = compat::decide(&rootfs, Some("550.1"), Some("12.0"), None);
        }
        stop.store(true, Ordering::Relaxed);
    });
    let opened = inotify.read_events().unwrap_or_default();
    assert!(
        opened.is_empty(),
        "the FIFO was opened {} times",
        opened.len()
    );
}

/// The image's `00-compat-*.conf` files name the directories `update-ldcache` scans
/// first. An image can ship thousands of them with thousands of lines each; the
/// hook reads a bounded number (what `enable-cuda-compat` writes is one line), so a
/// hostile image cannot keep it busy as root for as long as it likes.
#[test]
fn compat_files_name_a_bounded_number_of_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let conf = root.join("etc/ld.so.conf.d");
    fs::create_dir_all(&conf).unwrap();
    let lines: String = (0..5000).map(|i| format!("/compat/{i}\n")).collect();
    for f in 0..20 {
        fs::write(conf.join(format!("00-compat-{f:03}.conf")), &lines).unwrap();
    }
    let rootfs = open_rootfs(&state).unwrap();
    let dirs = ldcache::compat_dirs(&rootfs).unwrap();
    assert!(
        (1..=ldcache::MAX_COMPAT_DIRS).contains(&dirs.len()),
        "{} directories",
        dirs.len()
    );
    assert_eq!(dirs[0], Path::new("/compat/0"));
}

/// A compat `libcuda` whose name has no numeric major is the image's oddity, not a bad
/// flag: the hook does nothing (as NVIDIA's), and a bad flag's error names that flag.
#[test]
fn cuda_compat_blames_the_right_thing() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let dir = root.join("usr/local/cuda/compat");
    fs::create_dir_all(&dir).unwrap();
    fs::create_dir_all(root.join("etc")).unwrap();
    fs::write(root.join("etc/ld.so.cache"), b"").unwrap();
    fs::write(dir.join("libcuda.so.beta.1"), b"").unwrap();
    let rootfs = open_rootfs(&state).unwrap();
    let decided = compat::decide(&rootfs, Some("550.54.15"), None, None);
    assert!(
        matches!(decided, Ok(compat::Decision::Skip(_))),
        "{decided:?}"
    );
    let err = compat::decide(&rootfs, Some("550.54.15"), None, Some("usr/local/cuda"))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("--cuda-compat-container-root") && err.contains("\"usr/local/cuda\""),
        "{err}"
    );
}

/// `root.path` naming the host's root another way (a symlink to `/`, `..` enough to
/// climb to it) is refused like `/` itself: the hooks would write the host's
/// `/etc/ld.so.cache` and links in its `/usr/lib`.
#[test]
fn a_rootfs_that_is_the_host_root_by_another_name_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let up = "../".repeat(tmp.path().components().count() + 2);
    symlink("/", tmp.path().join("slash")).unwrap();
    for root in [up.as_str(), "slash", "slash/."] {
        fs::write(
            tmp.path().join("config.json"),
            format!(r#"{{"ociVersion":"1.0.2","root":{{"path":"{root}"}}}}"#),
        )
        .unwrap();
        let got = open_rootfs(&state);
        assert!(
            matches!(got, Err(StageError::HostRoot(_))),
            "{root}: {got:?}"
        );
    }
}

/// Unmounts on drop.
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// `create-symlinks` writes `/dev` links to the tmpfs runc mounts at the container's
/// `/dev`. An image whose `/dev` is a symlink to a volume's directory (a tmpfs from the
/// host) must not get the links written into that volume.
#[test]
fn dev_links_never_follow_an_image_link_to_another_tmpfs() {
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let vol = root.join("vol");
    fs::create_dir_all(&vol).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &vol,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some("size=64k"),
    )
    .unwrap();
    let _mounted = Mounted(vol.clone());
    symlink("/vol", root.join("dev")).unwrap();
    let rootfs = open_rootfs(&state).unwrap();
    let links =
        symlinks::parse_links(&["../card1::/dev/dri/by-path/pci-0000:3b:00.0-card".to_owned()])
            .unwrap();
    let done = symlinks::run(&rootfs, &links);
    assert!(done.is_err(), "{done:?}");
    assert_eq!(
        fs::read_dir(&vol).unwrap().count(),
        0,
        "links in the volume"
    );
}

/// A soname link is never made over something that is not a symlink, whatever its name
/// (as `ldconfig`, which says "is not a symbolic link"): an image's file stays, and a
/// directory in the way does not fail the container's start.
#[test]
fn soname_links_never_replace_files_or_directories() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let lib = root.join("usr/lib64");
    fs::create_dir_all(&lib).unwrap();
    fs::write(
        lib.join("libfoo.so.1.0"),
        elf::tiny_so("foo.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::write(lib.join("foo.so.1"), b"the image's own file").unwrap();
    fs::write(
        lib.join("libbar.so.1.0"),
        elf::tiny_so("bar.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::create_dir_all(lib.join("bar.so.1")).unwrap();
    let rootfs = open_rootfs(&state).unwrap();
    let done = ldcache::run(&rootfs, &[PathBuf::from("/usr/lib64")]);
    assert!(done.is_ok(), "{done:?}");
    assert_eq!(
        fs::read(lib.join("foo.so.1")).unwrap(),
        b"the image's own file"
    );
    assert!(lib.join("bar.so.1").is_dir());
}

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};

use super::*;

/// A host directory with a secret beside a rootfs whose paths lead toward it.
struct Setup {
    _tmp: tempfile::TempDir,
    host: PathBuf,
    root: PathBuf,
}

fn setup() -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let host = tmp.path().join("host");
    let root = tmp.path().join("rootfs");
    fs::create_dir_all(&host).unwrap();
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    fs::write(host.join("secret"), "host secret").unwrap();
    fs::write(root.join("usr/lib/inside"), "inside").unwrap();
    Setup {
        _tmp: tmp,
        host,
        root,
    }
}

fn ino(fd: &OwnedFd) -> u64 {
    stat::fstat(fd).unwrap().st_ino
}

#[test]
fn reads_plain_paths_and_misses() {
    let s = setup();
    let r = Rootfs::open(&s.root).unwrap();
    let got = r.read(Path::new("/usr/lib/inside"), 100).unwrap();
    assert_eq!(got.as_deref(), Some(&b"inside"[..]));
    assert_eq!(r.read(Path::new("/etc/ld.so.cache"), 100).unwrap(), None);
    assert_eq!(r.read(Path::new("/usr/lib/inside/x"), 100).unwrap(), None);
    assert!(matches!(
        r.read(Path::new("/usr/lib"), 100),
        Err(RootfsError::NotAFile { .. })
    ));
    assert!(matches!(
        r.read(Path::new("/usr/lib/inside"), 3),
        Err(RootfsError::TooLarge { limit: 3, .. })
    ));
}

#[test]
fn absolute_and_dotdot_symlinks_stay_inside() {
    let s = setup();
    // `/etc` -> the host directory's absolute path; `/up` -> far above the root.
    symlink(&s.host, s.root.join("etc")).unwrap();
    symlink("../../../../../../", s.root.join("up")).unwrap();
    symlink("/usr/lib/inside", s.root.join("abs-inside")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    assert_eq!(r.read(Path::new("/etc/secret"), 100).unwrap(), None);
    let via_up = format!("/up/{}/secret", s.host.strip_prefix("/").unwrap().display());
    assert_eq!(r.read(Path::new(&via_up), 100).unwrap(), None);
    assert_eq!(
        r.read(Path::new("/up/usr/lib/inside"), 100)
            .unwrap()
            .as_deref(),
        Some(&b"inside"[..])
    );
    assert_eq!(
        r.read(Path::new("/abs-inside"), 100).unwrap().as_deref(),
        Some(&b"inside"[..])
    );
}

#[test]
fn the_walk_agrees_with_openat2() {
    let s = setup();
    symlink(&s.host, s.root.join("etc")).unwrap();
    symlink("../../../..", s.root.join("up")).unwrap();
    symlink("lib", s.root.join("usr/lib64")).unwrap();
    symlink("/usr/lib64/inside", s.root.join("usr/chain")).unwrap();
    symlink("loop2", s.root.join("loop1")).unwrap();
    symlink("loop1", s.root.join("loop2")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    let flags = OFlag::O_RDONLY | OFlag::O_CLOEXEC;
    for path in [
        "/usr/lib/inside",
        "/usr/lib64/inside",
        "/usr/chain",
        "/up/usr/chain",
        "usr/../usr/lib/./inside",
        "/../../usr/lib/inside",
        "/",
    ] {
        let how = OpenHow::new()
            .flags(flags)
            .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let kernel = fcntl::openat2(&r.fd, relative(Path::new(path)).as_path(), how).unwrap();
        let ours = walk(r.fd.as_fd(), Path::new(path), flags, Mode::empty()).unwrap();
        assert_eq!(ino(&kernel), ino(&ours), "{path}");
    }
    for (path, errno) in [
        ("/etc/secret", Errno::ENOENT),
        ("/loop1", Errno::ELOOP),
        ("/usr/lib/inside/x", Errno::ENOTDIR),
    ] {
        assert_eq!(
            walk(r.fd.as_fd(), Path::new(path), flags, Mode::empty()).unwrap_err(),
            errno,
            "{path}"
        );
    }
}

#[test]
fn replace_writes_atomically_with_the_mode() {
    let s = setup();
    let r = Rootfs::open(&s.root).unwrap();
    r.replace(Path::new("/etc/ld.so.cache"), b"one", 0o644)
        .unwrap();
    r.replace(Path::new("/etc/ld.so.cache"), b"two", 0o644)
        .unwrap();
    let file = s.root.join("etc/ld.so.cache");
    assert_eq!(fs::read(&file).unwrap(), b"two");
    assert_eq!(
        fs::metadata(&file).unwrap().permissions().mode() & 0o777,
        0o644
    );
    assert_eq!(
        fs::metadata(s.root.join("etc")).unwrap().mode() & 0o777,
        0o755
    );
    // No temporary file is left behind.
    let names: Vec<_> = fs::read_dir(s.root.join("etc")).unwrap().collect();
    assert_eq!(names.len(), 1);
}

#[test]
fn replace_never_writes_through_symlinks_to_the_host() {
    let s = setup();
    // The target itself is a link to a host file: the link is replaced.
    fs::create_dir_all(s.root.join("etc")).unwrap();
    symlink(s.host.join("secret"), s.root.join("etc/ld.so.cache")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    r.replace(Path::new("/etc/ld.so.cache"), b"cache", 0o644)
        .unwrap();
    assert_eq!(fs::read(s.host.join("secret")).unwrap(), b"host secret");
    assert!(
        !fs::symlink_metadata(s.root.join("etc/ld.so.cache"))
            .unwrap()
            .file_type()
            .is_symlink()
    );

    // A parent that is a link to a host directory resolves inside the root, where
    // it does not exist: an error, and nothing is created on the host.
    symlink(&s.host, s.root.join("conf")).unwrap();
    let err = r
        .replace(Path::new("/conf/new-file"), b"x", 0o644)
        .unwrap_err();
    assert!(err.to_string().contains("/conf"), "{err}");
    assert_eq!(fs::read_dir(&s.host).unwrap().count(), 1);
}

#[test]
fn symlinks_are_created_replaced_and_kept_inside() {
    let s = setup();
    // The image's lib dir is a link to a host directory: the link must land inside.
    symlink(&s.host, s.root.join("lib64")).unwrap();
    fs::write(s.root.join("usr/lib/libcuda.so.1"), "image's copy").unwrap();
    fs::create_dir_all(s.root.join("usr/lib/adir")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    let cases = [
        // (name, path, target, changed)
        ("new", "/usr/lib/libcuda.so", "libcuda.so.1", true),
        ("same again", "/usr/lib/libcuda.so", "libcuda.so.1", false),
        (
            "other target",
            "/usr/lib/libcuda.so",
            "libcuda.so.550",
            true,
        ),
        (
            "over a file",
            "/usr/lib/libcuda.so.1",
            "libcuda.so.550",
            true,
        ),
        ("missing parents", "/opt/nv/bin/smi", "/usr/bin/smi", true),
    ];
    for (name, path, target, changed) in cases {
        assert_eq!(
            r.symlink(Path::new(path), target).unwrap(),
            changed,
            "case {name}"
        );
    }
    let link = |p: &str| fs::read_link(s.root.join(p)).unwrap();
    assert_eq!(link("usr/lib/libcuda.so"), Path::new("libcuda.so.550"));
    assert_eq!(link("usr/lib/libcuda.so.1"), Path::new("libcuda.so.550"));
    assert_eq!(link("opt/nv/bin/smi"), Path::new("/usr/bin/smi"));
    // `/lib64` names a host directory; inside the root that path does not exist, so
    // this is an error, and nothing is created on the host.
    assert!(
        r.symlink(Path::new("/lib64/libnvidia-ml.so.1"), "x")
            .is_err()
    );
    assert!(!s.host.join("libnvidia-ml.so.1").exists(), "host untouched");
    assert!(matches!(
        r.symlink(Path::new("/usr/lib/adir"), "x"),
        Err(RootfsError::Path {
            source: Errno::EISDIR,
            ..
        })
    ));
    let leftovers: Vec<_> = fs::read_dir(s.root.join("usr/lib"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains(".nvshim-"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn a_fifo_or_device_is_not_opened() {
    let s = setup();
    fs::create_dir_all(s.root.join("etc")).unwrap();
    nix::unistd::mkfifo(
        &s.root.join("etc/ld.so.cache"),
        Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    // Opening the FIFO for reading would block until a writer came: it must not be opened.
    assert!(matches!(
        r.read(Path::new("/etc/ld.so.cache"), 100),
        Err(RootfsError::NotAFile { .. })
    ));
}

#[test]
fn writes_that_lead_onto_another_filesystem_are_refused() {
    // A tmpfs mounted inside the root stands for runc's /proc or a volume; the image's
    // `/etc -> /vol` leads onto it. (Tests run as root, as the whole suite does.)
    let s = setup();
    let vol = s.root.join("vol");
    fs::create_dir_all(&vol).unwrap();
    nix::mount::mount(
        Some("tmpfs"),
        &vol,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    symlink("/vol", s.root.join("etc")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    let cache = r.replace(Path::new("/etc/ld.so.cache"), b"x", 0o644);
    let link = r.symlink(Path::new("/etc/libcuda.so.1"), "x");
    let _ = nix::mount::umount(&vol);
    assert!(
        matches!(cache, Err(RootfsError::OtherMount { .. })),
        "{cache:?}"
    );
    assert!(
        matches!(link, Err(RootfsError::OtherMount { .. })),
        "{link:?}"
    );
    assert!(!vol.join("ld.so.cache").exists());
}

#[test]
fn mountpoints_on_proc_are_refused_even_through_an_image_link() {
    let s = setup();
    let proc_dir = s.root.join("proc");
    fs::create_dir_all(&proc_dir).unwrap();
    fs::create_dir_all(s.root.join("usr/bin")).unwrap();
    // As runc leaves it before the prestart hook: the container's /proc is mounted.
    nix::mount::mount(
        Some("proc"),
        &proc_dir,
        Some("proc"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    )
    .unwrap();
    symlink("/proc/self/attr/exec", s.root.join("usr/bin/nvidia-smi")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    let direct = r.mountpoint(
        Path::new("/proc/self/attr/exec"),
        fdpath::MountpointKind::File,
    );
    let linked = r.mountpoint(
        Path::new("/usr/bin/nvidia-smi"),
        fdpath::MountpointKind::File,
    );
    let _ = nix::mount::umount(&proc_dir);
    assert!(
        matches!(direct, Err(RootfsError::OtherMount { .. })),
        "direct"
    );
    assert!(
        matches!(linked, Err(RootfsError::OtherMount { .. })),
        "through the link"
    );
}

/// While other threads rename files as fast as they can, the kernel asks lookups that
/// meet `..` to retry (EAGAIN); every lookup still answers, through the walk if need be.
#[test]
fn lookups_through_dotdot_answer_while_renames_race_them() {
    let s = setup();
    symlink("../../../..", s.root.join("up")).unwrap();
    let r = Rootfs::open(&s.root).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let churn = s.host.join("churn");
    std::thread::scope(|scope| {
        for n in 0..2 {
            let (stop, churn) = (&stop, &churn);
            scope.spawn(move || {
                let (a, b) = (
                    churn.with_extension(format!("a{n}")),
                    churn.with_extension(format!("b{n}")),
                );
                fs::write(&a, "x").unwrap();
                while !stop.load(Ordering::Relaxed) {
                    fs::rename(&a, &b).unwrap();
                    fs::rename(&b, &a).unwrap();
                }
            });
        }
        let mut failed = Vec::new();
        for _ in 0..100_000 {
            let path = Path::new("/up/usr/../usr/lib/inside");
            if let Err(e) = r.resolve(path, OFlag::O_RDONLY, Mode::empty()) {
                failed.push(e);
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(
            failed.is_empty(),
            "{} lookups failed: {:?}",
            failed.len(),
            &failed[..failed.len().min(3)]
        );
    });
}

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use super::*;
use crate::discover::SymlinkEdit;
use crate::ldcache as cache;

const LIB: &str = "/usr/lib/x86_64-linux-gnu";

/// A bundle in `dir` whose config.json names `rootfs` (created), and the OCI state a
/// runtime would write for it.
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

fn in_root(root: &Path, path: &str) -> PathBuf {
    root.join(path.trim_start_matches('/'))
}

#[test]
fn the_rootfs_comes_from_the_bundle_and_never_is_the_host_root() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    assert_eq!(rootfs_path(&state).unwrap(), tmp.path().join("rootfs"));
    assert!(open_rootfs(&state).is_ok());
    let file = tmp.path().join("state.json");
    fs::write(&file, &state).unwrap();
    assert_eq!(read_state(Some(&file)).unwrap(), state);
    fs::write(
        tmp.path().join("config.json"),
        r#"{"ociVersion":"1.0.2","root":{"path":"/"}}"#,
    )
    .unwrap();
    assert!(matches!(rootfs_path(&state), Err(StageError::HostRoot(_))));
    assert!(container_path("/usr/lib").is_some());
    for bad in ["usr/lib", "/usr/../etc", ""] {
        assert!(container_path(bad).is_none(), "{bad}");
    }
}

#[test]
fn versions_compare_like_ldconfig() {
    use ldcache::version_cmp as cmp;
    use std::cmp::Ordering::*;
    assert_eq!(
        cmp("libcuda.so.550.54.15", "libcuda.so.535.104.05"),
        Greater
    );
    assert_eq!(cmp("libcuda.so.9", "libcuda.so.10"), Less);
    assert_eq!(cmp("libcuda.so.1", "libcuda.so.01"), Equal);
    assert_eq!(cmp("libcuda.so.1", "libcuda.so.1.1"), Less);
}

#[test]
fn update_ldcache_links_and_caches_the_newest_library_of_each_soname() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let lib = in_root(&root, LIB);
    fs::create_dir_all(&lib).unwrap();
    fs::write(
        lib.join("libcuda.so.550.54.15"),
        elf::tiny_so("libcuda.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::write(
        lib.join("libcuda.so.535.1"),
        elf::tiny_so("libcuda.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::write(
        lib.join("libnvidia-ml.so.550.54.15"),
        elf::tiny_so("libnvidia-ml.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    // Not a library, another architecture, a FIFO: left out.
    fs::write(lib.join("libjunk.so.1"), b"#!/bin/sh\n").unwrap();
    fs::write(lib.join("libarm.so.1.0"), elf::tiny_so("libarm.so.1", 40)).unwrap();
    nix::unistd::mkfifo(
        &lib.join("libfifo.so.1"),
        nix::sys::stat::Mode::from_bits_truncate(0o644),
    )
    .unwrap();
    // An image's stale soname link is pointed at the newest library.
    symlink("libnvidia-ml.so.1.stale", lib.join("libnvidia-ml.so.1")).unwrap();

    let rootfs = open_rootfs(&state).unwrap();
    let folders = ldcache::parse_folders(&[LIB.to_owned(), LIB.to_owned()]).unwrap();
    assert_eq!(folders.len(), 1);
    let done = ldcache::run(&rootfs, &folders).unwrap();
    assert_eq!(done.links, 2);
    assert_eq!(
        fs::read_link(lib.join("libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.550.54.15")
    );
    assert_eq!(
        fs::read_link(lib.join("libnvidia-ml.so.1")).unwrap(),
        Path::new("libnvidia-ml.so.550.54.15")
    );
    let cache = cache::load(&in_root(&root, "/etc/ld.so.cache")).unwrap();
    let mut pairs: Vec<(String, String, i32)> = cache
        .entries
        .iter()
        .map(|e| (e.key.clone(), e.value.clone(), e.flags))
        .collect();
    pairs.sort();
    // This build's 64-bit flags: 0x0303 on x86-64, 0x0a03 on aarch64.
    let lib64 = cache::native_flags(cache::Class::Lib64).unwrap();
    assert_eq!(
        pairs,
        [
            ("libcuda.so.1".into(), format!("{LIB}/libcuda.so.1"), lib64),
            (
                "libnvidia-ml.so.1".into(),
                format!("{LIB}/libnvidia-ml.so.1"),
                lib64
            ),
        ]
    );
    // Again: nothing changes.
    let again = ldcache::run(&rootfs, &folders).unwrap();
    assert_eq!(again.links, 0);
    assert_eq!(again.refresh, crate::rootfs::linker::Refresh::Unchanged);
    // A folder the container lacks is skipped; a relative one is refused.
    assert!(ldcache::run(&rootfs, &[PathBuf::from("/nope")]).is_ok());
    assert!(ldcache::parse_folders(&["usr/lib".into()]).is_err());
}

/// The image links `/etc` (and `/lib`) to a host directory: every hook keeps to the
/// rootfs and the host directory stays as it was.
#[test]
fn hooks_never_follow_the_images_links_out_of_the_rootfs() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let host = tmp.path().join("host");
    fs::create_dir_all(&host).unwrap();
    fs::write(host.join("file"), b"host").unwrap();
    fs::set_permissions(host.join("file"), fs::Permissions::from_mode(0o600)).unwrap();
    fs::write(
        host.join("libcuda.so.550.1"),
        elf::tiny_so("libcuda.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    symlink(&host, root.join("etc")).unwrap();
    symlink(&host, root.join("lib")).unwrap();
    let listing = nvshim_testkit::dir_names;
    let before = listing(&host);
    let rootfs = open_rootfs(&state).unwrap();

    // create-symlinks: the link lands inside the rootfs (or fails), never in `host`.
    let link = SymlinkEdit {
        path: PathBuf::from("/etc/evil"),
        target: "/bin/sh".into(),
    };
    let _ = symlinks::run(&rootfs, &[link]);
    // update-ldcache: /lib's libraries are the rootfs's, and the cache goes inside.
    let done = ldcache::run(&rootfs, &[PathBuf::from("/lib")]);
    if let Ok(done) = done {
        assert!(done.entries.is_empty(), "{:?}", done.entries);
    }
    // chmod: no symlink is followed at all.
    let (mode, paths) = chmod::parse("777", &["/etc/file".to_owned()]).unwrap();
    assert!(chmod::run(&rootfs, mode, &paths).is_err());
    // update-application-profile writes under /etc.
    let _ = profile::run(&rootfs);

    assert_eq!(listing(&host), before);
    assert_eq!(
        fs::metadata(host.join("file"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o600
    );
    assert_eq!(fs::read(host.join("file")).unwrap(), b"host");
}

#[test]
fn create_symlinks_and_chmod_work_inside_the_rootfs() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let rootfs = open_rootfs(&state).unwrap();
    let links = symlinks::parse_links(&[
        "libcuda.so.1::/usr/lib64/libcuda.so".to_owned(),
        "../card1::/dev/dri/by-path/pci-0000:3b:00.0-card".to_owned(),
    ])
    .unwrap();
    assert_eq!(symlinks::run(&rootfs, &links).unwrap(), 2);
    assert_eq!(symlinks::run(&rootfs, &links).unwrap(), 0);
    assert_eq!(
        fs::read_link(in_root(&root, "/usr/lib64/libcuda.so")).unwrap(),
        Path::new("libcuda.so.1")
    );
    assert!(symlinks::parse_links(&["nocolons".to_owned()]).is_err());

    fs::create_dir_all(in_root(&root, "/dev/dri")).unwrap();
    fs::set_permissions(
        in_root(&root, "/dev/dri"),
        fs::Permissions::from_mode(0o700),
    )
    .unwrap();
    let (mode, paths) = chmod::parse("755", &["/dev/dri".into(), "/absent".into()]).unwrap();
    assert_eq!(chmod::run(&rootfs, mode, &paths).unwrap(), 1);
    assert_eq!(
        fs::metadata(in_root(&root, "/dev/dri"))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777,
        0o755
    );
    assert_eq!(chmod::run(&rootfs, mode, &paths).unwrap(), 0);
    for bad in ["", "9", "77777", "rwx"] {
        assert!(chmod::parse(bad, &[]).is_err(), "{bad:?}");
    }
    assert!(chmod::parse("755", &["dev".into()]).is_err());
}

#[test]
fn application_profile_masks_the_containers_gpus() {
    assert_eq!(
        profile::profile(0b1010),
        r#"{"profiles":[{"name":"_container_","settings":["EGLVisibleDGPUDevices",0xa]}],"rules":[{"pattern":[],"profile":"_container_"}]}"#
    );
    if !nix::unistd::geteuid().is_root() {
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let dev = in_root(&root, "/dev");
    fs::create_dir_all(&dev).unwrap();
    let rootfs = open_rootfs(&state).unwrap();
    assert_eq!(profile::run(&rootfs).unwrap(), None);
    for (name, minor) in [("nvidia1", 1), ("nvidia3", 3), ("nvidiactl", 255)] {
        nix::sys::stat::mknod(
            &dev.join(name),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(195, minor),
        )
        .unwrap();
    }
    // A regular file named like a GPU is not one.
    fs::write(dev.join("nvidia5"), b"").unwrap();
    assert_eq!(profile::run(&rootfs).unwrap(), Some(0b1010));
    let written = in_root(&root, profile::PROFILE);
    assert_eq!(
        fs::read_to_string(&written).unwrap(),
        profile::profile(0b1010)
    );
    assert_eq!(
        fs::metadata(&written).unwrap().permissions().mode() & 0o777,
        0o444
    );
}

#[test]
fn cuda_compat_follows_nvidias_major_version_rule() {
    use compat::Decision;
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let rootfs = open_rootfs(&state).unwrap();
    let decide = |host: Option<&str>| compat::decide(&rootfs, host, None, None).unwrap();
    assert!(matches!(decide(None), Decision::Skip(_)));
    assert!(matches!(decide(Some("550.54.15")), Decision::Skip(_)));
    let dir = in_root(&root, compat::DEFAULT_COMPAT_ROOT);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("libcuda.so.560.28.03"), b"").unwrap();
    fs::create_dir_all(in_root(&root, "/etc")).unwrap();
    fs::write(in_root(&root, "/etc/ld.so.cache"), b"").unwrap();
    assert_eq!(
        decide(Some("550.54.15")),
        Decision::UseCompat {
            dir: PathBuf::from(compat::DEFAULT_COMPAT_ROOT),
            library: "libcuda.so.560.28.03".into()
        }
    );
    assert!(matches!(decide(Some("560.35.03")), Decision::Skip(_)));
    assert!(matches!(decide(Some("570.1")), Decision::Skip(_)));
    assert!(compat::decide(&rootfs, Some("x.y"), None, None).is_err());
    fs::write(dir.join("libcuda.so.565.1.1"), b"").unwrap();
    assert!(matches!(decide(Some("550.54.15")), Decision::Skip(_)));
}

#[test]
fn cuda_compat_libraries_go_first_in_the_cache() {
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let lib = in_root(&root, LIB);
    let compat_dir = in_root(&root, compat::DEFAULT_COMPAT_ROOT);
    fs::create_dir_all(&lib).unwrap();
    fs::create_dir_all(&compat_dir).unwrap();
    fs::write(
        lib.join("libcuda.so.550.54.15"),
        elf::tiny_so("libcuda.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::write(
        lib.join("libnvidia-ml.so.550.54.15"),
        elf::tiny_so("libnvidia-ml.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::write(
        compat_dir.join("libcuda.so.560.28.03"),
        elf::tiny_so("libcuda.so.1", elf::NATIVE_MACHINE),
    )
    .unwrap();
    fs::create_dir_all(in_root(&root, "/etc")).unwrap();
    fs::write(in_root(&root, "/etc/ld.so.cache"), cache::write_new(&[])).unwrap();
    let rootfs = open_rootfs(&state).unwrap();

    let compat::Decision::UseCompat { dir, .. } =
        compat::decide(&rootfs, Some("550.54.15"), None, None).unwrap()
    else {
        panic!("the 560 compat library is newer than driver 550");
    };
    compat::apply(&rootfs, &dir).unwrap();
    assert_eq!(
        fs::read_to_string(in_root(&root, compat::CONF)).unwrap(),
        "/usr/local/cuda/compat\n"
    );
    ldcache::run(&rootfs, &[PathBuf::from(LIB)]).unwrap();
    let cache = cache::load(&in_root(&root, "/etc/ld.so.cache")).unwrap();
    let find =
        |key: &'static str| -> Vec<String> { cache.lookup(key).map(|e| e.value.clone()).collect() };
    assert_eq!(
        find("libcuda.so.1"),
        ["/usr/local/cuda/compat/libcuda.so.1"]
    );
    assert_eq!(
        find("libnvidia-ml.so.1"),
        [format!("{LIB}/libnvidia-ml.so.1")]
    );
    assert_eq!(
        fs::read_link(compat_dir.join("libcuda.so.1")).unwrap(),
        Path::new("libcuda.so.560.28.03")
    );
}

#[test]
fn the_compat_librarys_elf_note_decides_when_it_has_one() {
    use compat::{CompatNote, Decision};
    let tmp = tempfile::tempdir().unwrap();
    let state = bundle(tmp.path());
    let root = tmp.path().join("rootfs");
    let dir = in_root(&root, compat::DEFAULT_COMPAT_ROOT);
    fs::create_dir_all(&dir).unwrap();
    fs::create_dir_all(in_root(&root, "/etc")).unwrap();
    fs::write(in_root(&root, "/etc/ld.so.cache"), b"").unwrap();
    let desc = br#"{"Format":1,"CUDA Version":"12.9","Driver":[535,550,570,575],"Device":[1,2]}"#;
    let lib = elf::tiny_with_note(compat::NOTE_SECTION, "NVIDIA Corporation", desc);
    fs::write(dir.join("libcuda.so.575.57.08"), lib).unwrap();
    let rootfs = open_rootfs(&state).unwrap();
    let decide = |host| compat::decide(&rootfs, Some(host), None, None).unwrap();
    // Listed branches only: 560 is older than 575 but not supported by these libraries.
    assert!(matches!(decide("550.54.15"), Decision::UseCompat { .. }));
    assert!(matches!(decide("560.35.03"), Decision::Skip(_)));
    assert!(matches!(decide("580.1"), Decision::Skip(_)));

    let note = CompatNote::parse(br#"{"CUDA Version":"12.9"}"#).unwrap();
    assert!(note.use_compat(550, "12.8"));
    assert!(!note.use_compat(550, "12.9"));
    assert!(!note.use_compat(550, "13.0"));
    assert!(!note.use_compat(550, ""));
    assert!(note.use_compat(550, "garbage"));
}

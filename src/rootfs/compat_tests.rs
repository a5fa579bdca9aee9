use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use super::*;
use crate::ldcache::{self, FLAG_ELF_LIBC6, FLAG_X8664_LIB64};
use crate::rootfs::linker;

const LIB64: i32 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64;
const HOST_LIB: &str = "/usr/lib/x86_64-linux-gnu";

fn host(key: &str) -> Entry {
    Entry {
        key: key.into(),
        value: format!("{HOST_LIB}/{key}"),
        flags: LIB64,
        hwcap: 0,
    }
}

/// An image whose compat directory holds `libcuda.so.<version>` and its soname link.
fn image(root: &Path, version: &str, note: Option<&[u8]>) {
    let dir = root.join("usr/local/cuda/compat");
    fs::create_dir_all(&dir).unwrap();
    let lib = format!("libcuda.so.{version}");
    let bytes = match note {
        Some(desc) => elf::tiny_with_note(NOTE_SECTION, "NVIDIA Corporation", desc),
        None => elf::tiny_so("libcuda.so.1", elf::NATIVE_MACHINE),
    };
    fs::write(dir.join(&lib), bytes).unwrap();
    symlink(&lib, dir.join("libcuda.so.1")).unwrap();
    fs::write(dir.join("libnvidia-ptxjitcompiler.so.1"), b"").unwrap();
}

#[test]
fn a_newer_compat_libcuda_goes_ahead_of_the_hosts_for_the_sonames_it_has() {
    let tmp = tempfile::tempdir().unwrap();
    image(tmp.path(), "575.57.08", None);
    let rootfs = Rootfs::open(tmp.path()).unwrap();
    let add = [
        host("libcuda.so.1"),
        host("libnvidia-ml.so.1"),
        host("libnvidia-ptxjitcompiler.so.1"),
    ];
    let prefer = preferred(&rootfs, "550.54.15", None, &add);
    let pairs: Vec<(&str, &str)> = prefer
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    assert_eq!(
        pairs,
        [
            ("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
            (
                "libnvidia-ptxjitcompiler.so.1",
                "/usr/local/cuda/compat/libnvidia-ptxjitcompiler.so.1"
            ),
        ]
    );

    linker::install(&rootfs, &[], &add, &prefer).unwrap();
    let cache = ldcache::load(&tmp.path().join("etc/ld.so.cache")).unwrap();
    let found: Vec<&str> = cache
        .lookup("libcuda.so.1")
        .map(|e| e.value.as_str())
        .collect();
    assert_eq!(
        found,
        [
            "/usr/local/cuda/compat/libcuda.so.1",
            "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
        ]
    );
    // The next start of the same rootfs finds nothing to change.
    assert_eq!(
        linker::install(&rootfs, &[], &add, &prefer).unwrap().1,
        linker::Refresh::Unchanged
    );
}

#[test]
fn an_older_or_unsupported_compat_libcuda_leaves_the_host_first() {
    let add = [host("libcuda.so.1")];
    let tmp = tempfile::tempdir().unwrap();
    image(tmp.path(), "535.1.1", None);
    let rootfs = Rootfs::open(tmp.path()).unwrap();
    assert!(preferred(&rootfs, "550.54.15", None, &add).is_empty());
    // An unknown host driver branch decides nothing.
    assert!(preferred(&rootfs, "", None, &add).is_empty());

    // The note lists the branches it runs on: 560 is not one, 550 is.
    let tmp = tempfile::tempdir().unwrap();
    image(
        tmp.path(),
        "575.57.08",
        Some(br#"{"CUDA Version":"12.9","Driver":[535,550,570]}"#),
    );
    let rootfs = Rootfs::open(tmp.path()).unwrap();
    assert!(preferred(&rootfs, "560.35.03", None, &add).is_empty());
    assert_eq!(preferred(&rootfs, "550.54.15", None, &add).len(), 1);

    // No compat directory at all.
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = Rootfs::open(tmp.path()).unwrap();
    assert!(preferred(&rootfs, "550.54.15", None, &add).is_empty());
}

#[test]
fn a_compat_directory_linking_out_of_the_rootfs_stays_inside() {
    let outside = tempfile::tempdir().unwrap();
    image(outside.path(), "575.57.08", None);
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("usr/local/cuda")).unwrap();
    // An absolute link resolves inside the rootfs, where there is nothing.
    symlink(
        outside.path().join("usr/local/cuda/compat"),
        tmp.path().join("usr/local/cuda/compat"),
    )
    .unwrap();
    let rootfs = Rootfs::open(tmp.path()).unwrap();
    assert!(preferred(&rootfs, "550.54.15", None, &[host("libcuda.so.1")]).is_empty());
}

#[test]
fn an_unreadable_compat_directory_skips_without_failing() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir_all(tmp.path().join("usr/local/cuda")).unwrap();
    symlink("compat", tmp.path().join("usr/local/cuda/compat")).unwrap();
    let rootfs = Rootfs::open(tmp.path()).unwrap();
    assert!(preferred(&rootfs, "550.54.15", None, &[host("libcuda.so.1")]).is_empty());
}

#[test]
fn nvidias_opt_outs_turn_it_off() {
    let mut config = Config::default();
    assert!(enabled(&config));
    let modes = &mut config.nvidia_container_runtime.modes;
    modes.jit_cdi.nvcdi_disable_hooks = vec!["update-ldcache".into()];
    assert!(enabled(&config));
    for off in [HOOK_NAME, "all"] {
        let mut config = Config::default();
        config
            .nvidia_container_runtime
            .modes
            .jit_cdi
            .nvcdi_disable_hooks = vec![off.into()];
        assert!(!enabled(&config), "{off}");
    }
    let mut config = Config::default();
    config.features.disable_cuda_compat_lib_hook = true;
    assert!(!enabled(&config));
    for (mode, on) in [
        (CudaCompatMode::Ldconfig, true),
        (CudaCompatMode::Hook, true),
        (CudaCompatMode::Mount, true),
        (CudaCompatMode::Disabled, false),
    ] {
        let mut config = Config::default();
        config
            .nvidia_container_runtime
            .modes
            .legacy
            .cuda_compat_mode = mode;
        assert_eq!(enabled(&config), on, "{mode:?}");
    }
}

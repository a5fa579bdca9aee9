// SPDX-License-Identifier: Apache-2.0
//! WSL2 discovery on a node in a tempdir (mknod needs root, as the tests run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use super::*;
use crate::request::DriverCapabilities;
use crate::select::{SelectedGpu, Selection};

const STORE: &str = "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_0123456789abcdef";

fn write(root: &Path, path: &str) {
    let host = root.join(path.trim_start_matches('/'));
    fs::create_dir_all(host.parent().unwrap()).unwrap();
    fs::write(host, path).unwrap();
}

/// A WSL-shaped node: `dev/dxg` (10:63), `libdxcore.so`, an Intel store without
/// `libcuda.so.1.1` sorting first, and NVIDIA's store less `libnvdxgdmal.so.1`.
fn node(dir: &Path) -> Roots {
    let roots = Roots {
        driver: dir.join("driver"),
        dev: dir.to_path_buf(),
        proc: dir.to_path_buf(),
    };
    fs::create_dir_all(dir.join("dev")).unwrap();
    mknod(
        &dir.join("dev/dxg"),
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(10, 63),
    )
    .unwrap();
    write(&roots.driver, "/usr/lib/wsl/lib/libdxcore.so");
    write(&roots.driver, "/usr/lib/wsl/lib/libcuda.so.1");
    write(
        &roots.driver,
        "/usr/lib/wsl/drivers/iigd_dch.inf_amd64_00aa/libigd12umd64.so",
    );
    for name in REQUIRED_STORE_FILES
        .iter()
        .filter(|n| **n != "libnvdxgdmal.so.1")
    {
        write(&roots.driver, &format!("{STORE}/{name}"));
    }
    for name in [
        "libnvwgf2umx.so",
        "nvdlistx.dll",
        "nvptxJitCompiler.bin",
        "nv_dispi.inf",
        "nvlddmkm.sys",
    ] {
        write(&roots.driver, &format!("{STORE}/{name}"));
    }
    roots
}

fn gpu(index: u32) -> SelectedGpu {
    SelectedGpu {
        index,
        minor: index,
        uuid: format!("GPU-{index}"),
        bus_id: format!("0000:0{index}:00.0"),
    }
}

fn want(selection: &Selection) -> Want<'_> {
    Want {
        driver_version: "560.94",
        capabilities: DriverCapabilities::all(),
        selection,
        classes: Box::leak(Box::default()),
    }
}

#[test]
fn sonames_come_from_file_names() {
    let cases = [
        ("libcuda.so.1.1", "libcuda.so.1"),
        ("libnvidia-ml.so.1", "libnvidia-ml.so.1"),
        ("libdxcore.so", "libdxcore.so"),
        ("libcuda_loader.so", "libcuda_loader.so"),
        ("libfoo.so.12.4.1", "libfoo.so.12"),
    ];
    for (name, want) in cases {
        assert_eq!(soname(name), want, "case {name}");
    }
}

#[test]
fn additional_store_files_follow_nvidias_globs() {
    let cases = [
        ("libnvwgf2umx.so", true),
        ("libnvidia-gpucomp.so.560.94", true),
        ("nvdlistx.dll", true),
        ("nvptxJitCompiler.bin", true),
        ("nv_dispi.inf", false),
        ("nvlddmkm.sys", false),
        ("libcuda.so.1.1", false),
        ("nvcubins.bin", false),
        ("nvidia-smi", false),
    ];
    for (name, want) in cases {
        assert_eq!(is_additional(name), want, "case {name}");
    }
}

#[test]
fn the_store_holding_libcuda_is_nvidias() {
    let dir = tempfile::tempdir().unwrap();
    let roots = node(dir.path());
    assert_eq!(
        driver_store(&roots.driver).unwrap(),
        Some(PathBuf::from(STORE))
    );
    // A second NVIDIA store: the first by name wins, as the first dxcore adapter's would.
    write(
        &roots.driver,
        "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_00000000/libcuda.so.1.1",
    );
    assert_eq!(
        driver_store(&roots.driver).unwrap(),
        Some(PathBuf::from(
            "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_00000000"
        ))
    );
    assert_eq!(driver_store(&dir.path().join("nowhere")).unwrap(), None);
}

#[test]
fn all_gpus_get_dxg_dxcore_and_the_driver_store() {
    let dir = tempfile::tempdir().unwrap();
    let roots = node(dir.path());
    let selection = Selection {
        gpus: vec![gpu(0), gpu(1)],
        mig_devices: Vec::new(),
    };
    let out = discover(&roots, want(&selection)).unwrap();

    let nodes = out.node_numbers();
    assert_eq!(
        nodes,
        [("/dev/dxg".to_owned(), 10, 63)],
        "one node for all GPUs"
    );

    let files: Vec<(String, FileKind)> = out
        .files
        .iter()
        .map(|f| (f.path.display().to_string(), f.kind))
        .collect();
    let store = |name: &str| format!("{STORE}/{name}");
    let want_files = vec![
        (
            "/usr/lib/wsl/lib/libdxcore.so".to_owned(),
            FileKind::Library,
        ),
        (store("libcuda.so.1.1"), FileKind::Library),
        (store("libcuda_loader.so"), FileKind::Library),
        (store("libnvidia-ptxjitcompiler.so.1"), FileKind::Library),
        (store("libnvidia-ml.so.1"), FileKind::Library),
        (store("libnvidia-ml_loader.so"), FileKind::Library),
        (store("nvcubins.bin"), FileKind::Config),
        (store("nvidia-smi"), FileKind::Binary),
        (store("libnvwgf2umx.so"), FileKind::Library),
        (store("nvdlistx.dll"), FileKind::Config),
        (store("nvptxJitCompiler.bin"), FileKind::Config),
    ];
    assert_eq!(files, want_files);
    for file in &out.files {
        assert_eq!(
            file.host_path,
            roots.driver.join(file.path.strip_prefix("/").unwrap()),
            "{} is mounted from the driver root",
            file.path.display()
        );
    }

    let links: Vec<String> = out
        .files
        .iter()
        .flat_map(|f| &f.links)
        .map(|l| format!("{} -> {}", l.path.display(), l.target))
        .collect();
    assert_eq!(
        links,
        [
            format!("{STORE}/libcuda.so.1 -> libcuda.so.1.1"),
            format!("/usr/bin/nvidia-smi -> {STORE}/nvidia-smi"),
        ]
    );
    let entries: Vec<(String, String)> = out
        .files
        .iter()
        .filter_map(|f| f.ldcache.as_ref())
        .map(|e| (e.key.clone(), e.value.clone()))
        .collect();
    assert_eq!(
        entries,
        [
            ("libdxcore.so", "/usr/lib/wsl/lib/libdxcore.so".to_owned()),
            ("libcuda.so.1", store("libcuda.so.1")),
            ("libcuda_loader.so", store("libcuda_loader.so")),
            (
                "libnvidia-ptxjitcompiler.so.1",
                store("libnvidia-ptxjitcompiler.so.1")
            ),
            ("libnvidia-ml.so.1", store("libnvidia-ml.so.1")),
            ("libnvidia-ml_loader.so", store("libnvidia-ml_loader.so")),
            ("libnvwgf2umx.so", store("libnvwgf2umx.so")),
        ]
        .map(|(k, v)| (k.to_owned(), v))
    );
    // A required store file that is absent is noted, not fatal (NVIDIA skips it too).
    assert_eq!(
        out.missing
            .iter()
            .map(|m| (m.what.as_str(), m.required))
            .collect::<Vec<_>>(),
        [(store("libnvdxgdmal.so.1").as_str(), false)]
    );
}

#[test]
fn no_gpu_no_dxg_and_no_store_is_required_missing() {
    let dir = tempfile::tempdir().unwrap();
    let roots = node(dir.path());
    let none = Selection::default();
    let out = discover(&roots, want(&none)).unwrap();
    assert!(out.device_nodes.is_empty(), "no GPU selected: no /dev/dxg");
    assert!(!out.files.is_empty(), "the driver files still come");

    fs::remove_dir_all(roots.driver.join("usr/lib/wsl/drivers")).unwrap();
    let out = discover(&roots, want(&none)).unwrap();
    let missing = out.missing.iter().find(|m| m.required).unwrap();
    assert_eq!(missing.what, "/usr/lib/wsl/drivers/*/libcuda.so.1.1");
    assert!(
        missing
            .detail
            .as_deref()
            .unwrap()
            .contains("no NVIDIA driver store"),
        "{missing:?}"
    );
}

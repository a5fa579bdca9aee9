#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};

use super::*;
use crate::edits::{IPC_DIR_OPTIONS, SOCKET_OPTIONS};

fn bind(host: &str, container: &str, options: &[&str]) -> Mount {
    Mount {
        host_path: host.into(),
        container_path: container.into(),
        kind: Some("bind".into()),
        options: options.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn only_read_only_driver_files_are_eligible() {
    let lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15";
    assert!(eligible(&bind(lib, lib, RO_OPTIONS)));
    assert!(eligible(&bind(
        "/run/nvidia/driver/usr/bin/nvidia-smi",
        "/usr/bin/nvidia-smi",
        RO_OPTIONS
    )));
    // Sockets, the MPS pipe directory, writable or foreign options: their own mounts.
    let socket = "/run/nvidia-persistenced/socket";
    assert!(!eligible(&bind(socket, socket, SOCKET_OPTIONS)));
    assert!(!eligible(&bind(
        "/tmp/nvidia-mps",
        "/tmp/nvidia-mps",
        IPC_DIR_OPTIONS
    )));
    assert!(!eligible(&bind(lib, lib, &["bind", "rw"])));
    let mut tmpfs = bind(lib, lib, RO_OPTIONS);
    tmpfs.kind = Some("tmpfs".into());
    assert!(!eligible(&tmpfs));
    // Paths it must not turn into links: runc's own filesystems, the stage itself,
    // relative or climbing paths.
    for container in [
        "/dev/nvidia-caps/x",
        "/proc/driver/nvidia/params",
        "/sys/x",
        "/usr/lib/nvshim/x",
        "usr/lib/libcuda.so.1",
        "/usr/../etc/x",
    ] {
        assert!(!eligible(&bind(lib, container, RO_OPTIONS)), "{container}");
    }
    assert!(!eligible(&bind("relative/lib", lib, RO_OPTIONS)));
}

#[test]
fn layout_is_flat_until_two_files_share_a_name() {
    let hosts = [
        Path::new("/usr/bin/nvidia-smi"),
        Path::new("/usr/lib/i386-linux-gnu/libcuda.so.550.54.15"),
        Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
        Path::new("/usr/lib32/libcuda.so.550.54.15"),
    ];
    assert_eq!(
        layout(&hosts),
        [
            PathBuf::from("nvidia-smi"),
            "libcuda.so.550.54.15".into(),
            "1/libcuda.so.550.54.15".into(),
            "2/libcuda.so.550.54.15".into(),
        ]
    );
}

#[test]
fn the_key_changes_with_any_identity_path_or_place() {
    let host = Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15");
    let rel = Path::new("libcuda.so.550.54.15");
    let containers = [PathBuf::from(host)];
    let one = |host, rel, containers, identity| {
        key([KeyedFile {
            host,
            rel,
            containers,
            identity,
        }])
    };
    let base = one(host, rel, &containers, [1, 2, 3, 4, 5, 6]);
    assert_eq!(base, one(host, rel, &containers, [1, 2, 3, 4, 5, 6]));
    assert_eq!(base.len(), 16);
    for i in 0..6 {
        let mut id = [1, 2, 3, 4, 5, 6];
        id[i] += 1;
        assert_ne!(base, one(host, rel, &containers, id), "identity field {i}");
    }
    let other_host = Path::new("/usr/lib64/libcuda.so.550.54.15");
    assert_ne!(base, one(other_host, rel, &containers, [1, 2, 3, 4, 5, 6]));
    let other_rel = Path::new("1/libcuda.so.550.54.15");
    assert_ne!(base, one(host, other_rel, &containers, [1, 2, 3, 4, 5, 6]));
    // The tree holds the container paths: another one is another stage.
    let moved = [PathBuf::from("/usr/lib64/libcuda.so.550.54.15")];
    assert_ne!(base, one(host, rel, &moved, [1, 2, 3, 4, 5, 6]));
}

#[test]
fn a_missing_directory_links_to_the_tree_unless_something_else_goes_there() {
    let stage = Stage {
        host_dir: PathBuf::from("/run/nvshim/driver-stage/k"),
        links: [
            (
                "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin",
                "gsp_ga10x.bin",
            ),
            ("/usr/bin/nvidia-smi", "nvidia-smi"),
        ]
        .into_iter()
        .map(|(p, r)| (PathBuf::from(p), PathBuf::from(r)))
        .collect(),
        built: false,
    };
    assert_eq!(
        stage.dir_link(Path::new("/lib/firmware"), &[]).as_deref(),
        Some("/usr/lib/nvshim/t/lib/firmware")
    );
    // No staged file below it, or the file itself: no directory link.
    assert_eq!(stage.dir_link(Path::new("/lib/firmware/amd"), &[]), None);
    // Not the firmware's: directories stay directories.
    assert_eq!(stage.dir_link(Path::new("/usr"), &[]), None);
    assert_eq!(stage.dir_link(Path::new("/usr/bin/nvidia-smi"), &[]), None);
    // A soname link or another mount below it needs a real directory.
    let soname = Path::new("/lib/firmware/nvidia/550.54.15/gsp.bin");
    assert_eq!(stage.dir_link(Path::new("/lib/firmware"), &[soname]), None);
}

#[test]
fn rewrite_keeps_occupied_paths_and_other_mounts_and_adds_one_bind() {
    let lib = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15";
    let smi = "/usr/bin/nvidia-smi";
    let socket = "/run/nvidia-persistenced/socket";
    let mut mounts = vec![
        bind(lib, lib, RO_OPTIONS),
        bind(smi, smi, RO_OPTIONS),
        bind(socket, socket, SOCKET_OPTIONS),
    ];
    let stage = Stage {
        host_dir: "/run/nvshim/driver-stage/0123456789abcdef".into(),
        links: [
            (PathBuf::from(lib), PathBuf::from("libcuda.so.550.54.15")),
            (PathBuf::from(smi), PathBuf::from("nvidia-smi")),
        ]
        .into(),
        built: true,
    };
    assert_eq!(
        stage.symlinks(),
        [
            (PathBuf::from(smi), "/usr/lib/nvshim/nvidia-smi".to_string()),
            (
                PathBuf::from(lib),
                "/usr/lib/nvshim/libcuda.so.550.54.15".to_string()
            ),
        ]
    );
    stage.rewrite(&mut mounts, &[PathBuf::from(smi)]);
    let points: Vec<(&str, &str)> = mounts
        .iter()
        .map(|m| (m.container_path.as_str(), m.host_path.as_str()))
        .collect();
    assert_eq!(
        points,
        [
            (smi, smi),
            (socket, socket),
            (CONTAINER_DIR, "/run/nvshim/driver-stage/0123456789abcdef"),
        ]
    );
    assert_eq!(mounts[2].options, STAGE_OPTIONS);
    assert_eq!(mounts[2].kind.as_deref(), Some("bind"));
}

#[test]
fn every_link_target_fits_in_an_ext4_inode() {
    // The longest library names a driver ships.
    for name in [
        "libnvidia-vulkan-producer.so.550.54.15",
        "libnvidia-ptxjitcompiler.so.570.133.20",
    ] {
        let target = format!("{CONTAINER_DIR}/9/{name}");
        assert!(target.len() < 60, "{target}: {} bytes", target.len());
    }
}

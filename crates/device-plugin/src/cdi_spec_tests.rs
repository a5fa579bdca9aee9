// SPDX-License-Identifier: Apache-2.0
//! The root translation and the spec file's life; the spec built for a simulated node
//! is tested in `tests/plugin/cdi.rs`.

use std::fs;
use std::os::unix::fs::MetadataExt;

use super::*;
use crate::config::DeviceListStrategy;
use nvshim::cdi::{ContainerEdits, Device, DeviceNode, Mount};

fn settings(driver_root: &str, dev_root: &str) -> Settings {
    Settings {
        driver_root: driver_root.into(),
        dev_root: dev_root.into(),
        device_list_strategies: vec![DeviceListStrategy::CdiCri],
        ..Settings::default()
    }
}

#[test]
fn paths_move_from_the_seen_roots_to_the_hosts() {
    // (case, driver root, dev root, seen driver root, path, want)
    let cases = [
        (
            "same view",
            "/",
            "/",
            "/",
            "/usr/lib/libcuda.so.1",
            "/usr/lib/libcuda.so.1",
        ),
        (
            "helm: host / at /driver-root",
            "/",
            "/",
            "/driver-root",
            "/driver-root/usr/lib/libcuda.so.1",
            "/usr/lib/libcuda.so.1",
        ),
        (
            "driver container",
            "/run/nvidia/driver",
            "/run/nvidia/driver",
            "/driver-root",
            "/driver-root/dev/nvidia0",
            "/run/nvidia/driver/dev/nvidia0",
        ),
        (
            "seen at /, host elsewhere",
            "/run/nvidia/driver",
            "/run/nvidia/driver",
            "/",
            "/usr/bin/nvidia-smi",
            "/run/nvidia/driver/usr/bin/nvidia-smi",
        ),
        (
            "a name that only starts like the root",
            "/host",
            "/host",
            "/driver-root",
            "/driver-rootless/x",
            "/driver-rootless/x",
        ),
        (
            "the root itself",
            "/host",
            "/host",
            "/driver-root",
            "/driver-root",
            "/host",
        ),
    ];
    for (case, driver, dev, seen, path, want) in cases {
        let view = DriverView::with_seen_driver(&settings(driver, dev), seen.into());
        assert_eq!(view.to_host(path), want, "{case}");
    }
    // A dev root apart from the driver root is read in place, and device nodes go
    // by the dev roots even where the driver's root would also match.
    let view = DriverView::with_seen_driver(&settings("/run/nvidia/driver", "/"), "/".into());
    assert_eq!(view.node_to_host("/dev/nvidia0"), "/dev/nvidia0", "node");
    assert_eq!(
        view.to_host("/usr/bin/nvidia-smi"),
        "/run/nvidia/driver/usr/bin/nvidia-smi",
        "file"
    );
    let view = DriverView::with_seen_driver(&settings("/", "/"), "/driver-root".into());
    assert_eq!(
        view.node_to_host("/driver-root/dev/nvidia0"),
        "/dev/nvidia0",
        "node under a moved dev root"
    );
}

fn spec(host_path: &str) -> Spec {
    Spec {
        cdi_version: "0.5.0".into(),
        kind: CDI_KIND.into(),
        annotations: Default::default(),
        devices: vec![Device {
            name: "GPU-0".into(),
            annotations: Default::default(),
            container_edits: ContainerEdits {
                device_nodes: vec![DeviceNode {
                    path: "/dev/nvidia0".into(),
                    host_path: None,
                    kind: Some("c".into()),
                    major: Some(195),
                    minor: Some(0),
                    file_mode: None,
                    permissions: None,
                    uid: None,
                    gid: None,
                }],
                ..ContainerEdits::default()
            },
        }],
        container_edits: ContainerEdits {
            mounts: vec![Mount {
                host_path: host_path.into(),
                container_path: "/usr/lib/libcuda.so.1".into(),
                kind: None,
                options: vec!["ro".into()],
            }],
            ..ContainerEdits::default()
        },
    }
}

#[test]
fn relocation_rewrites_mounts_and_device_nodes() {
    let view = DriverView::with_seen_driver(&settings("/run/nvidia/driver", "/"), "/".into());
    let mut got = spec("/usr/lib/libcuda.so.1");
    view.relocate(&mut got);
    assert_eq!(
        got.container_edits.mounts[0].host_path, "/run/nvidia/driver/usr/lib/libcuda.so.1",
        "mount source"
    );
    // The dev root is `/` on both sides: no hostPath needed.
    assert_eq!(
        got.devices[0].container_edits.device_nodes[0].host_path,
        None
    );

    let view = DriverView::with_seen_driver(&settings("/host", "/host"), "/".into());
    let mut got = spec("/usr/lib/libcuda.so.1");
    view.relocate(&mut got);
    assert_eq!(
        got.devices[0].container_edits.device_nodes[0]
            .host_path
            .as_deref(),
        Some("/host/dev/nvidia0"),
        "a node read at its container path gets the host's path"
    );

    let same = DriverView::with_seen_driver(&settings("/", "/"), "/".into());
    let mut got = spec("/usr/lib/libcuda.so.1");
    same.relocate(&mut got);
    assert_eq!(got, spec("/usr/lib/libcuda.so.1"), "identity view");
}

#[test]
fn no_spec_without_a_cdi_strategy() {
    let s = Settings::default();
    let view = DriverView::with_seen_driver(&s, "/".into());
    let inventory = crate::resources::fixtures::gpus(2);
    let built = crate::resources::build(&inventory, &s, Path::new("/nonexistent")).unwrap();
    assert_eq!(build(&s, &view, &inventory, &built).unwrap(), None);
}

#[test]
fn the_file_is_written_once_per_content_and_removed_on_exit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CDI_SPEC_FILE);
    let mut file = SpecFile::default();

    let first = spec("/a");
    assert_eq!(
        file.sync(dir.path(), Some(&first)).unwrap(),
        Synced::Written(path.clone())
    );
    let written: Spec = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    assert_eq!(written, first, "the file holds the spec");
    let inode = fs::metadata(&path).unwrap().ino();
    assert_eq!(
        fs::metadata(&path).unwrap().mode() & 0o777,
        0o644,
        "readable by the engines"
    );

    assert_eq!(
        file.sync(dir.path(), Some(&first)).unwrap(),
        Synced::Unchanged(path.clone())
    );
    assert_eq!(
        fs::metadata(&path).unwrap().ino(),
        inode,
        "same content: not rewritten"
    );

    let second = spec("/b");
    assert_eq!(
        file.sync(dir.path(), Some(&second)).unwrap(),
        Synced::Written(path.clone())
    );
    assert_ne!(
        fs::metadata(&path).unwrap().ino(),
        inode,
        "replaced by rename"
    );
    let leftovers: Vec<_> = fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(leftovers, [CDI_SPEC_FILE], "no temp file left");

    assert_eq!(file.remove().unwrap(), Some(path.clone()));
    assert!(!path.exists(), "removed on exit");
    assert_eq!(file.remove().unwrap(), None, "removed once");
}

#[test]
fn a_stale_spec_of_the_plugins_kind_goes_and_others_stay() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(CDI_SPEC_FILE);
    let mut file = SpecFile::default();
    assert_eq!(file.sync(dir.path(), None).unwrap(), Synced::Absent);

    fs::write(&path, spec::to_json(&spec("/a"))).unwrap();
    assert_eq!(
        file.sync(dir.path(), None).unwrap(),
        Synced::Removed(path.clone())
    );
    assert!(!path.exists());

    for (case, text) in [
        (
            "another kind",
            r#"{"cdiVersion":"0.5.0","kind":"example.com/net"}"#,
        ),
        ("not JSON", "kind: k8s.device-plugin.nvidia.com/gpu"),
    ] {
        fs::write(&path, text).unwrap();
        assert_eq!(
            file.sync(dir.path(), None).unwrap(),
            Synced::Absent,
            "{case}"
        );
        assert_eq!(
            fs::read_to_string(&path).unwrap(),
            text,
            "{case}: left alone"
        );
    }
    // Not ours to remove on exit either.
    assert_eq!(file.remove().unwrap(), None);
    assert!(path.exists());
}

#[test]
fn moving_the_directory_moves_the_file() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut file = SpecFile::default();
    file.sync(dirs[0].path(), Some(&spec("/a"))).unwrap();
    file.sync(dirs[1].path(), Some(&spec("/a"))).unwrap();
    assert!(!dirs[0].path().join(CDI_SPEC_FILE).exists(), "old one gone");
    assert!(dirs[1].path().join(CDI_SPEC_FILE).exists());
    // And a missing directory is created.
    let nested = dirs[0].path().join("run/cdi");
    file.sync(&nested, Some(&spec("/a"))).unwrap();
    assert!(nested.join(CDI_SPEC_FILE).exists());
    assert!(!dirs[1].path().join(CDI_SPEC_FILE).exists());
}

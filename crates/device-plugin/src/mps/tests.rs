// SPDX-License-Identifier: Apache-2.0
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::*;
use crate::config::Settings;
use crate::mps_daemon::{Daemon, find_control};
use crate::resources::{self, fixtures};

fn mps_resources(replicas: u32, rename: bool) -> Vec<Resource> {
    let s = Settings {
        sharing: Some(fixtures::mps("nvidia.com/gpu", replicas, rename, true)),
        mps_root: Some("/run/nvidia/mps".into()),
        ..Settings::default()
    };
    resources::build(&fixtures::gpus(2), &s, Path::new("/nonexistent-sysfs")).unwrap()
}

#[test]
fn limits_split_the_gpu_between_the_replicas() {
    let cases: [(&str, u32, u32, u64); 4] = [
        ("2 replicas", 2, 50, 40_960),
        ("3 replicas round down", 3, 33, 27_306),
        ("100 replicas", 100, 1, 819),
        ("more replicas than percent", 1000, 1, 81),
    ];
    for (case, replicas, percent, mib) in cases {
        let resources = mps_resources(replicas, false);
        let limits = Limits::of(&resources[0]);
        assert_eq!(limits.active_thread_percentage, percent, "{case}");
        assert_eq!(limits.pinned_mem_mib, vec![(0, mib), (1, mib)], "{case}");
        assert_eq!(limits.pinned_env(), format!("0={mib}M,1={mib}M"), "{case}");
        assert_eq!(
            limits.commands(),
            vec![
                format!("set_default_active_thread_percentage {percent}"),
                format!("set_default_device_pinned_mem_limit 0 {mib}M"),
                format!("set_default_device_pinned_mem_limit 1 {mib}M"),
            ],
            "{case}"
        );
    }
}

#[test]
fn a_daemon_per_mps_resource_under_its_advertised_name() {
    for (case, rename, name) in [
        ("plain", false, "nvidia.com/gpu"),
        ("renamed", true, "nvidia.com/gpu.shared"),
    ] {
        let resources = mps_resources(4, rename);
        let daemons = Daemon::for_resources(&resources, Path::new("/run/nvidia/mps"));
        assert_eq!(daemons.len(), 1, "{case}");
        let d = &daemons[0];
        assert_eq!(d.resource, name, "{case}");
        assert_eq!(
            d.uuids,
            vec![fixtures::gpu_uuid(0), fixtures::gpu_uuid(1)],
            "{case}"
        );
        assert_eq!(
            d.env(),
            [
                (
                    "CUDA_MPS_PIPE_DIRECTORY",
                    format!("/run/nvidia/mps/{name}/pipe")
                ),
                (
                    "CUDA_MPS_LOG_DIRECTORY",
                    format!("/run/nvidia/mps/{name}/log")
                ),
                (
                    "CUDA_VISIBLE_DEVICES",
                    format!("{},{}", fixtures::gpu_uuid(0), fixtures::gpu_uuid(1))
                ),
            ],
            "{case}"
        );
        assert_eq!(
            d.started_file(),
            Path::new("/run/nvidia/mps").join(name).join(".started"),
            "{case}"
        );
    }
}

#[test]
fn time_slicing_gets_no_daemon() {
    let s = Settings {
        sharing: Some(fixtures::time_slicing("nvidia.com/gpu", 4, false, false)),
        ..Settings::default()
    };
    let resources = resources::build(&fixtures::gpus(2), &s, Path::new("/nonexistent")).unwrap();
    assert!(Daemon::for_resources(&resources, Path::new("/mps")).is_empty());
}

#[test]
fn the_control_binary_is_found_under_the_driver_root_first() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("driver");
    let on_path = dir.path().join("path");
    for d in [root.join("usr/bin"), on_path.clone()] {
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(CONTROL_BINARY), "").unwrap();
    }
    let path = on_path.as_os_str();
    assert_eq!(
        find_control(&root, Some(path)).unwrap(),
        root.join("usr/bin").join(CONTROL_BINARY)
    );
    assert_eq!(
        find_control(&dir.path().join("none"), Some(path)).unwrap(),
        on_path.join(CONTROL_BINARY)
    );
    let error = find_control(&dir.path().join("none"), None)
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("cannot find nvidia-cuda-mps-control"),
        "{error}"
    );
    assert!(
        error.contains("none/usr/bin/nvidia-cuda-mps-control"),
        "{error}"
    );
}

#[test]
fn a_missing_or_foreign_pid_is_not_a_live_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon {
        resource: "nvidia.com/gpu".into(),
        root: dir.path().to_owned(),
        uuids: vec![],
        commands: vec![],
    };
    assert!(!daemon.alive(), "no pid file");
    std::fs::create_dir_all(daemon.pid_file().parent().unwrap()).unwrap();
    // Our own pid: alive, but not the control daemon.
    std::fs::write(daemon.pid_file(), std::process::id().to_string()).unwrap();
    assert!(!daemon.alive(), "a process of another name");
    std::fs::write(daemon.pid_file(), "garbage").unwrap();
    assert!(!daemon.alive(), "not a number");
}

//! Device classes through our runtime and real runc: one container asks for IMEX
//! channels and every gated class at once (NVIDIA_IMEX_CHANNELS, NVIDIA_GDS,
//! NVIDIA_MOFED, NVIDIA_GDRCOPY, NVIDIA_NVSWITCH) and finds each node with the host's
//! numbers, GDS's `cufile.json` and udev database, and a cgroup rule per node in the
//! `config.json` the runtime wrote.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use nvshim_testkit::{
    CUFILE_JSON, GDRDRV_MAJOR, IMEX_CHANNELS_MAJOR, INFINIBAND_VERBS_MAJOR, NVIDIA_FS_MAJOR,
    NVSWITCH_MAJOR,
};
use serde_json::Value;

use crate::runc::{ok, setup};

/// Every class node the container should get: path, major, minor.
const NODES: [(&str, u32, u32); 11] = [
    (
        "/dev/nvidia-caps-imex-channels/channel0",
        IMEX_CHANNELS_MAJOR,
        0,
    ),
    (
        "/dev/nvidia-caps-imex-channels/channel2",
        IMEX_CHANNELS_MAJOR,
        2,
    ),
    ("/dev/nvidia-fs0", NVIDIA_FS_MAJOR, 0),
    ("/dev/nvidia-fs1", NVIDIA_FS_MAJOR, 1),
    ("/dev/infiniband/uverbs0", INFINIBAND_VERBS_MAJOR, 192),
    ("/dev/infiniband/uverbs1", INFINIBAND_VERBS_MAJOR, 193),
    ("/dev/infiniband/rdma_cm", 10, 58),
    ("/dev/gdrdrv", GDRDRV_MAJOR, 0),
    ("/dev/nvidia-nvswitchctl", NVSWITCH_MAJOR, 255),
    ("/dev/nvidia-nvswitch0", NVSWITCH_MAJOR, 0),
    ("/dev/nvidia-nvswitch1", NVSWITCH_MAJOR, 1),
];

#[test]
fn one_container_gets_imex_gds_mofed_gdrcopy_and_nvswitch() {
    let e = setup();
    e.node.sim.add_device_classes().unwrap();
    let host_channel2 = e
        .node
        .sim
        .dev_root
        .join("nvidia-caps-imex-channels/channel2");
    assert!(!host_channel2.exists(), "the node starts without channel 2");

    let paths: Vec<&str> = NODES.iter().map(|(p, _, _)| *p).collect();
    let script = format!(
        "stat -c '%n %t:%T' {}; echo ==; cat /etc/cufile.json; echo ==; ls /run/udev/data",
        paths.join(" ")
    );
    let run = e.run_script(
        &[
            "NVIDIA_VISIBLE_DEVICES=0",
            "NVIDIA_IMEX_CHANNELS=0,channel2",
            "NVIDIA_GDS=enabled",
            "NVIDIA_MOFED=enabled",
            "NVIDIA_GDRCOPY=enabled",
            "NVIDIA_NVSWITCH=enabled",
        ],
        &script,
    );
    ok(&run);
    let stdout = run.stdout();
    let sections: Vec<&str> = stdout.split("==\n").collect();
    assert_eq!(sections.len(), 3, "{stdout}");

    // Each node in the container, with the host's numbers (stat prints them in hex).
    for (path, major, minor) in NODES {
        let want = format!("{path} {major:x}:{minor:x}");
        assert!(
            sections[0].lines().any(|l| l == want),
            "{want:?} not in the container:\n{stdout}"
        );
    }
    assert_eq!(sections[1], CUFILE_JSON, "cufile.json is the host's");
    assert_eq!(sections[2].trim(), "c243:0", "/run/udev is the host's");

    // Channel 2 was missing: made on the host from proc/devices, as NVIDIA's CLI does.
    let meta = fs::symlink_metadata(&host_channel2).unwrap();
    assert!(meta.file_type().is_char_device());
    assert_eq!(
        meta.rdev(),
        nix::sys::stat::makedev(IMEX_CHANNELS_MAJOR.into(), 2)
    );

    // The config.json the runtime wrote: a node entry and an allow rule for each.
    let spec: Value =
        serde_json::from_slice(&fs::read(run.bundle.join("config.json")).unwrap()).unwrap();
    let devices = spec["linux"]["devices"].as_array().unwrap();
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    for (path, major, minor) in NODES {
        assert!(
            devices
                .iter()
                .any(|d| d["path"] == path && d["major"] == major && d["minor"] == minor),
            "no linux.devices entry for {path}"
        );
        assert!(
            rules.iter().any(|r| r["allow"] == true
                && r["type"] == "c"
                && r["major"] == major
                && r["minor"] == minor
                && r["access"] == "rwm"),
            "no cgroup rule for {path} ({major}:{minor}): {rules:?}"
        );
    }
    let mounts = spec["mounts"].as_array().unwrap();
    for destination in ["/etc/cufile.json", "/run/udev"] {
        let mount = mounts
            .iter()
            .find(|m| m["destination"] == destination)
            .unwrap_or_else(|| panic!("no mount at {destination}"));
        let options: Vec<&str> = mount["options"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(options, ["ro", "nosuid", "nodev", "rbind", "rprivate"]);
    }
}

//! Device classes through the prestart hook alone (no runtime of ours): a container
//! asking for an IMEX channel the host lacks and every gated class gets each node, able
//! to `open()` it past the device cgroup the hook extended (`ENXIO`/`ENODEV`: no driver
//! behind the simulated numbers; `EPERM` would be the cgroup's refusal), and GDS's host files;
//! a channel it did not ask for is not there.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use nvshim_testkit::CUFILE_JSON;
use serde_json::json;

use crate::prestart::setup;

#[test]
fn the_hook_gives_imex_gds_mofed_gdrcopy_and_nvswitch_nodes_the_cgroup_allows() {
    let e = setup();
    e.node.sim.add_device_classes().unwrap();
    let asked = [
        "/dev/nvidia-caps-imex-channels/channel2",
        "/dev/nvidia-fs0",
        "/dev/nvidia-fs1",
        "/dev/infiniband/uverbs0",
        "/dev/infiniband/uverbs1",
        "/dev/infiniband/rdma_cm",
        "/dev/gdrdrv",
        "/dev/nvidia-nvswitchctl",
        "/dev/nvidia-nvswitch0",
        "/dev/nvidia-nvswitch1",
    ];
    let not_asked = "/dev/nvidia-caps-imex-channels/channel0";
    let script = format!(
        "openprobe {} {not_asked}; echo ==; cat /etc/cufile.json; echo ==; ls /run/udev/data",
        asked.join(" ")
    );
    let config = e.config("");
    let run = e.run_with(
        &[
            "NVIDIA_VISIBLE_DEVICES=0",
            "NVIDIA_IMEX_CHANNELS=2",
            "NVIDIA_GDS=enabled",
            "NVIDIA_MOFED=enabled",
            "NVIDIA_GDRCOPY=enabled",
            "NVIDIA_NVSWITCH=enabled",
        ],
        &config,
        |_, spec| spec["process"]["args"] = json!(["sh", "-c", script]),
    );
    run.ok();
    let stdout = run.stdout();
    let sections: Vec<&str> = stdout.split("==\n").collect();
    assert_eq!(sections.len(), 3, "{stdout}");
    // ENXIO, or ENODEV for `rdma_cm` on the kernel's own misc major: both come from
    // behind the device cgroup.
    for path in asked {
        assert!(
            sections[0]
                .lines()
                .any(|l| l == format!("{path} ENXIO") || l == format!("{path} No such device")),
            "{path} not opened past the cgroup:\n{stdout}"
        );
    }
    assert!(
        sections[0]
            .lines()
            .any(|l| l == format!("{not_asked} ENOENT")),
        "a channel not asked for is absent:\n{stdout}"
    );
    assert_eq!(sections[1], CUFILE_JSON);
    assert_eq!(sections[2].trim(), "c243:0");
}

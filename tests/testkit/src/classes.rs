// SPDX-License-Identifier: Apache-2.0
//! The device classes besides GPUs, added to a built node on request
//! ([`SimNode::add_device_classes`]): IMEX channel 0, GDS (`nvidia-fs*`, `cufile.json`, the udev
//! database), MOFED (`infiniband/uverbs*`, `rdma_cm`), GDRCopy (`gdrdrv`) and NVSwitch
//! (`nvidia-nvswitchctl`, `nvidia-nvswitch*`), plus a `proc/devices` naming their majors.
//!
//! Opt-in, so that the nodes other tests see (and their golden outputs) stay as they are. The
//! majors are plausible dynamic ones (the real drivers register theirs at load time), each
//! listed in `proc/devices` under the driver's name. IMEX channel 2 is left out on purpose:
//! a request for it makes nvshim create the node from the `nvidia-caps-imex-channels` major.

use std::path::Path;

use crate::devices::DeviceNode;
use crate::error::TestkitError;
use crate::files;
use crate::node::SimNode;
use crate::spec::{NVIDIA_CAPS_MAJOR, NVIDIA_MAJOR, NVIDIA_UVM_MAJOR};

/// `nvidia-fs` (GPUDirect Storage).
pub const NVIDIA_FS_MAJOR: u32 = 243;
/// `infiniband_verbs`; the `uverbs<n>` minors start at 192.
pub const INFINIBAND_VERBS_MAJOR: u32 = 231;
/// `misc`: `rdma_cm` is a misc device.
pub const MISC_MAJOR: u32 = 10;
pub const RDMA_CM_MINOR: u32 = 58;
/// `gdrdrv` (GDRCopy).
pub const GDRDRV_MAJOR: u32 = 236;
/// `nvidia-nvswitch`; the control node is minor 255.
pub const NVSWITCH_MAJOR: u32 = 507;
/// `nvidia-caps-imex-channels`; the minor is the channel.
pub const IMEX_CHANNELS_MAJOR: u32 = 506;
/// `/etc/cufile.json` in the driver root.
pub const CUFILE_JSON: &str = "{\n  \"logging\": { \"level\": \"ERROR\" }\n}\n";
/// A file in the driver root's `/run/udev` (the udev database GDS reads).
pub const UDEV_DATA_FILE: &str = "run/udev/data/c243:0";

/// The class nodes, relative to the dev root's `dev/`.
pub fn class_nodes() -> Vec<DeviceNode> {
    let node = |path: &str, major, minor| DeviceNode {
        path: path.to_owned(),
        major,
        minor,
        mode: 0o666,
    };
    vec![
        node("nvidia-fs0", NVIDIA_FS_MAJOR, 0),
        node("nvidia-fs1", NVIDIA_FS_MAJOR, 1),
        node("infiniband/uverbs0", INFINIBAND_VERBS_MAJOR, 192),
        node("infiniband/uverbs1", INFINIBAND_VERBS_MAJOR, 193),
        node("infiniband/rdma_cm", MISC_MAJOR, RDMA_CM_MINOR),
        node("gdrdrv", GDRDRV_MAJOR, 0),
        node("nvidia-nvswitchctl", NVSWITCH_MAJOR, 255),
        node("nvidia-nvswitch0", NVSWITCH_MAJOR, 0),
        node("nvidia-nvswitch1", NVSWITCH_MAJOR, 1),
        node("nvidia-caps-imex-channels/channel0", IMEX_CHANNELS_MAJOR, 0),
    ]
}

/// `/proc/devices` of a node with the classes: the character majors by the drivers' names.
pub fn proc_devices() -> String {
    format!(
        "Character devices:\n  1 mem\n {MISC_MAJOR} misc\n{NVIDIA_MAJOR} nvidia-frontend\n\
         {INFINIBAND_VERBS_MAJOR} infiniband_verbs\n{GDRDRV_MAJOR} gdrdrv\n\
         {NVIDIA_FS_MAJOR} nvidia-fs\n{IMEX_CHANNELS_MAJOR} nvidia-caps-imex-channels\n\
         {NVSWITCH_MAJOR} nvidia-nvswitch\n{NVIDIA_UVM_MAJOR} nvidia-uvm\n\
         {NVIDIA_CAPS_MAJOR} nvidia-caps\n\nBlock devices:\n  7 loop\n"
    )
}

impl SimNode {
    /// Adds the device classes' nodes, GDS's files and `proc/devices` to this node.
    pub fn add_device_classes(&self) -> Result<(), TestkitError> {
        for node in class_nodes() {
            make(&self.dev_root.join(&node.path), &node)?;
        }
        files::write(
            &self.driver_root.join("etc/cufile.json"),
            CUFILE_JSON,
            0o644,
        )?;
        files::write(
            &self.driver_root.join(UDEV_DATA_FILE),
            "E:ID_VENDOR=nvidia\n",
            0o644,
        )?;
        files::write(&self.proc_root.join("devices"), proc_devices(), 0o444)
    }
}

fn make(path: &Path, node: &DeviceNode) -> Result<(), TestkitError> {
    if let Some(parent) = path.parent() {
        files::mkdir_all(parent)?;
    }
    files::char_device(path, node.major, node.minor, node.mode)
}

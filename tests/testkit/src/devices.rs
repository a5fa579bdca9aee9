// SPDX-License-Identifier: Apache-2.0
//! The dev root: real character device nodes made with `mknod` (needs root / `CAP_MKNOD`).
//!
//! The nodes are never opened; they exist so discovery can `stat` them and read their rdev, as it
//! does on a real host. Modes follow the driver's defaults: 0666 for the main nodes, 0400 for the
//! MIG `config` capability and 0444 (`DeviceFileMode: 292`) for `monitor` and the GI/CI access
//! capabilities.

use std::path::Path;

use crate::error::TestkitError;
use crate::files;
use crate::spec::{
    MIG_CONFIG_MINOR, MIG_MONITOR_MINOR, NVIDIA_CAPS_MAJOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR,
    NVIDIA_UVM_MAJOR, NVIDIACTL_MINOR, NodeSpec, mig_ci_minor, mig_gi_minor,
};

/// One device node: path relative to the dev root, major, minor, mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    pub path: String,
    pub major: u32,
    pub minor: u32,
    pub mode: u32,
}

/// Every node the dev root of `spec` holds, in creation order.
pub fn device_nodes(spec: &NodeSpec) -> Vec<DeviceNode> {
    let node = |path: String, major, minor, mode| DeviceNode {
        path,
        major,
        minor,
        mode,
    };
    let mut nodes = vec![
        node("nvidiactl".into(), NVIDIA_MAJOR, NVIDIACTL_MINOR, 0o666),
        node(
            "nvidia-modeset".into(),
            NVIDIA_MAJOR,
            NVIDIA_MODESET_MINOR,
            0o666,
        ),
        node("nvidia-uvm".into(), NVIDIA_UVM_MAJOR, 0, 0o666),
        node("nvidia-uvm-tools".into(), NVIDIA_UVM_MAJOR, 1, 0o666),
    ];
    for gpu in &spec.gpus {
        nodes.push(node(
            format!("nvidia{}", gpu.minor),
            NVIDIA_MAJOR,
            gpu.minor,
            0o666,
        ));
    }
    let cap = |minor: u32, mode| {
        node(
            format!("nvidia-caps/nvidia-cap{minor}"),
            NVIDIA_CAPS_MAJOR,
            minor,
            mode,
        )
    };
    nodes.push(cap(MIG_CONFIG_MINOR, 0o400));
    nodes.push(cap(MIG_MONITOR_MINOR, 0o444));
    let mut caps: Vec<u32> = Vec::new();
    for gpu in &spec.gpus {
        for mig in &gpu.mig_devices {
            let gi = mig_gi_minor(gpu.minor, mig.gpu_instance_id);
            let ci = mig_ci_minor(gpu.minor, mig.gpu_instance_id, mig.compute_instance_id);
            for minor in [gi, ci] {
                if !caps.contains(&minor) {
                    caps.push(minor);
                    nodes.push(cap(minor, 0o444));
                }
            }
        }
    }
    nodes
}

/// Creates the dev root at `root`.
pub(crate) fn build(root: &Path, spec: &NodeSpec) -> Result<(), TestkitError> {
    files::mkdir_all(&root.join("nvidia-caps"))?;
    for node in device_nodes(spec) {
        let path = root.join(&node.path);
        files::char_device(&path, node.major, node.minor, node.mode)?;
    }
    crate::graphics::build_dev(root, spec)
}

// SPDX-License-Identifier: Apache-2.0
//! The node's PCI functions as sysfs shows them, for gpu-feature-discovery's labels:
//! `D/sys/bus/pci/devices/<bus id>/{vendor,class,config}` for every GPU (an NVIDIA 3D
//! controller, `0x030200`) and for the onboard VGA (ASPEED, `0x030000`). The config space
//! is the 256 bytes an unprivileged reader gets; [`make_vgpu`] gives a GPU the vendor
//! capability a vGPU guest sees, [`set_pci_class`] another class (a GPU in graphics mode).

use std::path::{Path, PathBuf};

use crate::error::TestkitError;
use crate::files;
use crate::graphics::VGA_BUS_ID;
use crate::spec::NodeSpec;

/// Where sysfs lists PCI functions, under the node directory.
pub const SYSFS_PCI_DEVICES: &str = "sys/bus/pci/devices";
/// A GPU in compute mode: a 3D controller.
pub const PCI_CLASS_3D: u32 = 0x03_02_00;
/// A GPU in graphics mode (and the onboard VGA): a VGA controller.
pub const PCI_CLASS_VGA: u32 = 0x03_00_00;
const NVIDIA_VENDOR: &str = "0x10de";
const ASPEED_VENDOR: &str = "0x1a03";
/// Config space: the status register, its capability-list bit, the first capability.
const STATUS: usize = 0x06;
const STATUS_CAPABILITY_LIST: u8 = 0x10;
const CAPABILITY_POINTER: usize = 0x34;
const VENDOR_CAPABILITY_ID: u8 = 0x09;
/// Where [`make_vgpu`] puts the vendor capability.
const VGPU_CAPABILITY_AT: usize = 0xd4;

fn device_dir(dir: &Path, bus_id: &str) -> PathBuf {
    dir.join(SYSFS_PCI_DEVICES).join(bus_id)
}

/// Writes every GPU's (and the VGA's) `vendor`, `class` and `config` (`dir` is `D`).
pub(crate) fn build(dir: &Path, spec: &NodeSpec) -> Result<(), TestkitError> {
    write_function(dir, VGA_BUS_ID, ASPEED_VENDOR, PCI_CLASS_VGA)?;
    for gpu in &spec.gpus {
        write_function(dir, &gpu.bus_id, NVIDIA_VENDOR, PCI_CLASS_3D)?;
    }
    Ok(())
}

fn write_function(dir: &Path, bus_id: &str, vendor: &str, class: u32) -> Result<(), TestkitError> {
    let device = device_dir(dir, bus_id);
    files::mkdir_all(&device)?;
    files::write(&device.join("vendor"), format!("{vendor}\n"), 0o644)?;
    set_pci_class(dir, bus_id, class)?;
    files::write(&device.join("config"), config_space(None), 0o644)
}

/// Rewrites the `class` of the function at `bus_id` under the node directory `dir`.
pub fn set_pci_class(dir: &Path, bus_id: &str, class: u32) -> Result<(), TestkitError> {
    let path = device_dir(dir, bus_id).join("class");
    files::write(&path, format!("0x{class:06x}\n"), 0o644)
}

/// Makes the GPU at `bus_id` look like a vGPU (a guest's view): its config space gets a
/// vendor-specific capability with the `VF` signature and a host driver record holding
/// `version` and `branch` (10 bytes each, NUL-padded), the layout NVIDIA's hypervisor
/// driver exposes.
pub fn make_vgpu(
    dir: &Path,
    bus_id: &str,
    version: &str,
    branch: &str,
) -> Result<(), TestkitError> {
    let path = device_dir(dir, bus_id).join("config");
    files::write(&path, config_space(Some((version, branch))), 0o644)
}

/// 256 bytes of config space: NVIDIA's vendor id, and, for a vGPU, the capability list
/// holding one vendor capability.
fn config_space(vgpu: Option<(&str, &str)>) -> Vec<u8> {
    let mut config = vec![0u8; 256];
    config[0] = 0xde;
    config[1] = 0x10;
    let Some((version, branch)) = vgpu else {
        return config;
    };
    config[STATUS] |= STATUS_CAPABILITY_LIST;
    config[CAPABILITY_POINTER] = VGPU_CAPABILITY_AT as u8;
    // id, next (none), length, "VF", then records: id 0 (host driver), record length,
    // 10 bytes of version, 10 of branch.
    let mut capability = vec![VENDOR_CAPABILITY_ID, 0, 0, b'V', b'F', 0, 22];
    for text in [version, branch] {
        let mut field = [0u8; 10];
        let bytes = text.as_bytes();
        let n = bytes.len().min(10);
        field[..n].copy_from_slice(&bytes[..n]);
        capability.extend_from_slice(&field);
    }
    capability[2] = capability.len() as u8;
    config[VGPU_CAPABILITY_AT..VGPU_CAPABILITY_AT + capability.len()].copy_from_slice(&capability);
    config
}

// SPDX-License-Identifier: Apache-2.0
//! Test fixtures for the plugin's pure stages: hand-built inventories and a sysfs
//! tree in a temp dir.

use std::fs;
use std::path::{Path, PathBuf};

use crate::config::{SharedResource, Sharing, SharingStrategy};
use nvshim::inventory::{DriverInfo, Gpu, Inventory, MigDevice};

/// `GPU-0000000<i>-…`: distinct, recognisable UUIDs.
pub(crate) fn gpu_uuid(index: u32) -> String {
    format!("GPU-{index:08x}-1111-2222-3333-444444444444")
}

pub(crate) fn mig_uuid(gpu: u32, index: u32) -> String {
    format!("MIG-{gpu:04x}{index:04x}-aaaa-bbbb-cccc-dddddddddddd")
}

/// Bus id of GPU `index`: `0000:1<i>:00.0`-like, in PCI order.
pub(crate) fn bus_id(index: u32) -> String {
    format!("0000:{:02x}:00.0", 0x10 + index)
}

/// A full GPU with MIG off; its minor is its index.
pub(crate) fn gpu(index: u32) -> Gpu {
    Gpu {
        index,
        minor: index,
        uuid: gpu_uuid(index),
        bus_id: bus_id(index),
        name: "NVIDIA H100 80GB HBM3".to_string(),
        memory_bytes: Some(80 << 30),
        compute_capability: None,
        brand: None,
        mig_enabled: Some(false),
        mig_devices: Vec::new(),
    }
}

/// A MIG-enabled GPU with MIG devices of the given profiles (GI id = index + 1,
/// CI id 0).
pub(crate) fn mig_gpu(index: u32, profiles: &[&str]) -> Gpu {
    let mut g = gpu(index);
    g.mig_enabled = Some(true);
    g.mig_devices = profiles
        .iter()
        .zip(0u32..)
        .map(|(profile, m)| MigDevice {
            index: m,
            gpu_instance_id: m + 1,
            compute_instance_id: 0,
            uuid: mig_uuid(index, m),
            memory_bytes: None,
            profile: (*profile).to_string(),
        })
        .collect();
    g
}

pub(crate) fn inventory(gpus: Vec<Gpu>) -> Inventory {
    Inventory {
        driver: DriverInfo {
            version: "550.54.15".to_string(),
            cuda_version: None,
        },
        gpus,
    }
}

/// `count` full GPUs, indices 0..count.
pub(crate) fn gpus(count: u32) -> Inventory {
    inventory((0..count).map(gpu).collect())
}

pub(crate) fn time_slicing(name: &str, replicas: u32, rename: bool, fail: bool) -> Sharing {
    sharing(SharingStrategy::TimeSlicing, name, replicas, rename, fail)
}

/// `sharing.mps` of one resource.
pub(crate) fn mps(name: &str, replicas: u32, rename: bool, fail: bool) -> Sharing {
    sharing(SharingStrategy::Mps, name, replicas, rename, fail)
}

fn sharing(
    strategy: SharingStrategy,
    name: &str,
    replicas: u32,
    rename: bool,
    fail: bool,
) -> Sharing {
    Sharing {
        strategy,
        rename_by_default: rename,
        fail_requests_greater_than_one: fail,
        resources: vec![SharedResource {
            name: name.to_string(),
            replicas,
        }],
    }
}

/// Writes `<sysfs>/bus/pci/devices/<bus id>/numa_node` as a plain directory.
pub(crate) fn write_numa(sysfs: &Path, bus_id: &str, text: &str) {
    let dir = sysfs.join("bus/pci/devices").join(bus_id);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("numa_node"), text).unwrap();
}

/// Places a GPU in a fake PCI tree: the real directory
/// `<sysfs>/devices/pci0000:00/<bridges…>/<bus id>` (with `numa_node`), and the
/// `<sysfs>/bus/pci/devices/<bus id>` symlink to it that the kernel makes.
pub(crate) fn place_gpu(sysfs: &Path, bus_id: &str, bridges: &[&str], numa: &str) -> PathBuf {
    let mut dir = sysfs.join("devices/pci0000:00");
    for bridge in bridges {
        dir.push(bridge);
    }
    dir.push(bus_id);
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("numa_node"), numa).unwrap();
    let links = sysfs.join("bus/pci/devices");
    fs::create_dir_all(&links).unwrap();
    std::os::unix::fs::symlink(&dir, links.join(bus_id)).unwrap();
    dir
}

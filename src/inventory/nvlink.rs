// SPDX-License-Identifier: Apache-2.0
//! NVLink counts between the node's GPUs, for the device plugin's preferred allocation.
//!
//! Like NVIDIA's `go-gpuallocator`, a link joins two GPUs when one GPU's active link has
//! the other GPU's PCI address at its far end. Links to an NVSwitch (DGX/HGX A100 and H100)
//! lead to no GPU and so count for no pair; on such nodes every pair is equally close
//! through the switches and the matrix is empty, which is what the allocator's scoring
//! sees there too.
//!
//! This is a best-effort read: it never fails. A GPU or link NVML cannot describe counts
//! as no link, and is logged at debug level.

use std::collections::BTreeMap;

use super::{Inventory, normalize_bus_id};
use crate::nvml::{Device, NVLINK_MAX_LINKS, Nvml, NvmlError, Return};

/// Active NVLinks between GPU pairs, keyed by GPU indices `(low, high)` (PCI order, the
/// inventory's [`super::Gpu::index`]); pairs without a link are absent.
///
/// Each GPU's links are read from its own side; when both sides can be read they agree,
/// and the larger of the two counts is kept in case one side hides some links.
pub fn nvlink_matrix(nvml: &Nvml, inventory: &Inventory) -> BTreeMap<(u32, u32), u32> {
    let by_bus_id: BTreeMap<&str, u32> = inventory
        .gpus
        .iter()
        .map(|gpu| (gpu.bus_id.as_str(), gpu.index))
        .collect();
    let mut matrix = BTreeMap::new();
    for gpu in &inventory.gpus {
        let device = match nvml.device_by_uuid(&gpu.uuid) {
            Ok(device) => device,
            Err(error) => {
                tracing::debug!(gpu = gpu.index, uuid = %gpu.uuid, %error, "cannot read NVLinks; counting none");
                continue;
            }
        };
        let mut from_here: BTreeMap<(u32, u32), u32> = BTreeMap::new();
        for remote in remote_bus_ids(&device, gpu.index) {
            match by_bus_id.get(remote.as_str()) {
                Some(&peer) if peer != gpu.index => {
                    *from_here
                        .entry((gpu.index.min(peer), gpu.index.max(peer)))
                        .or_default() += 1;
                }
                // An NVSwitch, a GPU this process cannot see, or a loop-back.
                _ => {}
            }
        }
        for (pair, count) in from_here {
            let entry = matrix.entry(pair).or_insert(0);
            *entry = (*entry).max(count);
        }
    }
    matrix
}

/// The sysfs-form PCI addresses at the far end of each of `device`'s active links (one
/// entry per link, so a peer reached by three links appears three times).
fn remote_bus_ids(device: &Device, gpu: u32) -> Vec<String> {
    let mut remotes = Vec::new();
    for link in 0..NVLINK_MAX_LINKS {
        match device.nvlink_state(link) {
            Ok(true) => {}
            Ok(false) => continue,
            Err(error) if no_such_link(&error) => continue,
            Err(error) => {
                tracing::debug!(gpu, link, %error, "cannot read NVLink state; counting no link");
                continue;
            }
        }
        match device.nvlink_remote_pci_info(link) {
            Ok(pci) => match normalize_bus_id(&pci.bus_id) {
                Some(bus_id) => remotes.push(bus_id),
                None => {
                    tracing::debug!(gpu, link, bus_id = %pci.bus_id, "NVLink remote has no usable PCI address");
                }
            },
            Err(error) => {
                if !no_such_link(&error) {
                    tracing::debug!(gpu, link, %error, "cannot read NVLink remote; counting no link");
                }
            }
        }
    }
    remotes
}

/// What NVML answers for a link a GPU does not have: `NOT_SUPPORTED` (no NVLink at all, or
/// an old library) or `INVALID_ARGUMENT` (a link number past the GPU's last link).
fn no_such_link(error: &NvmlError) -> bool {
    error.is_not_supported() || error.code() == Some(Return::InvalidArgument)
}

// SPDX-License-Identifier: Apache-2.0
//! Where each GPU sits: its NUMA node, its PCIe switch, and (when NVML fills them in)
//! its NVLinks to the other GPUs. Loaded once at start and kept, so
//! `GetPreferredAllocation` never rebuilds it (NVIDIA's plugin initialises NVML and
//! walks every GPU pair on each call, which takes seconds on an 8-GPU node, issue #774).
//!
//! Reading the topology never fails: whatever sysfs does not say is unknown, and an
//! unknown placement only means a lower pair [`Topology::score`].

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::Serialize;

use nvshim::inventory::{Inventory, normalize_bus_id};

use super::resources::read_numa_node;

/// Score per NVLink between two GPUs (NVIDIA's go-gpuallocator counts 100 a link).
pub const NVLINK_SCORE: u32 = 100;
/// Score of two GPUs behind the same PCIe switch (go-gpuallocator's "single switch").
pub const SAME_SWITCH_SCORE: u32 = 50;
/// Score of two GPUs on the same NUMA node, i.e. the same CPU socket.
pub const SAME_NUMA_SCORE: u32 = 20;

/// Where one GPU sits on the PCIe tree.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The GPU's NUMA node, when sysfs gives one ≥ 0.
    pub numa_node: Option<i64>,
    /// The PCIe switch the GPU sits behind: the sysfs directory of the switch's
    /// upstream port. `None` when the GPU hangs directly off a root port or sysfs
    /// does not say.
    pub switch: Option<PathBuf>,
}

/// The placement of every GPU and the NVLink counts between them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Topology {
    gpus: BTreeMap<u32, Placement>,
    /// NVLink count per GPU pair, keyed `(lower index, higher index)`.
    links: BTreeMap<(u32, u32), u32>,
}

impl Topology {
    /// Reads each GPU's placement from sysfs (`<sysfs>/bus/pci/devices/<bus id>`).
    ///
    /// The switch is the **grandparent** of the GPU's canonical sysfs directory. A
    /// GPU's parent is the bridge port its slot hangs off, which behind a switch is
    /// one downstream port per GPU (`…/0000:01:00.0/0000:02:08.0/0000:07:00.0`), so
    /// parents would never match; the downstream ports all hang off the switch's one
    /// upstream port (`0000:01:00.0`), the grandparent. A GPU directly on a root port
    /// has the host bridge (`pci0000:00`) as grandparent, which is not a switch (it
    /// would lump every GPU of a socket together), so only a grandparent named like a
    /// PCI device counts.
    pub fn load(inventory: &Inventory, sysfs: &Path) -> Topology {
        let gpus = inventory
            .gpus
            .iter()
            .map(|gpu| {
                let numa_node = read_numa_node(sysfs, &gpu.bus_id).ok().flatten();
                let switch = switch_of(sysfs, &gpu.bus_id);
                (gpu.index, Placement { numa_node, switch })
            })
            .collect();
        Topology {
            gpus,
            links: BTreeMap::new(),
        }
    }

    /// A topology from placements the caller already knows.
    pub fn from_placements(gpus: BTreeMap<u32, Placement>) -> Topology {
        Topology {
            gpus,
            links: BTreeMap::new(),
        }
    }

    /// Adds NVLink counts (from NVML). A pair may be given either way round; if both
    /// are, the larger count is kept. Links from a GPU to itself are ignored.
    pub fn with_nvlinks(mut self, links: BTreeMap<(u32, u32), u32>) -> Topology {
        for ((a, b), count) in links {
            if a == b || count == 0 {
                continue;
            }
            let slot = self.links.entry((a.min(b), a.max(b))).or_insert(0);
            *slot = (*slot).max(count);
        }
        self
    }

    /// A GPU's placement, if the topology knows the GPU.
    pub fn placement(&self, gpu: u32) -> Option<&Placement> {
        self.gpus.get(&gpu)
    }

    /// The NVLink count between two GPUs (0 when unknown).
    pub fn nvlinks(&self, a: u32, b: u32) -> u32 {
        self.links.get(&(a.min(b), a.max(b))).copied().unwrap_or(0)
    }

    /// How well two GPUs pair, higher is better: [`NVLINK_SCORE`] per NVLink, plus
    /// [`SAME_SWITCH_SCORE`] behind one PCIe switch, else [`SAME_NUMA_SCORE`] on one
    /// NUMA node, else nothing. So any NVLink beats any PCIe path, a shared switch
    /// beats a shared socket, and unknown placements score as far apart. A GPU paired
    /// with itself scores 0.
    pub fn score(&self, a: u32, b: u32) -> u32 {
        if a == b {
            return 0;
        }
        let links = self.nvlinks(a, b).saturating_mul(NVLINK_SCORE);
        let pcie = match (self.gpus.get(&a), self.gpus.get(&b)) {
            (Some(pa), Some(pb)) => {
                if pa.switch.is_some() && pa.switch == pb.switch {
                    SAME_SWITCH_SCORE
                } else if pa.numa_node.is_some() && pa.numa_node == pb.numa_node {
                    SAME_NUMA_SCORE
                } else {
                    0
                }
            }
            _ => 0,
        };
        links.saturating_add(pcie)
    }
}

/// The canonical sysfs directory's grandparent, when it is a PCI device.
fn switch_of(sysfs: &Path, bus_id: &str) -> Option<PathBuf> {
    if bus_id.is_empty() || bus_id.contains('/') || bus_id.starts_with('.') {
        return None;
    }
    let dir = std::fs::canonicalize(sysfs.join("bus/pci/devices").join(bus_id)).ok()?;
    let grandparent = dir.parent()?.parent()?;
    let name = grandparent.file_name()?.to_str()?;
    normalize_bus_id(name)?;
    Some(grandparent.to_path_buf())
}

#[cfg(test)]
#[path = "topology_tests.rs"]
mod tests;

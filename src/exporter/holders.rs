// SPDX-License-Identifier: Apache-2.0
//! Attribution: which containers hold each GPU and MIG GPU instance, from what kubelet's
//! pod-resources `List` reports ([`ContainerDevices`], flattened). Device ids are the ones
//! NVIDIA's device plugin (and ours) advertise: `GPU-<uuid>`, `MIG-<uuid>`, the index `3`,
//! the MIG index `3:1`, each with `::<n>` when the GPU is shared (time-slicing or MPS
//! replicas). Only `nvidia.com/*` resources count.

use std::collections::HashMap;

use super::Exporter;

/// One container's devices of one resource, as kubelet reports them.
pub use crate::kubelet::pod_resources::ContainerDevices;

/// A container holding a unit: the labels its series get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Holder {
    pub pod: String,
    pub namespace: String,
    pub container: String,
    /// The replica number of a shared GPU (`vgpu` label), `None` for a whole one.
    pub vgpu: Option<String>,
}

/// A unit of the node: a whole GPU, or a MIG GPU instance (by the exporter's positions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Unit {
    Gpu(usize),
    Instance(usize, usize),
}

/// Who holds what; [`Holders::default`] is nobody.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Holders {
    pub(super) by_unit: HashMap<Unit, Vec<Holder>>,
}

impl Holders {
    /// The holders of the exporter's GPUs and instances among `containers`. Ids that name
    /// no unit of this node, and resources outside `nvidia.com/`, are ignored.
    pub fn from_containers(exporter: &Exporter, containers: &[ContainerDevices]) -> Holders {
        Holders::from_containers_named(exporter, containers, &[])
    }

    /// [`Holders::from_containers`], counting the resources named in `also` as GPUs too
    /// (dcgm-exporter's `--nvidia-resource-names`).
    pub fn from_containers_named(
        exporter: &Exporter,
        containers: &[ContainerDevices],
        also: &[String],
    ) -> Holders {
        let mut by_unit: HashMap<Unit, Vec<Holder>> = HashMap::new();
        for entry in containers {
            if !entry.resource.starts_with("nvidia.com/") && !also.contains(&entry.resource) {
                continue;
            }
            for id in &entry.device_ids {
                let (base, replica) = match id.split_once("::") {
                    Some((base, replica)) => (base, Some(replica.to_string())),
                    None => (id.as_str(), None),
                };
                let Some(unit) = exporter.unit_of_device_id(base) else {
                    tracing::debug!(id = %id, "device id names no GPU of this node; not attributed");
                    continue;
                };
                let holder = Holder {
                    pod: entry.pod.clone(),
                    namespace: entry.namespace.clone(),
                    container: entry.container.clone(),
                    vgpu: replica,
                };
                let holders = by_unit.entry(unit).or_default();
                if !holders.contains(&holder) {
                    holders.push(holder);
                }
            }
        }
        Holders { by_unit }
    }

    pub(super) fn of(&self, unit: Unit) -> &[Holder] {
        self.by_unit.get(&unit).map_or(&[], Vec::as_slice)
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The GPU half of a scrape with dcgm-exporter's names (`--metrics-names=dcgm`, the
//! default): `nvshim::exporter` reads the GPUs and MIG instances and writes the `DCGM_FI_*`
//! families; kubelet's pod-resources answer, flattened to what each container holds,
//! gives their pod labels. So the plugin's `/metrics` and `nvshim exporter` serve the
//! same series for the same node.

use nvshim::exporter::{ContainerDevices, Exporter, Holders};

use super::pods::api::ListPodResourcesResponse;

/// What kubelet's answer says each container holds, one entry per (container, resource).
pub(super) fn containers(response: &ListPodResourcesResponse) -> Vec<ContainerDevices> {
    let mut out = Vec::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                out.push(ContainerDevices {
                    pod: pod.name.clone(),
                    namespace: pod.namespace.clone(),
                    container: container.name.clone(),
                    resource: devices.resource_name.clone(),
                    device_ids: devices.device_ids.clone(),
                });
            }
        }
    }
    out
}

/// The exposition of `exporter`'s GPUs, labelled with who holds them. Blocking.
pub(super) fn render(exporter: &Exporter, containers: &[ContainerDevices], out: &mut String) {
    let holders = Holders::from_containers(exporter, containers);
    exporter.render(&holders, out);
}

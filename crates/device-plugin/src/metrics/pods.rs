// SPDX-License-Identifier: Apache-2.0
//! Which pod and container hold each GPU, from kubelet's pod-resources API (v1 `List`
//! on `/var/lib/kubelet/pod-resources/kubelet.sock`), asked at every scrape.
//!
//! Kubelet answers with the device ids each container got, per resource: exactly the ids
//! this plugin advertised (`GPU-…`, `3`, `MIG-…`, `3:1`, with `::<n>` for time-sliced
//! replicas). [`DeviceIds`] maps them back to GPU indices: a MIG device or a replica
//! counts for the GPU it lives on. Ids of other vendors' resources are ignored, so a
//! numeric id of some other plugin cannot pass for a GPU index.
//!
//! A missing socket means "no pod labels"; a failed or slow call (over
//! [`LIST_TIMEOUT`]) too, logged once at debug level until a call works again.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tonic::transport::{Endpoint, Uri};

use crate::resources::{REPLICA_SEPARATOR, Resource};
use api::ListPodResourcesRequest;
use api::pod_resources_lister_client::PodResourcesListerClient;
use nvshim::inventory::Inventory;

/// The kubelet pod-resources API v1 (`proto/podresources/v1/api.proto`), generated at
/// build time: the `PodResourcesLister` client the metrics use and, for tests that play
/// kubelet, its server.
pub mod api {
    #![allow(
        // Generated code: doc comments come from the proto and the lint set is not ours.
        missing_docs,
        clippy::doc_lazy_continuation,
        clippy::derive_partial_eq_without_eq,
        clippy::default_trait_access,
        clippy::too_long_first_doc_paragraph
    )]

    tonic::include_proto!("v1");
}

/// How long one scrape waits for kubelet's answer (connecting included).
pub const LIST_TIMEOUT: Duration = Duration::from_millis(200);
/// Resource names with this prefix are NVIDIA's even when this plugin does not advertise
/// them now (a config changed under a running pod).
const NVIDIA_PREFIX: &str = "nvidia.com/";

/// Why kubelet's pod resources could not be listed.
#[derive(Debug, thiserror::Error)]
pub enum PodResourcesError {
    #[error("pod-resources socket path {path:?} is not UTF-8")]
    PathNotUtf8 { path: PathBuf },
    #[error("cannot reach kubelet's pod-resources API at {path:?}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("kubelet's pod-resources API at {path:?} refused List: {status}")]
    List {
        path: PathBuf,
        status: tonic::Status,
    },
    #[error("kubelet's pod-resources API at {path:?} did not answer within {timeout:?}")]
    Timeout { path: PathBuf, timeout: Duration },
}

/// A container holding a GPU.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Holder {
    pub pod: String,
    pub namespace: String,
    pub container: String,
}

/// The containers holding each GPU, by GPU index; sorted, without repeats.
pub type Holders = BTreeMap<u32, Vec<Holder>>;

/// Kubelet device id → GPU index, for the resources a node advertises.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DeviceIds {
    by_id: HashMap<String, u32>,
    resources: HashSet<String>,
}

impl DeviceIds {
    /// Every id the node's devices go by: the advertised ids and, for ids from an earlier
    /// configuration, every GPU's and MIG device's UUID and index (`3`, `3:1`).
    pub fn new(inventory: &Inventory, resources: &[Resource]) -> DeviceIds {
        let mut by_id = HashMap::new();
        for gpu in &inventory.gpus {
            by_id.insert(gpu.uuid.clone(), gpu.index);
            by_id.insert(gpu.index.to_string(), gpu.index);
            for mig in &gpu.mig_devices {
                by_id.insert(mig.uuid.clone(), gpu.index);
                by_id.insert(format!("{}:{}", gpu.index, mig.index), gpu.index);
            }
        }
        for resource in resources {
            for device in &resource.devices {
                by_id.insert(device.id.clone(), device.unit.gpu);
            }
        }
        DeviceIds {
            by_id,
            resources: resources.iter().map(|r| r.name.clone()).collect(),
        }
    }

    /// The GPU a device id of `resource` stands for, if it is one of ours.
    pub fn gpu(&self, resource: &str, id: &str) -> Option<u32> {
        if !self.resources.contains(resource) && !resource.starts_with(NVIDIA_PREFIX) {
            return None;
        }
        if let Some(gpu) = self.by_id.get(id) {
            return Some(*gpu);
        }
        let (base, replica) = id.rsplit_once(REPLICA_SEPARATOR)?;
        if replica.is_empty() || !replica.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        self.by_id.get(base).copied()
    }
}

/// Kubelet's pod-resources socket, and whether the last call failed (so a failure is
/// logged once, not at every scrape).
#[derive(Debug)]
pub(super) struct PodResources {
    socket: PathBuf,
    failing: AtomicBool,
}

impl PodResources {
    pub(super) fn new(socket: PathBuf) -> PodResources {
        PodResources {
            socket,
            failing: AtomicBool::new(false),
        }
    }

    /// Who holds which GPU now; empty when kubelet's socket is absent or the call fails.
    pub(super) async fn holders(&self, ids: &DeviceIds) -> Holders {
        match self.answer().await {
            Some(response) => holders(&response, ids),
            None => Holders::default(),
        }
    }

    /// What each container holds now, one entry per (container, resource); empty when
    /// kubelet's socket is absent or the call fails.
    pub(super) async fn containers(&self) -> Vec<nvshim::exporter::ContainerDevices> {
        match self.answer().await {
            Some(response) => super::dcgm::containers(&response),
            None => Vec::new(),
        }
    }

    /// Kubelet's answer, bounded by [`LIST_TIMEOUT`]; `None` when the socket is absent or
    /// the call fails (logged once until a call works again).
    async fn answer(&self) -> Option<api::ListPodResourcesResponse> {
        if !self.socket.exists() {
            return None;
        }
        let listed = match tokio::time::timeout(LIST_TIMEOUT, list(&self.socket)).await {
            Ok(listed) => listed,
            Err(_) => Err(PodResourcesError::Timeout {
                path: self.socket.clone(),
                timeout: LIST_TIMEOUT,
            }),
        };
        match listed {
            Ok(response) => {
                if self.failing.swap(false, Ordering::Relaxed) {
                    tracing::debug!(socket = %self.socket.display(), "kubelet's pod-resources API answers again");
                }
                Some(response)
            }
            Err(error) => {
                if !self.failing.swap(true, Ordering::Relaxed) {
                    tracing::debug!(%error, "GPU metrics go without pod labels until kubelet answers");
                }
                None
            }
        }
    }
}

/// `List` on kubelet's pod-resources socket.
pub async fn list(socket: &Path) -> Result<api::ListPodResourcesResponse, PodResourcesError> {
    let text = socket
        .to_str()
        .ok_or_else(|| PodResourcesError::PathNotUtf8 {
            path: socket.to_path_buf(),
        })?;
    let connect = |source| PodResourcesError::Connect {
        path: socket.to_path_buf(),
        source,
    };
    // The HTTP/2 authority is `localhost`, as kubelet's own clients send: h2 servers
    // reject a socket path there.
    let channel = Endpoint::from_shared(format!("unix:{text}"))
        .map_err(connect)?
        .origin(Uri::from_static("http://localhost"))
        .connect()
        .await
        .map_err(connect)?;
    PodResourcesListerClient::new(channel)
        .list(ListPodResourcesRequest {})
        .await
        .map(tonic::Response::into_inner)
        .map_err(|status| PodResourcesError::List {
            path: socket.to_path_buf(),
            status,
        })
}

/// The containers holding each GPU according to kubelet's answer.
pub fn holders(response: &api::ListPodResourcesResponse, ids: &DeviceIds) -> Holders {
    let mut out = Holders::new();
    for pod in &response.pod_resources {
        for container in &pod.containers {
            for devices in &container.devices {
                for id in &devices.device_ids {
                    let Some(gpu) = ids.gpu(&devices.resource_name, id) else {
                        continue;
                    };
                    out.entry(gpu).or_default().push(Holder {
                        pod: pod.name.clone(),
                        namespace: pod.namespace.clone(),
                        container: container.name.clone(),
                    });
                }
            }
        }
    }
    for list in out.values_mut() {
        list.sort();
        list.dedup();
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::PathBuf;

    use super::api::{self, ContainerDevices, ContainerResources, ListPodResourcesResponse};
    use super::*;
    use crate::config::SharingStrategy;
    use crate::resources::{Device, Unit};
    use nvshim::inventory::{DriverInfo, Gpu, MigDevice};

    fn inventory() -> Inventory {
        let gpu = |index: u32| Gpu {
            index,
            minor: index,
            uuid: format!("GPU-{index}"),
            bus_id: format!("0000:0{index}:00.0"),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: None,
            compute_capability: None,
            brand: None,
            mig_enabled: Some(index == 2),
            mig_devices: if index == 2 {
                vec![MigDevice {
                    index: 0,
                    gpu_instance_id: 1,
                    compute_instance_id: 0,
                    uuid: "MIG-2-0".into(),
                    memory_bytes: None,
                    profile: "1g.10gb".into(),
                }]
            } else {
                Vec::new()
            },
        };
        Inventory {
            driver: DriverInfo {
                version: "550.54.15".into(),
                cuda_version: None,
            },
            gpus: (0..3).map(gpu).collect(),
        }
    }

    fn shared() -> Resource {
        let device = |gpu: u32, replica: u32| Device {
            id: format!("GPU-{gpu}::{replica}"),
            unit: Unit { gpu, mig: None },
            replica: Some(replica),
            uuid: format!("GPU-{gpu}"),
            runtime_id: format!("GPU-{gpu}"),
            numa_node: None,
            bus_id: String::new(),
            memory_mib: None,
            nodes: vec![PathBuf::from(format!("/dev/nvidia{gpu}"))],
        };
        Resource {
            name: "nvidia.com/gpu.shared".into(),
            devices: (0..2)
                .flat_map(|g| (0..2).map(move |r| device(g, r)))
                .collect(),
            replicas: Some(2),
            sharing: Some(SharingStrategy::TimeSlicing),
            fail_requests_greater_than_one: false,
        }
    }

    #[test]
    fn device_ids_map_to_gpus() {
        let ids = DeviceIds::new(&inventory(), &[shared()]);
        let cases = [
            (
                "advertised replica",
                "nvidia.com/gpu.shared",
                "GPU-1::1",
                Some(1),
            ),
            ("uuid", "nvidia.com/gpu", "GPU-0", Some(0)),
            ("index", "nvidia.com/gpu", "1", Some(1)),
            ("MIG uuid", "nvidia.com/mig-1g.10gb", "MIG-2-0", Some(2)),
            ("MIG index", "nvidia.com/mig-1g.10gb", "2:0", Some(2)),
            (
                "replica of an old config",
                "nvidia.com/gpu",
                "GPU-2::7",
                Some(2),
            ),
            ("bad replica", "nvidia.com/gpu", "GPU-2::x", None),
            ("unknown GPU", "nvidia.com/gpu", "GPU-9", None),
            ("someone else's resource", "example.com/fpga", "0", None),
        ];
        for (case, resource, id, want) in cases {
            assert_eq!(ids.gpu(resource, id), want, "case {case}");
        }
    }

    #[test]
    fn holders_come_from_kubelets_answer() {
        let ids = DeviceIds::new(&inventory(), &[shared()]);
        let container = |name: &str, resource: &str, ids: &[&str]| ContainerResources {
            name: name.into(),
            devices: vec![ContainerDevices {
                resource_name: resource.into(),
                device_ids: ids.iter().map(|s| s.to_string()).collect(),
                topology: None,
            }],
        };
        let response = ListPodResourcesResponse {
            pod_resources: vec![
                api::PodResources {
                    name: "p1".into(),
                    namespace: "ns".into(),
                    containers: vec![
                        container("c", "nvidia.com/gpu.shared", &["GPU-1::0", "GPU-1::1"]),
                        container("sidecar", "example.com/nic", &["1"]),
                    ],
                },
                api::PodResources {
                    name: "p2".into(),
                    namespace: "other".into(),
                    containers: vec![container("main", "nvidia.com/gpu.shared", &["GPU-1::0"])],
                },
            ],
        };
        let holder = |pod: &str, namespace: &str, container: &str| Holder {
            pod: pod.into(),
            namespace: namespace.into(),
            container: container.into(),
        };
        let got = holders(&response, &ids);
        let want = Holders::from([(
            1,
            vec![holder("p1", "ns", "c"), holder("p2", "other", "main")],
        )]);
        assert_eq!(got, want);
    }

    proptest::proptest! {
        /// Kubelet's ids are untrusted: any resource and id map to a GPU or to nothing,
        /// and a replica suffix on a known id maps to that id's GPU.
        #[test]
        fn any_device_id_maps_to_a_gpu_or_nothing(
            resource in "(nvidia\\.com/)?[a-z0-9.:/-]{0,16}",
            id in "[A-Za-z0-9:.-]{0,24}",
            known in 0usize..3,
            replica in 0u32..1000,
        ) {
            let ids = DeviceIds::new(&inventory(), &[shared()]);
            if let Some(gpu) = ids.gpu(&resource, &id) {
                proptest::prop_assert!(gpu < 3);
            }
            let uuid = format!("GPU-{known}");
            let with_replica = format!("{uuid}::{replica}");
            proptest::prop_assert_eq!(
                ids.gpu("nvidia.com/gpu", &with_replica),
                ids.gpu("nvidia.com/gpu", &uuid)
            );
        }
    }

    #[tokio::test(flavor = "current_thread")]
    async fn an_unreachable_kubelet_means_no_pod_labels() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("kubelet.sock");
        std::fs::write(&socket, "not a socket").unwrap();
        let error = list(&socket).await.err();
        assert!(
            matches!(error, Some(PodResourcesError::Connect { .. })),
            "{error:?}"
        );
        let pods = PodResources::new(socket);
        let ids = DeviceIds::new(&inventory(), &[]);
        assert_eq!(pods.holders(&ids).await, Holders::default());
        assert!(pods.failing.load(Ordering::Relaxed));
    }
}

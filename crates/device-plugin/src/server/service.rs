//! The `DevicePlugin` gRPC service for one resource: options, the device list stream,
//! preferred allocation and `Allocate`, each a thin translation between the kubelet's
//! protobuf messages and the plain functions in `allocate` and `preferred`.
//!
//! Bad input is answered with `InvalidArgument` and never affects the server.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::{Notify, watch};
use tokio_stream::Stream;
use tokio_stream::wrappers::WatchStream;
use tonic::{Request, Response, Status};

use super::limits::Limits;
use crate::allocate::{self, AllocateError, ContainerAllocation};
use crate::api::{
    self, AllocateRequest, AllocateResponse, CdiDevice, ContainerAllocateResponse,
    ContainerPreferredAllocationResponse, DevicePluginOptions, DeviceSpec, Empty,
    ListAndWatchResponse, Mount, NumaNode, PreStartContainerRequest, PreStartContainerResponse,
    PreferredAllocationRequest, PreferredAllocationResponse, TopologyInfo,
    device_plugin_server::DevicePlugin,
};
use crate::config::Settings;
use crate::health::HealthBoard;
use crate::metrics::Metrics;
use crate::preferred;
use crate::resources::{Resource, ResourceIndex};
use crate::topology::Topology;

/// What every call for one resource needs, built once.
#[derive(Debug)]
pub(super) struct Shared {
    settings: Arc<Settings>,
    resource: Resource,
    index: ResourceIndex,
    limits: Limits,
    health: Arc<HealthBoard>,
    topology: Arc<Topology>,
    metrics: Metrics,
    /// Open `ListAndWatch` streams: kubelet keeps one open while it uses us.
    streams: AtomicUsize,
    /// Told whenever a stream opens or closes (the serving loop's readiness).
    streams_changed: Arc<Notify>,
}

impl Shared {
    pub(super) fn new(
        settings: Arc<Settings>,
        resource: Resource,
        health: Arc<HealthBoard>,
        topology: Arc<Topology>,
    ) -> Self {
        let index = ResourceIndex::new(&resource);
        let limits = Limits::for_resource(&resource);
        Self {
            settings,
            resource,
            index,
            limits,
            health,
            topology,
            metrics: Metrics::disabled(),
            streams: AtomicUsize::new(0),
            streams_changed: Arc::new(Notify::new()),
        }
    }

    /// Tells `notify` when a `ListAndWatch` stream opens or closes.
    pub(super) fn with_stream_notify(mut self, notify: Arc<Notify>) -> Self {
        self.streams_changed = notify;
        self
    }

    /// How many `ListAndWatch` streams are open now.
    pub(super) fn streams(&self) -> usize {
        self.streams.load(Ordering::Relaxed)
    }

    /// Counts this resource's `Allocate` calls into `metrics`.
    pub(super) fn with_metrics(mut self, metrics: Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    pub(super) fn resource(&self) -> &Resource {
        &self.resource
    }

    pub(super) fn limits(&self) -> &Limits {
        &self.limits
    }

    /// Refuses id lists no device of this resource could make up.
    fn check_ids(&self, call: &str, ids: &[String]) -> Result<(), Status> {
        self.limits
            .check_ids(call, &self.resource.name, ids)
            .inspect_err(|status| {
                tracing::warn!(call, error = %status.message(), "request refused");
            })
    }

    /// The full device list with each device's health now.
    fn devices(&self) -> ListAndWatchResponse {
        let devices = self
            .resource
            .devices
            .iter()
            .map(|device| api::Device {
                id: device.id.clone(),
                health: if self.health.is_healthy(device.unit) {
                    api::HEALTHY
                } else {
                    api::UNHEALTHY
                }
                .to_string(),
                topology: device.numa_node.map(|id| TopologyInfo {
                    nodes: vec![NumaNode { id }],
                }),
            })
            .collect();
        ListAndWatchResponse { devices }
    }
}

/// The `DevicePlugin` service for one resource. Cheap to clone.
#[derive(Debug, Clone)]
pub struct DevicePluginService {
    shared: Arc<Shared>,
    /// Becomes true when the server stops; open `ListAndWatch` streams then end.
    /// `None`: never stops.
    stop: Option<watch::Receiver<bool>>,
}

impl DevicePluginService {
    /// A service for `resource` that is never told to stop: for serving it by hand
    /// (benchmarks, tools). [`super::serve`] builds its own.
    pub fn new(
        settings: Arc<Settings>,
        resource: Resource,
        health: Arc<HealthBoard>,
        topology: Arc<Topology>,
    ) -> Self {
        Self {
            shared: Arc::new(Shared::new(settings, resource, health, topology)),
            stop: None,
        }
    }

    /// A service whose streams end when `stop` turns true (or its sender is dropped).
    pub(super) fn stopping_with(shared: Arc<Shared>, stop: watch::Receiver<bool>) -> Self {
        Self {
            shared,
            stop: Some(stop),
        }
    }
}

impl From<&AllocateError> for Status {
    fn from(error: &AllocateError) -> Self {
        // Every refusal is about the request; NVIDIA's plugin answers UNKNOWN, which
        // tells kubelet (and whoever reads its events) less.
        Status::invalid_argument(error.to_string())
    }
}

#[tonic::async_trait]
impl DevicePlugin for DevicePluginService {
    async fn get_device_plugin_options(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<DevicePluginOptions>, Status> {
        Ok(Response::new(options()))
    }

    type ListAndWatchStream = DeviceStream;

    async fn list_and_watch(
        &self,
        _: Request<Empty>,
    ) -> Result<Response<Self::ListAndWatchStream>, Status> {
        if self.stop.as_ref().is_some_and(|stop| *stop.borrow()) {
            return Err(stopping());
        }
        self.shared.streams.fetch_add(1, Ordering::Relaxed);
        self.shared.streams_changed.notify_one();
        tracing::debug!(resource = %self.shared.resource.name, "ListAndWatch opened");
        Ok(Response::new(DeviceStream {
            shared: self.shared.clone(),
            changes: Some(WatchStream::new(self.shared.health.subscribe())),
            stop: self.stop.clone().map(WatchStream::from_changes),
        }))
    }

    async fn get_preferred_allocation(
        &self,
        request: Request<PreferredAllocationRequest>,
    ) -> Result<Response<PreferredAllocationResponse>, Status> {
        let shared = &*self.shared;
        let container_responses = request
            .into_inner()
            .container_requests
            .iter()
            .map(|container| {
                shared.check_ids("GetPreferredAllocation", &container.available_device_i_ds)?;
                shared.check_ids(
                    "GetPreferredAllocation",
                    &container.must_include_device_i_ds,
                )?;
                // One event per RPC, after the bounds checks (so a log line stays small):
                // the real-kubelet test reads Register -> ListAndWatch ->
                // GetPreferredAllocation -> Allocate from these.
                tracing::debug!(
                    resource = %shared.resource.name,
                    available = ?container.available_device_i_ds,
                    must_include = ?container.must_include_device_i_ds,
                    size = container.allocation_size,
                    "GetPreferredAllocation"
                );
                let size = usize::try_from(container.allocation_size).map_err(|_| {
                    Status::invalid_argument(format!(
                        "invalid preferred allocation request for {}: allocation size {}",
                        shared.resource.name, container.allocation_size
                    ))
                })?;
                preferred::preferred(
                    &shared.resource,
                    &shared.index,
                    &shared.topology,
                    &container.available_device_i_ds,
                    &container.must_include_device_i_ds,
                    size,
                )
                .map(|device_i_ds| ContainerPreferredAllocationResponse { device_i_ds })
                .map_err(|e| refuse("GetPreferredAllocation", &e))
            })
            .collect::<Result<_, Status>>()?;
        Ok(Response::new(PreferredAllocationResponse {
            container_responses,
        }))
    }

    async fn allocate(
        &self,
        request: Request<AllocateRequest>,
    ) -> Result<Response<AllocateResponse>, Status> {
        let shared = &*self.shared;
        let started = Instant::now();
        let healthy = |unit| shared.health.is_healthy(unit);
        let request = request.into_inner();
        let container_responses: Result<Vec<_>, Status> = request
            .container_requests
            .iter()
            .map(|container| {
                shared.check_ids("Allocate", &container.devices_ids)?;
                tracing::debug!(
                    resource = %shared.resource.name,
                    ids = ?container.devices_ids,
                    "Allocate"
                );
                allocate::allocate(
                    &shared.resource,
                    &shared.index,
                    &container.devices_ids,
                    &shared.settings,
                    &healthy,
                )
                .map(response)
                .map_err(|e| refuse("Allocate", &e))
            })
            .collect();
        shared.metrics.allocated(
            &shared.resource.name,
            request.container_requests.len(),
            container_responses.is_ok(),
            started.elapsed(),
        );
        Ok(Response::new(AllocateResponse {
            container_responses: container_responses?,
        }))
    }

    async fn pre_start_container(
        &self,
        request: Request<PreStartContainerRequest>,
    ) -> Result<Response<PreStartContainerResponse>, Status> {
        self.shared
            .check_ids("PreStartContainer", &request.get_ref().devices_ids)?;
        Ok(Response::new(PreStartContainerResponse {}))
    }
}

/// Logs a refused request once, here at the boundary, and maps it to a status.
fn refuse(call: &str, error: &AllocateError) -> Status {
    tracing::warn!(call, %error, "request refused");
    Status::from(error)
}

fn stopping() -> Status {
    Status::unavailable("device plugin is restarting or stopping")
}

/// One container's answer in the kubelet's shape.
fn response(allocation: ContainerAllocation) -> ContainerAllocateResponse {
    let ContainerAllocation {
        envs,
        mounts,
        devices,
        annotations,
        cdi_devices,
    } = allocation;
    ContainerAllocateResponse {
        envs: envs.into_iter().collect(),
        mounts: mounts
            .into_iter()
            .map(|m| Mount {
                container_path: m.container_path,
                host_path: m.host_path,
                read_only: m.read_only,
            })
            .collect(),
        devices: devices
            .into_iter()
            .map(|d| DeviceSpec {
                container_path: d.container_path,
                host_path: d.host_path,
                permissions: d.permissions,
            })
            .collect(),
        annotations: annotations.into_iter().collect(),
        cdi_devices: cdi_devices
            .into_iter()
            .map(|name| CdiDevice { name })
            .collect(),
    }
}

/// The `ListAndWatch` stream: the device list at once, again after every health
/// change (changes that come faster than kubelet reads are sent once), and an
/// `UNAVAILABLE` end when the server stops, as kubelet sees from NVIDIA's plugin.
pub struct DeviceStream {
    shared: Arc<Shared>,
    /// `None` once the stream has ended.
    changes: Option<WatchStream<u64>>,
    stop: Option<WatchStream<bool>>,
}

impl Drop for DeviceStream {
    fn drop(&mut self) {
        // Kubelet closed the stream (or went away): it no longer sees our devices.
        self.shared.streams.fetch_sub(1, Ordering::Relaxed);
        self.shared.streams_changed.notify_one();
        tracing::debug!(resource = %self.shared.resource.name, "ListAndWatch closed");
    }
}

impl Stream for DeviceStream {
    type Item = Result<ListAndWatchResponse, Status>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let Some(changes) = this.changes.as_mut() else {
            return Poll::Ready(None);
        };
        // Stop first: a stopping server must not keep a stream alive.
        if let Some(stop) = this.stop.as_mut() {
            loop {
                match Pin::new(&mut *stop).poll_next(cx) {
                    Poll::Pending => break,
                    Poll::Ready(Some(false)) => continue,
                    Poll::Ready(Some(true) | None) => {
                        this.changes = None;
                        return Poll::Ready(Some(Err(stopping())));
                    }
                }
            }
        }
        match Pin::new(changes).poll_next(cx) {
            Poll::Ready(Some(_)) => Poll::Ready(Some(Ok(this.shared.devices()))),
            Poll::Ready(None) => {
                // The board is gone: the node is being replaced.
                this.changes = None;
                Poll::Ready(Some(Err(stopping())))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// The options we register with and answer `GetDevicePluginOptions` with.
pub(super) fn options() -> DevicePluginOptions {
    DevicePluginOptions {
        pre_start_required: false,
        get_preferred_allocation_available: true,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::path::PathBuf;

    use tokio_stream::StreamExt;

    use super::*;
    use crate::api::ContainerAllocateRequest;
    use crate::health::UnitHealth;
    use crate::resources::{Device, Unit};

    fn service() -> (DevicePluginService, Arc<HealthBoard>) {
        let devices = (0..2)
            .map(|gpu| Device {
                id: format!("GPU-{gpu}"),
                unit: Unit { gpu, mig: None },
                replica: None,
                uuid: format!("GPU-{gpu}"),
                runtime_id: format!("GPU-{gpu}"),
                numa_node: None,
                bus_id: String::new(),
                memory_mib: None,
                nodes: vec![PathBuf::from(format!("/dev/nvidia{gpu}"))],
            })
            .collect();
        let resource = Resource {
            name: "nvidia.com/gpu".into(),
            devices,
            replicas: None,
            sharing: None,
            fail_requests_greater_than_one: false,
        };
        let board = Arc::new(HealthBoard::new(resource.units()));
        let service = DevicePluginService::new(
            Arc::new(Settings::default()),
            resource,
            board.clone(),
            Arc::new(Topology::default()),
        );
        (service, board)
    }

    #[tokio::test(flavor = "current_thread")]
    async fn handlers_without_a_socket() {
        let (service, board) = service();
        let answer = service
            .allocate(Request::new(AllocateRequest {
                container_requests: vec![ContainerAllocateRequest {
                    devices_ids: vec!["GPU-1".into()],
                }],
            }))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            answer.container_responses[0]
                .envs
                .get("NVIDIA_VISIBLE_DEVICES")
                .map(String::as_str),
            Some("GPU-1")
        );

        let mut stream = service
            .list_and_watch(Request::new(Empty {}))
            .await
            .unwrap()
            .into_inner();
        let first = stream.next().await.unwrap().unwrap();
        assert_eq!(first.devices.len(), 2);
        assert!(first.devices.iter().all(|d| d.topology.is_none()));
        let sick = UnitHealth::Unhealthy {
            reason: "test".into(),
            xid: None,
        };
        assert!(board.set(&[Unit { gpu: 0, mig: None }], &sick));
        let second = stream.next().await.unwrap().unwrap();
        assert_eq!(second.devices[0].health, api::UNHEALTHY);
        assert_eq!(second.devices[1].health, api::HEALTHY);
    }

    #[test]
    fn refusals_are_invalid_arguments_naming_the_ids() {
        let error = AllocateError::DuplicateDevices {
            resource: "nvidia.com/gpu".into(),
            ids: {
                let mut ids = allocate::IdList::default();
                ids.push("GPU-1");
                ids
            },
        };
        let status = Status::from(&error);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(status.message().contains("GPU-1"), "{status:?}");
    }
}

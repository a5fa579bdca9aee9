// SPDX-License-Identifier: Apache-2.0
//! The core library's blocking pod-resources client (`nvshim::kubelet::pod_resources`,
//! hand-written HTTP/2, what `nvshim exporter` uses) against tonic's server (h2), the
//! stack the plugin's own metrics use, playing kubelet on a temp socket: a large answer
//! (many times the default 64 KiB flow-control window) and a gRPC error.

use std::time::Duration;

use nvshim::kubelet::pod_resources::{self, Http2Error, Problem};
use nvshim_device_plugin::metrics::pods::api::pod_resources_lister_server::{
    PodResourcesLister, PodResourcesListerServer,
};
use nvshim_device_plugin::metrics::pods::api::{ListPodResourcesRequest, ListPodResourcesResponse};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

use crate::metrics::{GPU_RESOURCE, Lister, pod};

/// Refuses every `List`, as a kubelet does for a client it does not allow.
struct Refusing;

#[tonic::async_trait]
impl PodResourcesLister for Refusing {
    async fn list(
        &self,
        _: Request<ListPodResourcesRequest>,
    ) -> Result<Response<ListPodResourcesResponse>, Status> {
        Err(Status::permission_denied("pod resources: not for you"))
    }
}

#[tokio::test]
async fn the_core_client_reads_tonics_answer_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("kubelet.sock");
    let lister = Lister::default();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(lister.clone()))
            .serve_with_incoming(UnixListenerStream::new(
                UnixListener::bind(&socket).unwrap(),
            )),
    );
    let ids: Vec<Vec<String>> = (0..2000)
        .map(|p| {
            (0..8)
                .map(|g| format!("GPU-{p:04}-{g}-0000-0000-000000000000"))
                .collect()
        })
        .collect();
    *lister.0.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: ids
            .iter()
            .enumerate()
            .map(|(p, gpus)| {
                let gpus: Vec<&str> = gpus.iter().map(String::as_str).collect();
                pod(&format!("pod-{p}"), "ns", "main", GPU_RESOURCE, &gpus)
            })
            .collect(),
    };
    let path = socket.clone();
    let got =
        tokio::task::spawn_blocking(move || pod_resources::list(&path, Duration::from_secs(20)))
            .await
            .unwrap()
            .unwrap();
    assert_eq!(got.len(), 2000);
    let last = &got[1999];
    assert_eq!(
        (
            last.pod.as_str(),
            last.namespace.as_str(),
            last.container.as_str(),
            last.resource.as_str()
        ),
        ("pod-1999", "ns", "main", GPU_RESOURCE)
    );
    assert_eq!(last.device_ids, ids[1999]);
    server.abort();
    let _ = server.await;

    let refusing = dir.path().join("refusing.sock");
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(Refusing))
            .serve_with_incoming(UnixListenerStream::new(
                UnixListener::bind(&refusing).unwrap(),
            )),
    );
    let path = refusing.clone();
    let error =
        tokio::task::spawn_blocking(move || pod_resources::list(&path, Duration::from_secs(20)))
            .await
            .unwrap()
            .unwrap_err();
    match &error.problem {
        Problem::Http2(Http2Error::Grpc {
            code: 7, message, ..
        }) => {
            assert_eq!(message, "pod resources: not for you");
        }
        other => panic!("unexpected {other:?}"),
    }
    assert!(error.to_string().contains("refusing.sock"), "{error}");
    server.abort();
    let _ = server.await;
}

// SPDX-License-Identifier: Apache-2.0
//! The `nvidia-device-plugin` binary under requests no kubelet sends, and its
//! readiness telling the truth (issue 18):
//!
//! - requests past the limits (a 1 MiB id, 10,000 ids, a 1 MiB message announced in
//!   the gRPC prefix) are `INVALID_ARGUMENT` naming the limit, and the plugin's memory
//!   does not grow with them; unknown, empty and duplicate ids are refused as before;
//! - `/readyz` is 200 only while kubelet streams `ListAndWatch` from every resource: a
//!   kubelet that accepts the registration but never streams leaves it at 503, and the
//!   log says why.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use crate::common::kubelet::FakeKubelet;
use crate::common::plugin_proc::{PluginProc, node_args};
use nvshim_device_plugin::api::{
    AllocateRequest, ContainerAllocateRequest, ContainerPreferredAllocationRequest, Empty,
    PreferredAllocationRequest,
};
use nvshim_testkit::NodeSpec;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tonic::Code;

const WITHIN: Duration = Duration::from_secs(20);

fn plugin_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin"))
}

async fn http_status(addr: SocketAddr, path: &str) -> Option<u16> {
    let mut stream = tokio::net::TcpStream::connect(addr).await.ok()?;
    let request = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\n\r\n");
    stream.write_all(request.as_bytes()).await.ok()?;
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.ok()?;
    reply.split(' ').nth(1).and_then(|code| code.parse().ok())
}

fn free_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

/// Waits until `/readyz` answers `want`.
async fn readyz(addr: SocketAddr, want: u16, plugin: &PluginProc, case: &str) {
    let deadline = tokio::time::Instant::now() + WITHIN;
    loop {
        if http_status(addr, "/readyz").await == Some(want) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "case {case}: /readyz never answered {want}\n{}",
            plugin.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "current_thread")]
async fn readiness_needs_kubelet_to_stream_list_and_watch() {
    let node = crate::common::node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    // A kubelet that registers plugins and never dials back (one whose every stream
    // fails looks the same to us).
    let kubelet = FakeKubelet::without_streams(dir.path());
    let addr = free_port();
    let mut args = node_args(&node.sim, dir.path());
    args.extend(["--health-addr".into(), addr.to_string()]);
    let plugin = PluginProc::spawn(plugin_bin(), &args, &node.sim.env());
    kubelet.wait_registrations(1, WITHIN).await;
    readyz(addr, 503, &plugin, "registered, not streamed").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        http_status(addr, "/readyz").await,
        Some(503),
        "still not ready"
    );
    assert!(
        plugin
            .log()
            .contains("registered, but kubelet has no ListAndWatch stream open for nvidia.com/gpu"),
        "the log says why:\n{}",
        plugin.log()
    );

    // Kubelet opens the stream: ready. It closes it: not ready again.
    let mut client = kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    stream.message().await.unwrap().unwrap();
    readyz(addr, 200, &plugin, "streamed").await;
    drop(stream);
    drop(client);
    readyz(addr, 503, &plugin, "stream closed").await;
}

#[tokio::test(flavor = "current_thread")]
async fn a_kubelet_that_streams_makes_it_ready() {
    let node = crate::common::node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let mut kubelet = FakeKubelet::start(dir.path());
    let addr = free_port();
    let mut args = node_args(&node.sim, dir.path());
    args.extend(["--health-addr".into(), addr.to_string()]);
    let plugin = PluginProc::spawn(plugin_bin(), &args, &node.sim.env());
    kubelet.wait_registrations(1, WITHIN).await;
    readyz(addr, 200, &plugin, "registered and streamed").await;
    kubelet.stop().await;
    readyz(addr, 503, &plugin, "kubelet gone").await;
    kubelet.restart().await;
    kubelet.wait_registrations(2, WITHIN).await;
    readyz(addr, 200, &plugin, "kubelet back").await;
}

fn allocate(ids: Vec<String>) -> AllocateRequest {
    AllocateRequest {
        container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
    }
}

/// The bad-request set of the issue, each refused with `INVALID_ARGUMENT` naming what
/// is wrong, without the plugin's memory growing with the request.
#[tokio::test(flavor = "current_thread")]
async fn requests_past_the_limits_are_refused_naming_them() {
    let node = crate::common::node(&NodeSpec::standard(8));
    let dir = tempfile::tempdir().unwrap();
    let mut args = node_args(&node.sim, dir.path());
    args[1] = String::new(); // --kubelet-socket "": serve only
    let plugin = PluginProc::spawn(plugin_bin(), &args, &node.sim.env());
    let socket = dir.path().join("nvidia-gpu.sock");
    // "serving" is logged once the socket listens; the file exists from bind, a moment
    // earlier, when a connect is refused.
    assert!(
        plugin.wait_log("serving resource=", WITHIN).await,
        "{}",
        plugin.log()
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("unix:{}", socket.display()))
        .unwrap()
        .origin(tonic::transport::Uri::from_static("http://localhost"))
        .connect()
        .await
        .unwrap();
    // Our client's own limit is 4 MiB; the plugin's must answer first.
    let mut client =
        nvshim_device_plugin::api::device_plugin_client::DevicePluginClient::new(channel)
            .max_encoding_message_size(8 << 20);
    let uuid = node.sim.spec.gpus[0].uuid.clone();
    let before = plugin.status_kib("VmRSS").unwrap();
    let cases: [(&str, AllocateRequest, &str); 7] = [
        (
            "1 MiB id",
            allocate(vec!["x".repeat(1 << 20)]),
            "a request message of 1048",
        ),
        (
            "10,000 ids",
            allocate((0..10_000).map(|i| format!("{i}")).collect()),
            "larger than the 8192-byte limit",
        ),
        (
            "100 ids",
            allocate((0..100).map(|i| format!("{i}")).collect()),
            "100 device ids for nvidia.com/gpu, more than the 8 it has",
        ),
        (
            "a 200-byte id",
            allocate(vec!["y".repeat(200)]),
            "a device id of 200 bytes for nvidia.com/gpu, whose ids are at most 40 bytes",
        ),
        ("unknown id", allocate(vec!["GPU-nope".into()]), "GPU-nope"),
        ("empty", allocate(vec![]), "no device"),
        (
            "duplicates",
            allocate(vec![uuid.clone(), uuid.clone()]),
            "more than once",
        ),
    ];
    for _ in 0..20 {
        for (name, request, want) in &cases {
            let status = client.allocate(request.clone()).await.unwrap_err();
            assert_eq!(
                status.code(),
                Code::InvalidArgument,
                "case {name}: {status:?}"
            );
            assert!(
                status.message().contains(want),
                "case {name}: {:?} does not say {want:?}",
                status.message()
            );
        }
    }
    let preferred = PreferredAllocationRequest {
        container_requests: vec![ContainerPreferredAllocationRequest {
            available_device_i_ds: (0..20).map(|i| format!("{i}")).collect(),
            must_include_device_i_ds: vec![],
            allocation_size: 1,
        }],
    };
    let status = client
        .get_preferred_allocation(preferred)
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("more than the 8 it has"),
        "{status:?}"
    );
    // Still serving, and answering well-formed requests.
    let ok = client.allocate(allocate(vec![uuid.clone()])).await.unwrap();
    assert_eq!(ok.into_inner().container_responses.len(), 1);
    let after = plugin.status_kib("VmRSS").unwrap();
    assert!(
        after < before + 4096,
        "VmRSS grew from {before} KiB to {after} KiB over 140 bad requests"
    );
}

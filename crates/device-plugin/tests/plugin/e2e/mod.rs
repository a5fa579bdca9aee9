// SPDX-License-Identifier: Apache-2.0
//! The `nvidia-device-plugin` binary as a real process, against the fake kubelet
//! (`crate::common::kubelet`) on simulated nodes with the mock NVML: registration and the
//! device list, `Allocate` for every strategy, time-slicing, MIG, XID health events,
//! kubelet restarts, bad input, init failures, signals, and the chain from `Allocate`
//! through `nvidia-container-runtime` and runc to the GPUs a container sees.
//!
//! Every test builds its own node and socket directory, so they run in parallel. Waits
//! poll against deadlines. The one-second bounds are the requirements (kubelet
//! restart, deleted socket, XID 79); the others are generous limits for a debug build
//! on a busy machine, not measurements (those are in `benches/plugin.rs`).

use std::collections::HashMap;
use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common::kubelet::{Registered, dial_plugin};
use crate::common::plugin_proc::{PluginProc, node_args};
use crate::common::{GPU_SCRIPT, Printed, node};
use nix::sys::signal::Signal;
use nvshim_device_plugin::api::device_plugin_client::DevicePluginClient;
use nvshim_device_plugin::api::{
    AllocateRequest, CdiDevice, ContainerAllocateRequest, ContainerAllocateResponse,
    ContainerPreferredAllocationRequest, DeviceSpec, Empty, ListAndWatchResponse, Mount,
    PreferredAllocationRequest,
};
use nvshim_testkit::{MigSpec, NodeSpec, SimNode, runc_bundle};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

/// The bound for re-registering after a kubelet restart or a deleted socket,
/// and for an XID 79 to reach `ListAndWatch`.
const WITHIN: Duration = Duration::from_secs(1);
/// How long an ignored XID must leave the device list alone.
const QUIET: Duration = Duration::from_millis(1500);
/// A limit for what has no required bound (start-up, exit, SIGHUP rebuild).
const GENEROUS: Duration = Duration::from_secs(20);

const GPU_RESOURCE: &str = "nvidia.com/gpu";
const GPU_SOCKET: &str = "nvidia-gpu.sock";
const VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";
const VOLUME_ROOT: &str = "/var/run/nvidia-container-devices";
const CDI_KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
const CDI_ANNOTATION: &str = "cdi.k8s.io/nvidia-device-plugin_";
/// What an annotation key's random-looking `<uid>` is replaced with for comparison.
const UID: &str = "<uid>";
/// The control nodes `pass-device-specs` adds when they exist (all do on a simulated
/// node), in NVIDIA's order.
const CONTROL_NODES: [&str; 4] = [
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
];

fn plugin_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin"))
}

/// A plugin process with its own socket directory and fake kubelet. Fields drop in
/// order: the process is killed before its directory goes.
struct Running {
    plugin: PluginProc,
    kubelet: crate::common::kubelet::FakeKubelet,
    dir: tempfile::TempDir,
}

impl Running {
    fn sockets(&self) -> PathBuf {
        self.dir.path().join("plugins")
    }

    fn socket(&self, endpoint: &str) -> PathBuf {
        self.sockets().join(endpoint)
    }

    fn config(&self) -> PathBuf {
        self.dir.path().join("config.yaml")
    }

    /// Waits at most `within` until `n` registrations in all have arrived.
    async fn registrations(&self, n: usize, within: Duration, case: &str) -> Vec<Registered> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let all = self.kubelet.registrations();
            if all.len() >= n {
                return all;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "case {case}: expected {n} registrations within {within:?}, got {:?}\nplugin log:\n{}",
                all.iter()
                    .map(|r| &r.request.resource_name)
                    .collect::<Vec<_>>(),
                self.plugin.log()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }

    async fn dial(&self, endpoint: &str) -> DevicePluginClient<Channel> {
        dial_plugin(&self.socket(endpoint)).await
    }

    /// A `ListAndWatch` stream on `endpoint` and its first list.
    async fn watch(
        &self,
        endpoint: &str,
        case: &str,
    ) -> (tonic::Streaming<ListAndWatchResponse>, ListAndWatchResponse) {
        let mut client = self.dial(endpoint).await;
        let mut stream = client
            .list_and_watch(Empty {})
            .await
            .unwrap_or_else(|e| panic!("case {case}: ListAndWatch: {e}"))
            .into_inner();
        let first = self.next(&mut stream, GENEROUS, case).await;
        (stream, first)
    }

    /// The next list on `stream`, at most `within` from now.
    async fn next(
        &self,
        stream: &mut tonic::Streaming<ListAndWatchResponse>,
        within: Duration,
        case: &str,
    ) -> ListAndWatchResponse {
        match tokio::time::timeout(within, stream.message()).await {
            Ok(Ok(Some(list))) => list,
            Ok(Ok(None)) => panic!("case {case}: the stream ended\n{}", self.plugin.log()),
            Ok(Err(status)) => panic!("case {case}: the stream failed: {status}"),
            Err(_) => panic!(
                "case {case}: no ListAndWatch message within {within:?}\nplugin log:\n{}",
                self.plugin.log()
            ),
        }
    }

    /// Asserts the process is still running.
    fn alive(&mut self, case: &str) {
        let exited = self.plugin.exited();
        assert!(
            exited.is_none(),
            "case {case}: the plugin exited ({exited:?})\n{}",
            self.plugin.log()
        );
    }
}

/// How to start one plugin.
#[derive(Default)]
struct Launch<'a> {
    /// Flags after the node's ([`node_args`]).
    args: &'a [&'a str],
    env: &'a [(&'a str, &'a str)],
    /// The config file's text; passed with `--config-file`.
    config: Option<&'a str>,
    /// Replaces the node's `--nvml-lib`.
    nvml_lib: Option<&'a str>,
}

/// Starts a fake kubelet in a fresh socket directory and the plugin against it.
async fn launch(sim: &SimNode, how: Launch<'_>) -> Running {
    let dir = tempfile::tempdir().unwrap();
    let sockets = dir.path().join("plugins");
    fs::create_dir(&sockets).unwrap();
    let kubelet = crate::common::kubelet::FakeKubelet::start(&sockets);
    let mut args = node_args(sim, &sockets);
    if let Some(lib) = how.nvml_lib {
        let at = args.iter().position(|a| a == "--nvml-lib").unwrap();
        args[at + 1] = lib.to_string();
    }
    if let Some(text) = how.config {
        let path = dir.path().join("config.yaml");
        fs::write(&path, text).unwrap();
        args.push("--config-file".into());
        args.push(path.display().to_string());
    }
    args.extend(how.args.iter().map(|a| a.to_string()));
    let mut env = sim.env();
    env.extend(how.env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let plugin = PluginProc::spawn(plugin_bin(), &args, &env);
    Running {
        plugin,
        kubelet,
        dir,
    }
}

fn uuids(sim: &SimNode) -> Vec<String> {
    sim.spec.gpus.iter().map(|g| g.uuid.clone()).collect()
}

fn ids(list: &ListAndWatchResponse) -> Vec<String> {
    list.devices.iter().map(|d| d.id.clone()).collect()
}

fn unhealthy(list: &ListAndWatchResponse) -> Vec<String> {
    list.devices
        .iter()
        .filter(|d| d.health != "Healthy")
        .map(|d| {
            assert_eq!(d.health, "Unhealthy", "{d:?}");
            d.id.clone()
        })
        .collect()
}

fn allocate_request(containers: &[&[String]]) -> AllocateRequest {
    AllocateRequest {
        container_requests: containers
            .iter()
            .map(|ids| ContainerAllocateRequest {
                devices_ids: ids.to_vec(),
            })
            .collect(),
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// `<uuid> <xid>` appended to the node's event file in one write; the mock turns it
/// into an XID event.
fn append_event(sim: &SimNode, line: &str) {
    let config: Value = serde_json::from_slice(&fs::read(&sim.mock_config).unwrap()).unwrap();
    let events = config["event_file"].as_str().unwrap();
    let mut file = fs::OpenOptions::new().append(true).open(events).unwrap();
    file.write_all(format!("{line}\n").as_bytes()).unwrap();
}

/// `version: v1` with time-slicing of `nvidia.com/gpu`.
fn time_slicing(replicas: u32, extra: &str) -> String {
    format!(
        "version: v1\nsharing:\n  timeSlicing:\n{extra}    resources:\n    \
         - name: nvidia.com/gpu\n      replicas: {replicas}\n"
    )
}

mod allocate;
mod chain;
mod lifecycle;
mod sharing;

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

// 1. Registration and the device list.

#[tokio::test]
async fn registers_and_streams_the_eight_gpus() {
    let node = node(&NodeSpec::standard(8));
    let by_index: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    let cases: [(&str, &[&str], Vec<String>); 2] = [
        ("uuid", &[], uuids(&node.sim)),
        ("index", &["--device-id-strategy", "index"], by_index),
    ];
    for (case, args, want) in cases {
        let run = launch(
            &node.sim,
            Launch {
                args,
                ..Launch::default()
            },
        )
        .await;
        let registered = run.registrations(1, GENEROUS, case).await;
        let request = &registered[0].request;
        assert_eq!(request.version, "v1beta1", "case {case}");
        assert_eq!(request.endpoint, GPU_SOCKET, "case {case}");
        assert_eq!(request.resource_name, GPU_RESOURCE, "case {case}");
        let options = request.options.expect("options");
        assert!(
            options.get_preferred_allocation_available && !options.pre_start_required,
            "case {case}: {options:?}"
        );
        let mut client = run.dial(GPU_SOCKET).await;
        let served = client
            .get_device_plugin_options(Empty {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(served, options, "case {case}");

        let (_stream, list) = run.watch(GPU_SOCKET, case).await;
        assert_eq!(ids(&list), want, "case {case}");
        assert!(unhealthy(&list).is_empty(), "case {case}: {list:?}");
        assert_eq!(
            run.kubelet.registrations().len(),
            1,
            "case {case}: registered once"
        );
    }
}

// 2. Allocate for every device-list strategy × id strategy, with and without
// pass-device-specs.

/// What one container must get, as NVIDIA's plugin shapes it, for devices whose
/// runtime ids are `ids` (unit order) and whose `/dev/nvidia<minor>` are `minors`.
fn expected(
    sim: &SimNode,
    strategies: &[&str],
    pass_specs: bool,
    ids: &[String],
    minors: &[u32],
) -> ContainerAllocateResponse {
    let mut want = ContainerAllocateResponse::default();
    let has = |s: &str| strategies.contains(&s);
    let names: Vec<String> = ids.iter().map(|id| format!("{CDI_KIND}={id}")).collect();
    if has("cdi-annotations") {
        want.annotations
            .insert(format!("{CDI_ANNOTATION}{UID}"), names.join(","));
    }
    if has("cdi-cri") {
        want.cdi_devices = names
            .iter()
            .map(|name| CdiDevice { name: name.clone() })
            .collect();
    }
    // With CDI only, the CDI spec carries everything: no env, no device specs.
    if strategies.iter().all(|s| s.starts_with("cdi-")) {
        return want;
    }
    if has("envvar") {
        want.envs.insert(VISIBLE.into(), ids.join(","));
    }
    if has("volume-mounts") {
        want.envs.insert(VISIBLE.into(), VOLUME_ROOT.into());
        want.mounts = ids
            .iter()
            .map(|id| Mount {
                container_path: format!("{VOLUME_ROOT}/{id}"),
                host_path: "/dev/null".into(),
                read_only: false,
            })
            .collect();
    }
    if pass_specs {
        let gpus = minors.iter().map(|m| format!("/dev/nvidia{m}"));
        want.devices = CONTROL_NODES
            .iter()
            .map(|n| n.to_string())
            .chain(gpus)
            .map(|path| DeviceSpec {
                host_path: sim.dir.join(&path[1..]).display().to_string(),
                container_path: path,
                permissions: "rw".into(),
            })
            .collect();
    }
    want
}

/// Replaces the `<uid>` of the CDI annotation key with [`UID`] after checking that it
/// is a UUID and that the key is a valid annotation name.
fn without_uid(mut got: ContainerAllocateResponse, case: &str) -> ContainerAllocateResponse {
    got.annotations = got
        .annotations
        .into_iter()
        .map(|(key, value)| {
            let uid = key
                .strip_prefix(CDI_ANNOTATION)
                .unwrap_or_else(|| panic!("case {case}: unexpected annotation {key:?}"));
            let groups: Vec<usize> = uid.split('-').map(str::len).collect();
            assert!(
                groups == [8, 4, 4, 4, 12]
                    && uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
                "case {case}: annotation key {key:?} does not end in a UUID"
            );
            let name = key.split_once('/').map_or(key.as_str(), |(_, n)| n);
            assert!(name.len() <= 63, "case {case}: {key:?} is too long a name");
            (format!("{CDI_ANNOTATION}{UID}"), value)
        })
        .collect();
    got
}

#[tokio::test]
async fn allocate_answers_every_strategy_and_id_strategy() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let minor = |i: usize| sim.spec.gpus[i].minor;
    let strategies: [&[&str]; 6] = [
        &["envvar"],
        &["volume-mounts"],
        &["cdi-annotations"],
        &["cdi-cri"],
        &["envvar", "cdi-cri"],
        &["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"],
    ];
    for list in strategies {
        for id_strategy in ["uuid", "index"] {
            for pass_specs in [false, true] {
                let case = format!("{list:?} {id_strategy} pass-device-specs={pass_specs}");
                let strategy_flag = format!("--device-list-strategy={}", list.join(","));
                let pass_flag = format!("--pass-device-specs={pass_specs}");
                let args = [
                    strategy_flag.as_str(),
                    "--device-id-strategy",
                    id_strategy,
                    pass_flag.as_str(),
                ];
                let run = launch(
                    sim,
                    Launch {
                        args: &args,
                        ..Launch::default()
                    },
                )
                .await;
                run.registrations(1, GENEROUS, &case).await;
                let id = |i: usize| match id_strategy {
                    "uuid" => uuid(i),
                    _ => i.to_string(),
                };
                // GPU 6 is /dev/nvidia7 on the standard node; requested out of order.
                let answer = run
                    .dial(GPU_SOCKET)
                    .await
                    .allocate(allocate_request(&[&[id(6), id(1)], &[id(3)]]))
                    .await
                    .unwrap_or_else(|e| panic!("case {case}: {e}\n{}", run.plugin.log()))
                    .into_inner();
                let got: Vec<ContainerAllocateResponse> = answer
                    .container_responses
                    .into_iter()
                    .map(|c| without_uid(c, &case))
                    .collect();
                let want = vec![
                    expected(
                        sim,
                        list,
                        pass_specs,
                        &[id(1), id(6)],
                        &[minor(1), minor(6)],
                    ),
                    expected(sim, list, pass_specs, &[id(3)], &[minor(3)]),
                ];
                assert_eq!(got, want, "case {case}");
            }
        }
    }
}

#[tokio::test]
async fn device_list_strategy_from_the_environment_and_the_config_file() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let file = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [cdi-cri]\n    \
                deviceIDStrategy: index\n";
    let cases: [(&str, Launch, Vec<String>, &[&str]); 3] = [
        (
            "env DEVICE_LIST_STRATEGY=volume-mounts",
            Launch {
                env: &[("DEVICE_LIST_STRATEGY", "volume-mounts")],
                ..Launch::default()
            },
            vec![uuid(2)],
            &["volume-mounts"],
        ),
        (
            "config file cdi-cri, index",
            Launch {
                config: Some(file),
                ..Launch::default()
            },
            strings(&["2"]),
            &["cdi-cri"],
        ),
        (
            "flag envvar beats env cdi-cri",
            Launch {
                args: &["--device-list-strategy", "envvar"],
                env: &[("DEVICE_LIST_STRATEGY", "cdi-cri")],
                ..Launch::default()
            },
            vec![uuid(2)],
            &["envvar"],
        ),
    ];
    for (case, how, ids, strategies) in cases {
        let run = launch(sim, how).await;
        run.registrations(1, GENEROUS, case).await;
        let answer = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[&ids]))
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .into_inner();
        let got = without_uid(answer.container_responses[0].clone(), case);
        let minor = sim.spec.gpus[2].minor;
        assert_eq!(
            got,
            expected(sim, strategies, false, &ids, &[minor]),
            "case {case}"
        );
    }
}

// 3. Time-slicing.

#[tokio::test]
async fn time_slicing_advertises_replicas_and_maps_them_back() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let config = time_slicing(4, "");
    for (case, id_strategy) in [("uuid", "uuid"), ("index", "index")] {
        let run = launch(
            sim,
            Launch {
                args: &["--device-id-strategy", id_strategy],
                config: Some(&config),
                ..Launch::default()
            },
        )
        .await;
        let registered = run.registrations(1, GENEROUS, case).await;
        assert_eq!(
            (
                registered[0].request.resource_name.as_str(),
                registered[0].request.endpoint.as_str()
            ),
            (GPU_RESOURCE, GPU_SOCKET),
            "case {case}"
        );
        let base = |i: usize| match id_strategy {
            "uuid" => sim.spec.gpus[i].uuid.clone(),
            _ => i.to_string(),
        };
        let want: Vec<String> = (0..8)
            .flat_map(|g| (0..4).map(move |n| (g, n)))
            .map(|(g, n)| format!("{}::{n}", base(g)))
            .collect();
        let (_stream, list) = run.watch(GPU_SOCKET, case).await;
        assert_eq!(list.devices.len(), 32, "case {case}");
        assert_eq!(ids(&list), want, "case {case}");
        assert!(unhealthy(&list).is_empty(), "case {case}");

        let mut client = run.dial(GPU_SOCKET).await;
        let replica = |g: usize, n: u32| format!("{}::{n}", base(g));
        for (what, request, visible) in [
            (
                "two replicas of GPU 2",
                vec![replica(2, 3), replica(2, 1)],
                base(2),
            ),
            (
                "replicas of GPUs 5 and 2",
                vec![replica(5, 0), replica(2, 2)],
                format!("{},{}", base(2), base(5)),
            ),
        ] {
            let answer = client
                .allocate(allocate_request(&[&request]))
                .await
                .unwrap_or_else(|e| panic!("case {case} {what}: {e}"))
                .into_inner();
            let envs = &answer.container_responses[0].envs;
            assert_eq!(
                envs,
                &HashMap::from([(VISIBLE.to_string(), visible)]),
                "case {case} {what}"
            );
        }
    }
}

#[tokio::test]
async fn time_slicing_rename_by_default_and_fail_requests_greater_than_one() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();

    let case = "renameByDefault";
    let run = launch(
        sim,
        Launch {
            config: Some(&time_slicing(4, "    renameByDefault: true\n")),
            ..Launch::default()
        },
    )
    .await;
    let registered = run.registrations(1, GENEROUS, case).await;
    let request = &registered[0].request;
    assert_eq!(
        (request.resource_name.as_str(), request.endpoint.as_str()),
        ("nvidia.com/gpu.shared", "nvidia-gpu.shared.sock"),
        "case {case}"
    );
    let (_stream, list) = run.watch("nvidia-gpu.shared.sock", case).await;
    assert_eq!(list.devices.len(), 32, "case {case}");
    assert!(
        !run.socket(GPU_SOCKET).exists(),
        "case {case}: nvidia.com/gpu is not served"
    );
    assert_eq!(run.kubelet.registrations().len(), 1, "case {case}");
    drop(run);

    let case = "failRequestsGreaterThanOne";
    let run = launch(
        sim,
        Launch {
            config: Some(&time_slicing(4, "    failRequestsGreaterThanOne: true\n")),
            ..Launch::default()
        },
    )
    .await;
    run.registrations(1, GENEROUS, case).await;
    let mut client = run.dial(GPU_SOCKET).await;
    for request in [
        vec![format!("{}::0", uuid(1)), format!("{}::1", uuid(1))],
        vec![format!("{}::0", uuid(1)), format!("{}::0", uuid(4))],
    ] {
        let refused = client
            .allocate(allocate_request(&[&request]))
            .await
            .expect_err(case);
        assert_eq!(refused.code(), Code::InvalidArgument, "case {case}");
        assert!(
            refused
                .message()
                .contains("maximum request size for shared resources is 1; found 2"),
            "case {case}: {refused:?}"
        );
    }
    let one = client
        .allocate(allocate_request(&[&[format!("{}::3", uuid(1))]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        one.container_responses[0].envs.get(VISIBLE),
        Some(&uuid(1)),
        "case {case}: one replica"
    );
}

// 4. MIG.

/// Every GPU in MIG mode with two `1g.10gb` devices (GI 1 and 2, CI 0).
fn all_mig(n: usize) -> NodeSpec {
    let mut spec = NodeSpec::standard(n);
    for (g, gpu) in spec.gpus.iter_mut().enumerate() {
        gpu.mig_devices = (1..=2u32)
            .map(|gi| MigSpec {
                gpu_instance_id: gi,
                compute_instance_id: 0,
                uuid: format!("MIG-5e1f{g:04x}-{gi:04x}-4000-8000-{g:06x}{gi:06x}"),
                memory_bytes: 10 << 30,
                profile: "1g.10gb".into(),
            })
            .collect();
    }
    spec
}

#[tokio::test]
async fn mig_single_advertises_mig_devices_as_gpus() {
    let node = node(&all_mig(8));
    let sim = &node.sim;
    let migs: Vec<String> = sim
        .spec
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.uuid.clone()))
        .collect();
    let by_index: Vec<String> = (0..8)
        .flat_map(|g| (0..2).map(move |m| format!("{g}:{m}")))
        .collect();
    for (case, id_strategy, want) in [("uuid", "uuid", migs), ("index", "index", by_index)] {
        let run = launch(
            sim,
            Launch {
                args: &[
                    "--mig-strategy",
                    "single",
                    "--device-id-strategy",
                    id_strategy,
                ],
                ..Launch::default()
            },
        )
        .await;
        let registered = run.registrations(1, GENEROUS, case).await;
        assert_eq!(
            registered[0].request.resource_name, GPU_RESOURCE,
            "case {case}"
        );
        let (_stream, list) = run.watch(GPU_SOCKET, case).await;
        assert_eq!(ids(&list), want, "case {case}");
        let answer = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[&[want[5].clone(), want[2].clone()]]))
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .into_inner();
        assert_eq!(
            answer.container_responses[0].envs.get(VISIBLE),
            Some(&format!("{},{}", want[2], want[5])),
            "case {case}"
        );
        assert_eq!(run.kubelet.registrations().len(), 1, "case {case}");
    }

    // A node with MIG on some GPUs only cannot be advertised with `single`.
    let case = "single on a mixed node";
    let mixed = crate::common::node(&NodeSpec::with_mig(8));
    let mut run = launch(
        &mixed.sim,
        Launch {
            args: &["--mig-strategy", "single"],
            ..Launch::default()
        },
    )
    .await;
    let status = run.plugin.exit(GENEROUS).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "case {case}: {status:?}"
    );
    let log = run.plugin.log();
    assert!(
        log.contains("mig-strategy=single needs every GPU in the same MIG mode"),
        "case {case}: {log}"
    );
}

#[tokio::test]
async fn mig_mixed_registers_one_resource_per_profile() {
    let node = node(&NodeSpec::with_mig(8));
    let sim = &node.sim;
    let gpu0 = &sim.spec.gpus[0];
    let (small, large) = (&gpu0.mig_devices[0], &gpu0.mig_devices[1]);
    assert_eq!(
        (small.profile.as_str(), large.profile.as_str()),
        ("1g.10gb", "2g.20gb")
    );
    for id_strategy in ["uuid", "index"] {
        let case = id_strategy;
        let run = launch(
            sim,
            Launch {
                args: &["--mig-strategy=mixed", "--device-id-strategy", id_strategy],
                ..Launch::default()
            },
        )
        .await;
        let mut registered: Vec<(String, String)> = run
            .registrations(3, GENEROUS, case)
            .await
            .iter()
            .map(|r| (r.request.resource_name.clone(), r.request.endpoint.clone()))
            .collect();
        registered.sort();
        assert_eq!(
            registered,
            [
                (GPU_RESOURCE.to_string(), GPU_SOCKET.to_string()),
                (
                    "nvidia.com/mig-1g.10gb".into(),
                    "nvidia-mig-1g.10gb.sock".into()
                ),
                (
                    "nvidia.com/mig-2g.20gb".into(),
                    "nvidia-mig-2g.20gb.sock".into()
                ),
            ],
            "case {case}"
        );
        let index = id_strategy == "index";
        let gpus: Vec<String> = (1..8)
            .map(|g| match index {
                true => g.to_string(),
                false => sim.spec.gpus[g].uuid.clone(),
            })
            .collect();
        let (small_id, large_id) = match index {
            true => ("0:0".to_string(), "0:1".to_string()),
            false => (small.uuid.clone(), large.uuid.clone()),
        };
        for (endpoint, want) in [
            (GPU_SOCKET, gpus),
            ("nvidia-mig-1g.10gb.sock", vec![small_id]),
            ("nvidia-mig-2g.20gb.sock", vec![large_id]),
        ] {
            let (_stream, list) = run.watch(endpoint, case).await;
            assert_eq!(ids(&list), want, "case {case} {endpoint}");
            let answer = run
                .dial(endpoint)
                .await
                .allocate(allocate_request(&[&want[..1]]))
                .await
                .unwrap_or_else(|e| panic!("case {case} {endpoint}: {e}"))
                .into_inner();
            assert_eq!(
                answer.container_responses[0].envs.get(VISIBLE),
                Some(&want[0]),
                "case {case} {endpoint}"
            );
        }
        // A MIG device is not a GPU: asking the GPU resource for it is refused.
        let refused = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[std::slice::from_ref(&small.uuid)]))
            .await
            .expect_err(case);
        assert_eq!(refused.code(), Code::InvalidArgument, "case {case}");
    }
}

// 5. Health.

#[tokio::test]
async fn xid_79_marks_gpu_3_unhealthy_and_xid_13_does_not() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid3 = sim.spec.gpus[3].uuid.clone();
    let case = "whole GPUs";
    let run = launch(sim, Launch::default()).await;
    run.registrations(1, GENEROUS, case).await;
    let (mut stream, list) = run.watch(GPU_SOCKET, case).await;
    assert!(unhealthy(&list).is_empty(), "case {case}");

    // XID 13 is an application error: nothing changes.
    append_event(sim, &format!("{uuid3} 13"));
    match tokio::time::timeout(QUIET, stream.message()).await {
        Err(_) => {}
        Ok(Ok(Some(list))) => assert!(
            unhealthy(&list).is_empty(),
            "case {case}: XID 13 changed the list: {list:?}"
        ),
        Ok(other) => panic!("case {case}: the stream ended: {other:?}"),
    }

    append_event(sim, &format!("{uuid3} 79"));
    let appended = Instant::now();
    let list = run.next(&mut stream, WITHIN, case).await;
    assert!(appended.elapsed() <= WITHIN, "case {case}");
    assert_eq!(unhealthy(&list), [uuid3.as_str()], "case {case}: {list:?}");
    assert_eq!(list.devices.len(), 8, "case {case}");

    // Kubelet would not pick it, and Allocate refuses it.
    let refused = run
        .dial(GPU_SOCKET)
        .await
        .allocate(allocate_request(&[std::slice::from_ref(&uuid3)]))
        .await
        .expect_err(case);
    assert_eq!(refused.code(), Code::InvalidArgument, "case {case}");
    assert!(
        refused.message().contains("unhealthy") && refused.message().contains(&uuid3),
        "case {case}: {refused:?}"
    );
}

#[tokio::test]
async fn xid_79_marks_every_replica_of_gpu_3_unhealthy_together() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid3 = sim.spec.gpus[3].uuid.clone();
    let case = "time-slicing, 4 replicas";
    let run = launch(
        sim,
        Launch {
            config: Some(&time_slicing(4, "")),
            ..Launch::default()
        },
    )
    .await;
    run.registrations(1, GENEROUS, case).await;
    let (mut stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 32, "case {case}");
    assert!(unhealthy(&list).is_empty(), "case {case}");

    append_event(sim, &format!("{uuid3} 79"));
    let appended = Instant::now();
    let list = run.next(&mut stream, WITHIN, case).await;
    assert!(appended.elapsed() <= WITHIN, "case {case}");
    let want: Vec<String> = (0..4).map(|n| format!("{uuid3}::{n}")).collect();
    assert_eq!(unhealthy(&list), want, "case {case}: in one update");
}

// 6. Kubelet restarts and a deleted socket.

#[tokio::test]
async fn re_registers_within_a_second_of_a_kubelet_restart_or_a_deleted_socket() {
    let node = node(&NodeSpec::standard(8));
    let mut run = launch(&node.sim, Launch::default()).await;
    run.registrations(1, GENEROUS, "start").await;
    let (mut old, _) = run.watch(GPU_SOCKET, "start").await;

    let case = "kubelet.sock deleted and re-created";
    run.kubelet.restart().await;
    let recreated = Instant::now();
    let registered = run.registrations(2, WITHIN, case).await;
    let took = registered[1].at.saturating_duration_since(recreated);
    assert!(took <= WITHIN, "case {case}: {took:?}");
    assert_eq!(
        registered[1].request.resource_name, GPU_RESOURCE,
        "case {case}"
    );
    // The stream kubelet had before its restart ends.
    match tokio::time::timeout(GENEROUS, old.message()).await {
        Ok(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "case {case}"),
        Ok(Ok(None)) => {}
        other => panic!("case {case}: the old stream goes on: {other:?}"),
    }
    let (_stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 8, "case {case}");

    let case = "our socket deleted";
    fs::remove_file(run.socket(GPU_SOCKET)).unwrap();
    let deleted = Instant::now();
    let registered = run.registrations(3, WITHIN, case).await;
    let took = registered[2].at.saturating_duration_since(deleted);
    assert!(took <= WITHIN, "case {case}: {took:?}");
    assert!(run.socket(GPU_SOCKET).exists(), "case {case}");
    let (_stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 8, "case {case}");

    let case = "kubelet down for 2 s, then back";
    run.kubelet.stop().await;
    // Long enough for the registration backoff to grow past a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.kubelet.restart().await;
    let back = Instant::now();
    let registered = run.registrations(4, WITHIN, case).await;
    let took = registered[3].at.saturating_duration_since(back);
    assert!(took <= WITHIN, "case {case}: {took:?}");
    run.alive(case);
}

// 7. Bad input.

#[tokio::test]
async fn bad_allocate_requests_are_refused_and_the_plugin_serves_on() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let mut run = launch(sim, Launch::default()).await;
    run.registrations(1, GENEROUS, "start").await;
    let mut client = run.dial(GPU_SOCKET).await;

    let unknown: Vec<String> = (0..10_000).map(|i| format!("GPU-bogus-{i}")).collect();
    let repeated = vec![uuid(0); 10_000];
    let known_then_unknown: Vec<String> = (0..10_000)
        .map(|i| match i {
            0..8 => uuid(i),
            _ => format!("GPU-more-{i}"),
        })
        .collect();
    let nine: Vec<String> = (0..9).map(|i| format!("GPU-{i}")).collect();
    // 10,000 ids are over the message limit (8 KiB for 8 GPUs): refused from the
    // gRPC prefix, before they are read.
    let limit = "larger than the 8192-byte limit";
    let cases: [(&str, Vec<String>, &str); 7] = [
        ("empty", vec![], "no device ids"),
        ("unknown", vec![uuid(0), "GPU-nope".into()], "GPU-nope"),
        ("duplicate", vec![uuid(1), uuid(2), uuid(1)], &uuid(1)),
        (
            "9 ids for 8 GPUs",
            nine,
            "9 device ids for nvidia.com/gpu, more than the 8",
        ),
        ("10,000 unknown", unknown, limit),
        ("10,000 duplicates", repeated, limit),
        ("8 known, 9,992 unknown", known_then_unknown, limit),
    ];
    for (case, ids, names) in &cases {
        let refused = client
            .allocate(allocate_request(&[&[uuid(3)], ids]))
            .await
            .expect_err(case);
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "case {case}: {refused:?}"
        );
        assert!(
            refused.message().contains(names),
            "case {case}: {:?} does not name {names}",
            refused.message()
        );
        assert!(
            refused.message().len() < 1024,
            "case {case}: a message of {} bytes",
            refused.message().len()
        );
        run.alive(case);
    }
    // A bad GetPreferredAllocation is refused too.
    let refused = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["GPU-nope".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .expect_err("preferred");
    assert_eq!(refused.code(), Code::InvalidArgument, "case preferred");

    run.alive("after the bad requests");
    let answer = client
        .allocate(allocate_request(&[&[uuid(5), uuid(4)]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0].envs.get(VISIBLE),
        Some(&format!("{},{}", uuid(4), uuid(5))),
        "case valid after bad"
    );
    assert_eq!(
        run.kubelet.registrations().len(),
        1,
        "bad input restarts nothing"
    );
}

// 8. Init errors.

#[tokio::test]
async fn init_errors_exit_with_a_message_unless_fail_on_init_error_is_false() {
    let node = node(&NodeSpec::standard(8));
    let empty = crate::common::node(&NodeSpec::standard(0));
    let broken = "/nonexistent/libnvidia-ml.so.1";
    let cases: [(&str, &SimNode, Launch, &str); 3] = [
        (
            "broken NVML path",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                ..Launch::default()
            },
            "cannot load NVML",
        ),
        ("no GPUs", &empty.sim, Launch::default(), "no GPUs found"),
        (
            "FAIL_ON_INIT_ERROR=true in the env",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                env: &[("FAIL_ON_INIT_ERROR", "true")],
                ..Launch::default()
            },
            "cannot load NVML",
        ),
    ];
    for (case, sim, how, why) in cases {
        let mut run = launch(sim, how).await;
        let status = run.plugin.exit(GENEROUS).await;
        let log = run.plugin.log();
        assert!(
            status.is_some_and(|s| !s.success()),
            "case {case}: {status:?}\n{log}"
        );
        assert!(
            log.contains(&format!("nvidia-device-plugin: error: {why}"))
                && log.contains("--fail-on-init-error=false"),
            "case {case}: {log}"
        );
        assert!(run.kubelet.registrations().is_empty(), "case {case}");
    }

    let cases: [(&str, &SimNode, Launch, &str); 3] = [
        (
            "--fail-on-init-error=false, broken NVML path",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                args: &["--fail-on-init-error=false"],
                ..Launch::default()
            },
            "cannot load NVML",
        ),
        (
            "FAIL_ON_INIT_ERROR=false, broken NVML path",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                env: &[("FAIL_ON_INIT_ERROR", "false")],
                ..Launch::default()
            },
            "cannot load NVML",
        ),
        (
            "--fail-on-init-error=false, no GPUs",
            &empty.sim,
            Launch {
                args: &["--fail-on-init-error=false"],
                ..Launch::default()
            },
            "no GPUs found",
        ),
    ];
    for (case, sim, how, why) in cases {
        let mut run = launch(sim, how).await;
        assert!(
            run.plugin.wait_log("serving no devices", GENEROUS).await,
            "case {case}: says why\n{}",
            run.plugin.log()
        );
        assert!(
            run.plugin.log().contains(why),
            "case {case}: {}",
            run.plugin.log()
        );
        // Stays up: no crash loop.
        tokio::time::sleep(QUIET).await;
        run.alive(case);
        assert!(run.kubelet.registrations().is_empty(), "case {case}");
        let served: Vec<String> = fs::read_dir(run.sockets())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "kubelet.sock")
            .collect();
        assert!(served.is_empty(), "case {case}: serves {served:?}");
    }
}

// 9. Signals.

#[tokio::test]
async fn sigterm_and_sigint_exit_0_and_remove_the_socket() {
    let node = node(&NodeSpec::standard(8));
    for (case, signal) in [("SIGTERM", Signal::SIGTERM), ("SIGINT", Signal::SIGINT)] {
        let mut run = launch(&node.sim, Launch::default()).await;
        run.registrations(1, GENEROUS, case).await;
        let (mut stream, _) = run.watch(GPU_SOCKET, case).await;
        assert!(run.socket(GPU_SOCKET).exists(), "case {case}");
        run.plugin.signal(signal);
        let status = run.plugin.exit(GENEROUS).await;
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "case {case}: {status:?}\n{}",
            run.plugin.log()
        );
        assert!(
            !run.socket(GPU_SOCKET).exists(),
            "case {case}: socket left behind"
        );
        assert!(
            run.kubelet.socket().exists(),
            "case {case}: kubelet's socket is not ours"
        );
        // The open stream ended rather than hanging.
        let ended = tokio::time::timeout(GENEROUS, stream.message()).await;
        assert!(
            matches!(ended, Ok(Ok(None) | Err(_))),
            "case {case}: {ended:?}"
        );
    }
}

#[tokio::test]
async fn sighup_rereads_the_config_file_and_streams_the_new_devices() {
    let node = node(&NodeSpec::standard(8));
    let case = "replicas 2 → 4";
    let run = launch(
        &node.sim,
        Launch {
            config: Some(&time_slicing(2, "")),
            ..Launch::default()
        },
    )
    .await;
    run.registrations(1, GENEROUS, case).await;
    let (mut old, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 16, "case {case}: before SIGHUP");

    // Replace the file as config tools do: write aside, then rename over it.
    let aside = run.dir.path().join("config.yaml.new");
    fs::write(&aside, time_slicing(4, "")).unwrap();
    fs::rename(&aside, run.config()).unwrap();
    run.plugin.signal(Signal::SIGHUP);

    let registered = run.registrations(2, GENEROUS, case).await;
    assert_eq!(
        registered[1].request.resource_name, GPU_RESOURCE,
        "case {case}"
    );
    match tokio::time::timeout(GENEROUS, old.message()).await {
        Ok(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "case {case}"),
        Ok(Ok(None)) => {}
        other => panic!("case {case}: the old stream goes on: {other:?}"),
    }
    let (_stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 32, "case {case}: after SIGHUP");
    let uuid0 = &node.sim.spec.gpus[0].uuid;
    assert_eq!(list.devices[3].id, format!("{uuid0}::3"), "case {case}");
}

// 10. The chain: Allocate → env → nvidia-container-runtime → runc → the GPUs a
// container sees.

#[tokio::test]
async fn allocated_env_gives_the_container_exactly_those_gpus() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    sim.container_rootfs().build(&rootfs).unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, sim.runtime_config("runc", None)).unwrap();
    let runc_root = dir.path().join("runc-root");
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();

    for id_strategy in ["uuid", "index"] {
        let case = id_strategy;
        let run = launch(
            sim,
            Launch {
                args: &["--device-id-strategy", id_strategy],
                ..Launch::default()
            },
        )
        .await;
        run.registrations(1, GENEROUS, case).await;
        let id = |i: usize| match id_strategy {
            "uuid" => uuid(i),
            _ => i.to_string(),
        };
        // GPU 6 is /dev/nvidia7 on the standard node.
        let answer = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[&[id(6), id(1)]]))
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .into_inner();
        let mut envs: Vec<String> = answer.container_responses[0]
            .envs
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        envs.sort();
        assert_eq!(envs.len(), 1, "case {case}: {envs:?}");

        let id = format!("nvshim-plugin-e2e-{}-{case}", std::process::id());
        let bundle = dir.path().join(&id);
        let mut env = vec![
            "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
            "MOCK_NVML_DEV_ROOT=/dev",
        ];
        env.extend(envs.iter().map(String::as_str));
        runc_bundle(&bundle, &rootfs, &["sh", "-c", GPU_SCRIPT], &env).unwrap();
        // The mock NVML inside reads the node's GPUs from its config: mount it in.
        let spec_path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&spec_path).unwrap()).unwrap();
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/etc/mock-nvml.json",
            "type": "bind",
            "source": sim.mock_config,
            "options": ["ro", "bind"],
        }));
        fs::write(&spec_path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let out = Command::new(crate::common::runtime_bin())
            .env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
            .arg("--root")
            .arg(&runc_root)
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .output()
            .unwrap();
        let printed = Printed(String::from_utf8_lossy(&out.stdout).into_owned());
        assert!(
            out.status.success(),
            "case {case}: container failed ({}):\n{}\n{}",
            out.status,
            printed.0,
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            printed.gpu_nodes(),
            strings(&["nvidia1", "nvidia7"]),
            "case {case}: {envs:?}\n{}",
            printed.0
        );
        let smi = printed.smi_lines();
        assert_eq!(smi.len(), 2, "case {case}: {smi:?}");
        assert!(
            smi[0].contains(&uuid(1)) && smi[1].contains(&uuid(6)),
            "case {case}: {smi:?}"
        );
    }
}

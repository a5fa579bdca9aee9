// SPDX-License-Identifier: Apache-2.0
//! MPS sharing with the real `nvidia-device-plugin` binary on a simulated node: the
//! plugin against the fake kubelet (replicas advertised, `Allocate` carrying the MPS
//! pipe, shm and limits), and `nvidia-device-plugin mps-control-daemon` driving the
//! testkit's fake `nvidia-cuda-mps-control` (started with the right env and commands,
//! restarted when its daemon dies, stopped with `quit` on SIGTERM and SIGINT).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::kubelet::{FakeKubelet, dial_plugin};
use crate::common::node;
use crate::common::plugin_proc::{PluginProc, node_args};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvshim_device_plugin::api::{AllocateRequest, ContainerAllocateRequest, Empty, Mount};
use nvshim_testkit::{MPS_PID_FILE, NodeSpec, SimNode, mps_record};

/// A limit for start-up, restarts and exits: generous for a debug build on a busy
/// machine, not a measurement.
const GENEROUS: Duration = Duration::from_secs(20);
const POLL: Duration = Duration::from_millis(20);
const RESOURCE: &str = "nvidia.com/gpu";

fn plugin_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin"))
}

/// `version: v1` sharing `nvidia.com/gpu` `replicas` ways with MPS.
fn mps_config(replicas: u32, extra: &str) -> String {
    format!(
        "version: v1\nsharing:\n  mps:\n{extra}    resources:\n    - name: {RESOURCE}\n      replicas: {replicas}\n"
    )
}

/// The MiB each of `replicas` replicas gets of the node's GPU `i`.
fn share_mib(sim: &SimNode, i: usize, replicas: u64) -> u64 {
    sim.spec.gpus[i].memory_bytes / (1024 * 1024) / replicas
}

fn uuids(sim: &SimNode) -> Vec<String> {
    sim.spec.gpus.iter().map(|g| g.uuid.clone()).collect()
}

#[tokio::test]
async fn the_plugin_advertises_mps_replicas_and_allocate_carries_the_pipe_shm_and_limits() {
    let node = node(&NodeSpec::standard(2));
    let sim = &node.sim;
    let dir = tempfile::tempdir().unwrap();
    let sockets = dir.path().join("plugins");
    fs::create_dir(&sockets).unwrap();
    let config = dir.path().join("config.yaml");
    let cases = [
        ("plain", "", "nvidia.com/gpu", "nvidia-gpu.sock"),
        (
            "renamed",
            "    renameByDefault: true\n",
            "nvidia.com/gpu.shared",
            "nvidia-gpu.shared.sock",
        ),
    ];
    for (case, extra, resource, endpoint) in cases {
        fs::write(&config, mps_config(4, extra)).unwrap();
        let kubelet = FakeKubelet::start(&sockets);
        let mut args = node_args(sim, &sockets);
        args.extend(
            [
                "--config-file",
                config.to_str().unwrap(),
                "--mps-root",
                "/run/nvidia/mps",
            ]
            .map(String::from),
        );
        let plugin = PluginProc::spawn(plugin_bin(), &args, &sim.env());
        let registered = kubelet.wait_registrations(1, GENEROUS).await;
        assert_eq!(
            registered.first().map(|r| r.request.resource_name.as_str()),
            Some(resource),
            "{case}\n{}",
            plugin.log()
        );
        let mut client = dial_plugin(&sockets.join(endpoint)).await;
        let list = client
            .list_and_watch(Empty {})
            .await
            .unwrap()
            .into_inner()
            .message()
            .await
            .unwrap()
            .unwrap();
        let ids: Vec<String> = list.devices.iter().map(|d| d.id.clone()).collect();
        let want: Vec<String> = uuids(sim)
            .iter()
            .flat_map(|u| (0..4).map(move |n| format!("{u}::{n}")))
            .collect();
        assert_eq!(ids, want, "{case}");

        let gpu1 = &sim.spec.gpus[1].uuid;
        let request = |ids: Vec<String>| AllocateRequest {
            container_requests: vec![ContainerAllocateRequest { devices_ids: ids }],
        };
        let answer = client
            .allocate(request(vec![format!("{gpu1}::2")]))
            .await
            .unwrap_or_else(|e| panic!("{case}: {e}"))
            .into_inner();
        let got = &answer.container_responses[0];
        let pipe = format!("/mps/{resource}/pipe");
        assert_eq!(
            got.envs,
            HashMap::from([
                ("NVIDIA_VISIBLE_DEVICES".to_string(), gpu1.clone()),
                ("CUDA_MPS_PIPE_DIRECTORY".to_string(), pipe.clone()),
                ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".to_string(), "25".into()),
                (
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".to_string(),
                    format!("0={}M", share_mib(sim, 1, 4)),
                ),
            ]),
            "{case}"
        );
        assert_eq!(
            got.mounts,
            [
                Mount {
                    container_path: pipe,
                    host_path: format!("/run/nvidia/mps/{resource}/pipe"),
                    read_only: false,
                },
                Mount {
                    container_path: "/dev/shm".into(),
                    host_path: "/run/nvidia/mps/shm".into(),
                    read_only: false,
                },
            ],
            "{case}"
        );
        // MPS defaults to failRequestsGreaterThanOne, as NVIDIA's plugin does.
        let two = client
            .allocate(request(vec![format!("{gpu1}::0"), format!("{gpu1}::1")]))
            .await
            .unwrap_err();
        assert!(
            two.message()
                .contains("maximum request size for shared resources is 1; found 2"),
            "{case}: {two}"
        );
        drop(plugin);
    }
}

#[tokio::test]
async fn the_plugin_refuses_mps_without_a_root_and_on_a_mig_node() {
    let cases = [
        (
            "no root",
            NodeSpec::standard(1),
            vec![],
            "sharing.mps needs an MPS root: set --mps-root, MPS_ROOT or flags.mpsRoot",
        ),
        (
            "MIG GPU",
            NodeSpec::with_mig(2),
            vec!["--mps-root=/run/nvidia/mps"],
            "sharing.mps cannot share GPUs with MIG enabled",
        ),
    ];
    for (case, spec, extra, want) in cases {
        let node = node(&spec);
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.yaml");
        fs::write(&config, mps_config(2, "")).unwrap();
        let mut args = node_args(&node.sim, dir.path());
        args.extend(["--config-file".to_string(), config.display().to_string()]);
        args.extend(extra.iter().map(|a| a.to_string()));
        let mut plugin = PluginProc::spawn(plugin_bin(), &args, &node.sim.env());
        let status = plugin.exit(GENEROUS).await.expect("the plugin exits");
        assert_eq!(status.code(), Some(1), "{case}");
        assert!(plugin.log().contains(want), "{case}: {}", plugin.log());
    }
}

/// The control daemon mode on a simulated node, with its MPS root in a tempdir.
struct ControlDaemon {
    proc: PluginProc,
    root: PathBuf,
    args: Vec<String>,
    env: Vec<(String, String)>,
    _dir: tempfile::TempDir,
}

impl ControlDaemon {
    fn start(sim: &SimNode, replicas: u32) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("mps");
        let config = dir.path().join("config.yaml");
        fs::write(&config, mps_config(replicas, "")).unwrap();
        let args: Vec<String> = [
            "--config-file",
            config.to_str().unwrap(),
            "--nvml-lib",
            crate::common::plugin_proc::nvml_lib(sim).to_str().unwrap(),
            "--nvidia-driver-root",
            sim.driver_root.to_str().unwrap(),
            "mps-control-daemon",
        ]
        .map(String::from)
        .to_vec();
        // The root comes from the env here, as NVIDIA's DaemonSet passes it.
        let mut env = sim.env();
        env.push(("MPS_ROOT".into(), root.display().to_string()));
        let proc = PluginProc::spawn(plugin_bin(), &args, &env);
        Self {
            proc,
            root,
            args,
            env,
            _dir: dir,
        }
    }

    /// Kills the control daemon process (not the MPS daemon) and starts another on the
    /// same root, as when its pod is killed and comes back.
    async fn respawn(&mut self) {
        self.proc.signal(Signal::SIGKILL);
        self.proc.exit(GENEROUS).await.expect("killed");
        self.proc = PluginProc::spawn(plugin_bin(), &self.args, &self.env);
    }

    fn dir(&self) -> PathBuf {
        self.root.join(RESOURCE)
    }

    fn record(&self) -> Vec<String> {
        mps_record(&self.dir().join("log"))
    }

    fn daemon_pid(&self) -> Option<i32> {
        fs::read_to_string(self.dir().join("pipe").join(MPS_PID_FILE))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Waits for `.started` and `starts` daemon starts in the record.
    async fn wait_started(&self, starts: usize, case: &str) {
        let deadline = tokio::time::Instant::now() + GENEROUS;
        loop {
            let record = self.record();
            let started = record.iter().filter(|l| l.starts_with("start ")).count();
            if self.dir().join(".started").exists() && started >= starts {
                return;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "{case}: no .started with {starts} starts within {GENEROUS:?}; record {record:?}\n{}",
                self.proc.log()
            );
            tokio::time::sleep(POLL).await;
        }
    }
}

fn process_gone(pid: i32) -> bool {
    !Path::new(&format!("/proc/{pid}")).exists()
        || fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
            s.rsplit_once(')')
                .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
        })
}

#[tokio::test]
async fn the_control_daemon_starts_configures_restarts_and_stops_the_mps_daemon() {
    let node = node(&NodeSpec::standard(2));
    let sim = &node.sim;
    for (case, signal) in [("SIGTERM", Signal::SIGTERM), ("SIGINT", Signal::SIGINT)] {
        let mut daemon = ControlDaemon::start(sim, 4);
        daemon.wait_started(1, case).await;
        let configure = [
            "set_default_active_thread_percentage 25".to_string(),
            format!(
                "set_default_device_pinned_mem_limit 0 {}M",
                share_mib(sim, 0, 4)
            ),
            format!(
                "set_default_device_pinned_mem_limit 1 {}M",
                share_mib(sim, 1, 4)
            ),
        ];
        let start = format!("start CUDA_VISIBLE_DEVICES={}", uuids(sim).join(","));
        let mut want: Vec<String> = std::iter::once(start.clone())
            .chain(configure.iter().cloned())
            .collect();
        assert_eq!(daemon.record(), want, "{case}");
        assert!(daemon.root.join("shm").is_dir(), "{case}: the shm dir");

        // Kill the MPS daemon behind its back: it comes back, configured again.
        let first = daemon.daemon_pid().expect("a pid file");
        kill(Pid::from_raw(first), Signal::SIGKILL).unwrap();
        daemon.wait_started(2, case).await;
        let second = daemon.daemon_pid().expect("a new pid file");
        assert_ne!(first, second, "{case}: a new daemon");
        want.push(start.clone());
        want.extend(configure.iter().cloned());
        assert_eq!(daemon.record(), want, "{case}: after the restart");
        assert!(
            daemon
                .proc
                .log()
                .contains("the MPS control daemon is gone; restarting it"),
            "{case}: {}",
            daemon.proc.log()
        );

        daemon.proc.signal(signal);
        let status = daemon
            .proc
            .exit(GENEROUS)
            .await
            .expect("exits on the signal");
        assert_eq!(status.code(), Some(0), "{case}: {}", daemon.proc.log());
        want.push("quit".into());
        assert_eq!(daemon.record(), want, "{case}: quit sent");
        assert!(
            !daemon.dir().join(".started").exists(),
            "{case}: .started removed"
        );
        assert!(process_gone(second), "{case}: the MPS daemon is gone");
    }
}

#[tokio::test]
async fn a_new_control_daemon_replaces_the_mps_daemon_its_predecessor_left() {
    let node = node(&NodeSpec::standard(1));
    let sim = &node.sim;
    let mut daemon = ControlDaemon::start(sim, 2);
    daemon.wait_started(1, "first").await;
    let orphan = daemon.daemon_pid().expect("a pid file");
    daemon.respawn().await;
    daemon.wait_started(2, "second").await;
    assert!(
        daemon
            .proc
            .log()
            .contains("an MPS control daemon is already running; restarting it"),
        "{}",
        daemon.proc.log()
    );
    assert!(process_gone(orphan), "the old MPS daemon was told to quit");
    let configure = [
        "set_default_active_thread_percentage 50".to_string(),
        format!(
            "set_default_device_pinned_mem_limit 0 {}M",
            share_mib(sim, 0, 2)
        ),
    ];
    let start = format!("start CUDA_VISIBLE_DEVICES={}", uuids(sim)[0]);
    let mut want = vec![start.clone()];
    want.extend(configure.iter().cloned());
    want.push("quit".into());
    want.push(start);
    want.extend(configure.iter().cloned());
    assert_eq!(daemon.record(), want);
    daemon.proc.signal(Signal::SIGTERM);
    assert_eq!(
        daemon.proc.exit(GENEROUS).await.and_then(|s| s.code()),
        Some(0)
    );
}

#[tokio::test]
async fn the_control_daemon_waits_without_mps_and_fails_without_its_binary() {
    let node = node(&NodeSpec::standard(1));
    let sim = &node.sim;
    // Without sharing.mps there is nothing to run: it waits for its signal.
    let dir = tempfile::tempdir().unwrap();
    let args: Vec<String> = [
        "--nvml-lib",
        crate::common::plugin_proc::nvml_lib(sim).to_str().unwrap(),
        "mps-control-daemon",
    ]
    .map(String::from)
    .to_vec();
    let mut idle = PluginProc::spawn(plugin_bin(), &args, &sim.env());
    assert!(
        idle.wait_log("no resource is shared with MPS", GENEROUS)
            .await,
        "{}",
        idle.log()
    );
    idle.signal(Signal::SIGTERM);
    assert_eq!(idle.exit(GENEROUS).await.and_then(|s| s.code()), Some(0));

    // A driver root without nvidia-cuda-mps-control: the error names where it looked.
    let config = dir.path().join("config.yaml");
    fs::write(&config, mps_config(2, "")).unwrap();
    let empty_root = dir.path().join("driver");
    fs::create_dir(&empty_root).unwrap();
    let args: Vec<String> = [
        "--config-file",
        config.to_str().unwrap(),
        "--mps-root",
        dir.path().join("mps").to_str().unwrap(),
        "--nvml-lib",
        crate::common::plugin_proc::nvml_lib(sim).to_str().unwrap(),
        "--nvidia-driver-root",
        empty_root.to_str().unwrap(),
        "mps-control-daemon",
    ]
    .map(String::from)
    .to_vec();
    let mut missing = PluginProc::spawn(plugin_bin(), &args, &sim.env());
    let status = missing.exit(GENEROUS).await.expect("exits");
    assert_eq!(status.code(), Some(1));
    let log = missing.log();
    assert!(log.contains("cannot find nvidia-cuda-mps-control"), "{log}");
    assert!(
        log.contains(&format!(
            "{}/usr/bin/nvidia-cuda-mps-control",
            empty_root.display()
        )),
        "{log}"
    );

    // A control binary whose -d fails: the exit status and its stderr, and exit 1.
    let bin = empty_root.join("usr/bin");
    fs::create_dir_all(&bin).unwrap();
    let control = bin.join("nvidia-cuda-mps-control");
    fs::write(&control, "#!/bin/sh\necho 'no GPU for you' >&2\nexit 3\n").unwrap();
    fs::set_permissions(
        &control,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let mut failing = PluginProc::spawn(plugin_bin(), &args, &sim.env());
    let status = failing.exit(GENEROUS).await.expect("exits");
    assert_eq!(status.code(), Some(1));
    let log = failing.log();
    assert!(log.contains("no GPU for you"), "{log}");
    assert!(
        log.contains("nvidia-cuda-mps-control -d for nvidia.com/gpu failed (exit status: 3)"),
        "{log}"
    );
}

// SPDX-License-Identifier: Apache-2.0
//! The device plugin against a **real kubelet** (v1.20.2, `scripts/build-kubelet.sh`),
//! not the fake one: kubelet in standalone mode runs static pods on a real containerd
//! (CRI) whose runc is our `nvidia-container-runtime`, on a simulated 4-GPU node.
//!
//! Both kubelet builds run the same cases:
//! - `kubelet`: stock 1.20.2, which dials plugins with the socket path as the HTTP/2
//!   `:authority` (every kubelet before 1.26);
//! - `kubelet-authority`: the same with `grpc.WithAuthority("localhost")` (1.26+).
//!
//! Cases, per kubelet: for every device-list strategy, a pod asking for two GPUs runs
//! after Register → ListAndWatch → GetPreferredAllocation → Allocate (read from the
//! plugin's debug log) and sees the GPUs it was allocated (`cdi-cri`: none, since
//! kubelet 1.20 does not know the CRI `cdi_devices` field); a pod asking for more GPUs than
//! are free is refused at admission without an `Allocate`; a killed and restarted kubelet
//! gets the plugin registered again and a new pod gets its GPUs. While a pod holds GPUs,
//! kubelet's pod-resources `List` through the core's blocking client names them.
//!
//! One containerd and one node serve every case; strategies change by restarting only
//! the plugin. All cases run and every failure is reported at the end, by case.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common::kube::{KubeNode, kubelet_dir, tail};
use crate::common::plugin_proc::{PluginProc, node_args};
use crate::common::{GPU_SCRIPT, Node, Printed, node, runtime_bin};
use nvshim_testkit::NodeSpec;
use serde_json::json;

const GPU_IMAGE: &str = "nvshim.test/gpu:1";
const RESOURCE: &str = "nvidia.com/gpu";
/// Where a pod mounts the mock NVML's config.
const MOCK_CONFIG: &str = "/etc/mock-nvml.json";
/// Start-up, registration, a pod's run: generous limits for a debug build on a busy
/// machine, not measurements.
const WITHIN: Duration = Duration::from_secs(60);

/// The plugin's event once kubelet has accepted its registration.
const REGISTERED: &str = "registered with kubelet resource=nvidia.com/gpu";
/// The plugin's log once kubelet streams ListAndWatch (which carries the devices): a pod
/// admitted between registration and kubelet taking in the first list finds no GPU
/// available, so the cases also wait for kubelet's checkpoint to list them.
const STREAMED: &str = "ready: every resource is served and streamed by kubelet";
/// The plugin's event of each RPC, in the order a pod's admission makes them. (The
/// `Register` event comes before the call: kubelet opens ListAndWatch while it handles it.)
const SEQUENCE: [&str; 4] = [
    "Register resource=nvidia.com/gpu",
    "ListAndWatch opened resource=nvidia.com/gpu",
    "GetPreferredAllocation resource=nvidia.com/gpu",
    "Allocate resource=nvidia.com/gpu",
];

/// The cases each kubelet runs, in order: the device-list strategies, then the others.
const CASES: [&str; 6] = [
    "envvar",
    "volume-mounts",
    "cdi-annotations",
    "cdi-cri",
    "refused-at-admission",
    "kubelet-restart",
];

/// The simulated node and what the plugin needs to run on it.
/// Fields drop in order: kubelet and containerd stop before the node and the temp dir go.
struct Fixture {
    kube: KubeNode,
    node: Node,
    _dir: tempfile::TempDir,
}

impl Fixture {
    /// Starts the plugin with `strategy` and waits for it to register.
    fn plugin(&self, strategy: &str, case: &str) -> PluginProc {
        let sockets = self.kube.device_plugins();
        let mut args = node_args(&self.node.sim, &sockets);
        let pod_resources = self.kube.kubelet_root().join("pod-resources/kubelet.sock");
        args.extend([
            "--device-list-strategy".into(),
            strategy.into(),
            "--pod-resources-socket".into(),
            pod_resources.display().to_string(),
            // Our events at debug, not h2's frames.
            "--log-level".into(),
            "info,nvshim=debug".into(),
        ]);
        let mark = self.kube.devices_checkpoint_mark();
        let plugin = PluginProc::spawn(
            Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin")),
            &args,
            &self.node.sim.env(),
        );
        wait_log(&plugin, REGISTERED, 1, case);
        wait_log(&plugin, STREAMED, 1, case);
        self.kube.wait_devices_listed(RESOURCE, mark, WITHIN);
        plugin
    }

    /// A static pod whose one container `gpu` asks for `gpus` GPUs and runs `script`.
    fn add_pod(&self, name: &str, gpus: u32, script: &str) {
        let pod = json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": { "name": name },
            "spec": {
                "hostNetwork": true,
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 0,
                "volumes": [{
                    "name": "mock",
                    "hostPath": { "path": self.node.sim.mock_config, "type": "File" }
                }],
                "containers": [{
                    "name": "gpu",
                    "image": GPU_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["/bin/sh", "-c", script],
                    "env": [
                        { "name": "MOCK_NVML_CONFIG", "value": MOCK_CONFIG },
                        { "name": "MOCK_NVML_DEV_ROOT", "value": "/dev" }
                    ],
                    "volumeMounts": [
                        { "name": "mock", "mountPath": MOCK_CONFIG, "readOnly": true }
                    ],
                    "resources": { "limits": { RESOURCE: gpus } }
                }]
            }
        });
        self.kube.add_pod(name, &pod);
    }

    /// Runs pod `name` asking for `gpus` GPUs to completion; returns what it printed.
    fn run_pod(&self, name: &str, gpus: u32, plugin: &PluginProc, case: &str) -> Printed {
        self.add_pod(name, gpus, GPU_SCRIPT);
        let status = self.kube.wait_pod(name, WITHIN, |s| {
            matches!(s["phase"].as_str(), Some("Succeeded" | "Failed"))
        });
        let out = self.kube.container_output(name, "gpu");
        self.kube.remove_pod(name);
        assert_eq!(
            status["phase"],
            "Succeeded",
            "case {case}: pod {name} did not succeed: {status:#}\noutput:\n{out}\n{}",
            self.logs(plugin)
        );
        Printed(out)
    }

    fn logs(&self, plugin: &PluginProc) -> String {
        format!(
            "plugin log:\n{}\nkubelet log (device lines):\n{}",
            tail(&plugin.log(), 30),
            tail(&device_lines(&self.kube.kubelet_log()), 30)
        )
    }
}

/// kubelet's log lines about device plugins and admission.
fn device_lines(log: &str) -> String {
    log.lines()
        .filter(|l| {
            ["manager.go", "endpoint.go", "predicate.go", "nvidia.com"]
                .iter()
                .any(|w| l.contains(w))
                && !l.contains("Machine:")
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Waits until `needle` appears `n` times in the plugin's log.
fn wait_log(plugin: &PluginProc, needle: &str, n: usize, case: &str) {
    let deadline = Instant::now() + WITHIN;
    while plugin.log().matches(needle).count() < n {
        assert!(
            Instant::now() < deadline,
            "case {case}: {needle:?} not {n} times in the plugin log within {WITHIN:?}:\n{}",
            tail(&plugin.log(), 30)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The ids of the last `Allocate` in the plugin's log.
fn last_allocate(log: &str) -> String {
    log.lines()
        .rev()
        .find(|l| l.contains(SEQUENCE[3]))
        .unwrap_or("")
        .to_owned()
}

/// Asserts that `printed` shows exactly `n` GPUs, each of them in the last `Allocate`.
fn assert_gpus(printed: &Printed, n: usize, plugin: &PluginProc, case: &str) {
    let smi = printed.smi_lines();
    assert_eq!(
        (printed.gpu_nodes().len(), smi.len()),
        (n, n),
        "case {case}: /dev/nvidia<N> nodes and nvidia-smi GPUs; output:\n{}\nplugin log:\n{}",
        printed.0,
        tail(&plugin.log(), 20)
    );
    let allocate = last_allocate(&plugin.log());
    for line in &smi {
        let uuid = line
            .split("UUID: ")
            .nth(1)
            .unwrap_or("")
            .trim_end_matches(')');
        assert!(
            !uuid.is_empty() && allocate.contains(uuid),
            "case {case}: {line:?} is not among the allocated: {allocate}"
        );
    }
}

/// The index in `log` of the first `step` after byte `from`.
fn position(log: &str, step: &str, from: usize) -> Option<usize> {
    log[from..].find(step).map(|i| i + from)
}

/// One device-list strategy: the RPC sequence, then the GPUs the container sees.
fn strategy(fx: &Fixture, tag: &str, strategy: &str) {
    let case = format!("{tag}/{strategy}");
    let plugin = fx.plugin(strategy, &case);
    let printed = fx.run_pod(&format!("{tag}-{strategy}"), 2, &plugin, &case);
    let log = plugin.log();
    let mut at = 0;
    for step in SEQUENCE {
        at = position(&log, step, at).unwrap_or_else(|| {
            panic!(
                "case {case}: no {step:?} after the previous RPC in the plugin log:\n{}",
                tail(&log, 30)
            )
        });
    }
    match strategy {
        // kubelet 1.20 drops the CDIDevices of the Allocate response (the field came in
        // 1.28): the container runs with no GPU.
        "cdi-cri" => assert_gpus(&printed, 0, &plugin, &case),
        _ => assert_gpus(&printed, 2, &plugin, &case),
    }
}

/// A pod asking for more GPUs than are free is refused by kubelet, not the plugin.
fn admission(fx: &Fixture, tag: &str) {
    let case = format!("{tag}/refused-at-admission");
    let plugin = fx.plugin("envvar", &case);
    let hold = format!("{tag}-hold");
    fx.add_pod(
        &hold,
        2,
        &format!("{GPU_SCRIPT}; echo held; exec sleep 3600"),
    );
    let running = fx.kube.wait_pod(&hold, WITHIN, |s| {
        matches!(
            s["phase"].as_str(),
            Some("Running" | "Succeeded" | "Failed")
        )
    });
    let deadline = Instant::now() + WITHIN;
    while running["phase"] == "Running"
        && !fx.kube.container_output(&hold, "gpu").contains("held")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(200));
    }
    let held = Printed(fx.kube.container_output(&hold, "gpu"));
    assert!(
        running["phase"] == "Running" && held.0.contains("held"),
        "case {case}: the pod holding 2 GPUs did not run: {running:#}\n{}",
        fx.logs(&plugin)
    );
    assert_gpus(&held, 2, &plugin, &case);
    pod_resources_name(fx, &hold, &case);

    let allocations = plugin.log().matches(SEQUENCE[3]).count();
    let greedy = format!("{tag}-greedy");
    fx.add_pod(&greedy, 3, GPU_SCRIPT);
    let status = fx
        .kube
        .wait_pod(&greedy, WITHIN, |s| s["phase"] == "Failed");
    fx.kube.remove_pod(&greedy);
    fx.kube.remove_pod(&hold);
    let message = status["message"].as_str().unwrap_or("");
    assert!(
        status["phase"] == "Failed"
            && status["reason"] == "UnexpectedAdmissionError"
            && message.contains(&format!("devices unavailable for {RESOURCE}"))
            && message.contains("Requested: 3, Available: 2"),
        "case {case}: pod asking for 3 of 2 free GPUs: {status:#}\n{}",
        fx.logs(&plugin)
    );
    assert_eq!(
        plugin.log().matches(SEQUENCE[3]).count(),
        allocations,
        "case {case}: the plugin got an Allocate for the refused pod:\n{}",
        tail(&plugin.log(), 20)
    );
}

/// kubelet's own pod-resources server (grpc-go) read through the core's blocking client
/// (`nvshim exporter`'s pod labels): the pod `hold` (a static pod, so kubelet names it
/// `<hold>-<node>`) has two GPUs in its container `gpu`.
fn pod_resources_name(fx: &Fixture, hold: &str, case: &str) {
    let socket = fx.kube.kubelet_root().join("pod-resources/kubelet.sock");
    let listed = nvshim::kubelet::pod_resources::list(&socket, WITHIN)
        .unwrap_or_else(|e| panic!("case {case}: {e}"));
    let held: Vec<_> = listed
        .iter()
        .filter(|d| d.pod.starts_with(hold) && d.resource == RESOURCE)
        .collect();
    assert!(
        held.len() == 1 && held[0].container == "gpu" && held[0].device_ids.len() == 2,
        "case {case}: pod-resources List for {hold}: {listed:?}"
    );
}

/// kubelet killed and started again: the plugin registers again, a new pod gets GPUs.
fn restart(fx: &mut Fixture, kubelet: &Path, tag: &str) {
    let case = format!("{tag}/kubelet-restart");
    let plugin = fx.plugin("envvar", &case);
    let mark = fx.kube.devices_checkpoint_mark();
    fx.kube.stop_kubelet();
    fx.kube.start_kubelet(kubelet);
    wait_log(&plugin, REGISTERED, 2, &case);
    wait_log(&plugin, STREAMED, 2, &case);
    fx.kube.wait_devices_listed(RESOURCE, mark, WITHIN);
    let printed = fx.run_pod(&format!("{tag}-after-restart"), 2, &plugin, &case);
    assert_gpus(&printed, 2, &plugin, &case);
}

#[test]
fn device_plugin_with_a_real_kubelet() {
    let kubelets = kubelet_dir();
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("runtime.toml");
    let runtime_config = node.sim.runtime_config("runc", None);
    // The volume-mounts strategy hands GPUs over as /dev/null mounts, which the runtime
    // honours only when told to (a top-level key, as in NVIDIA's config).
    // CDI names resolve against our own empty spec directory, never a spec some other
    // process left in the host's /etc/cdi or /var/run/cdi: the runtime must resolve the
    // device plugin's `k8s.device-plugin.nvidia.com/gpu=<id>` names itself.
    let spec_dir = dir.path().join("cdi");
    std::fs::create_dir(&spec_dir).unwrap();
    std::fs::write(
        &config,
        format!(
            "accept-nvidia-visible-devices-as-volume-mounts = true\n{runtime_config}\n\
             [nvidia-container-runtime.modes.cdi]\nspec-dirs = [{:?}]\n",
            spec_dir.display().to_string()
        ),
    )
    .unwrap();
    let runtime = runtime_bin();
    let kube = KubeNode::start(
        &dir.path().join("kube"),
        Path::new(&runtime),
        &[("NVIDIA_CTK_CONFIG_FILE_PATH", config.to_str().unwrap())],
    );
    let rootfs = dir.path().join("gpu-rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    kube.import_image(GPU_IMAGE, &rootfs, &["/bin/sh"]);
    let mut fx = Fixture {
        kube,
        node,
        _dir: dir,
    };

    let mut failures = Vec::new();
    for (tag, binary) in [("authority", "kubelet-authority"), ("stock", "kubelet")] {
        let kubelet = kubelets.join(binary);
        fx.kube.start_kubelet(&kubelet);
        for name in CASES {
            let run = || match name {
                "refused-at-admission" => admission(&fx, tag),
                "kubelet-restart" => restart(&mut fx, &kubelet, tag),
                strategy_name => strategy(&fx, tag, strategy_name),
            };
            if let Err(panic) = catch_unwind(AssertUnwindSafe(run)) {
                let text = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                failures.push(format!("{binary} {name}: {text}"));
                eprintln!("FAILED {binary} {name}");
            }
            fx.kube.remove_all_pods();
        }
        fx.kube.stop_kubelet();
    }
    assert!(
        failures.is_empty(),
        "{} case(s) failed:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
}

// SPDX-License-Identifier: Apache-2.0
//! The chart rendered with value sets: every output passes `kubernetes-validate --strict`
//! (one run for all of them), and the defaults install the toolkit first, wait for it,
//! and validate the node through the runtime class.

use std::collections::BTreeMap;
use std::fs;
use std::process::Command;

use serde_json::{Value, json};

use super::{merged_values, run_renderer, schema_errors};

/// The rendered objects, or the renderer's error.
pub(crate) fn render(values: &str) -> Result<Vec<Value>, String> {
    let text = run_renderer(values, &[])?;
    Ok(serde_saphyr::from_multiple(&text).unwrap())
}

pub(crate) fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

pub(super) fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    find(docs, kind, name).unwrap_or_else(|| {
        let names: Vec<String> = docs
            .iter()
            .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
            .collect();
        panic!("no {kind} {name} among {names:?}")
    })
}

pub(crate) fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

/// A container's plain `env` entries (none without an `env` list).
pub(crate) fn env(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

pub(crate) fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// The value sets: (case, values over values.yaml).
pub(crate) const CASES: [(&str, &str); 9] = [
    ("defaults", "{}"),
    (
        "labels, exporter and MIG",
        r#"
gfd: {enabled: true, noTimestamp: true, sleepInterval: 30s}
exporter:
  enabled: true
  port: 9500
  collectors: |
    DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).
migStrategy: single
failOnInitError: false
deviceListStrategy: cdi-annotations,volume-mounts
deviceIDStrategy: index
"#,
    ),
    (
        "CRI-O with a driver container",
        r#"
installer:
  runtime: crio
  restartMode: systemd
  setAsDefault: true
  cdiEnabled: true
  toolkitDir: /opt/nvidia/toolkit
  config: /etc/crio/crio.conf
  env: [{name: RUNTIME_DROP_IN_CONFIG, value: /etc/crio/crio.conf.d/99-nvidia.conf}]
nvidiaDriverRoot: /run/nvidia/driver
validation: {enabled: false}
runtimeClass: {create: false}
openshift: {enabled: true}
"#,
    ),
    (
        "CRI-O with the OCI hook",
        r#"
installer: {runtime: crio, crioConfigMode: hook}
gfd: {enabled: true}
"#,
    ),
    (
        "a config map of two configs",
        r#"
gfd: {enabled: true}
config:
  map:
    default: |
      version: v1
      flags:
        migStrategy: none
    mig-mixed: |
      version: v1
      flags:
        migStrategy: mixed
  default: mig-mixed
"#,
    ),
    (
        "two configs, the one named default",
        r#"
config:
  map:
    default: "version: v1\n"
    other: "version: v1\n"
"#,
    ),
    (
        "MPS sharing",
        r#"
gfd: {enabled: true}
nodeSelector: {pool: gpu}
config:
  map:
    mps: |
      version: v1
      sharing:
        mps:
          resources:
            - name: nvidia.com/gpu
              replicas: 4
"#,
    ),
    (
        // The env var counts again: NVIDIA's toolkit defaults, where envvar can allocate.
        "NVIDIA's toolkit defaults, envvar",
        r#"
installer: {acceptEnvvarWhenUnprivileged: true}
deviceListStrategy: cdi-annotations,envvar
gfd: {enabled: true}
exporter: {enabled: true}
config:
  map:
    mps: |
      version: v1
      sharing:
        mps:
          resources:
            - name: nvidia.com/gpu
              replicas: 2
"#,
    ),
    (
        "custom placement, no installer",
        r#"
installer: {enabled: false}
exporter: {enabled: true}
gfd: {enabled: true}
nodeSelector: {nvidia.com/gpu.product: A100-SXM4-80GB}
affinity: null
tolerations:
  - {key: dedicated, operator: Equal, value: gpu, effect: NoSchedule}
resources:
  requests: {cpu: 50m, memory: 64Mi}
  limits: {memory: 128Mi}
priorityClassName: gpu-critical
imagePullSecrets: [{name: registry}]
podAnnotations: {team: ml}
global: {imageRegistry: registry.example}
image: {repository: registry.example/nvshim/plugin, tag: "0.2.0"}
"#,
    ),
];

pub(super) fn case(name: &str) -> &'static str {
    CASES.iter().find(|(c, _)| *c == name).unwrap().1
}

#[test]
fn helm_chart_renders_objects_kubernetes_validate_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let mut rendered = BTreeMap::new();
    for (i, (case, values)) in CASES.iter().enumerate() {
        assert_eq!(
            schema_errors(&merged_values(values)),
            Vec::<String>::new(),
            "case {case}"
        );
        let text = run_renderer(values, &[]).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let file = dir.path().join(format!("case-{i}.yaml"));
        fs::write(&file, &text).unwrap();
        files.push(file);
        rendered.insert(*case, serde_saphyr::from_multiple::<Value>(&text).unwrap());
    }
    let out = Command::new("kubernetes-validate")
        .args(["--strict", "--no-warn"])
        .args(&files)
        .output()
        .expect("kubernetes-validate (`.ci/run` installs it with pip)");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success() && !text.contains("ERROR"), "{text}");
    // It checked every object of every case.
    let objects: usize = rendered.values().map(Vec::len).sum();
    assert_eq!(
        text.matches(" passed for resource ").count(),
        objects,
        "{text}"
    );

    let kinds = |case: &str| -> Vec<String> {
        let mut kinds: Vec<String> = rendered[case]
            .iter()
            .map(|d| {
                format!(
                    "{}/{}",
                    d["kind"].as_str().unwrap(),
                    d["metadata"]["name"].as_str().unwrap()
                )
            })
            .collect();
        kinds.sort();
        kinds
    };
    assert_eq!(
        kinds("defaults"),
        [
            "DaemonSet/nvshim-device-plugin",
            "DaemonSet/nvshim-toolkit",
            "Job/nvshim-validation-1",
            "RuntimeClass/nvidia",
            "ServiceAccount/nvshim-device-plugin",
            "ServiceAccount/nvshim-toolkit",
        ],
    );
    assert_eq!(
        kinds("labels, exporter and MIG"),
        [
            "ConfigMap/nvshim-exporter-collectors",
            "DaemonSet/nvshim-device-plugin",
            "DaemonSet/nvshim-exporter",
            "DaemonSet/nvshim-labels",
            "DaemonSet/nvshim-toolkit",
            "Job/nvshim-validation-1",
            "RuntimeClass/nvidia",
            "Service/nvshim-exporter",
            "ServiceAccount/nvshim-device-plugin",
            "ServiceAccount/nvshim-exporter",
            "ServiceAccount/nvshim-labels",
            "ServiceAccount/nvshim-toolkit",
        ],
    );
    assert_eq!(
        kinds("CRI-O with a driver container"),
        [
            "DaemonSet/nvshim-device-plugin",
            "DaemonSet/nvshim-toolkit",
            "Role/nvshim-privileged-scc",
            "RoleBinding/nvshim-privileged-scc",
            "ServiceAccount/nvshim-device-plugin",
            "ServiceAccount/nvshim-toolkit",
        ],
    );
}

#[test]
fn helm_defaults_install_the_toolkit_first_and_validate_through_the_runtime_class() {
    let docs = render("{}").unwrap();
    let installer = object(&docs, "DaemonSet", "nvshim-toolkit");
    let plugin = object(&docs, "DaemonSet", "nvshim-device-plugin");
    let job = object(&docs, "Job", "nvshim-validation-1");
    assert_eq!(object(&docs, "RuntimeClass", "nvidia")["handler"], "nvidia");
    for d in &docs {
        if d["kind"] != "RuntimeClass" {
            assert_eq!(
                d["metadata"]["namespace"], "nvshim",
                "case {}",
                d["metadata"]["name"]
            );
        }
    }

    // The installer: privileged, the host's / at /host, the engine's PIDs, surge first.
    let spec = pod(installer);
    assert_eq!(spec["hostPID"], true);
    assert!(
        spec.get("runtimeClassName").is_none(),
        "the installer cannot need the runtime"
    );
    // The undo waits up to DRAIN_BOUND for GPU containers to stop before it removes the
    // runtime they need to be stopped; the pod's grace period must cover it and a restart.
    let grace = spec["terminationGracePeriodSeconds"].as_u64().unwrap();
    let bound = nvshim::cli::install::drain::DRAIN_BOUND.as_secs();
    assert!(
        grace >= bound + 20,
        "terminationGracePeriodSeconds {grace} leaves the undo's {bound} s drain no margin"
    );
    let container = &spec["containers"][0];
    assert_eq!(container["image"], "ghcr.io/nvshim/container-toolkit:0.1.0");
    // Ready on its own install, not on the host's ready file (the old pod's in an update).
    assert_eq!(
        container["readinessProbe"]["exec"]["command"],
        json!([
            "/usr/bin/nvshim",
            "doctor",
            "--wait-for",
            nvshim::cli::install::args::POD_READY_FILE,
            "--timeout",
            "1"
        ])
    );
    assert_eq!(container["securityContext"]["privileged"], true);
    assert_eq!(
        strings(&container["args"]),
        [
            "--host-root=/host",
            "--runtime=containerd",
            "--runtime-name=nvidia",
            "--toolkit-dir=/usr/local/nvidia/toolkit",
            "--driver-root=/",
            "--ready-file=/run/nvidia/validations/toolkit-ready",
            // Image env is not an allocation (values.rs checks what goes with it).
            "--accept-nvidia-visible-devices-envvar-when-unprivileged=false",
            "--accept-nvidia-visible-devices-as-volume-mounts=true",
        ]
    );
    assert_eq!(
        installer["spec"]["updateStrategy"],
        json!({"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}})
    );
    let volumes = spec["volumes"].as_array().unwrap();
    for (mount, host) in [("/host", "/"), ("/run/nvidia", "/run/nvidia")] {
        let m = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == mount)
            .unwrap_or_else(|| panic!("case {mount}"));
        let v = volumes.iter().find(|v| v["name"] == m["name"]).unwrap();
        assert_eq!(v["hostPath"]["path"], host, "case {mount}");
    }

    // The plugin waits for the ready file, and runs through the runtime class (not the
    // engine's default), where the hook of its CDI spec is the installer's.
    let spec = pod(plugin);
    assert_eq!(spec["runtimeClassName"], "nvidia");
    let wait = &spec["initContainers"][0];
    assert_eq!(
        strings(&wait["command"]),
        [
            "/usr/bin/nvshim",
            "doctor",
            "--wait-for",
            "/run/nvidia/validations/toolkit-ready",
            "--timeout",
            "0"
        ]
    );
    assert_eq!(
        wait["volumeMounts"],
        json!([{"name": "validations", "mountPath": "/run/nvidia/validations", "readOnly": true}])
    );
    let validations = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "validations")
        .unwrap();
    assert_eq!(validations["hostPath"]["path"], "/run/nvidia/validations");
    let container = &spec["containers"][0];
    let plugin_env = env(container);
    assert_eq!(plugin_env["NVIDIA_VISIBLE_DEVICES"], "all");
    assert_eq!(plugin_env["DEVICE_LIST_STRATEGY"], "volume-mounts");
    assert_eq!(
        plugin_env["NVIDIA_CDI_HOOK_PATH"],
        "/usr/local/nvidia/toolkit/nvidia-cdi-hook"
    );
    for unset in [
        "MIG_STRATEGY",
        "FAIL_ON_INIT_ERROR",
        "CONFIG_FILE",
        "NVIDIA_MIG_MONITOR_DEVICES",
    ] {
        assert!(
            !plugin_env.contains_key(unset),
            "case {unset}: {plugin_env:?}"
        );
    }
    assert_eq!(
        container["securityContext"]["capabilities"]["drop"],
        json!(["ALL"])
    );
    assert_eq!(spec["priorityClassName"], "system-node-critical");

    // The validation Job: nvshim doctor in a GPU container of the runtime class.
    let spec = pod(job);
    assert_eq!(spec["runtimeClassName"], "nvidia");
    assert_eq!(spec["restartPolicy"], "Never");
    let container = &spec["containers"][0];
    assert_eq!(
        strings(&container["command"]),
        ["/usr/bin/nvshim", "doctor", "--in-container"]
    );
    let job_env = env(container);
    assert_eq!(job_env["NVIDIA_VISIBLE_DEVICES"], "all");
    assert_eq!(job_env["NVIDIA_DRIVER_CAPABILITIES"], "compute,utility");
    assert_eq!(spec["initContainers"][0]["name"], "toolkit-ready");

    // NOTES.txt renders and names the objects it tells the user to watch.
    let notes = run_renderer("{}", &["-notes"]).unwrap();
    let notes = notes
        .split("# Notes:\n")
        .nth(1)
        .expect("NOTES.txt rendered");
    for expected in [
        "rollout status daemonset/nvshim-toolkit",
        "logs job/nvshim-validation-1",
    ] {
        assert!(notes.contains(expected), "case {expected}: {notes}");
    }
    // Another release name prefixes every object, and selectors stay apart.
    let text = run_renderer("{}", &["-release", "gpu", "-namespace", "gpu-system"]).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let plugin = object(&docs, "DaemonSet", "gpu-nvshim-device-plugin");
    assert_eq!(plugin["metadata"]["namespace"], "gpu-system");
    assert_eq!(
        plugin["spec"]["selector"]["matchLabels"]["app.kubernetes.io/instance"],
        "gpu"
    );
    object(&docs, "DaemonSet", "gpu-nvshim-toolkit");
    object(&docs, "Job", "gpu-nvshim-validation-1");
}

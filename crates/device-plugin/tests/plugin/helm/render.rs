// SPDX-License-Identifier: Apache-2.0
//! The chart rendered with value sets: every output passes `kubernetes-validate --strict`
//! (one run for all of them), and each object carries the values it was given.

use std::collections::BTreeMap;
use std::fs;
use std::process::Command;

use serde_json::{Value, json};

use super::{merged_values, run_renderer, schema_errors};

/// The rendered objects, or the renderer's error.
fn render(values: &str) -> Result<Vec<Value>, String> {
    let text = run_renderer(values, &[])?;
    Ok(serde_saphyr::from_multiple(&text).unwrap())
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> Option<&'a Value> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
}

fn object<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    find(docs, kind, name).unwrap_or_else(|| {
        let names: Vec<String> = docs
            .iter()
            .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
            .collect();
        panic!("no {kind} {name} among {names:?}")
    })
}

fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

/// A container's plain `env` entries.
fn env(container: &Value) -> BTreeMap<String, String> {
    container["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| {
            Some((
                e["name"].as_str()?.to_owned(),
                e["value"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

fn strings(v: &Value) -> Vec<&str> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect()
}

/// The value sets: (case, values over values.yaml).
const CASES: [(&str, &str); 6] = [
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
deviceListStrategy: cdi-annotations,envvar
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
  config: /etc/crio/crio.conf.d/99-nvidia.conf
nvidiaDriverRoot: /run/nvidia/driver
validation: {enabled: false}
runtimeClass: {create: false}
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
image: {repository: registry.example/nvshim/plugin, tag: "0.2.0"}
"#,
    ),
];

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
        ],
    );
    assert_eq!(
        kinds("CRI-O with a driver container"),
        ["DaemonSet/nvshim-device-plugin", "DaemonSet/nvshim-toolkit"],
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
    let container = &spec["containers"][0];
    assert_eq!(container["image"], "ghcr.io/nvshim/container-toolkit:0.1.0");
    assert_eq!(container["securityContext"]["privileged"], true);
    assert_eq!(
        strings(&container["args"]),
        [
            "--host-root=/host",
            "--runtime=containerd",
            "--runtime-name=nvidia",
            "--toolkit-dir=/usr/local/nvidia/toolkit",
            "--restart-mode=signal",
            "--driver-root=/",
            "--ready-file=/run/nvidia/validations/toolkit-ready",
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
}

fn case(name: &str) -> &'static str {
    CASES.iter().find(|(c, _)| *c == name).unwrap().1
}

#[test]
fn helm_values_reach_the_plugin_labels_exporter_and_installer() {
    // NVIDIA's value names become NVIDIA's variables on the plugin and the labels.
    let docs = render(case("labels, exporter and MIG")).unwrap();
    let plugin = &pod(object(&docs, "DaemonSet", "nvshim-device-plugin"))["containers"][0];
    let plugin_env = env(plugin);
    for (name, value) in [
        ("MIG_STRATEGY", "single"),
        ("FAIL_ON_INIT_ERROR", "false"),
        ("DEVICE_LIST_STRATEGY", "cdi-annotations,envvar"),
        ("DEVICE_ID_STRATEGY", "index"),
        ("NVIDIA_MIG_MONITOR_DEVICES", "all"),
    ] {
        assert_eq!(
            plugin_env.get(name).map(String::as_str),
            Some(value),
            "case {name}"
        );
    }
    assert_eq!(
        plugin["securityContext"]["capabilities"]["add"],
        json!(["SYS_ADMIN"])
    );
    let labels = &pod(object(&docs, "DaemonSet", "nvshim-labels"))["containers"][0];
    assert_eq!(strings(&labels["command"]), ["/usr/bin/nvshim", "labels"]);
    let labels_env = env(labels);
    for (name, value) in [
        ("GFD_MIG_STRATEGY", "single"),
        ("GFD_FAIL_ON_INIT_ERROR", "false"),
        ("GFD_NO_TIMESTAMP", "true"),
        ("GFD_SLEEP_INTERVAL", "30s"),
        (
            "GFD_OUTPUT_FILE",
            "/etc/kubernetes/node-feature-discovery/features.d/nvshim",
        ),
    ] {
        assert_eq!(
            labels_env.get(name).map(String::as_str),
            Some(value),
            "case {name}"
        );
    }
    // The exporter on its port, with the collectors file from its ConfigMap.
    let exporter = object(&docs, "DaemonSet", "nvshim-exporter");
    let container = &pod(exporter)["containers"][0];
    let exporter_env = env(container);
    assert_eq!(exporter_env["DCGM_EXPORTER_LISTEN"], ":9500");
    assert_eq!(
        exporter_env["DCGM_EXPORTER_COLLECTORS"],
        "/etc/nvshim-exporter/collectors.csv"
    );
    assert_eq!(
        container["ports"],
        json!([{"name": "metrics", "containerPort": 9500}])
    );
    let collectors = object(&docs, "ConfigMap", "nvshim-exporter-collectors");
    assert_eq!(
        collectors["data"]["collectors.csv"],
        "DCGM_FI_DEV_GPU_UTIL, gauge, GPU utilization (in %).\n"
    );
    let service = object(&docs, "Service", "nvshim-exporter");
    assert_eq!(
        service["spec"]["selector"],
        exporter["spec"]["selector"]["matchLabels"]
    );
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 9500, "targetPort": "metrics"}])
    );

    // CRI-O, systemd, the runtime as the default, a driver container.
    let docs = render(case("CRI-O with a driver container")).unwrap();
    let installer = &pod(object(&docs, "DaemonSet", "nvshim-toolkit"))["containers"][0];
    assert_eq!(
        strings(&installer["args"]),
        [
            "--host-root=/host",
            "--runtime=crio",
            "--runtime-name=nvidia",
            "--toolkit-dir=/opt/nvidia/toolkit",
            "--restart-mode=systemd",
            "--driver-root=/run/nvidia/driver",
            "--ready-file=/run/nvidia/validations/toolkit-ready",
            "--set-as-default",
            "--cdi-enabled",
            "--config=/etc/crio/crio.conf.d/99-nvidia.conf",
        ]
    );
    let spec = pod(object(&docs, "DaemonSet", "nvshim-device-plugin"));
    assert!(
        spec.get("runtimeClassName").is_none(),
        "the default runtime needs no class"
    );
    let plugin_env = env(&spec["containers"][0]);
    assert_eq!(plugin_env["NVIDIA_DRIVER_ROOT"], "/run/nvidia/driver");
    assert_eq!(
        plugin_env["NVIDIA_CDI_HOOK_PATH"],
        "/opt/nvidia/toolkit/nvidia-cdi-hook"
    );
    let driver_root = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "driver-root")
        .unwrap();
    assert_eq!(driver_root["hostPath"]["path"], "/run/nvidia/driver");
    assert!(
        spec["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .contains(
                &json!({"name": "driver-root", "mountPath": "/driver-root", "readOnly": true})
            )
    );
}

#[test]
fn helm_config_map_and_placement_reach_every_pod() {
    // Two configs: a ConfigMap of both, and the chosen one as every pod's config file.
    for (name, chosen) in [
        ("a config map of two configs", "mig-mixed"),
        ("two configs, the one named default", "default"),
    ] {
        let docs = render(case(name)).unwrap();
        let map = object(&docs, "ConfigMap", "nvshim-config");
        assert_eq!(map["data"].as_object().unwrap().len(), 2, "case {name}");
        for (workload, variable) in [
            ("nvshim-device-plugin", "CONFIG_FILE"),
            ("nvshim-labels", "GFD_CONFIG_FILE"),
        ] {
            let Some(ds) = find(&docs, "DaemonSet", workload) else {
                assert_eq!(workload, "nvshim-labels", "case {name}");
                continue;
            };
            let spec = pod(ds);
            let container = &spec["containers"][0];
            assert_eq!(
                env(container)[variable],
                format!("/config/{chosen}"),
                "case {name} {workload}"
            );
            let volume = spec["volumes"]
                .as_array()
                .unwrap()
                .iter()
                .find(|v| v["name"] == "config")
                .unwrap();
            assert_eq!(
                volume["configMap"]["name"], "nvshim-config",
                "case {name} {workload}"
            );
        }
    }
    let docs = render(case("a config map of two configs")).unwrap();
    let map = object(&docs, "ConfigMap", "nvshim-config");
    assert_eq!(
        map["data"]["mig-mixed"],
        "version: v1\nflags:\n  migStrategy: mixed\n"
    );

    // Custom placement: every node agent gets it, and no installer means no wait.
    let docs = render(case("custom placement, no installer")).unwrap();
    assert!(find(&docs, "DaemonSet", "nvshim-toolkit").is_none());
    for name in ["nvshim-device-plugin", "nvshim-labels", "nvshim-exporter"] {
        let spec = pod(object(&docs, "DaemonSet", name));
        assert_eq!(
            spec["nodeSelector"],
            json!({"nvidia.com/gpu.product": "A100-SXM4-80GB"}),
            "case {name}"
        );
        assert_eq!(
            spec["tolerations"],
            json!([{"key": "dedicated", "operator": "Equal", "value": "gpu", "effect": "NoSchedule"}]),
            "case {name}"
        );
        assert!(spec.get("affinity").is_none(), "case {name}");
        assert!(spec.get("initContainers").is_none(), "case {name}");
        assert!(spec.get("runtimeClassName").is_none(), "case {name}");
        assert_eq!(spec["priorityClassName"], "gpu-critical", "case {name}");
        assert_eq!(
            spec["imagePullSecrets"],
            json!([{"name": "registry"}]),
            "case {name}"
        );
        assert_eq!(
            spec["containers"][0]["image"], "registry.example/nvshim/plugin:0.2.0",
            "case {name}"
        );
        let ds = object(&docs, "DaemonSet", name);
        assert_eq!(
            ds["spec"]["template"]["metadata"]["annotations"]["team"], "ml",
            "case {name}"
        );
    }
    for name in ["nvshim-device-plugin", "nvshim-labels"] {
        let container = &pod(object(&docs, "DaemonSet", name))["containers"][0];
        assert_eq!(
            container["resources"],
            json!({"requests": {"cpu": "50m", "memory": "64Mi"}, "limits": {"memory": "128Mi"}}),
            "case {name}"
        );
    }
    let job = pod(object(&docs, "Job", "nvshim-validation-1"));
    assert_eq!(job["runtimeClassName"], "nvidia");
    assert!(job.get("initContainers").is_none());
}

#[test]
fn helm_chart_refuses_contradictory_values_by_name() {
    for (case, values, message) in [
        (
            "config.name and config.map",
            "config: {name: mine, map: {a: \"version: v1\"}}",
            "config.name (\"mine\") and config.map (keys a) are both set",
        ),
        (
            "config.default not in config.map",
            "config: {default: c, map: {a: \"version: v1\", b: \"version: v1\"}}",
            "config.default \"c\" is not a key of config.map (keys: a, b)",
        ),
        (
            "no config chosen",
            "config: {map: {a: \"version: v1\", b: \"version: v1\"}}",
            "pick no key of config.map (keys: a, b)",
        ),
        (
            "the default namespace",
            "namespaceOverride: default",
            "namespace \"default\" is refused",
        ),
    ] {
        let err = render(values).expect_err(case);
        assert!(err.contains(message), "case {case}: {err}");
    }
    // What those refusals allow.
    let docs = render("namespaceOverride: default\nallowDefaultNamespace: true").unwrap();
    assert_eq!(
        object(&docs, "DaemonSet", "nvshim-device-plugin")["metadata"]["namespace"],
        "default"
    );
    let docs = render(
        "config: {map: {a: \"version: v1\", b: \"version: v1\"}, fallbackStrategies: [empty]}",
    )
    .unwrap();
    let plugin = &pod(object(&docs, "DaemonSet", "nvshim-device-plugin"))["containers"][0];
    assert!(!env(plugin).contains_key("CONFIG_FILE"));
}

// SPDX-License-Identifier: Apache-2.0
//! What each value set puts in the objects: NVIDIA's value names as NVIDIA's variables on
//! the plugin and the labels, the installer's flags, the exporter's port and collectors,
//! a config map's chosen file, placement on every pod; image env as no allocation (the
//! installer's two toolkit flags, the plugin's volume-mounts default, every GPU pod of
//! ours asking by a mount) unless the installer is off or the values opt out; and the
//! values the chart refuses, each by name.

use serde_json::{Value, json};

use super::render::{case, env, find, object, pod, render, strings};

#[test]
fn helm_values_reach_the_plugin_labels_exporter_and_installer() {
    // NVIDIA's value names become NVIDIA's variables on the plugin and the labels.
    let docs = render(case("labels, exporter and MIG")).unwrap();
    let plugin = &pod(object(&docs, "DaemonSet", "nvshim-device-plugin"))["containers"][0];
    let plugin_env = env(plugin);
    for (name, value) in [
        ("MIG_STRATEGY", "single"),
        ("FAIL_ON_INIT_ERROR", "false"),
        ("DEVICE_LIST_STRATEGY", "cdi-annotations,volume-mounts"),
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
            "--accept-nvidia-visible-devices-envvar-when-unprivileged=false",
            "--accept-nvidia-visible-devices-as-volume-mounts=true",
            "--set-as-default",
            "--cdi-enabled",
            "--config=/etc/crio/crio.conf",
        ]
    );
    assert_eq!(
        installer["env"],
        json!([{"name": "RUNTIME_DROP_IN_CONFIG", "value": "/etc/crio/crio.conf.d/99-nvidia.conf"}])
    );
    // OpenShift: each agent's own service account may use the privileged SCC.
    let binding = object(&docs, "RoleBinding", "nvshim-privileged-scc");
    let role = object(&docs, "Role", "nvshim-privileged-scc");
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": ["security.openshift.io"], "resources": ["securitycontextconstraints"],
                "resourceNames": ["privileged"], "verbs": ["use"]}])
    );
    for ds in ["nvshim-toolkit", "nvshim-device-plugin"] {
        let account = &pod(object(&docs, "DaemonSet", ds))["serviceAccountName"];
        assert!(
            binding["subjects"].as_array().unwrap().contains(
                &json!({"kind": "ServiceAccount", "name": account, "namespace": "nvshim"})
            ),
            "case {ds}: {account} not bound"
        );
        let sa = object(&docs, "ServiceAccount", account.as_str().unwrap());
        assert_eq!(sa["automountServiceAccountToken"], false, "case {ds}");
    }
    assert_eq!(binding["subjects"].as_array().unwrap().len(), 2);

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
fn helm_mps_sharing_runs_the_control_daemon_on_mps_nodes() {
    let docs = render(case("MPS sharing")).unwrap();
    let daemon = object(&docs, "DaemonSet", "nvshim-mps-control-daemon");
    let spec = pod(daemon);
    assert_eq!(spec["hostPID"], true);
    assert_eq!(
        spec["nodeSelector"],
        json!({"pool": "gpu", "nvidia.com/mps.capable": "true"})
    );
    assert_eq!(spec["initContainers"][0]["name"], "toolkit-ready");
    let container = &spec["containers"][0];
    assert_eq!(
        strings(&container["command"]),
        ["/usr/bin/nvidia-device-plugin", "mps-control-daemon"]
    );
    let daemon_env = env(container);
    assert_eq!(daemon_env["MPS_ROOT"], "/run/nvidia/mps");
    assert_eq!(daemon_env["CONFIG_FILE"], "/config/mps");
    let root = spec["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "mps-root")
        .unwrap();
    assert_eq!(root["hostPath"]["path"], "/run/nvidia/mps");
    // The plugin gets the same root; the labels (which set nvidia.com/mps.capable) the
    // same config; without a config there is no daemon.
    let plugin = &pod(object(&docs, "DaemonSet", "nvshim-device-plugin"))["containers"][0];
    assert_eq!(env(plugin)["MPS_ROOT"], "/run/nvidia/mps");
    let labels = &pod(object(&docs, "DaemonSet", "nvshim-labels"))["containers"][0];
    assert_eq!(env(labels)["GFD_CONFIG_FILE"], "/config/mps");
    let docs = render(case("defaults")).unwrap();
    assert!(find(&docs, "DaemonSet", "nvshim-mps-control-daemon").is_none());
}

/// Our own pods that run through the runtime with every GPU.
const GPU_PODS: [(&str, &str); 5] = [
    ("DaemonSet", "nvshim-device-plugin"),
    ("DaemonSet", "nvshim-labels"),
    ("DaemonSet", "nvshim-exporter"),
    ("DaemonSet", "nvshim-mps-control-daemon"),
    ("Job", "nvshim-validation-1"),
];

/// Values that deploy every one of [`GPU_PODS`]: labels, exporter, and a config with MPS
/// sharing (the control daemon).
const EVERY_GPU_POD: &str = r#"
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
"#;

/// The installer's flags for "image env is not an allocation": config.toml's keys of the
/// same names.
const ALLOCATION_ONLY_ARGS: [&str; 2] = [
    "--accept-nvidia-visible-devices-envvar-when-unprivileged=false",
    "--accept-nvidia-visible-devices-as-volume-mounts=true",
];

/// The mount that asks the runtime for every GPU the way the plugin's volume-mounts
/// allocation does, and its volume.
fn all_gpus_mount() -> Value {
    json!({"name": "nvidia-all-gpus", "mountPath": "/var/run/nvidia-container-devices/all",
           "readOnly": true})
}

fn all_gpus_volume() -> Value {
    json!({"name": "nvidia-all-gpus", "hostPath": {"path": "/dev/null", "type": "CharDevice"}})
}

/// A pod's entries of a list (`volumes`, a container's `volumeMounts`) that touch the
/// device request: named `nvidia-all-gpus`, at `/var/run/nvidia-container-devices`, or of
/// `/dev/null`.
fn device_request_entries(list: &Value) -> Vec<&Value> {
    list.as_array()
        .map_or(&[][..], Vec::as_slice)
        .iter()
        .filter(|e| {
            e["name"] == "nvidia-all-gpus"
                || e["mountPath"]
                    .as_str()
                    .is_some_and(|p| p.starts_with("/var/run/nvidia-container-devices"))
                || e["hostPath"]["path"] == "/dev/null"
        })
        .collect()
}

#[test]
fn helm_image_env_is_no_allocation_unless_the_installer_is_off_or_the_values_opt_out() {
    for (mode, extra, allocation_only) in [
        ("defaults", "", true),
        (
            "installer.acceptEnvvarWhenUnprivileged=true",
            "installer: {acceptEnvvarWhenUnprivileged: true}\n",
            false,
        ),
        (
            "installer.enabled=false",
            "installer: {enabled: false}\n",
            false,
        ),
    ] {
        let docs = render(&format!("{EVERY_GPU_POD}{extra}"))
            .unwrap_or_else(|e| panic!("case {mode}: {e}"));

        // The installer writes the two toolkit keys, or leaves NVIDIA's defaults.
        let accept_args: Vec<&str> = find(&docs, "DaemonSet", "nvshim-toolkit")
            .map(|ds| strings(&pod(ds)["containers"][0]["args"]))
            .unwrap_or_default()
            .into_iter()
            .filter(|a| a.starts_with("--accept-"))
            .collect();
        let want: &[&str] = if allocation_only {
            &ALLOCATION_ONLY_ARGS
        } else {
            &[]
        };
        assert_eq!(accept_args, want, "case {mode}");

        // The plugin allocates by volume mounts, or by its own default (envvar).
        let plugin = &pod(object(&docs, "DaemonSet", "nvshim-device-plugin"))["containers"][0];
        assert_eq!(
            env(plugin).get("DEVICE_LIST_STRATEGY").map(String::as_str),
            allocation_only.then_some("volume-mounts"),
            "case {mode}"
        );

        // Each GPU pod of ours asks for every GPU by a mount on its main container, and
        // no other container (the readiness wait) does.
        for (kind, name) in GPU_PODS {
            let spec = pod(object(&docs, kind, name));
            let (want_mounts, want_volumes) = if allocation_only {
                (vec![all_gpus_mount()], vec![all_gpus_volume()])
            } else {
                (Vec::new(), Vec::new())
            };
            assert_eq!(
                device_request_entries(&spec["containers"][0]["volumeMounts"]),
                want_mounts.iter().collect::<Vec<_>>(),
                "case {mode} {name}"
            );
            assert_eq!(
                device_request_entries(&spec["volumes"]),
                want_volumes.iter().collect::<Vec<_>>(),
                "case {mode} {name}"
            );
            for container in spec["initContainers"]
                .as_array()
                .map_or(&[][..], Vec::as_slice)
            {
                assert_eq!(
                    device_request_entries(&container["volumeMounts"]),
                    Vec::<&Value>::new(),
                    "case {mode} {name} {}",
                    container["name"]
                );
            }
        }
        // The installer is no GPU pod: it gets no such mount.
        if let Some(installer) = find(&docs, "DaemonSet", "nvshim-toolkit") {
            let spec = pod(installer);
            assert!(
                device_request_entries(&spec["volumes"]).is_empty(),
                "case {mode}"
            );
        }
    }

    // A strategy given wins over the volume-mounts default, and the pods keep their mount;
    // envvar renders where the env var counts.
    for (mode, values, strategy, allocation_only) in [
        (
            "defaults, cdi-cri",
            "deviceListStrategy: cdi-cri",
            "cdi-cri",
            true,
        ),
        (
            "defaults, volume-mounts and cdi-annotations",
            "deviceListStrategy: volume-mounts,cdi-annotations",
            "volume-mounts,cdi-annotations",
            true,
        ),
        (
            "acceptEnvvarWhenUnprivileged, envvar",
            "installer: {acceptEnvvarWhenUnprivileged: true}\ndeviceListStrategy: envvar",
            "envvar",
            false,
        ),
        (
            "no installer, envvar",
            "installer: {enabled: false}\ndeviceListStrategy: envvar",
            "envvar",
            false,
        ),
    ] {
        let docs = render(values).unwrap_or_else(|e| panic!("case {mode}: {e}"));
        let spec = pod(object(&docs, "DaemonSet", "nvshim-device-plugin"));
        assert_eq!(
            env(&spec["containers"][0])["DEVICE_LIST_STRATEGY"],
            strategy,
            "case {mode}"
        );
        assert_eq!(
            device_request_entries(&spec["volumes"]).len(),
            usize::from(allocation_only),
            "case {mode}"
        );
    }
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
        // Image env is not an allocation: envvar could give no unprivileged pod a GPU.
        (
            "envvar with the defaults",
            "deviceListStrategy: envvar",
            "deviceListStrategy \"envvar\" lists envvar: the runtime refuses \
             NVIDIA_VISIBLE_DEVICES from unprivileged containers while \
             installer.acceptEnvvarWhenUnprivileged is false",
        ),
        (
            "envvar in a list, acceptEnvvarWhenUnprivileged=false given",
            "deviceListStrategy: cdi-annotations,envvar\n\
             installer: {acceptEnvvarWhenUnprivileged: false}",
            "deviceListStrategy \"cdi-annotations,envvar\" lists envvar",
        ),
    ] {
        let err = render(values).expect_err(case);
        assert!(err.contains(message), "case {case}: {err}");
        if case.starts_with("envvar") {
            // The way out: the strategies that allocate then, or the opt-out.
            for way_out in [
                "valid then: volume-mounts, cdi-annotations, cdi-cri",
                "or set installer.acceptEnvvarWhenUnprivileged=true",
            ] {
                assert!(err.contains(way_out), "case {case}: {err}");
            }
        }
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

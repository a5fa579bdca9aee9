//! The shipped Kubernetes manifests say what the README and NVIDIA's manifest say: the
//! DaemonSet in kube-system, the `nvidia.com/gpu` toleration, node-critical priority, the
//! device-plugins hostPath, no privilege, and probes on the port the plugin serves; the
//! metrics port, the ServiceMonitor that scrapes it and the Grafana dashboard agree with
//! the plugin and each other.

use std::fs;

use nvshim_device_plugin::config;
use serde_json::{Value, json};

const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deployments/nvidia-device-plugin.yml"
);

fn manifest() -> Value {
    let text = fs::read_to_string(MANIFEST).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

#[test]
fn the_daemonset_matches_nvidias_shape_and_drops_privilege() {
    let ds = manifest();
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"].as_array().unwrap().contains(
            &json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        )
    );
    let container = &pod["containers"][0];
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert!(security.get("privileged").is_none_or(|p| p == false));

    let volume = &pod["volumes"][0];
    assert_eq!(
        volume["hostPath"]["path"],
        "/var/lib/kubelet/device-plugins"
    );
    assert_eq!(
        container["volumeMounts"][0],
        json!({"name": volume["name"], "mountPath": "/var/lib/kubelet/device-plugins"})
    );
}

#[test]
fn the_probes_use_the_address_the_plugin_is_told_to_serve() {
    let ds = manifest();
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let env: Vec<(&str, &str)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let value = e["value"].as_str().unwrap_or_else(|| {
                // Only the node's name comes from the downward API.
                assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], "spec.nodeName");
                ""
            });
            (e["name"].as_str().unwrap(), value)
        })
        .collect();
    let addr = env
        .iter()
        .find(|(k, _)| *k == "NVSHIM_HEALTH_ADDR")
        .map(|(_, v)| *v)
        .expect("NVSHIM_HEALTH_ADDR");
    let port: u16 = addr.rsplit_once(':').unwrap().1.parse().unwrap();
    assert_eq!(container["ports"][0]["containerPort"], port);
    let name = &container["ports"][0]["name"];
    assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/healthz");
    assert_eq!(container["livenessProbe"]["httpGet"]["port"], *name);
    assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
    assert_eq!(container["readinessProbe"]["httpGet"]["port"], *name);
    // Every variable the manifest sets is one the plugin reads.
    let known = [
        config::ENV_FAIL_ON_INIT_ERROR,
        config::ENV_HEALTH_ADDR,
        config::ENV_MIG_STRATEGY,
        config::ENV_DEVICE_LIST_STRATEGY,
        config::ENV_DEVICE_ID_STRATEGY,
        nvshim_device_plugin::metrics::ENV_NODE_NAME,
    ];
    for (key, value) in env {
        assert!(known.contains(&key), "{key}={value}");
    }
}

const SERVICE_MONITOR: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deployments/servicemonitor.yml"
);
const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deployments/grafana-dashboard.json"
);

/// The manifest's `--metrics-addr` port: the one its `metrics` containerPort names.
fn metrics_port(container: &Value) -> u16 {
    let args: Vec<&str> = container["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    let addr = args
        .iter()
        .find_map(|a| a.strip_prefix("--metrics-addr="))
        .expect("--metrics-addr=[IP]:PORT in args");
    // The plugin parses it as the flag would.
    let parsed = config::parse_listen_addr(addr).unwrap();
    parsed.port()
}

#[test]
fn metrics_are_served_on_the_port_the_pod_declares_and_can_name_pods() {
    let ds = manifest();
    let pod = &ds["spec"]["template"]["spec"];
    let container = &pod["containers"][0];
    let port = metrics_port(container);
    let declared = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["name"] == "metrics")
        .expect("a port named metrics");
    assert_eq!(declared["containerPort"], port);
    // kubelet's pod-resources socket, read-only, where the plugin looks by default.
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/var/lib/kubelet/pod-resources")
        .expect("the pod-resources mount");
    assert_eq!(mount["readOnly"], true);
    assert!(config::POD_RESOURCES_SOCKET.starts_with("/var/lib/kubelet/pod-resources/"));
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the pod-resources volume");
    assert_eq!(volume["hostPath"]["path"], "/var/lib/kubelet/pod-resources");
}

/// The host's CDI spec directory is where the plugin writes its spec by default, so
/// the engines on the host read what a `cdi-*` strategy names.
#[test]
fn the_plugins_cdi_spec_directory_is_the_hosts() {
    let ds = manifest();
    let pod = &ds["spec"]["template"]["spec"];
    let mount = pod["containers"][0]["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "cdi-specs")
        .expect("the CDI spec mount");
    let default = config::Settings::default();
    assert_eq!(
        mount["mountPath"],
        default.cdi_spec_dir.display().to_string()
    );
    assert_ne!(mount["readOnly"], true, "the plugin writes there");
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "cdi-specs")
        .expect("the CDI spec volume");
    assert_eq!(volume["hostPath"]["path"], "/var/run/cdi");
    assert_eq!(volume["hostPath"]["type"], "DirectoryOrCreate");
}

#[test]
fn the_service_monitor_scrapes_the_plugins_metrics_port() {
    let ds = manifest();
    let text = fs::read_to_string(SERVICE_MONITOR).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let kind = |k: &str| {
        docs.iter()
            .find(|d| d["kind"] == k)
            .unwrap_or_else(|| panic!("no {k}"))
    };
    let (service, monitor) = (kind("Service"), kind("ServiceMonitor"));
    assert_eq!(
        service["metadata"]["namespace"],
        ds["metadata"]["namespace"]
    );
    assert_eq!(
        service["spec"]["selector"], ds["spec"]["template"]["metadata"]["labels"],
        "the Service selects the plugin's pods"
    );
    let container = &ds["spec"]["template"]["spec"]["containers"][0];
    let service_port = &service["spec"]["ports"][0];
    assert_eq!(service_port["targetPort"], "metrics");
    assert_eq!(service_port["port"], metrics_port(container));
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    for (key, value) in monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
    {
        assert_eq!(&service["metadata"]["labels"][key], value, "label {key}");
    }
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["port"], service_port["name"]);
    assert_eq!(endpoint["path"], "/metrics");
}

#[test]
fn the_dashboard_charts_metrics_the_plugin_serves() {
    let dashboard: Value = serde_json::from_str(&fs::read_to_string(DASHBOARD).unwrap()).unwrap();
    let datasource = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["type"] == "datasource")
        .expect("a datasource variable");
    assert_eq!(datasource["query"], "prometheus");
    let exprs: Vec<&str> = dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|p| p["targets"].as_array().into_iter().flatten())
        .filter_map(|t| t["expr"].as_str())
        .collect();
    let served = [
        "nvshim_gpu_utilization_ratio",
        "nvshim_gpu_memory_used_bytes",
        "nvshim_gpu_memory_total_bytes",
        "nvshim_gpu_temperature_celsius",
        "nvshim_gpu_power_watts",
        "nvshim_gpu_sm_clock_hertz",
        "nvshim_gpu_xid_errors_total",
        "nvshim_plugin_allocations_total",
        "nvshim_plugin_allocate_duration_seconds_bucket",
    ];
    for metric in served {
        assert!(
            exprs.iter().any(|e| e.contains(metric)),
            "no panel charts {metric}"
        );
    }
    // Every nvshim metric a panel names is one of the plugin's.
    for expr in &exprs {
        for word in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
            if word.starts_with("nvshim_") {
                let known = served.contains(&word)
                    || [
                        "nvshim_gpu_memory_utilization_ratio",
                        "nvshim_gpu_healthy",
                        "nvshim_plugin_registrations_total",
                        "nvshim_plugin_health_transitions_total",
                    ]
                    .contains(&word);
                assert!(
                    known,
                    "{word} in {expr:?} is not a metric the plugin serves"
                );
            }
        }
    }
}

const MPS_MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../deployments/nvidia-device-plugin-mps-control-daemon.yml"
);

#[test]
fn the_mps_control_daemon_runs_our_subcommand_on_mps_nodes_with_the_host_pids() {
    use clap::Parser as _;
    let ds: Value = serde_saphyr::from_str(&fs::read_to_string(MPS_MANIFEST).unwrap()).unwrap();
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(
        pod["hostPID"], true,
        "MPS clients are other pods' processes"
    );
    assert_eq!(
        pod["nodeSelector"],
        json!({"nvidia.com/mps.capable": "true"})
    );
    assert_eq!(pod["priorityClassName"], "system-node-critical");
    assert!(
        pod["tolerations"].as_array().unwrap().contains(
            &json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        )
    );

    // The command line is one the plugin binary parses into the daemon mode.
    let container = &pod["containers"][0];
    let argv: Vec<&str> = container["command"]
        .as_array()
        .unwrap()
        .iter()
        .chain(container["args"].as_array().unwrap())
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(argv[0], "nvidia-device-plugin");
    let args = config::PluginArgs::try_parse_from(&argv).unwrap();
    assert_eq!(args.command, Some(config::PluginCommand::MpsControlDaemon));

    let env: Vec<(&str, &str)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    for (key, value) in &env {
        assert!(
            [config::ENV_MPS_ROOT, config::ENV_CONFIG_FILE].contains(key),
            "{key}={value} is not a variable the daemon reads"
        );
    }
    let value = |name: &str| {
        env.iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| *v)
            .unwrap_or_else(|| panic!("{name} not set"))
    };
    // The root is the host's /run/nvidia/mps (NVIDIA's Helm default), mounted at the
    // same path, so the paths the daemon uses are the host paths the plugin mounts.
    let mounted = |path: &str| -> &Value {
        let mount = container["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| path.starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("nothing mounted at {path}"));
        pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap()
    };
    assert_eq!(value(config::ENV_MPS_ROOT), "/run/nvidia/mps");
    assert_eq!(
        mounted("/run/nvidia/mps")["hostPath"]["path"],
        "/run/nvidia/mps"
    );
    assert!(
        mounted(value(config::ENV_CONFIG_FILE))
            .get("configMap")
            .is_some(),
        "the config file comes from a ConfigMap"
    );
}

//! The shipped Kubernetes manifests say what the README and NVIDIA's manifest say: the
//! DaemonSet in kube-system, the `nvidia.com/gpu` toleration, node-critical priority, the
//! device-plugins hostPath, no privilege, and probes on the port the plugin serves.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;

use nvshim::plugin::config;
use serde_json::{Value, json};

const MANIFEST: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deployments/nvidia-device-plugin.yml"
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
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
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
    ];
    for (key, value) in env {
        assert!(known.contains(&key), "{key}={value}");
    }
}

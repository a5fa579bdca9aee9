// SPDX-License-Identifier: Apache-2.0
//! The labels DaemonSet and the example pod say what `nvshim labels` does: the args parse
//! as nvshim's own CLI, the output file lies in the hostPath NFD reads, the pod keeps
//! privilege dropped, and the example's node affinity names labels nvshim writes, with
//! `Gt` values that are single integers.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use crate::cli::labels::{self, DeviceFacts, Facts, LabelSettings};
use crate::cli::{Cli, Command};
use crate::inventory::{DriverInfo, Gpu, Inventory};
use clap::Parser;
use serde_json::{Value, json};

const DAEMONSET: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/deployments/nvshim-labels.yml");
const EXAMPLE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deployments/examples/gpu-memory-affinity.yml"
);
const FEATURES_D: &str = "/etc/kubernetes/node-feature-discovery/features.d";

fn load(path: &str) -> Value {
    let text = fs::read_to_string(path).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .unwrap_or_else(|| panic!("not a list: {value}"))
        .iter()
        .map(|v| v.as_str().unwrap_or_else(|| panic!("not a string: {v}")))
        .collect()
}

#[test]
fn the_daemonset_runs_nvshim_labels_into_nfds_directory() {
    let ds = load(DAEMONSET);
    assert_eq!(ds["kind"], "DaemonSet");
    assert_eq!(ds["metadata"]["namespace"], "kube-system");
    assert_eq!(
        ds["spec"]["selector"]["matchLabels"],
        ds["spec"]["template"]["metadata"]["labels"]
    );
    let pod = &ds["spec"]["template"]["spec"];
    assert!(
        pod["tolerations"].as_array().unwrap().contains(
            &json!({"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"})
        )
    );
    let container = &pod["containers"][0];
    assert_eq!(strings(&container["command"]), ["/usr/bin/nvshim"]);

    // The args are nvshim's: parse them with its own CLI.
    let args = strings(&container["args"]);
    let cli = Cli::try_parse_from(std::iter::once("nvshim").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let Command::Labels(labels) = cli.command else {
        panic!("not `nvshim labels`: {args:?}");
    };
    assert_eq!(labels.interval, Some(std::time::Duration::from_secs(60)));
    let output = labels.output.clone().expect("an output file");
    assert_eq!(output, Path::new(FEATURES_D).join("nvshim"));

    // The output's directory is the host's features.d, mounted at the same path.
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| output.starts_with(m["mountPath"].as_str().unwrap()))
        .expect("a mount holding the output file");
    assert_eq!(mount["mountPath"], FEATURES_D);
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .unwrap();
    assert_eq!(volume["hostPath"]["path"], FEATURES_D);
    assert!(mount.get("readOnly").is_none_or(|r| r == false));

    let env: Vec<(&str, &str)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    assert!(env.contains(&("NVIDIA_VISIBLE_DEVICES", "all")), "{env:?}");

    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
    assert!(security.get("privileged").is_none_or(|p| p == false));

    let terms = &pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let keys: Vec<&str> = terms
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["matchExpressions"].as_array().unwrap())
        .map(|e| e["key"].as_str().unwrap())
        .collect();
    assert!(keys.contains(&"nvidia.com/gpu.present"), "{keys:?}");
}

/// The labels nvshim writes for one A100 node, to check the example's keys against.
fn emitted_keys() -> Vec<String> {
    let inventory = Inventory {
        driver: DriverInfo {
            version: "550.54.15".into(),
            cuda_version: Some("12.4".into()),
        },
        gpus: vec![Gpu {
            index: 0,
            minor: 0,
            uuid: "GPU-00000000-0000-4000-8000-000000000000".into(),
            bus_id: "0000:07:00.0".into(),
            name: "NVIDIA A100-SXM4-80GB".into(),
            memory_bytes: Some(80 << 30),
            compute_capability: Some("8.0".into()),
            brand: None,
            mig_enabled: Some(false),
            mig_devices: Vec::new(),
        }],
    };
    let facts = Facts {
        inventory: &inventory,
        from_nvml: true,
        machine: None,
        devices: &DeviceFacts::default(),
    };
    labels::compute(&facts, &LabelSettings::default())
        .into_keys()
        .collect()
}

#[test]
fn the_example_pod_selects_on_memory_and_compute_capability() {
    let pod = load(EXAMPLE);
    assert_eq!(pod["kind"], "Pod");
    let terms = &pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        ["nodeSelectorTerms"];
    let expressions = terms[0]["matchExpressions"].as_array().unwrap();
    let emitted = emitted_keys();
    let mut gt = Vec::new();
    for expression in expressions {
        let key = expression["key"].as_str().unwrap();
        assert!(
            emitted.iter().any(|k| k == key),
            "{key} is not a label nvshim writes"
        );
        if expression["operator"] == "Gt" {
            let values = strings(&expression["values"]);
            assert_eq!(values.len(), 1, "Gt takes one value: {expression}");
            values[0]
                .parse::<i64>()
                .unwrap_or_else(|e| panic!("Gt value {:?}: {e}", values[0]));
            gt.push((key, values[0]));
        }
    }
    assert_eq!(
        gt,
        [
            ("nvidia.com/gpu.memory", "40000"),
            ("nvidia.com/gpu.compute.major", "7")
        ]
    );
    let limits = &pod["spec"]["containers"][0]["resources"]["limits"];
    assert_eq!(limits["nvidia.com/gpu"], 1);
}

const NODE_FEATURE_DAEMONSET: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deployments/nvshim-labels-nodefeature.yml"
);

/// The NodeFeature variant: the labeller runs as a service account that may do what
/// `node_feature::publish` and `remove` do (get, create, update, delete nodefeatures) in
/// its own namespace, its args parse as nvshim's and select the NodeFeature output, and
/// the node and namespace come from the downward API.
#[test]
fn the_node_feature_daemonset_publishes_with_its_service_account() {
    let text = fs::read_to_string(NODE_FEATURE_DAEMONSET).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
    let find = |kind: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind)
            .unwrap_or_else(|| panic!("no {kind}"))
    };
    let (account, role, binding, ds) = (
        find("ServiceAccount"),
        find("Role"),
        find("RoleBinding"),
        find("DaemonSet"),
    );
    let namespace = &ds["metadata"]["namespace"];
    for doc in [account, role, binding] {
        assert_eq!(&doc["metadata"]["namespace"], namespace, "{}", doc["kind"]);
    }
    let rule = role["rules"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| strings(&r["resources"]).contains(&"nodefeatures"))
        .expect("a rule for nodefeatures");
    assert_eq!(strings(&rule["apiGroups"]), ["nfd.k8s-sigs.io"]);
    let verbs = strings(&rule["verbs"]);
    for verb in ["get", "create", "update", "delete"] {
        assert!(verbs.contains(&verb), "{verb} missing from {verbs:?}");
    }
    assert_eq!(binding["roleRef"]["name"], role["metadata"]["name"]);
    assert_eq!(binding["roleRef"]["kind"], "Role");
    assert_eq!(
        binding["subjects"][0],
        json!({"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": namespace})
    );

    let pod = &ds["spec"]["template"]["spec"];
    assert_eq!(pod["serviceAccountName"], account["metadata"]["name"]);
    assert!(
        pod.get("volumes").is_none(),
        "no hostPath: the API replaces features.d"
    );
    let container = &pod["containers"][0];
    let args = strings(&container["args"]);
    let cli = Cli::try_parse_from(std::iter::once("nvshim").chain(args.iter().copied()))
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let Command::Labels(args) = cli.command else {
        panic!("not `nvshim labels`");
    };
    let field = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone())
    };
    assert_eq!(field("NODE_NAME"), Some(json!("spec.nodeName")));
    assert_eq!(field("NAMESPACE"), Some(json!("metadata.namespace")));
    // As the kubelet fills them in.
    let env = |name: &str| match name {
        "NODE_NAME" => Some("gpu-node-1".to_string()),
        "NAMESPACE" => Some("kube-system".to_string()),
        _ => None,
    };
    let resolved = labels::gfd::resolve(&args, &env, &Default::default()).unwrap();
    assert_eq!(
        resolved.output,
        labels::Output::NodeFeature {
            node: "gpu-node-1".into(),
            namespace: Some("kube-system".into()),
        }
    );
    assert_eq!(resolved.interval, Some(std::time::Duration::from_secs(60)));
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));
}

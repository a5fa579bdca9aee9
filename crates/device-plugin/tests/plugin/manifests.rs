// SPDX-License-Identifier: Apache-2.0
//! Every manifest in `deployments/` through tools we did not write: `kubernetes-validate
//! --strict` (Kubernetes' OpenAPI schemas, offline; unknown fields are errors) and
//! `kubectl kustomize` (all of them as one kustomization). Then the exporter's DaemonSet
//! (`nvshim-exporter.yml`) against dcgm-exporter's manifest shape and our plugin's, and
//! every manifest on NVIDIA's env-var requests (they run on a toolkit with NVIDIA's
//! defaults, not behind our installer).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

fn deployments() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deployments")
}

/// The manifests: every `*.yml` directly in `deployments/`.
fn manifest_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = fs::read_dir(deployments())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yml"))
        .collect();
    files.sort();
    files
}

fn documents(name: &str) -> Vec<Value> {
    let text = fs::read_to_string(deployments().join(name)).unwrap();
    serde_saphyr::from_multiple(&text).unwrap()
}

/// Runs a tool of the suite's (installed by `.ci/run`): success and stdout + stderr.
pub(crate) fn run(command: &mut Command, what: &str) -> (bool, String) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("cannot run {what} (.ci/run installs it): {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[test]
fn every_manifest_passes_kubernetes_validate_and_kustomize() {
    let files = manifest_files();
    assert!(files.len() >= 5, "{files:?}");
    for file in &files {
        let (ok, text) = run(
            Command::new("kubernetes-validate")
                .args(["--strict", "--no-warn"])
                .arg(file),
            "kubernetes-validate",
        );
        assert!(
            ok && !text.contains("ERROR"),
            "case {}:\n{text}",
            file.display()
        );
    }
    // The check fails on a manifest that is wrong.
    let dir = tempfile::tempdir().unwrap();
    let exporter = fs::read_to_string(deployments().join("nvshim-exporter.yml")).unwrap();
    let broken = dir.path().join("broken.yml");
    fs::write(
        &broken,
        exporter.replace("containerPort: 9400", "containerPort: metrics"),
    )
    .unwrap();
    let (ok, text) = run(
        Command::new("kubernetes-validate")
            .args(["--strict", "--no-warn"])
            .arg(&broken),
        "kubernetes-validate",
    );
    assert!(
        !ok || text.contains("ERROR"),
        "a string containerPort passed:\n{text}"
    );

    // All of them as one kustomization (kustomize wants them inside its directory); a
    // manifest that replaces another goes in a kustomization of its own, in its place.
    let name = |file: &PathBuf| file.file_name().unwrap().to_str().unwrap().to_owned();
    let names: Vec<String> = files.iter().map(name).collect();
    let mut sets: Vec<Vec<&str>> = vec![
        names
            .iter()
            .map(String::as_str)
            .filter(|n| !ALTERNATIVES.iter().any(|(alt, _)| alt == n))
            .collect(),
    ];
    for (alternative, replaces) in ALTERNATIVES {
        assert!(names.iter().any(|n| n == alternative), "{alternative}");
        sets.push(
            sets[0]
                .iter()
                .copied()
                .filter(|n| *n != replaces)
                .chain([alternative])
                .collect(),
        );
    }
    for set in sets {
        let dir = tempfile::tempdir().unwrap();
        let mut resources = String::from("resources:\n");
        for name in &set {
            fs::copy(deployments().join(name), dir.path().join(name)).unwrap();
            resources.push_str(&format!("  - {name}\n"));
        }
        fs::write(dir.path().join("kustomization.yaml"), resources).unwrap();
        let (ok, text) = run(
            Command::new("kubectl").arg("kustomize").arg(dir.path()),
            "kubectl",
        );
        assert!(ok, "kubectl kustomize {set:?}:\n{text}");
        assert!(text.contains("name: nvshim-exporter"), "{text}");
    }
}

/// Manifests that replace another (the same objects, deployed another way): `(file,
/// the file it replaces)`.
const ALTERNATIVES: [(&str, &str); 1] = [("nvshim-labels-nodefeature.yml", "nvshim-labels.yml")];

#[test]
fn the_exporter_daemonset_has_dcgm_exporters_shape() {
    let docs = documents("nvshim-exporter.yml");
    let ds = docs
        .iter()
        .find(|d| d["kind"] == "DaemonSet")
        .expect("a DaemonSet");
    let service = docs
        .iter()
        .find(|d| d["kind"] == "Service")
        .expect("a Service");
    let plugin = &documents("nvidia-device-plugin.yml")[0];
    let pod = &ds["spec"]["template"]["spec"];
    let plugin_pod = &plugin["spec"]["template"]["spec"];
    let labels = &ds["spec"]["template"]["metadata"]["labels"];
    assert_eq!(ds["spec"]["selector"]["matchLabels"], *labels);
    // Where our plugin runs: its namespace, toleration, priority and image.
    assert_eq!(ds["metadata"]["namespace"], plugin["metadata"]["namespace"]);
    assert_eq!(pod["tolerations"], plugin_pod["tolerations"]);
    assert_eq!(pod["priorityClassName"], plugin_pod["priorityClassName"]);
    let container = &pod["containers"][0];
    assert_eq!(container["image"], plugin_pod["containers"][0]["image"]);
    assert_eq!(container["command"], json!(["/usr/bin/nvshim"]));
    assert_eq!(container["args"][0], "exporter");

    // dcgm-exporter's environment names and port.
    let env: Vec<(&str, &str)> = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| (e["name"].as_str().unwrap(), e["value"].as_str().unwrap()))
        .collect();
    for expected in [
        ("DCGM_EXPORTER_LISTEN", ":9400"),
        ("DCGM_EXPORTER_KUBERNETES", "true"),
        ("DCGM_EXPORTER_INTERVAL", "30000"),
    ] {
        assert!(env.contains(&expected), "case {expected:?}: {env:?}");
    }
    assert_eq!(
        container["ports"],
        json!([{"name": "metrics", "containerPort": 9400}])
    );
    for probe in ["livenessProbe", "readinessProbe"] {
        let get = &container[probe]["httpGet"];
        assert_eq!(
            (&get["path"], &get["port"]),
            (&json!("/health"), &json!("metrics")),
            "case {probe}"
        );
    }
    let security = &container["securityContext"];
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"], json!(["ALL"]));

    // kubelet's pod-resources socket, read-only, where the exporter looks by default.
    let mount = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["mountPath"] == "/var/lib/kubelet/pod-resources")
        .expect("the pod-resources mount");
    assert_eq!(mount["readOnly"], true);
    assert!(
        nvshim::kubelet::pod_resources::DEFAULT_SOCKET
            .starts_with("/var/lib/kubelet/pod-resources/")
    );
    let volume = pod["volumes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == mount["name"])
        .expect("the pod-resources volume");
    assert_eq!(volume["hostPath"]["path"], "/var/lib/kubelet/pod-resources");

    // The Service: port 9400 named metrics, selecting the exporter's pods.
    assert_eq!(service["spec"]["selector"], *labels);
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "metrics", "port": 9400, "targetPort": "metrics"}])
    );
    // And a ServiceMonitor scrapes it.
    let monitors = documents("servicemonitor.yml");
    let monitor = monitors
        .iter()
        .find(|d| {
            d["kind"] == "ServiceMonitor"
                && d["spec"]["selector"]["matchLabels"] == service["metadata"]["labels"]
        })
        .expect("a ServiceMonitor selecting the exporter's Service");
    assert_eq!(monitor["spec"]["endpoints"][0]["port"], "metrics");

    // The image has the binary the DaemonSet runs.
    let dockerfile = fs::read_to_string(deployments().join("Dockerfile")).unwrap();
    assert!(
        dockerfile
            .lines()
            .any(|l| l.starts_with("COPY ") && l.ends_with(" /usr/bin/nvshim")),
        "deployments/Dockerfile does not install /usr/bin/nvshim"
    );
}

/// The loose manifests run without our installer, on nodes whose toolkit keeps NVIDIA's
/// defaults: the image's `NVIDIA_VISIBLE_DEVICES` is the request and volume mounts are
/// ignored. So none of them asks for GPUs by a mount under
/// `/var/run/nvidia-container-devices` or sets `DEVICE_LIST_STRATEGY` to `volume-mounts`
/// (an allocation would then reach no container); the Kustomize components add both, with
/// the installer flags that make the runtime read them (docs/kustomize.md).
#[test]
fn the_loose_manifests_keep_nvidias_env_var_requests() {
    let root = nvshim::request::VOLUME_MOUNT_ROOT;
    let mut containers = 0;
    for file in manifest_files() {
        let name = file.file_name().unwrap().to_str().unwrap().to_owned();
        for doc in documents(&name) {
            let spec = &doc["spec"]["template"]["spec"];
            let all = ["containers", "initContainers"]
                .into_iter()
                .flat_map(|key| spec[key].as_array().into_iter().flatten());
            for c in all {
                containers += 1;
                let mounts = c["volumeMounts"].as_array().into_iter().flatten();
                for m in mounts {
                    let path = m["mountPath"].as_str().unwrap_or("");
                    assert!(!path.starts_with(root), "case {name}: {c}");
                }
                let env = c["env"].as_array().into_iter().flatten();
                for e in env {
                    let strategy = e["name"] == "DEVICE_LIST_STRATEGY";
                    let value = e["value"].as_str().unwrap_or("");
                    assert!(
                        !(strategy && value.contains("volume-mounts")),
                        "case {name}: {c}"
                    );
                }
            }
        }
    }
    assert!(containers >= 5, "{containers} containers");
}

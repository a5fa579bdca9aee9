// SPDX-License-Identifier: Apache-2.0
//! `deployments/kustomize/`: every overlay (and the base) rendered by `kubectl kustomize`,
//! the output through `kubernetes-validate --strict` (Kubernetes' OpenAPI schemas,
//! offline; every kind must have a schema, so nothing passes unchecked: the OpenShift
//! overlay grants the built-in `privileged` SCC through RBAC, as NVIDIA's operator does,
//! and creates no SCC object), then what the deployment's order and safety rest on:
//! the RuntimeClass, the installer's `--runtime` for the overlay's engine, the init
//! container waiting for the installer's ready file and the `nvidia` runtime class in
//! every GPU workload, the validation
//! Job through the `nvidia` runtime class, the SCC grant covering every pod that needs
//! it, and the components' containers equal to the loose manifests' in `deployments/`
//! but for what makes image env no allocation: the installer's two
//! `--accept-nvidia-visible-devices-*` flags, the plugin's `DEVICE_LIST_STRATEGY`
//! (`volume-mounts`, through the plugin's own resolution) and every GPU pod's `/dev/null`
//! mount at `/var/run/nvidia-container-devices/all`. The opt-out that docs/kustomize.md
//! gives renders NVIDIA's toolkit defaults.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::manifests::run;

use nvshim::request::{VOLUME_MOUNT_ROOT, VOLUME_MOUNT_SOURCE};
use nvshim_device_plugin::config::{self, DeviceListStrategy, PluginArgs};
use serde_json::{Value, json};

const READY_FILE: &str = "/run/nvidia/validations/toolkit-ready";
const NAMESPACE: &str = "nvshim";

/// The installer's flags that make image env no allocation: the runtime ignores an
/// unprivileged container's `NVIDIA_VISIBLE_DEVICES` and takes volume mounts instead.
pub(crate) const ALLOCATION_ONLY_FLAGS: [&str; 2] = [
    "--accept-nvidia-visible-devices-envvar-when-unprivileged=false",
    "--accept-nvidia-visible-devices-as-volume-mounts=true",
];
/// The volume (and mount) by which our own GPU pods ask for every GPU.
pub(crate) const ALL_GPUS_VOLUME: &str = "nvidia-all-gpus";
pub(crate) const PLUGIN: &str = "nvidia-device-plugin-daemonset";

/// The path an allocation of every GPU mounts `/dev/null` at.
fn all_gpus_path() -> String {
    format!("{VOLUME_MOUNT_ROOT}/all")
}

pub(crate) fn deployments() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deployments")
}

/// `(overlay directory under deployments/kustomize, the engine its installer configures)`.
pub(crate) const OVERLAYS: [(&str, &str); 3] = [
    ("overlays/containerd", "containerd"),
    ("overlays/crio", "crio"),
    ("overlays/openshift", "crio"),
];

/// `kubectl kustomize <tree>/<dir>`.
pub(crate) fn render(tree: &Path, dir: &str) -> String {
    let (ok, text) = run(
        Command::new("kubectl").arg("kustomize").arg(tree.join(dir)),
        "kubectl",
    );
    assert!(ok, "kubectl kustomize {dir}:\n{text}");
    text
}

/// `kubernetes-validate --strict` on rendered files: `Err` with its report unless every
/// object passed and every kind had a schema.
fn validate(files: &[PathBuf]) -> Result<(), String> {
    let (ok, text) = run(
        Command::new("kubernetes-validate")
            .args(["--strict", "--quiet"])
            .args(files),
        "kubernetes-validate",
    );
    if ok && !text.contains("ERROR") && !text.contains("Couldn't find schema") {
        Ok(())
    } else {
        Err(text)
    }
}

fn by_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

pub(crate) fn named<'a>(docs: &'a [Value], kind: &str, name: &str) -> Result<&'a Value, String> {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .ok_or_else(|| format!("no {kind} {name}"))
}

pub(crate) fn pod(workload: &Value) -> &Value {
    &workload["spec"]["template"]["spec"]
}

fn strings(value: &Value) -> Vec<&str> {
    value
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The hostPath behind the volume a container mounts at `mount_path`.
fn host_path_at<'a>(pod: &'a Value, container: &Value, mount_path: &str) -> Option<&'a str> {
    let mount = container["volumeMounts"]
        .as_array()?
        .iter()
        .find(|m| m["mountPath"] == mount_path)?;
    pod["volumes"]
        .as_array()?
        .iter()
        .find(|v| v["name"] == mount["name"])?["hostPath"]["path"]
        .as_str()
}

/// Whether `pod` holds an init container that waits for the ready file, with the file's
/// host directory mounted read-only where it looks.
fn waits_for_toolkit(pod: &Value) -> bool {
    let dir = Path::new(READY_FILE)
        .parent()
        .and_then(Path::to_str)
        .unwrap_or("");
    pod["initContainers"].as_array().is_some_and(|inits| {
        inits.iter().any(|c| {
            let command = strings(&c["command"]);
            command.ends_with(&["doctor", "--wait-for", READY_FILE])
                && host_path_at(pod, c, dir) == Some(dir)
                && c["volumeMounts"]
                    .as_array()
                    .unwrap_or(&Vec::new())
                    .iter()
                    .any(|m| m["mountPath"] == dir && m["readOnly"] == true)
        })
    })
}

/// What a rendered overlay must hold; `Err` names the first thing missing.
fn check_overlay(docs: &[Value], engine: &str, openshift: bool) -> Result<(), String> {
    for doc in docs {
        let cluster_scoped =
            ["Namespace", "RuntimeClass"].contains(&doc["kind"].as_str().unwrap_or(""));
        if !cluster_scoped && doc["metadata"]["namespace"] != NAMESPACE {
            return Err(format!(
                "{} {} is not in {NAMESPACE}",
                doc["kind"], doc["metadata"]["name"]
            ));
        }
    }
    let class = named(docs, "RuntimeClass", "nvidia")?;
    if class["handler"] != "nvidia" {
        return Err(format!(
            "RuntimeClass nvidia has handler {}",
            class["handler"]
        ));
    }

    let installer = named(docs, "DaemonSet", "nvshim-installer")?;
    let ipod = pod(installer);
    let container = &ipod["containers"][0];
    let args = strings(&container["args"]);
    let runtimes: Vec<&&str> = args
        .iter()
        .filter(|a| a.starts_with("--runtime="))
        .collect();
    if runtimes != [&format!("--runtime={engine}").as_str()] {
        return Err(format!(
            "installer args {args:?}: want exactly --runtime={engine}"
        ));
    }
    if !args.contains(&"--host-root=/host") || host_path_at(ipod, container, "/host") != Some("/") {
        return Err(format!(
            "installer: the host's / is not --host-root=/host: {args:?}"
        ));
    }
    if host_path_at(ipod, container, "/run/nvidia") != Some("/run/nvidia") {
        return Err("installer: no hostPath /run/nvidia at /run/nvidia".into());
    }
    // Ready on its own install: the host's ready file is the old pod's during an update.
    let probe = strings(&container["readinessProbe"]["exec"]["command"]);
    if !probe.ends_with(&[
        "--wait-for",
        nvshim::cli::install::args::POD_READY_FILE,
        "--timeout",
        "1",
    ]) {
        return Err(format!(
            "installer: readiness probe {probe:?} is not on its own install"
        ));
    }
    if container["securityContext"]["privileged"] != true || ipod["hostPID"] != true {
        return Err("installer: not privileged with hostPID".into());
    }
    // What the image's `nvshim install` makes of the command line.
    let settings = crate::helm::installer_args::resolve(container)?;
    if settings.engine.unit() != engine || !settings.daemon {
        return Err(format!(
            "installer resolves to {:?} (daemon: {}), want {engine} and a daemon",
            settings.engine, settings.daemon
        ));
    }
    // Image env is not an allocation: both flags, and what `nvshim install` makes of them.
    let missing: Vec<&&str> = ALLOCATION_ONLY_FLAGS
        .iter()
        .filter(|f| !args.contains(f))
        .collect();
    if !missing.is_empty() {
        return Err(format!("installer args {args:?}: no {missing:?}"));
    }
    if (
        settings.accept_envvar_unprivileged,
        settings.accept_volume_mounts,
    ) != (false, true)
    {
        return Err(format!(
            "installer accepts the env var when unprivileged: {}, volume mounts: {}; \
             want false and true",
            settings.accept_envvar_unprivileged, settings.accept_volume_mounts
        ));
    }
    let rolling = &installer["spec"]["updateStrategy"]["rollingUpdate"];
    if (&rolling["maxSurge"], &rolling["maxUnavailable"]) != (&json!(1), &json!(0)) {
        return Err(format!(
            "installer: update strategy {rolling}: want maxSurge 1, maxUnavailable 0"
        ));
    }

    // Every GPU workload but the installer waits for it.
    let waiting: BTreeSet<&str> = by_kind(docs, "DaemonSet")
        .into_iter()
        .filter(|d| waits_for_toolkit(pod(d)))
        .filter_map(|d| d["metadata"]["name"].as_str())
        .collect();
    let want: BTreeSet<&str> = [PLUGIN, "nvshim-labels", "nvshim-exporter"].into();
    if waiting != want {
        return Err(format!(
            "DaemonSets waiting for {READY_FILE}: {waiting:?}, want {want:?}"
        ));
    }
    // ... and gets the driver through the nvidia runtime class (the installer does not
    // make it the engine's default).
    for name in &want {
        let class = &pod(named(docs, "DaemonSet", name)?)["runtimeClassName"];
        if class != "nvidia" {
            return Err(format!(
                "DaemonSet {name}: runtimeClassName {class}, want nvidia"
            ));
        }
    }

    // The plugin answers Allocate with volume mounts, the request the runtime takes.
    let strategies = plugin_strategies(&pod(named(docs, "DaemonSet", PLUGIN)?)["containers"][0])?;
    if strategies != [DeviceListStrategy::VolumeMounts] {
        return Err(format!(
            "{PLUGIN}: DEVICE_LIST_STRATEGY resolves to {strategies:?}, want [VolumeMounts]"
        ));
    }

    let job = named(docs, "Job", "nvshim-validation")?;
    let jpod = pod(job);
    // Every GPU pod of ours asks for every GPU the way an allocation does.
    for name in &want {
        asks_for_every_gpu(pod(named(docs, "DaemonSet", name)?))
            .map_err(|e| format!("DaemonSet {name}: {e}"))?;
    }
    asks_for_every_gpu(jpod).map_err(|e| format!("validation Job: {e}"))?;
    if jpod["runtimeClassName"] != "nvidia" {
        return Err(format!(
            "validation Job: runtimeClassName {}",
            jpod["runtimeClassName"]
        ));
    }
    let jc = &jpod["containers"][0];
    if !strings(&jc["command"]).ends_with(&["doctor", "--in-container"]) {
        return Err(format!("validation Job: command {}", jc["command"]));
    }
    let env = &jc["env"];
    for (name, value) in [
        ("NVIDIA_VISIBLE_DEVICES", "all"),
        ("NVIDIA_DRIVER_CAPABILITIES", "compute,utility"),
    ] {
        if !env
            .as_array()
            .is_some_and(|e| e.contains(&json!({"name": name, "value": value})))
        {
            return Err(format!("validation Job: no {name}={value} in {env}"));
        }
    }

    // OpenShift: every pod that only the privileged SCC admits runs under a service
    // account granted `use` of it.
    let needs_scc: BTreeSet<&str> = by_kind(docs, "DaemonSet")
        .into_iter()
        .chain(by_kind(docs, "Job"))
        .map(pod)
        .filter(|p| {
            let privileged = p["containers"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| {
                    c["securityContext"]["privileged"] == true
                        || c["securityContext"]["runAsUser"] == 0
                })
            });
            let host_path = p["volumes"]
                .as_array()
                .is_some_and(|vs| vs.iter().any(|v| v.get("hostPath").is_some()));
            privileged || host_path || p["hostPID"] == true
        })
        .map(|p| p["serviceAccountName"].as_str().unwrap_or("default"))
        .collect();
    let granted = scc_granted(docs);
    if openshift {
        let missing: Vec<&&str> = needs_scc.difference(&granted).collect();
        if !missing.is_empty() {
            return Err(format!(
                "service accounts not granted the privileged SCC: {missing:?}"
            ));
        }
    } else if !granted.is_empty() {
        return Err(format!("an SCC grant outside OpenShift: {granted:?}"));
    }
    Ok(())
}

/// The plugin container's `DEVICE_LIST_STRATEGY` as the plugin resolves its environment
/// (entries from the downward API left out).
pub(crate) fn plugin_strategies(container: &Value) -> Result<Vec<DeviceListStrategy>, String> {
    let env: BTreeMap<&str, &str> = container["env"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| Some((e["name"].as_str()?, e["value"].as_str()?)))
        .collect();
    let lookup = |name: &str| env.get(name).map(|v| (*v).to_owned());
    config::resolve(&PluginArgs::default(), &lookup)
        .map(|settings| settings.device_list_strategies)
        .map_err(|e| format!("{PLUGIN}: the plugin refuses its environment {env:?}: {e}"))
}

/// `Ok` when every container of `pod` mounts the `nvidia-all-gpus` volume read-only at
/// `/var/run/nvidia-container-devices/all`, that volume is the host's `/dev/null` (the
/// runtime counts no other source), and no init container mounts it (they need no GPU).
fn asks_for_every_gpu(pod: &Value) -> Result<(), String> {
    let path = all_gpus_path();
    let want = json!({"name": ALL_GPUS_VOLUME, "mountPath": path, "readOnly": true});
    for container in pod["containers"].as_array().into_iter().flatten() {
        let mounts = container["volumeMounts"].as_array();
        if !mounts.is_some_and(|m| m.contains(&want)) {
            return Err(format!(
                "container {} does not mount {ALL_GPUS_VOLUME} read-only at {path}",
                container["name"]
            ));
        }
    }
    for init in pod["initContainers"].as_array().into_iter().flatten() {
        let mounts = init["volumeMounts"].as_array().into_iter().flatten();
        if mounts.into_iter().any(|m| m["name"] == ALL_GPUS_VOLUME) {
            return Err(format!(
                "init container {} mounts {ALL_GPUS_VOLUME}",
                init["name"]
            ));
        }
    }
    let volume = pod["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|v| v["name"] == ALL_GPUS_VOLUME);
    let want = json!({"path": VOLUME_MOUNT_SOURCE, "type": "CharDevice"});
    match volume {
        Some(v) if v["hostPath"] == want && v.as_object().is_some_and(|o| o.len() == 2) => Ok(()),
        other => Err(format!(
            "volume {ALL_GPUS_VOLUME} is {other:?}, want hostPath {want}"
        )),
    }
}

/// The service accounts bound to a Role that allows `use` of the `privileged` SCC.
fn scc_granted(docs: &[Value]) -> BTreeSet<&str> {
    let roles: BTreeSet<&str> = by_kind(docs, "Role")
        .into_iter()
        .filter(|r| {
            r["rules"].as_array().is_some_and(|rules| {
                rules.iter().any(|rule| {
                    strings(&rule["apiGroups"]) == ["security.openshift.io"]
                        && strings(&rule["resources"]) == ["securitycontextconstraints"]
                        && strings(&rule["resourceNames"]) == ["privileged"]
                        && strings(&rule["verbs"]) == ["use"]
                })
            })
        })
        .filter_map(|r| r["metadata"]["name"].as_str())
        .collect();
    by_kind(docs, "RoleBinding")
        .into_iter()
        .filter(|b| {
            b["roleRef"]["kind"] == "Role"
                && roles.contains(b["roleRef"]["name"].as_str().unwrap_or(""))
        })
        .flat_map(|b| b["subjects"].as_array().into_iter().flatten())
        .filter(|s| s["kind"] == "ServiceAccount" && s["namespace"] == NAMESPACE)
        .filter_map(|s| s["name"].as_str())
        .collect()
}

/// Renders and checks every overlay of the tree at `tree` (a copy of
/// deployments/kustomize in the break test).
fn check_tree(tree: &Path) -> Result<(), String> {
    let scratch = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    let base = render(tree, "base");
    let base_docs: Vec<Value> = serde_saphyr::from_multiple(&base).unwrap();
    if by_kind(&base_docs, "RuntimeClass").len() != 1 || by_kind(&base_docs, "Namespace").len() != 1
    {
        return Err(format!(
            "base: want a Namespace and a RuntimeClass:\n{base}"
        ));
    }
    files.push(scratch.path().join("base.yaml"));
    fs::write(&files[0], &base).unwrap();
    for (dir, engine) in OVERLAYS {
        let text = render(tree, dir);
        let docs: Vec<Value> = serde_saphyr::from_multiple(&text).unwrap();
        check_overlay(&docs, engine, dir.ends_with("openshift"))
            .map_err(|e| format!("{dir}: {e}"))?;
        let file = scratch
            .path()
            .join(format!("{}.yaml", dir.replace('/', "-")));
        fs::write(&file, &text).unwrap();
        files.push(file);
    }
    validate(&files)
}

#[test]
fn every_kustomize_overlay_renders_validates_and_orders_the_pieces() {
    let tree = deployments().join("kustomize");
    check_tree(&tree).unwrap();

    // The checks fail on a broken tree: a copy without the plugin's init container, with
    // a field the schema refuses, with CRI-O's installer configuring containerd, with the
    // exporter's account left out of the SCC grant, with the labeller on another runtime
    // class, with the installer's runtime refusing volume mounts, with the plugin on the
    // envvar strategy, with the exporter's every-GPU mount elsewhere, with the validation
    // pod's every-GPU volume from another device, with the validation pod's account left
    // out of the SCC grant.
    let breaks: [(&str, &str, &str, &str); 10] = [
        (
            "overlays/crio/kustomization.yaml",
            "value: --runtime=crio",
            "value: --runtime=containerd",
            "want exactly --runtime=crio",
        ),
        (
            "overlays/openshift/privileged-scc.yaml",
            "name: nvshim-exporter",
            "name: nvshim-exporter-typo",
            "not granted the privileged SCC: [\"nvshim-exporter\"]",
        ),
        (
            "components/labels/labels.yaml",
            "runtimeClassName: nvidia",
            "runtimeClassName: runc",
            "runtimeClassName \"runc\", want nvidia",
        ),
        (
            "components/device-plugin/device-plugin.yaml",
            "--wait-for",
            "--wait-fr",
            "waiting for",
        ),
        (
            "components/exporter/exporter.yaml",
            "containerPort: 9400",
            "containerPort: metrics",
            "ERROR",
        ),
        (
            "components/installer/installer.yaml",
            "- --accept-nvidia-visible-devices-as-volume-mounts=true",
            "- --accept-nvidia-visible-devices-as-volume-mounts=false",
            "no [\"--accept-nvidia-visible-devices-as-volume-mounts=true\"]",
        ),
        (
            "components/device-plugin/device-plugin.yaml",
            "value: volume-mounts",
            "value: envvar",
            "DEVICE_LIST_STRATEGY resolves to [Envvar]",
        ),
        (
            "components/exporter/exporter.yaml",
            "mountPath: /var/run/nvidia-container-devices/all",
            "mountPath: /var/run/nvidia-container-devices/0",
            "DaemonSet nvshim-exporter: container \"nvshim-exporter\" does not mount",
        ),
        (
            "components/validation/validation.yaml",
            "path: /dev/null",
            "path: /dev/zero",
            "validation Job: volume nvidia-all-gpus",
        ),
        (
            "overlays/openshift/privileged-scc.yaml",
            "name: nvshim-validation",
            "name: nvshim-validation-typo",
            "not granted the privileged SCC: [\"nvshim-validation\"]",
        ),
    ];
    for (file, from, to, expected) in breaks {
        let copy = tempfile::tempdir().unwrap();
        copy_tree(&tree, copy.path());
        let path = copy.path().join(file);
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "case {file}: no {from:?}");
        fs::write(&path, text.replacen(from, to, 1)).unwrap();
        let error = check_tree(copy.path()).expect_err(&format!("case {file}: {to:?} passed"));
        assert!(error.contains(expected), "case {file}: {error}");
    }
}

pub(crate) fn copy_tree(from: &Path, to: &Path) {
    for entry in fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            fs::create_dir_all(&target).unwrap();
            copy_tree(&entry.path(), &target);
        } else {
            fs::copy(entry.path(), &target).unwrap();
        }
    }
}

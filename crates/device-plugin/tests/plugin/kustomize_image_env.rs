// SPDX-License-Identifier: Apache-2.0
//! `deployments/kustomize/` against the loose manifests and NVIDIA's defaults: the components
//! run the loose manifests' containers but for what makes image env no allocation, and the
//! opt-out that docs/kustomize.md gives renders NVIDIA's toolkit defaults.

use std::fs;

use nvshim_device_plugin::config::{self, DeviceListStrategy};
use serde_json::{Value, json};

use crate::kustomize::{
    ALL_GPUS_VOLUME, ALLOCATION_ONLY_FLAGS, OVERLAYS, PLUGIN, copy_tree, deployments, named,
    plugin_strategies, pod, render,
};

/// The components run the loose manifests' containers, tolerations and priority: one
/// definition of each workload, whichever way it is deployed. The loose manifests run
/// on a toolkit with NVIDIA's defaults (no installer of ours), where the env var is
/// the request and volume mounts are ignored; so the components' containers equal
/// theirs once the every-GPU mount (and the plugin's `DEVICE_LIST_STRATEGY`) is taken
/// out, and each container has it to take out.
#[test]
fn the_components_run_the_loose_manifests_containers() {
    let tree = deployments().join("kustomize");
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&render(&tree, "overlays/containerd")).unwrap();
    for (file, name) in [
        ("nvidia-device-plugin.yml", PLUGIN),
        ("nvshim-labels-nodefeature.yml", "nvshim-labels"),
        ("nvshim-exporter.yml", "nvshim-exporter"),
    ] {
        let loose: Vec<Value> =
            serde_saphyr::from_multiple(&fs::read_to_string(deployments().join(file)).unwrap())
                .unwrap();
        let loose = pod(named(&loose, "DaemonSet", name).unwrap());
        let ours = pod(named(&docs, "DaemonSet", name).unwrap());
        assert_eq!(
            allocation_neutral(&ours["containers"], name == PLUGIN),
            Ok(loose["containers"].clone()),
            "case {file} containers"
        );
        for key in ["tolerations", "priorityClassName", "affinity"] {
            assert_eq!(ours[key], loose[key], "case {file} {key}");
        }
    }
}

/// `containers` without the every-GPU mount (an emptied `volumeMounts` goes too) and,
/// with `plugin`, without `DEVICE_LIST_STRATEGY=volume-mounts`; `Err` names a container
/// that lacks one of them.
fn allocation_neutral(containers: &Value, plugin: bool) -> Result<Value, String> {
    let mut containers = containers.clone();
    let strategy = json!({"name": config::ENV_DEVICE_LIST_STRATEGY, "value": "volume-mounts"});
    for c in containers.as_array_mut().into_iter().flatten() {
        let name = c["name"].to_string();
        let obj = c.as_object_mut().ok_or(format!("container {name}"))?;
        let mounts = obj
            .get_mut("volumeMounts")
            .and_then(Value::as_array_mut)
            .ok_or(format!("container {name}: no volumeMounts"))?;
        let before = mounts.len();
        mounts.retain(|m| m["name"] != ALL_GPUS_VOLUME);
        if mounts.len() + 1 != before {
            return Err(format!(
                "container {name}: no single {ALL_GPUS_VOLUME} mount"
            ));
        }
        if mounts.is_empty() {
            obj.remove("volumeMounts");
        }
        if plugin {
            let env = obj
                .get_mut("env")
                .and_then(Value::as_array_mut)
                .ok_or(format!("container {name}: no env"))?;
            let before = env.len();
            env.retain(|e| *e != strategy);
            if env.len() + 1 != before {
                return Err(format!("container {name}: no {strategy}"));
            }
        }
    }
    Ok(containers)
}

/// The patches docs/kustomize.md gives to opt out (NVIDIA's toolkit defaults: the env
/// var counts, volume mounts do not, the plugin on its default strategy), verbatim.
const OPT_OUT: &str = "\
patches:
  - target: {kind: DaemonSet, name: nvshim-installer}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/args/4
        value: --accept-nvidia-visible-devices-envvar-when-unprivileged=false
      - op: remove
        path: /spec/template/spec/containers/0/args/4
      - op: test
        path: /spec/template/spec/containers/0/args/4
        value: --accept-nvidia-visible-devices-as-volume-mounts=true
      - op: remove
        path: /spec/template/spec/containers/0/args/4
  - target: {kind: DaemonSet, name: nvidia-device-plugin-daemonset}
    patch: |-
      - op: test
        path: /spec/template/spec/containers/0/env/0/name
        value: DEVICE_LIST_STRATEGY
      - op: remove
        path: /spec/template/spec/containers/0/env/0
";

#[test]
fn the_documented_opt_out_renders_nvidias_toolkit_defaults() {
    let doc = fs::read_to_string(deployments().join("../docs/kustomize.md")).unwrap();
    assert!(doc.contains(OPT_OUT), "docs/kustomize.md lacks:\n{OPT_OUT}");

    let tree = deployments().join("kustomize");
    for (overlay, _) in OVERLAYS {
        // An overlay next to the overlay it changes, as the document puts it.
        let copy = tempfile::tempdir().unwrap();
        copy_tree(&tree, copy.path());
        let base = overlay.trim_start_matches("overlays/");
        let opt_out = format!("overlays/{base}-envvar");
        let dir = copy.path().join(&opt_out);
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("kustomization.yaml"),
            format!(
                "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
                 resources:\n  - ../{base}\n{OPT_OUT}"
            ),
        )
        .unwrap();
        let docs: Vec<Value> = serde_saphyr::from_multiple(&render(copy.path(), &opt_out)).unwrap();
        let default: Vec<Value> = serde_saphyr::from_multiple(&render(&tree, overlay)).unwrap();

        let installer =
            &pod(named(&docs, "DaemonSet", "nvshim-installer").unwrap())["containers"][0];
        let settings = crate::helm::installer_args::resolve(installer)
            .unwrap_or_else(|e| panic!("case {overlay}: {e}"));
        assert_eq!(
            (
                settings.accept_envvar_unprivileged,
                settings.accept_volume_mounts
            ),
            (true, false),
            "case {overlay}"
        );
        let plugin = &pod(named(&docs, "DaemonSet", PLUGIN).unwrap())["containers"][0];
        assert_eq!(
            plugin_strategies(plugin),
            Ok(vec![DeviceListStrategy::Envvar]),
            "case {overlay}"
        );
        // Nothing else changes: the default with the flags and the variable taken out.
        let mut want = default;
        for doc in &mut want {
            let container = "/spec/template/spec/containers/0";
            if doc["kind"] != "DaemonSet" {
                continue;
            }
            if doc["metadata"]["name"] == "nvshim-installer" {
                let args = doc.pointer_mut(&format!("{container}/args"));
                if let Some(args) = args.and_then(Value::as_array_mut) {
                    args.retain(|a| !ALLOCATION_ONLY_FLAGS.iter().any(|f| a == f));
                }
            } else if doc["metadata"]["name"] == PLUGIN {
                let env = doc.pointer_mut(&format!("{container}/env"));
                if let Some(env) = env.and_then(Value::as_array_mut) {
                    env.retain(|e| e["name"] != config::ENV_DEVICE_LIST_STRATEGY);
                }
            }
        }
        assert_eq!(docs, want, "case {overlay}");
    }
}

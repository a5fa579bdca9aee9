//! Applies [`ContainerEdits`] to an OCI spec held as a `serde_json::Value`: the only
//! code that writes a container's `config.json`.
//!
//! Semantics follow the CDI reference library: a device node or mount with the same
//! path as one we add is replaced (remove by key, then add), env vars replace a
//! variable of the same name, identical hooks and cgroup rules are not added twice,
//! so applying the same edits twice gives the same spec. Everything we do not add is
//! left exactly where it was: no reordering, no dropped unknown fields. Missing
//! intermediate objects (`linux`, `linux.resources`, `hooks`) are created; a field of
//! the wrong JSON type is an error naming its JSON pointer, never overwritten.

use serde_json::{Map, Value, json};
use std::collections::HashSet;

use crate::cdi::{ContainerEdits, DeviceNode, Hook, Mount};
use crate::hook_contract::{HOOK_BINARY, TOOLKIT_HOOK_BINARY};

/// Basenames of the prestart hook dockerd adds for `--gpus` (and NVIDIA's alias).
/// Our runtime injects through the spec, so that hook would do the work twice.
pub const LEGACY_HOOK_NAMES: [&str; 2] = [HOOK_BINARY, TOOLKIT_HOOK_BINARY];

/// Set on specs our runtime edited, so a prestart hook that still runs (for example
/// one a hooks.d directory adds) knows the GPUs are already there.
pub const INJECTED_ANNOTATION: &str = "nvshim.io/injected";

/// What `apply` changed, for the debug log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    pub env: usize,
    pub device_nodes: usize,
    pub cgroup_rules: usize,
    pub mounts: usize,
    pub hooks: usize,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum InjectError {
    #[error("config.json is not a JSON object")]
    NotAnObject,
    #[error("config.json field {pointer} is {found}, expected {expected}")]
    Shape {
        pointer: String,
        expected: &'static str,
        found: &'static str,
    },
}

/// Applies `edits` to `spec`.
pub fn apply(spec: &mut Value, edits: &ContainerEdits) -> Result<Applied, InjectError> {
    let root = spec.as_object_mut().ok_or(InjectError::NotAnObject)?;
    let mut applied = Applied::default();

    if !edits.env.is_empty() {
        let process = object_at(root, "process", "/process")?;
        let env = array_at(process, "env", "/process/env")?;
        for var in &edits.env {
            let name = var.split_once('=').map_or(var.as_str(), |(n, _)| n);
            env.retain(|v| {
                v.as_str()
                    .is_none_or(|s| s.split_once('=').map_or(s, |(n, _)| n) != name)
            });
            env.push(Value::String(var.clone()));
            applied.env += 1;
        }
    }

    if !edits.device_nodes.is_empty() {
        let linux = object_at(root, "linux", "/linux")?;
        {
            let devices = array_at(linux, "devices", "/linux/devices")?;
            let nodes = last_by_key(&edits.device_nodes, |n| n.path.as_str());
            let paths: HashSet<&str> = nodes.iter().map(|n| n.path.as_str()).collect();
            devices.retain(|d| {
                d.get("path")
                    .and_then(Value::as_str)
                    .is_none_or(|p| !paths.contains(p))
            });
            for node in nodes {
                devices.push(device_entry(node));
                applied.device_nodes += 1;
            }
        }
        let resources = object_at(linux, "resources", "/linux/resources")?;
        let rules = array_at(resources, "devices", "/linux/resources/devices")?;
        for node in &edits.device_nodes {
            let rule = cgroup_rule(node);
            if !rules.contains(&rule) {
                rules.push(rule);
                applied.cgroup_rules += 1;
            }
        }
    }

    if !edits.mounts.is_empty() {
        let mounts = array_at(root, "mounts", "/mounts")?;
        let ours = last_by_key(&edits.mounts, |m| m.container_path.as_str());
        let destinations: HashSet<&str> = ours.iter().map(|m| m.container_path.as_str()).collect();
        mounts.retain(|m| {
            m.get("destination")
                .and_then(Value::as_str)
                .is_none_or(|d| !destinations.contains(d))
        });
        for mount in ours {
            mounts.push(mount_entry(mount));
            applied.mounts += 1;
        }
    }

    if !edits.hooks.is_empty() {
        let hooks = object_at(root, "hooks", "/hooks")?;
        for hook in &edits.hooks {
            let pointer = format!("/hooks/{}", hook.hook_name);
            let stage = array_at(hooks, &hook.hook_name, &pointer)?;
            let entry = hook_entry(hook);
            if !stage.contains(&entry) {
                stage.push(entry);
                applied.hooks += 1;
            }
        }
    }

    if !edits.additional_gids.is_empty() {
        let process = object_at(root, "process", "/process")?;
        let user = object_at(process, "user", "/process/user")?;
        let gids = array_at(user, "additionalGids", "/process/user/additionalGids")?;
        for gid in &edits.additional_gids {
            if !gids.iter().any(|g| g.as_u64() == Some(u64::from(*gid))) {
                gids.push(json!(gid));
            }
        }
    }
    Ok(applied)
}

/// The items whose key is not repeated later in `items`, in order: an edit replaces
/// the spec's entry with the same path, and a later edit replaces an earlier one.
/// One pass with a set instead of a scan of the spec per edit (the runtime applies
/// ~60 mounts to specs that already have ~10, on every GPU container start).
fn last_by_key<T>(items: &[T], key: impl Fn(&T) -> &str) -> Vec<&T> {
    let mut seen = HashSet::new();
    let mut out: Vec<&T> = items.iter().rev().filter(|i| seen.insert(key(i))).collect();
    out.reverse();
    out
}

/// Removes the `prestart` hooks dockerd adds for `--gpus` (by basename, as NVIDIA's
/// runtime does). Returns how many were removed.
pub fn remove_legacy_hooks(spec: &mut Value) -> usize {
    let Some(prestart) = spec
        .pointer_mut("/hooks/prestart")
        .and_then(Value::as_array_mut)
    else {
        return 0;
    };
    let before = prestart.len();
    prestart.retain(|hook| !is_legacy_hook(hook));
    before - prestart.len()
}

/// Marks `spec` as edited by our runtime ([`INJECTED_ANNOTATION`], the request's
/// devices as its value), creating `annotations` if needed.
pub fn mark(spec: &mut Value, devices: &str) -> Result<(), InjectError> {
    let root = spec.as_object_mut().ok_or(InjectError::NotAnObject)?;
    let annotations = root
        .entry("annotations")
        .or_insert_with(|| Value::Object(Map::new()));
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    let map = annotations.as_object_mut().ok_or(InjectError::Shape {
        pointer: "/annotations".into(),
        expected: "an object",
        found: "not an object",
    })?;
    map.insert(INJECTED_ANNOTATION.into(), Value::String(devices.into()));
    Ok(())
}

/// Whether `spec` carries the mark [`mark`] sets (a string annotation).
pub fn is_marked(spec: &Value) -> bool {
    spec.get("annotations")
        .and_then(Value::as_object)
        .and_then(|annotations| annotations.get(INJECTED_ANNOTATION))
        .is_some_and(Value::is_string)
}

/// Whether `spec` has a hook that [`remove_legacy_hooks`] would remove.
pub fn has_legacy_hook(spec: &Value) -> bool {
    spec.pointer("/hooks/prestart")
        .and_then(Value::as_array)
        .is_some_and(|hooks| hooks.iter().any(is_legacy_hook))
}

fn is_legacy_hook(hook: &Value) -> bool {
    hook.get("path")
        .and_then(Value::as_str)
        .and_then(|p| p.rsplit('/').next())
        .is_some_and(|base| LEGACY_HOOK_NAMES.contains(&base))
}

fn device_entry(node: &DeviceNode) -> Value {
    let mut entry = Map::new();
    entry.insert("path".into(), json!(node.path));
    entry.insert("type".into(), json!(node.kind.as_deref().unwrap_or("c")));
    if let Some(major) = node.major {
        entry.insert("major".into(), json!(major));
    }
    if let Some(minor) = node.minor {
        entry.insert("minor".into(), json!(minor));
    }
    if let Some(mode) = node.file_mode {
        entry.insert("fileMode".into(), json!(mode));
    }
    if let Some(uid) = node.uid {
        entry.insert("uid".into(), json!(uid));
    }
    if let Some(gid) = node.gid {
        entry.insert("gid".into(), json!(gid));
    }
    Value::Object(entry)
}

fn cgroup_rule(node: &DeviceNode) -> Value {
    let mut rule = Map::new();
    rule.insert("allow".into(), json!(true));
    rule.insert("type".into(), json!(node.kind.as_deref().unwrap_or("c")));
    if let Some(major) = node.major {
        rule.insert("major".into(), json!(major));
    }
    if let Some(minor) = node.minor {
        rule.insert("minor".into(), json!(minor));
    }
    rule.insert(
        "access".into(),
        json!(node.permissions.as_deref().unwrap_or("rwm")),
    );
    Value::Object(rule)
}

fn mount_entry(mount: &Mount) -> Value {
    json!({
        "destination": mount.container_path,
        "type": mount.kind.as_deref().unwrap_or("bind"),
        "source": mount.host_path,
        "options": mount.options,
    })
}

fn hook_entry(hook: &Hook) -> Value {
    let mut entry = Map::new();
    entry.insert("path".into(), json!(hook.path));
    if !hook.args.is_empty() {
        entry.insert("args".into(), json!(hook.args));
    }
    if !hook.env.is_empty() {
        entry.insert("env".into(), json!(hook.env));
    }
    if let Some(timeout) = hook.timeout {
        entry.insert("timeout".into(), json!(timeout));
    }
    Value::Object(entry)
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// `map[key]` as an object, created when absent (or null).
fn object_at<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
    pointer: &str,
) -> Result<&'a mut Map<String, Value>, InjectError> {
    let slot = map.entry(key).or_insert_with(|| Value::Object(Map::new()));
    if slot.is_null() {
        *slot = Value::Object(Map::new());
    }
    let found = kind(slot);
    slot.as_object_mut().ok_or_else(|| InjectError::Shape {
        pointer: pointer.to_string(),
        expected: "an object",
        found,
    })
}

/// `map[key]` as an array, created when absent (or null).
fn array_at<'a>(
    map: &'a mut Map<String, Value>,
    key: &str,
    pointer: &str,
) -> Result<&'a mut Vec<Value>, InjectError> {
    let slot = map.entry(key).or_insert_with(|| Value::Array(Vec::new()));
    if slot.is_null() {
        *slot = Value::Array(Vec::new());
    }
    let found = kind(slot);
    slot.as_array_mut().ok_or_else(|| InjectError::Shape {
        pointer: pointer.to_string(),
        expected: "an array",
        found,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn edits() -> ContainerEdits {
        ContainerEdits {
            env: vec!["NVIDIA_X=1".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: None,
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(0),
                file_mode: Some(0o666),
                permissions: Some("rwm".into()),
                uid: None,
                gid: None,
            }],
            mounts: vec![Mount {
                host_path: "/usr/bin/nvidia-smi".into(),
                container_path: "/usr/bin/nvidia-smi".into(),
                kind: Some("bind".into()),
                options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvshim".into(),
                args: vec!["nvshim".into(), "hook".into()],
                env: vec!["PATH=/usr/bin".into()],
                timeout: None,
            }],
            additional_gids: vec![44],
        }
    }

    fn docker_like() -> Value {
        json!({
            "ociVersion": "1.2.0",
            "x-unknown-top": {"keep": [1, 2]},
            "process": {"env": ["PATH=/bin", "NVIDIA_X=0"], "user": {"uid": 0, "gid": 0}, "x-unknown": true},
            "root": {"path": "rootfs"},
            "mounts": [
                {"destination": "/proc", "type": "proc", "source": "proc"},
                {"destination": "/usr/bin/nvidia-smi", "type": "bind", "source": "/elsewhere", "options": ["rbind"]},
                {"destination": "/data", "type": "bind", "source": "/srv"}
            ],
            "hooks": {"prestart": [
                {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]},
                {"path": "/usr/libexec/other-hook"}
            ]},
            "linux": {
                "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}],
                "resources": {"devices": [{"allow": false, "access": "rwm"}], "x-future": 1},
                "namespaces": [{"type": "time2"}]
            }
        })
    }

    #[test]
    fn edits_land_where_runc_reads_them() -> Result<(), InjectError> {
        let mut spec = docker_like();
        let applied = apply(&mut spec, &edits())?;
        assert_eq!(
            applied,
            Applied {
                env: 1,
                device_nodes: 1,
                cgroup_rules: 1,
                mounts: 1,
                hooks: 1
            }
        );
        assert_eq!(spec["process"]["env"], json!(["PATH=/bin", "NVIDIA_X=1"]));
        assert_eq!(
            spec["linux"]["devices"],
            json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}])
        );
        assert_eq!(
            spec["linux"]["resources"]["devices"][1],
            json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"})
        );
        let destinations: Vec<&str> = spec["mounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| m["destination"].as_str())
            .collect();
        assert_eq!(
            destinations,
            ["/proc", "/data", "/usr/bin/nvidia-smi"],
            "replaced, others kept in place"
        );
        assert_eq!(
            spec["hooks"]["createContainer"][0]["env"],
            json!(["PATH=/usr/bin"])
        );
        assert_eq!(spec["process"]["user"]["additionalGids"], json!([44]));
        // Untouched: unknown fields, future values, the legacy hook (removed separately).
        assert_eq!(spec["x-unknown-top"], json!({"keep": [1, 2]}));
        assert_eq!(spec["process"]["x-unknown"], json!(true));
        assert_eq!(spec["linux"]["resources"]["x-future"], json!(1));
        assert_eq!(spec["linux"]["namespaces"], json!([{"type": "time2"}]));
        assert_eq!(spec["hooks"]["prestart"].as_array().map(Vec::len), Some(2));
        Ok(())
    }

    #[test]
    fn applying_twice_changes_nothing_more() -> Result<(), InjectError> {
        let mut once = docker_like();
        apply(&mut once, &edits())?;
        let mut twice = once.clone();
        apply(&mut twice, &edits())?;
        assert_eq!(once, twice);
        Ok(())
    }

    #[test]
    fn missing_sections_are_created() -> Result<(), InjectError> {
        let mut spec = json!({"ociVersion": "1.0.2", "linux": null});
        apply(&mut spec, &edits())?;
        assert_eq!(spec["linux"]["devices"][0]["path"], "/dev/nvidia0");
        assert_eq!(spec["mounts"][0]["destination"], "/usr/bin/nvidia-smi");
        assert_eq!(spec["process"]["env"], json!(["NVIDIA_X=1"]));
        Ok(())
    }

    #[test]
    fn wrong_shapes_are_errors_naming_the_field() {
        let cases = [
            ("array root", json!([]), None),
            ("linux string", json!({"linux": "x"}), Some("/linux")),
            (
                "devices object",
                json!({"linux": {"devices": {}}}),
                Some("/linux/devices"),
            ),
            ("mounts number", json!({"mounts": 3}), Some("/mounts")),
            (
                "env string",
                json!({"process": {"env": "A=1"}}),
                Some("/process/env"),
            ),
            ("hooks array", json!({"hooks": []}), Some("/hooks")),
        ];
        for (name, mut spec, pointer) in cases {
            let before = spec.clone();
            match (apply(&mut spec, &edits()), pointer) {
                (Err(InjectError::NotAnObject), None) => {}
                (Err(InjectError::Shape { pointer: got, .. }), Some(want)) => {
                    assert_eq!(got, want, "case {name}")
                }
                (other, _) => panic!("case {name}: {other:?}"),
            }
            // A shape error may leave earlier sections edited in memory; the caller
            // never writes a spec whose apply failed.
            let _ = before;
        }
    }

    #[test]
    fn legacy_hooks_are_removed_by_basename_only() {
        let mut spec = docker_like();
        if let Some(prestart) = spec["hooks"]["prestart"].as_array_mut() {
            prestart.push(json!({"path": "/opt/bin/nvidia-container-toolkit"}));
        }
        assert!(has_legacy_hook(&spec));
        assert_eq!(remove_legacy_hooks(&mut spec), 2);
        assert_eq!(
            spec["hooks"]["prestart"],
            json!([{"path": "/usr/libexec/other-hook"}])
        );
        assert!(!has_legacy_hook(&spec));
        assert_eq!(remove_legacy_hooks(&mut json!({})), 0);
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|n| json!(n)),
            "[a-z/]{0,8}".prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::btree_map(
                    prop_oneof![
                        Just("linux".to_string()),
                        Just("mounts".to_string()),
                        Just("process".to_string()),
                        Just("hooks".to_string()),
                        Just("devices".to_string()),
                        Just("env".to_string()),
                        "[a-z]{1,6}"
                    ],
                    inner,
                    0..4
                )
                .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        #[test]
        fn apply_never_panics_and_is_idempotent(spec in arb_json()) {
            let mut once = spec.clone();
            if apply(&mut once, &edits()).is_ok() {
                let mut twice = once.clone();
                prop_assert!(apply(&mut twice, &edits()).is_ok());
                prop_assert_eq!(once, twice);
            }
            let mut s = spec;
            let _ = remove_legacy_hooks(&mut s);
        }
    }

    #[test]
    fn the_mark_is_written_and_read_here() {
        let mut spec = json!({"ociVersion": "1.0.2", "annotations": null});
        assert!(!is_marked(&spec));
        mark(&mut spec, "all").unwrap();
        assert!(is_marked(&spec));
        assert_eq!(spec["annotations"][INJECTED_ANNOTATION], "all");
        let mut spec = json!({"annotations": {"a": "b"}});
        mark(&mut spec, "0,1").unwrap();
        assert_eq!(
            spec["annotations"],
            json!({"a": "b", INJECTED_ANNOTATION: "0,1"})
        );
        // Only a string counts, as the tolerant views read annotations.
        assert!(!is_marked(
            &json!({"annotations": {INJECTED_ANNOTATION: 1}})
        ));
        assert_eq!(
            mark(&mut json!({"annotations": []}), "all"),
            Err(InjectError::Shape {
                pointer: "/annotations".into(),
                expected: "an object",
                found: "not an object",
            })
        );
        assert_eq!(mark(&mut json!([]), "all"), Err(InjectError::NotAnObject));
    }
}

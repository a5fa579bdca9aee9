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
//!
//! Each fragment we add (a device, a device cgroup rule, a mount, a hook) is built as
//! its `oci-spec` type and serialized into the document; the document itself stays a
//! `serde_json::Value` and is never read into `oci_spec::runtime::Spec`, which would
//! drop the fields it does not know.

use oci_spec::runtime::{LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType};
use serde_json::{Map, Value, json};
use std::collections::HashSet;
use std::path::PathBuf;

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
    #[error("device node {path}: unknown type {kind:?} (valid: b, c, u, p)")]
    DeviceType { path: String, kind: String },
    #[error("cannot write the OCI {what} for {key}: {reason}")]
    Fragment {
        what: &'static str,
        key: String,
        reason: String,
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
                devices.push(device_entry(node)?);
                applied.device_nodes += 1;
            }
        }
        let resources = object_at(linux, "resources", "/linux/resources")?;
        let rules = array_at(resources, "devices", "/linux/resources/devices")?;
        for node in &edits.device_nodes {
            let rule = cgroup_rule(node)?;
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
            mounts.push(mount_entry(mount)?);
            applied.mounts += 1;
        }
    }

    if !edits.hooks.is_empty() {
        let hooks = object_at(root, "hooks", "/hooks")?;
        for hook in &edits.hooks {
            let pointer = format!("/hooks/{}", hook.hook_name);
            let stage = array_at(hooks, &hook.hook_name, &pointer)?;
            let entry = hook_entry(hook)?;
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

/// The node's device type; absent or empty (CDI allows both) is `c`, the driver's.
fn device_type(node: &DeviceNode) -> Result<LinuxDeviceType, InjectError> {
    match node.kind.as_deref().unwrap_or("") {
        "" | "c" => Ok(LinuxDeviceType::C),
        "b" => Ok(LinuxDeviceType::B),
        "u" => Ok(LinuxDeviceType::U),
        "p" => Ok(LinuxDeviceType::P),
        other => Err(InjectError::DeviceType {
            path: node.path.clone(),
            kind: other.to_owned(),
        }),
    }
}

/// A fragment as JSON.
fn to_json<T: serde::Serialize>(
    what: &'static str,
    key: &str,
    fragment: &T,
) -> Result<Value, InjectError> {
    serde_json::to_value(fragment).map_err(|e| InjectError::Fragment {
        what,
        key: key.to_owned(),
        reason: e.to_string(),
    })
}

/// `linux.devices[]`: an `oci_spec` `LinuxDevice`. Its `major`/`minor` are not
/// optional, while a CDI node may leave them to the runtime: those the node does not
/// give are left out, as the CDI library leaves them.
fn device_entry(node: &DeviceNode) -> Result<Value, InjectError> {
    let mut device = LinuxDevice::default();
    device
        .set_path(PathBuf::from(&node.path))
        .set_typ(device_type(node)?)
        .set_major(node.major.unwrap_or(0))
        .set_minor(node.minor.unwrap_or(0))
        .set_file_mode(node.file_mode)
        .set_uid(node.uid)
        .set_gid(node.gid);
    let mut entry = to_json("device", &node.path, &device)?;
    if let Some(fields) = entry.as_object_mut() {
        if node.major.is_none() {
            fields.remove("major");
        }
        if node.minor.is_none() {
            fields.remove("minor");
        }
    }
    Ok(entry)
}

/// `linux.resources.devices[]`: an `oci_spec` `LinuxDeviceCgroup` allowing the node.
fn cgroup_rule(node: &DeviceNode) -> Result<Value, InjectError> {
    let mut rule = LinuxDeviceCgroup::default();
    rule.set_allow(true)
        .set_typ(Some(device_type(node)?))
        .set_major(node.major)
        .set_minor(node.minor)
        .set_access(Some(
            node.permissions.clone().unwrap_or_else(|| "rwm".to_owned()),
        ));
    to_json("device cgroup rule", &node.path, &rule)
}

/// `mounts[]`: an `oci_spec` `Mount`.
fn mount_entry(mount: &Mount) -> Result<Value, InjectError> {
    let mut entry = oci_spec::runtime::Mount::default();
    entry
        .set_destination(PathBuf::from(&mount.container_path))
        .set_typ(Some(
            mount.kind.clone().unwrap_or_else(|| "bind".to_owned()),
        ))
        .set_source(Some(PathBuf::from(&mount.host_path)))
        .set_options(Some(mount.options.clone()));
    to_json("mount", &mount.container_path, &entry)
}

/// `hooks.<stage>[]`: an `oci_spec` `Hook`.
fn hook_entry(hook: &Hook) -> Result<Value, InjectError> {
    let mut entry = oci_spec::runtime::Hook::default();
    entry
        .set_path(PathBuf::from(&hook.path))
        .set_args((!hook.args.is_empty()).then(|| hook.args.clone()))
        .set_env((!hook.env.is_empty()).then(|| hook.env.clone()))
        .set_timeout(hook.timeout);
    to_json("hook", &hook.path, &entry)
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
mod tests;

//! CDI wire types: the shape every front end speaks.
//!
//! [`ContainerEdits`] is the Container Device Interface's `containerEdits` object,
//! field for field, so what `nvshim list --json` prints, what the runtime applies to
//! `config.json` and what `nvshim cdi generate` writes are one value. [`Spec`] is a
//! whole spec file.
//!
//! The types, names and versions are plain data with no I/O; [`registry`] is the one
//! part that reads files: the spec directories (`/etc/cdi`, `/var/run/cdi`).

pub mod name;
pub mod registry;
pub mod spec;
pub mod transform;

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub use name::{CdiNameError, QualifiedName};
pub use registry::{Registry, RegistryError};
pub use spec::{SpecError, minimum_version};

/// The CDI spec version whose `containerEdits` fields we use.
pub const MIN_CDI_VERSION: &str = "0.5.0";

/// The environment every hook we put in a spec gets. An empty `env` would make runc
/// hand the hook its own environment (CVE-2025-23266).
pub const HOOK_ENV: &str = "PATH=/usr/sbin:/usr/bin:/sbin:/bin";

/// The kind of the GPU devices we generate and resolve: `nvidia.com/gpu`.
pub const NVIDIA_GPU_KIND: &str = "nvidia.com/gpu";

/// A CDI spec file: one kind of device, each device with its edits, plus the edits
/// every device of the spec shares.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Spec {
    pub cdi_version: String,
    /// `vendor/class`, e.g. `nvidia.com/gpu`.
    pub kind: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub devices: Vec<Device>,
    #[serde(default, skip_serializing_if = "ContainerEdits::is_empty")]
    pub container_edits: ContainerEdits,
}

/// One named device of a [`Spec`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Device {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
    pub container_edits: ContainerEdits,
}

/// `containerEdits`: what to add to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ContainerEdits {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub device_nodes: Vec<DeviceNode>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mounts: Vec<Mount>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hooks: Vec<Hook>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub additional_gids: Vec<u32>,
}

impl ContainerEdits {
    pub fn is_empty(&self) -> bool {
        self.env.is_empty()
            && self.device_nodes.is_empty()
            && self.mounts.is_empty()
            && self.hooks.is_empty()
            && self.additional_gids.is_empty()
    }

    /// Adds `other` the way the CDI library combines several devices' edits: a later
    /// env var, device node or mount replaces an earlier one with the same name or
    /// path; a hook or group already present is not added again. Then
    /// [`normalise`](Self::normalise).
    pub fn merge(&mut self, other: &ContainerEdits) {
        for var in &other.env {
            let name = env_name(var);
            self.env.retain(|v| env_name(v) != name);
            self.env.push(var.clone());
        }
        for node in &other.device_nodes {
            self.device_nodes.retain(|n| n.path != node.path);
            self.device_nodes.push(node.clone());
        }
        for mount in &other.mounts {
            self.mounts
                .retain(|m| m.container_path != mount.container_path);
            self.mounts.push(mount.clone());
        }
        for hook in &other.hooks {
            if !self.hooks.contains(hook) {
                self.hooks.push(hook.clone());
            }
        }
        for gid in &other.additional_gids {
            if !self.additional_gids.contains(gid) {
                self.additional_gids.push(*gid);
            }
        }
        self.normalise();
    }

    /// Puts the edits in the one order every producer uses, so edits built directly
    /// and edits assembled from a spec file compare equal: device nodes by path, mounts
    /// parents before children (as the CDI library sorts them, and as runc needs) then
    /// by path, each mount path once (the first wins). Env and hooks keep their order:
    /// it is meaningful.
    pub fn normalise(&mut self) {
        self.device_nodes.sort_by(|a, b| a.path.cmp(&b.path));
        self.mounts.sort_by(|a, b| {
            depth(&a.container_path)
                .cmp(&depth(&b.container_path))
                .then_with(|| a.container_path.cmp(&b.container_path))
        });
        // Sorted, so the same path is adjacent; the stable sort kept the first first.
        self.mounts
            .dedup_by(|later, first| later.container_path == first.container_path);
    }
}

fn env_name(var: &str) -> &str {
    var.split_once('=').map_or(var, |(name, _)| name)
}

/// How many names `path` has (`/usr/lib/x` has 3): what `Path::components` counts
/// past the root, in byte operations (the sort calls this often).
fn depth(path: &str) -> usize {
    path.split('/')
        .filter(|part| !part.is_empty() && *part != ".")
        .count()
}

/// A device node to create in the container and allow in its device cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct DeviceNode {
    /// Path inside the container, e.g. `/dev/nvidia0`.
    pub path: String,
    /// Path on the host when it differs from `path` (a separate dev root).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_path: Option<String>,
    /// `c` for the character devices NVIDIA's driver exposes.
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub major: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub minor: Option<i64>,
    /// Permission bits of the node as created in the container (the host's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file_mode: Option<u32>,
    /// Device cgroup access, `rwm`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permissions: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uid: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gid: Option<u32>,
}

/// A bind mount.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mount {
    pub host_path: String,
    pub container_path: String,
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub options: Vec<String>,
}

/// An OCI hook, tagged with the lifecycle stage it runs at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Hook {
    /// `createContainer`, `prestart`, ….
    pub hook_name: String,
    pub path: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Always set by us: an empty `env` makes runc hand the hook its own environment,
    /// which is how CVE-2025-23266 let an image's `LD_PRELOAD` into a host hook.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<i64>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_names_follow_the_cdi_spec() -> Result<(), serde_json::Error> {
        let edits = ContainerEdits {
            env: vec!["A=1".into()],
            device_nodes: vec![DeviceNode {
                path: "/dev/nvidia0".into(),
                host_path: Some("/x/dev/nvidia0".into()),
                kind: Some("c".into()),
                major: Some(195),
                minor: Some(0),
                file_mode: Some(0o666),
                permissions: Some("rwm".into()),
                uid: None,
                gid: None,
            }],
            mounts: vec![Mount {
                host_path: "/a".into(),
                container_path: "/b".into(),
                kind: Some("bind".into()),
                options: vec!["ro".into()],
            }],
            hooks: vec![Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvshim".into(),
                args: vec!["nvshim".into()],
                env: vec!["PATH=/usr/bin".into()],
                timeout: None,
            }],
            additional_gids: vec![],
        };
        let json = serde_json::to_value(&edits)?;
        assert_eq!(json["deviceNodes"][0]["hostPath"], "/x/dev/nvidia0");
        assert_eq!(json["deviceNodes"][0]["type"], "c");
        assert_eq!(json["deviceNodes"][0]["fileMode"], 0o666);
        assert_eq!(json["mounts"][0]["containerPath"], "/b");
        assert_eq!(json["hooks"][0]["hookName"], "createContainer");
        assert!(json.get("additionalGids").is_none());
        let back: ContainerEdits = serde_json::from_value(json)?;
        assert_eq!(back, edits);
        Ok(())
    }

    #[test]
    fn fields_we_cannot_apply_are_refused_not_dropped() {
        for (case, json) in [
            (
                "containerEdits.intelRdt",
                r#"{"cdiVersion":"0.7.0","kind":"a.com/b","devices":[{"name":"x","containerEdits":{"intelRdt":{"closID":"c"}}}]}"#,
            ),
            (
                "deviceNode field",
                r#"{"cdiVersion":"0.5.0","kind":"a.com/b","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"path":"/dev/x","future":1}]}}]}"#,
            ),
            (
                "spec field",
                r#"{"cdiVersion":"0.5.0","kind":"a.com/b","future":[],"devices":[{"name":"x","containerEdits":{"env":["A=1"]}}]}"#,
            ),
        ] {
            let err = serde_json::from_str::<Spec>(json).map(|_| ()).unwrap_err();
            assert!(err.to_string().contains("unknown field"), "{case}: {err}");
        }
    }
}

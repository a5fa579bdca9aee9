//! CDI wire types: the shape every front end speaks.
//!
//! [`ContainerEdits`] is the Container Device Interface's `containerEdits` object,
//! field for field, so what `nvshim list --json` prints, what the runtime applies to
//! `config.json` and what `nvshim cdi generate` writes are one value. This module is a
//! leaf: plain data and serde, no I/O.

use serde::{Deserialize, Serialize};

/// The CDI spec version whose `containerEdits` fields we use.
pub const MIN_CDI_VERSION: &str = "0.5.0";

/// `containerEdits`: what to add to a container's OCI spec.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
}

/// A device node to create in the container and allow in its device cgroup.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
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
#[serde(rename_all = "camelCase")]
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
#[serde(rename_all = "camelCase")]
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
}

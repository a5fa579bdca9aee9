//! One CDI spec file: its versions, parsing from bytes, validation, and writing.
//!
//! Parsing takes bytes and the file's path (for the format and for messages); the
//! reading is [`registry`](super::registry)'s. Validation follows the CDI library's
//! rules, and [`minimum_version`] is its version table: a spec must declare at least
//! the version whose features it uses, and `nvshim cdi generate` declares exactly that.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::name::{self, CdiNameError};
use super::{ContainerEdits, Spec};

/// The released CDI spec versions, oldest first.
pub const KNOWN_VERSIONS: &[&str] = &[
    "0.1.0", "0.2.0", "0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "1.0.0",
];

/// The largest spec file we read. NVIDIA's largest generated specs are well under a
/// MiB; the limit only stops a stray file from taking the runtime's memory.
pub const MAX_SPEC_SIZE: usize = 16 * 1024 * 1024;

/// The OCI hook stages a CDI hook may name.
pub const HOOK_NAMES: &[&str] = &[
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

/// Where in a spec an edit is, for messages: `device "0"` or the spec-level edits.
const SPEC_LEVEL: &str = "spec-level containerEdits";

/// Why a spec file cannot be used. [`parse`] names the file in every error; the rule
/// variants [`validate`] returns come wrapped in [`SpecError::Invalid`] there.
#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    #[error("CDI spec {} is {size} bytes, over the {MAX_SPEC_SIZE}-byte limit", path.display())]
    TooLarge { path: PathBuf, size: usize },
    #[error("CDI spec {} has an unsupported extension (valid: .json, .yaml, .yml)", path.display())]
    Extension { path: PathBuf },
    #[error("cannot parse CDI spec {} as JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("cannot parse CDI spec {} as YAML: {source}", path.display())]
    Yaml {
        path: PathBuf,
        #[source]
        source: Box<serde_saphyr::Error>,
    },
    /// A spec that parsed but broke a rule; the variants below say which.
    #[error("invalid CDI spec {}: {source}", path.display())]
    Invalid {
        path: PathBuf,
        #[source]
        source: Box<SpecError>,
    },
    #[error("cannot write CDI spec as YAML: {0}")]
    ToYaml(#[source] serde_saphyr::SerializeError),
    #[error("unknown cdiVersion {version:?} (known: {})", KNOWN_VERSIONS.join(", "))]
    UnknownVersion { version: String },
    #[error("spec uses features of CDI {required} but says cdiVersion {declared}")]
    VersionTooLow {
        required: &'static str,
        declared: String,
    },
    #[error("invalid kind: {0}")]
    Kind(#[source] CdiNameError),
    #[error("spec has no devices")]
    NoDevices,
    #[error("invalid device: {0}")]
    DeviceName(#[source] CdiNameError),
    #[error("device {name:?} is defined more than once")]
    DuplicateDevice { name: String },
    #[error("device {name:?} has no container edits")]
    NoEdits { name: String },
    #[error("{at}: env entry {entry:?} is not NAME=VALUE")]
    Env { at: String, entry: String },
    #[error("{at}: device node path {path:?} is not absolute")]
    DeviceNodePath { at: String, path: String },
    #[error("{at}: device node {path:?} has unknown type {kind:?} (valid: b, c, u, p)")]
    DeviceNodeType {
        at: String,
        path: String,
        kind: String,
    },
    #[error(
        "{at}: device node {path:?} has permissions {permissions:?} \
         (valid: a combination of r, w and m)"
    )]
    DeviceNodePermissions {
        at: String,
        path: String,
        permissions: String,
    },
    #[error("{at}: mount containerPath {path:?} is not absolute")]
    MountPath { at: String, path: String },
    #[error("{at}: mount at {path:?} has an empty hostPath")]
    MountHostPath { at: String, path: String },
    #[error("{at}: unknown hookName {name:?} (valid: {})", HOOK_NAMES.join(", "))]
    HookName { at: String, name: String },
    #[error("{at}: hook path {path:?} is not absolute")]
    HookPath { at: String, path: String },
}

/// A version as numbers, so `0.10.0` sorts after `0.9.0`.
fn version_key(version: &str) -> Option<(u32, u32, u32)> {
    let mut parts = version.split('.').map(|p| p.parse::<u32>().ok());
    let key = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(key)
}

/// The lowest CDI version whose features `spec` uses, by the CDI library's table:
/// 0.3.0 is the floor; mount `type` needs 0.4.0; a device name not starting with a
/// letter, or a device node `hostPath`, 0.5.0; annotations, or a `.` in the class,
/// 0.6.0; `additionalGids`, 0.7.0.
pub fn minimum_version(spec: &Spec) -> &'static str {
    let all_edits = || {
        std::iter::once(&spec.container_edits)
            .chain(spec.devices.iter().map(|d| &d.container_edits))
    };
    if all_edits().any(|e| !e.additional_gids.is_empty()) {
        return "0.7.0";
    }
    let dotted_class = spec
        .kind
        .split_once('/')
        .is_some_and(|(vendor, class)| !vendor.is_empty() && class.contains('.'));
    if !spec.annotations.is_empty()
        || spec.devices.iter().any(|d| !d.annotations.is_empty())
        || dotted_class
    {
        return "0.6.0";
    }
    let digit_name = spec.devices.iter().any(|d| {
        d.name
            .bytes()
            .next()
            .is_some_and(|c| !c.is_ascii_alphabetic())
    });
    let host_path = all_edits()
        .flat_map(|e| &e.device_nodes)
        .any(|n| n.host_path.as_deref().is_some_and(|p| !p.is_empty()));
    if digit_name || host_path {
        return "0.5.0";
    }
    let mount_type = all_edits()
        .flat_map(|e| &e.mounts)
        .any(|m| m.kind.as_deref().is_some_and(|k| !k.is_empty()));
    if mount_type {
        return "0.4.0";
    }
    "0.3.0"
}

/// Parses a spec file's contents: YAML for `.yaml`/`.yml`, JSON for `.json`, by the
/// extension of `path`. Then [`validate`]s it. Every error names `path`.
pub fn parse(bytes: &[u8], path: &Path) -> Result<Spec, SpecError> {
    if bytes.len() > MAX_SPEC_SIZE {
        return Err(SpecError::TooLarge {
            path: path.to_path_buf(),
            size: bytes.len(),
        });
    }
    let spec: Spec = match path.extension().and_then(|e| e.to_str()) {
        Some("json") => serde_json::from_slice(bytes).map_err(|source| SpecError::Json {
            path: path.to_path_buf(),
            source,
        })?,
        Some("yaml" | "yml") => {
            // One line, without the source snippet: the message goes into runc's log
            // and the registry's error list, which quote the file name instead.
            let options = serde_saphyr::options! { with_snippet: false };
            serde_saphyr::from_slice_with_options(bytes, options).map_err(|source| {
                SpecError::Yaml {
                    path: path.to_path_buf(),
                    source: Box::new(source),
                }
            })?
        }
        _ => {
            return Err(SpecError::Extension {
                path: path.to_path_buf(),
            });
        }
    };
    validate(&spec).map_err(|source| SpecError::Invalid {
        path: path.to_path_buf(),
        source: Box::new(source),
    })?;
    Ok(spec)
}

/// Checks a spec against the CDI rules: a known `cdiVersion` no lower than
/// [`minimum_version`], a valid kind, at least one device, valid and unique device
/// names, each device with edits, and well-formed edits.
pub fn validate(spec: &Spec) -> Result<(), SpecError> {
    let declared = version_key(&spec.cdi_version)
        .filter(|_| KNOWN_VERSIONS.contains(&spec.cdi_version.as_str()))
        .ok_or_else(|| SpecError::UnknownVersion {
            version: spec.cdi_version.clone(),
        })?;
    let required = minimum_version(spec);
    if version_key(required).is_some_and(|r| r > declared) {
        return Err(SpecError::VersionTooLow {
            required,
            declared: spec.cdi_version.clone(),
        });
    }
    name::parse_kind(&spec.kind).map_err(SpecError::Kind)?;
    if spec.devices.is_empty() {
        return Err(SpecError::NoDevices);
    }
    let mut seen = HashSet::new();
    for device in &spec.devices {
        name::validate_device_name(&device.name).map_err(SpecError::DeviceName)?;
        if !seen.insert(device.name.as_str()) {
            return Err(SpecError::DuplicateDevice {
                name: device.name.clone(),
            });
        }
        if device.container_edits.is_empty() {
            return Err(SpecError::NoEdits {
                name: device.name.clone(),
            });
        }
        validate_edits(
            &device.container_edits,
            &format!("device {:?}", device.name),
        )?;
    }
    validate_edits(&spec.container_edits, SPEC_LEVEL)
}

fn validate_edits(edits: &ContainerEdits, at: &str) -> Result<(), SpecError> {
    let at = || at.to_owned();
    for entry in &edits.env {
        // The CDI library wants a non-empty name before the '='.
        if entry.find('=').is_none_or(|i| i == 0) {
            return Err(SpecError::Env {
                at: at(),
                entry: entry.clone(),
            });
        }
    }
    for node in &edits.device_nodes {
        if !node.path.starts_with('/') {
            return Err(SpecError::DeviceNodePath {
                at: at(),
                path: node.path.clone(),
            });
        }
        if let Some(kind) = &node.kind
            && !matches!(kind.as_str(), "" | "b" | "c" | "u" | "p")
        {
            return Err(SpecError::DeviceNodeType {
                at: at(),
                path: node.path.clone(),
                kind: kind.clone(),
            });
        }
        if let Some(permissions) = &node.permissions
            && !permissions.chars().all(|c| matches!(c, 'r' | 'w' | 'm'))
        {
            return Err(SpecError::DeviceNodePermissions {
                at: at(),
                path: node.path.clone(),
                permissions: permissions.clone(),
            });
        }
    }
    for mount in &edits.mounts {
        if !mount.container_path.starts_with('/') {
            return Err(SpecError::MountPath {
                at: at(),
                path: mount.container_path.clone(),
            });
        }
        if mount.host_path.is_empty() {
            return Err(SpecError::MountHostPath {
                at: at(),
                path: mount.container_path.clone(),
            });
        }
    }
    for hook in &edits.hooks {
        if !HOOK_NAMES.contains(&hook.hook_name.as_str()) {
            return Err(SpecError::HookName {
                at: at(),
                name: hook.hook_name.clone(),
            });
        }
        if !hook.path.starts_with('/') {
            return Err(SpecError::HookPath {
                at: at(),
                path: hook.path.clone(),
            });
        }
    }
    Ok(())
}

/// The spec as pretty JSON with a trailing newline: what `nvshim cdi generate` writes
/// to a `.json` file.
pub fn to_json(spec: &Spec) -> Vec<u8> {
    // Serialising these types cannot fail: every map has string keys and every field
    // is plain data, so the empty fallback is never taken.
    let mut out = serde_json::to_vec_pretty(spec).unwrap_or_default();
    out.push(b'\n');
    out
}

/// The spec as YAML: what `nvshim cdi generate` writes to a `.yaml` file.
pub fn to_yaml(spec: &Spec) -> Result<String, SpecError> {
    serde_saphyr::to_string(spec).map_err(SpecError::ToYaml)
}

#[cfg(test)]
#[path = "spec_tests.rs"]
mod tests;

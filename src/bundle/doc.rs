// SPDX-License-Identifier: Apache-2.0
//! [`SpecDoc`]: `config.json` as a `serde_json::Value`, and the read views over it.

use serde_json::Value;

use super::{BundleError, kind_of};

/// `CAP_SYS_ADMIN`: a container holding it in its bounding set counts as privileged.
const CAP_SYS_ADMIN: &str = "CAP_SYS_ADMIN";

/// A parsed `config.json`.
///
/// Holds the whole document as a JSON object with its key order kept (serde_json's
/// `preserve_order`), so unknown fields, future enum values and the order of capability sets
/// survive a load and save untouched. Numbers keep their integer or float kind; integers
/// outside `i64`/`u64` and floats go through `f64` (the OCI spec has neither).
#[derive(Debug, Clone, PartialEq)]
pub struct SpecDoc {
    value: Value,
}

/// One entry of `mounts`, as read by [`SpecDoc::mounts`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MountView<'a> {
    /// Position in the `mounts` array (entries without a string `destination` are skipped, so
    /// positions can have gaps).
    pub index: usize,
    pub destination: &'a str,
    pub source: Option<&'a str>,
    /// The mount's `type`.
    pub kind: Option<&'a str>,
    /// String options only, in order.
    pub options: Vec<&'a str>,
}

impl SpecDoc {
    /// Parses `config.json` bytes. The document must be a JSON object; a syntax error names
    /// the line and column.
    pub fn parse(bytes: &[u8]) -> Result<SpecDoc, BundleError> {
        SpecDoc::parse_named(bytes, "config.json")
    }

    /// [`SpecDoc::parse`], with `what` (usually the file's path) in the error.
    pub(super) fn parse_named(bytes: &[u8], what: &str) -> Result<SpecDoc, BundleError> {
        let value = serde_json::from_slice(bytes).map_err(|source| BundleError::Json {
            what: what.to_owned(),
            source,
        })?;
        SpecDoc::with_name(value, what)
    }

    /// Wraps a document built elsewhere (tests, `serde_json::json!`). It must be an object.
    pub fn from_value(value: Value) -> Result<SpecDoc, BundleError> {
        SpecDoc::with_name(value, "config.json")
    }

    fn with_name(value: Value, what: &str) -> Result<SpecDoc, BundleError> {
        if value.is_object() {
            Ok(SpecDoc { value })
        } else {
            Err(BundleError::NotObject {
                what: what.to_owned(),
                found: kind_of(&value),
            })
        }
    }

    pub fn value(&self) -> &Value {
        &self.value
    }

    /// The document, for editing. Keep it an object: [`SpecDoc::to_vec`] writes whatever is
    /// here.
    pub fn value_mut(&mut self) -> &mut Value {
        &mut self.value
    }

    pub fn into_value(self) -> Value {
        self.value
    }

    /// Serializes the document as compact JSON with no trailing newline, as containerd, docker
    /// and podman write `config.json` (only `runc spec` indents, for people to read). Keys keep
    /// their order; unlike Go's encoder, `<`, `>` and `&` are not escaped, which is the same
    /// JSON.
    pub fn to_vec(&self) -> Result<Vec<u8>, BundleError> {
        // Room for a spec with GPUs injected, so the writer does not grow a few bytes at a
        // time (an 8-GPU spec is about 10 KiB).
        let mut bytes = Vec::with_capacity(16 * 1024);
        serde_json::to_writer(&mut bytes, &self.value)
            .map_err(|source| BundleError::Serialize { source })?;
        Ok(bytes)
    }

    /// `process.env`, string entries only, in order.
    pub fn env(&self) -> Vec<&str> {
        strings(self.value.pointer("/process/env"))
    }

    /// The value of `name` in `process.env`. The last entry wins, as in runc (its init sets
    /// the entries one after another) and in NVIDIA's toolkit (which reads them into a map).
    /// Entries without `=` define nothing.
    pub fn env_var(&self, name: &str) -> Option<&str> {
        self.env().into_iter().rev().find_map(|entry| {
            let (key, value) = entry.split_once('=')?;
            (key == name).then_some(value)
        })
    }

    /// `mounts`: every entry that is an object with a string `destination`.
    pub fn mounts(&self) -> Vec<MountView<'_>> {
        let Some(mounts) = self.value.get("mounts").and_then(Value::as_array) else {
            return Vec::new();
        };
        mounts
            .iter()
            .enumerate()
            .filter_map(|(index, mount)| {
                Some(MountView {
                    index,
                    destination: mount.get("destination")?.as_str()?,
                    source: mount.get("source").and_then(Value::as_str),
                    kind: mount.get("type").and_then(Value::as_str),
                    options: strings(mount.get("options")),
                })
            })
            .collect()
    }

    /// `annotations` with string values, in document order; other values are skipped.
    pub fn annotations(&self) -> Vec<(&str, &str)> {
        let Some(annotations) = self.value.get("annotations").and_then(Value::as_object) else {
            return Vec::new();
        };
        annotations
            .iter()
            .filter_map(|(key, value)| Some((key.as_str(), value.as_str()?)))
            .collect()
    }

    /// `process.capabilities.bounding`, or, in the form before runtime-spec 1.0.0-rc5 where
    /// `process.capabilities` was one plain array, that array.
    pub fn bounding_capabilities(&self) -> Vec<&str> {
        match self.value.pointer("/process/capabilities") {
            Some(Value::Array(_)) => strings(self.value.pointer("/process/capabilities")),
            Some(Value::Object(sets)) => strings(sets.get("bounding")),
            _ => Vec::new(),
        }
    }

    /// Whether the container is privileged by NVIDIA's definition: `CAP_SYS_ADMIN` is in its
    /// bounding set. That is what `--privileged` gives, and it still counts a container whose
    /// user is not root.
    pub fn is_privileged(&self) -> bool {
        self.bounding_capabilities().contains(&CAP_SYS_ADMIN)
    }

    /// `root.path`: the rootfs, relative to the bundle or absolute.
    pub fn root_path(&self) -> Option<&str> {
        self.value.pointer("/root/path").and_then(Value::as_str)
    }
}

/// The strings of `value` if it is an array; other elements are skipped.
fn strings(value: Option<&Value>) -> Vec<&str> {
    value
        .and_then(Value::as_array)
        .map(|items| items.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

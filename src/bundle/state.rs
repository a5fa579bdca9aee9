// SPDX-License-Identifier: Apache-2.0
//! [`OciState`]: the container state a runtime writes on a hook's stdin.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde_json::Value;

use super::{BundleError, kind_of};

const WHAT: &str = "OCI state";

/// The runtime state of a container, as a hook receives it.
///
/// Only `bundle` and `pid` matter to us, so the rest is read tolerantly: fields of the wrong
/// type read as absent, extra fields and statuses outside the spec (`paused`, or a future one)
/// are fine. That is why this is not `oci_spec::runtime::State`: it rejects statuses it does
/// not know (runc writes `paused`), a whole state for one field of the wrong type, and has no
/// `bundlePath` (runc before 1.0.0-rc5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OciState {
    pub oci_version: Option<String>,
    /// Empty if absent.
    pub id: String,
    pub status: Option<String>,
    /// The container's init process; absent before it exists (spec: required once `created`).
    pub pid: Option<i32>,
    /// From `bundle`, or `bundlePath` as runc before 1.0.0-rc5 wrote it.
    pub bundle: PathBuf,
    /// String values only.
    pub annotations: BTreeMap<String, String>,
}

/// Parses the state JSON. Fails only if it is not a JSON object, has no non-empty `bundle`
/// (or `bundlePath`), or has a `pid` that is not a positive `i32`.
pub fn parse_state(bytes: &[u8]) -> Result<OciState, BundleError> {
    let value: Value = serde_json::from_slice(bytes).map_err(|source| BundleError::Json {
        what: WHAT.to_owned(),
        source,
    })?;
    let Value::Object(fields) = value else {
        return Err(BundleError::NotObject {
            what: WHAT.to_owned(),
            found: kind_of(&value),
        });
    };
    let text = |key: &str| fields.get(key).and_then(Value::as_str).map(str::to_owned);

    let pid = match fields.get("pid") {
        None | Some(Value::Null) => None,
        Some(pid) => Some(
            pid.as_i64()
                .and_then(|p| i32::try_from(p).ok())
                .filter(|&p| p > 0)
                .ok_or_else(|| BundleError::State {
                    reason: format!("pid must be a positive process id, found {pid}"),
                })?,
        ),
    };
    let bundle = text("bundle")
        .filter(|b| !b.is_empty())
        .or_else(|| text("bundlePath").filter(|b| !b.is_empty()))
        .ok_or_else(|| BundleError::State {
            reason: "no bundle: neither \"bundle\" nor \"bundlePath\" is a non-empty string"
                .to_owned(),
        })?;
    let annotations = fields
        .get("annotations")
        .and_then(Value::as_object)
        .map(|map| {
            map.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect()
        })
        .unwrap_or_default();

    Ok(OciState {
        oci_version: text("ociVersion"),
        id: text("id").unwrap_or_default(),
        status: text("status"),
        pid,
        bundle: PathBuf::from(bundle),
        annotations,
    })
}

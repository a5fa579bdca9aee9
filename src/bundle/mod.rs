// SPDX-License-Identifier: Apache-2.0
//! The OCI bundle: its `config.json` as a JSON document, and the runtime state a hook reads.
//!
//! A leaf module. The runtime front end loads `config.json` into a [`SpecDoc`], reads what the
//! request needs through tolerant views ([`SpecDoc::env_var`], [`SpecDoc::mounts`], …), lets
//! `inject` edit the document, and replaces the file with [`Bundle::save`]; the prestart hook
//! reads the [`OciState`] on its stdin with [`parse_state`] to find the bundle and the
//! container's pid.
//!
//! The document stays a `serde_json::Value` (with key order preserved), never an
//! `oci_spec::runtime::Spec`: oci-spec drops unknown fields, reorders capability sets and
//! rejects enum values newer than the crate, and a runtime shim must hand runc back everything
//! it was given. The views never fail: a field of the wrong type reads as absent.
//!
//! What it must not do: decide anything about GPUs, or write `config.json` other than whole,
//! through a temp file and a rename.

mod dir;
mod doc;
mod state;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod roundtrip_tests;
#[cfg(test)]
mod tests;

use std::io;
use std::path::PathBuf;

pub use dir::{Bundle, CONFIG_FILE, Loaded};
pub use doc::{MountView, SpecDoc};
pub use state::{OciState, parse_state};

#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// `config.json` is a FIFO, a device or a directory: reading it could block or never
    /// end, so it is not read at all.
    #[error("{path} is not a regular file (found {found})")]
    NotRegular { path: PathBuf, found: &'static str },
    /// Writing `path` failed; `config.json` is unchanged.
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{what} is not valid JSON: {source}")]
    Json {
        /// The file, or `config.json` / `OCI state` when parsed from bytes.
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("{what} must be a JSON object, found {found}")]
    NotObject { what: String, found: &'static str },
    #[error("cannot serialize config.json: {source}")]
    Serialize {
        #[source]
        source: serde_json::Error,
    },
    /// The OCI state lacks, or has a bad, field that a hook needs.
    #[error("invalid OCI state: {reason}")]
    State { reason: String },
}

/// What kind of JSON value `value` is, for error messages.
fn kind_of(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

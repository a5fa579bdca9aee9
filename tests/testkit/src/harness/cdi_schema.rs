// SPDX-License-Identifier: Apache-2.0
//! The official CDI JSON schema (the copy Debian ships with the CDI Go library), for the
//! tests that check the specs we write (`tests/cdi_schema.rs`, the device plugin's
//! `tests/plugin/cdi.rs`). `defs.json` is resolved from the same directory: the validator runs offline and
//! never fetches anything.

use std::fs;
use std::path::Path;

use jsonschema::{Registry, Validator};
use serde_json::{Value, json};

/// Where `golang-github-container-orchestrated-devices-container-device-interface-dev`
/// installs the schema.
const SCHEMA_DIR: &str = "/usr/share/gocode/src/github.com/container-orchestrated-devices/\
                          container-device-interface/schema";
const PACKAGE: &str = "golang-github-container-orchestrated-devices-container-device-interface-dev";

/// Validators for a whole spec, and for a `containerEdits` object on its own (the
/// schema leaves the spec-level `containerEdits` unchecked, so we check it this way).
pub struct Schema {
    spec: Validator,
    edits: Validator,
}

impl Schema {
    /// Every schema error of `spec`, as `location: message` lines.
    pub fn errors(&self, spec: &Value) -> Vec<String> {
        let mut errors: Vec<String> = self
            .spec
            .iter_errors(spec)
            .map(|e| format!("{}: {e}", e.instance_path()))
            .collect();
        if let Some(edits) = spec.get("containerEdits") {
            errors.extend(
                self.edits
                    .iter_errors(edits)
                    .map(|e| format!("/containerEdits{}: {e}", e.instance_path())),
            );
        }
        errors
    }
}

/// The schema, or `None` (with a message) when the package is not installed; under
/// `CI=true` a missing schema fails the test instead.
pub fn schema(test: &str) -> Option<Schema> {
    let dir = Path::new(SCHEMA_DIR);
    if !dir.join("schema.json").is_file() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: {SCHEMA_DIR}/schema.json is missing: install the Debian package {PACKAGE} \
             (CI=true skips nothing)"
        );
        eprintln!("{test}: skipped: no CDI schema at {SCHEMA_DIR} (install {PACKAGE})");
        return None;
    }
    let read = |name: &str| -> Value {
        let path = dir.join(name);
        serde_json::from_slice(&fs::read(&path).unwrap())
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    };
    // schema.json refers to "defs.json#/definitions/…": relative to schema.json's own
    // file URI, that is defs.json's file URI, where the registry holds it.
    let base = format!("file://{SCHEMA_DIR}/schema.json");
    let defs = format!("file://{SCHEMA_DIR}/defs.json");
    let registry = Registry::new().add(&defs, read("defs.json")).unwrap();
    let registry = registry.prepare().unwrap();
    let build = |schema: &Value| {
        jsonschema::options()
            .with_base_uri(base.clone())
            .with_registry(&registry)
            .offline()
            .build(schema)
            .unwrap_or_else(|e| panic!("building a validator for {schema}: {e}"))
    };
    let spec = build(&read("schema.json"));
    let edits = build(&json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$ref": "defs.json#/definitions/containerEdits",
    }));
    Some(Schema { spec, edits })
}

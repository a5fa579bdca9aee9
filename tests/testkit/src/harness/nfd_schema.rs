// SPDX-License-Identifier: Apache-2.0
//! NFD's NodeFeature CRD schema (vendored in `tests/fixtures/nfd`, its source noted
//! there), for the tests of the NodeFeature output. Offline: nothing is fetched.

use std::path::Path;

use serde_json::Value;

/// The vendored schema, relative to the workspace root.
const SCHEMA: &str = "tests/fixtures/nfd/nodefeature-v1alpha1.schema.json";

/// Every schema error of `object`, as `location: message` lines.
pub fn errors(object: &Value) -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .join(SCHEMA);
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let schema: Value =
        serde_json::from_slice(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let validator = jsonschema::options()
        .offline()
        .build(&schema)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    validator
        .iter_errors(object)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

//! The specs `nvshim cdi generate` writes, JSON and YAML, for a plain 4-GPU node and
//! one with MIG devices, checked against the official CDI JSON schema (the copy
//! Debian ships with the CDI Go library), and against what podman 4.3's CDI library
//! needs beyond it: `cdiVersion` at most 0.5.0 and hooks runc can run.
//!
//! The schema and its validator are in `common::cdi_schema`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common::cdi_schema::schema;
use crate::common::{node, nvshim};
use nvshim_testkit::NodeSpec;
use serde_json::{Value, json};

/// The spec generated for `spec`'s node: as JSON, and as YAML read into JSON values.
fn generated(spec: &NodeSpec) -> (Value, Value) {
    let node = node(spec);
    let run = |format: &str| {
        crate::common::ok(
            nvshim(&node, &["cdi", "generate", "--format", format]),
            &format!("nvshim cdi generate --format {format}"),
        )
    };
    let json_text = run("json");
    let yaml_text = run("yaml");
    let from_json: Value = serde_json::from_str(&json_text).unwrap();
    let from_yaml: Value = serde_saphyr::from_str(&yaml_text)
        .unwrap_or_else(|e| panic!("the YAML spec does not parse: {e}\n{yaml_text}"));
    (from_json, from_yaml)
}

/// Every hook of `spec`: spec-level and in devices.
fn hooks(spec: &Value) -> Vec<&Value> {
    let devices = spec["devices"].as_array().into_iter().flatten();
    std::iter::once(&spec["containerEdits"])
        .chain(devices.map(|d| &d["containerEdits"]))
        .filter_map(|edits| edits["hooks"].as_array())
        .flatten()
        .collect()
}

fn device_names(spec: &Value) -> Vec<&str> {
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect()
}

#[test]
fn generated_specs_follow_the_cdi_schema() {
    let Some(schema) = schema("generated_specs_follow_the_cdi_schema") else {
        return;
    };
    let mig = NodeSpec::with_mig(4);
    let mig_uuid = mig.gpus[0].mig_devices[1].uuid.clone();
    let nodes = [
        ("standard(4)", NodeSpec::standard(4), vec!["0", "3", "all"]),
        (
            "with_mig(4)",
            mig,
            vec!["0", "0:0", "0:1", &mig_uuid, "all"],
        ),
    ];
    for (node_name, node_spec, want_names) in &nodes {
        let (from_json, from_yaml) = generated(node_spec);
        assert_eq!(
            from_json, from_yaml,
            "{node_name}: the JSON and YAML specs differ"
        );
        for (format, spec) in [("json", &from_json), ("yaml", &from_yaml)] {
            let case = format!("{node_name}, {format}");
            let errors = schema.errors(spec);
            assert!(
                errors.is_empty(),
                "{case}: not valid CDI:\n{}\n{spec:#}",
                errors.join("\n")
            );
            // Index names ("0") need 0.5.0, the newest version podman 4.3 reads.
            assert_eq!(spec["cdiVersion"], "0.5.0", "{case}: cdiVersion");
            assert_eq!(spec["kind"], "nvidia.com/gpu", "{case}: kind");
            let names = device_names(spec);
            for want in want_names {
                assert!(names.contains(want), "{case}: no device {want}: {names:?}");
            }
            let hooks = hooks(spec);
            assert!(!hooks.is_empty(), "{case}: no hook in the spec");
            for hook in hooks {
                let path = hook["path"].as_str().unwrap_or("");
                assert!(
                    path.starts_with('/'),
                    "{case}: hook path is not absolute: {hook}"
                );
                let env = hook["env"].as_array().map_or(0, Vec::len);
                assert!(env > 0, "{case}: hook without env: {hook}");
            }
        }
    }
}

#[test]
fn the_validator_rejects_broken_specs() {
    type Break = fn(&mut Value);
    let Some(schema) = schema("the_validator_rejects_broken_specs") else {
        return;
    };
    let (spec, _) = generated(&NodeSpec::standard(2));
    assert_eq!(
        schema.errors(&spec),
        Vec::<String>::new(),
        "the unbroken spec"
    );
    let cases: [(&str, Break); 5] = [
        ("no kind", |s| {
            s.as_object_mut().unwrap().remove("kind");
        }),
        ("device without containerEdits", |s| {
            s["devices"][0]
                .as_object_mut()
                .unwrap()
                .remove("containerEdits");
        }),
        ("device name a number", |s| {
            s["devices"][0]["name"] = json!(0);
        }),
        ("device node without path", |s| {
            let node = &mut s["devices"][0]["containerEdits"]["deviceNodes"][0];
            node.as_object_mut().unwrap().remove("path");
        }),
        ("spec-level hook without path", |s| {
            let hook = &mut s["containerEdits"]["hooks"][0];
            hook.as_object_mut().unwrap().remove("path");
        }),
    ];
    for (case, mutate) in cases {
        let mut broken = spec.clone();
        mutate(&mut broken);
        assert_ne!(broken, spec, "{case}: the mutation changed nothing");
        assert!(
            !schema.errors(&broken).is_empty(),
            "{case}: the validator accepted it"
        );
    }
}

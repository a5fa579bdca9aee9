//! `apply`, the mark and the fragments, on real-shaped specs.

use super::*;
use proptest::prelude::*;

fn edits() -> ContainerEdits {
    ContainerEdits {
        env: vec!["NVIDIA_X=1".into()],
        device_nodes: vec![DeviceNode {
            path: "/dev/nvidia0".into(),
            host_path: None,
            kind: Some("c".into()),
            major: Some(195),
            minor: Some(0),
            file_mode: Some(0o666),
            permissions: Some("rwm".into()),
            uid: None,
            gid: None,
        }],
        mounts: vec![Mount {
            host_path: "/usr/bin/nvidia-smi".into(),
            container_path: "/usr/bin/nvidia-smi".into(),
            kind: Some("bind".into()),
            options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
        }],
        hooks: vec![Hook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvshim".into(),
            args: vec!["nvshim".into(), "hook".into()],
            env: vec!["PATH=/usr/bin".into()],
            timeout: None,
        }],
        additional_gids: vec![44],
    }
}

fn docker_like() -> Value {
    json!({
        "ociVersion": "1.2.0",
        "x-unknown-top": {"keep": [1, 2]},
        "process": {"env": ["PATH=/bin", "NVIDIA_X=0"], "user": {"uid": 0, "gid": 0}, "x-unknown": true},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": "/usr/bin/nvidia-smi", "type": "bind", "source": "/elsewhere", "options": ["rbind"]},
            {"destination": "/data", "type": "bind", "source": "/srv"}
        ],
        "hooks": {"prestart": [
            {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["nvidia-container-runtime-hook", "prestart"]},
            {"path": "/usr/libexec/other-hook"}
        ]},
        "linux": {
            "devices": [{"path": "/dev/nvidia0", "type": "c", "major": 1, "minor": 1}],
            "resources": {"devices": [{"allow": false, "access": "rwm"}], "x-future": 1},
            "namespaces": [{"type": "time2"}]
        }
    })
}

#[test]
fn edits_land_where_runc_reads_them() -> Result<(), InjectError> {
    let mut spec = docker_like();
    let applied = apply(&mut spec, &edits())?;
    assert_eq!(
        applied,
        Applied {
            env: 1,
            device_nodes: 1,
            cgroup_rules: 1,
            mounts: 1,
            hooks: 1
        }
    );
    assert_eq!(spec["process"]["env"], json!(["PATH=/bin", "NVIDIA_X=1"]));
    assert_eq!(
        spec["linux"]["devices"],
        json!([{"path": "/dev/nvidia0", "type": "c", "major": 195, "minor": 0, "fileMode": 438}])
    );
    assert_eq!(
        spec["linux"]["resources"]["devices"][1],
        json!({"allow": true, "type": "c", "major": 195, "minor": 0, "access": "rwm"})
    );
    let destinations: Vec<&str> = spec["mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["destination"].as_str())
        .collect();
    assert_eq!(
        destinations,
        ["/proc", "/data", "/usr/bin/nvidia-smi"],
        "replaced, others kept in place"
    );
    assert_eq!(
        spec["hooks"]["createContainer"][0]["env"],
        json!(["PATH=/usr/bin"])
    );
    assert_eq!(spec["process"]["user"]["additionalGids"], json!([44]));
    // Untouched: unknown fields, future values, the legacy hook (removed separately).
    assert_eq!(spec["x-unknown-top"], json!({"keep": [1, 2]}));
    assert_eq!(spec["process"]["x-unknown"], json!(true));
    assert_eq!(spec["linux"]["resources"]["x-future"], json!(1));
    assert_eq!(spec["linux"]["namespaces"], json!([{"type": "time2"}]));
    assert_eq!(spec["hooks"]["prestart"].as_array().map(Vec::len), Some(2));
    Ok(())
}

#[test]
fn applying_twice_changes_nothing_more() -> Result<(), InjectError> {
    let mut once = docker_like();
    apply(&mut once, &edits())?;
    let mut twice = once.clone();
    apply(&mut twice, &edits())?;
    assert_eq!(once, twice);
    Ok(())
}

#[test]
fn missing_sections_are_created() -> Result<(), InjectError> {
    let mut spec = json!({"ociVersion": "1.0.2", "linux": null});
    apply(&mut spec, &edits())?;
    assert_eq!(spec["linux"]["devices"][0]["path"], "/dev/nvidia0");
    assert_eq!(spec["mounts"][0]["destination"], "/usr/bin/nvidia-smi");
    assert_eq!(spec["process"]["env"], json!(["NVIDIA_X=1"]));
    Ok(())
}

#[test]
fn device_fragments_follow_the_node() {
    let mut e = edits();
    e.device_nodes[0].kind = Some(String::new());
    e.device_nodes[0].minor = None;
    let mut spec = json!({});
    apply(&mut spec, &e).unwrap();
    assert_eq!(
        spec.pointer("/linux/devices/0"),
        Some(&json!({"path": "/dev/nvidia0", "type": "c", "major": 195, "fileMode": 438})),
        "an empty type is c; an absent minor stays absent"
    );
    assert_eq!(
        spec.pointer("/linux/resources/devices/0"),
        Some(&json!({"allow": true, "type": "c", "major": 195, "access": "rwm"}))
    );
    e.device_nodes[0].kind = Some("x".into());
    let err = apply(&mut json!({}), &e).unwrap_err();
    assert_eq!(
        err.to_string(),
        "device node /dev/nvidia0: unknown type \"x\" (valid: b, c, u, p)"
    );
}

#[test]
fn wrong_shapes_are_errors_naming_the_field() {
    let cases = [
        ("array root", json!([]), None),
        ("linux string", json!({"linux": "x"}), Some("/linux")),
        (
            "devices object",
            json!({"linux": {"devices": {}}}),
            Some("/linux/devices"),
        ),
        ("mounts number", json!({"mounts": 3}), Some("/mounts")),
        (
            "env string",
            json!({"process": {"env": "A=1"}}),
            Some("/process/env"),
        ),
        ("hooks array", json!({"hooks": []}), Some("/hooks")),
    ];
    for (name, mut spec, pointer) in cases {
        let before = spec.clone();
        match (apply(&mut spec, &edits()), pointer) {
            (Err(InjectError::NotAnObject), None) => {}
            (Err(InjectError::Shape { pointer: got, .. }), Some(want)) => {
                assert_eq!(got, want, "case {name}")
            }
            (other, _) => panic!("case {name}: {other:?}"),
        }
        // A shape error may leave earlier sections edited in memory; the caller
        // never writes a spec whose apply failed.
        let _ = before;
    }
}

#[test]
fn legacy_hooks_are_removed_by_basename_only() {
    let mut spec = docker_like();
    if let Some(prestart) = spec["hooks"]["prestart"].as_array_mut() {
        prestart.push(json!({"path": "/opt/bin/nvidia-container-toolkit"}));
    }
    assert!(has_legacy_hook(&spec));
    assert_eq!(remove_legacy_hooks(&mut spec), 2);
    assert_eq!(
        spec["hooks"]["prestart"],
        json!([{"path": "/usr/libexec/other-hook"}])
    );
    assert!(!has_legacy_hook(&spec));
    assert_eq!(remove_legacy_hooks(&mut json!({})), 0);
}

fn arb_json() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i32>().prop_map(|n| json!(n)),
        "[a-z/]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop_oneof![
                    Just("linux".to_string()),
                    Just("mounts".to_string()),
                    Just("process".to_string()),
                    Just("hooks".to_string()),
                    Just("devices".to_string()),
                    Just("env".to_string()),
                    "[a-z]{1,6}"
                ],
                inner,
                0..4
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #[test]
    fn apply_never_panics_and_is_idempotent(spec in arb_json()) {
        let mut once = spec.clone();
        if apply(&mut once, &edits()).is_ok() {
            let mut twice = once.clone();
            prop_assert!(apply(&mut twice, &edits()).is_ok());
            prop_assert_eq!(once, twice);
        }
        let mut s = spec;
        let _ = remove_legacy_hooks(&mut s);
    }
}

#[test]
fn the_mark_is_written_and_read_here() {
    let mut spec = json!({"ociVersion": "1.0.2", "annotations": null});
    assert!(!is_marked(&spec));
    mark(&mut spec, "all").unwrap();
    assert!(is_marked(&spec));
    assert_eq!(spec["annotations"][INJECTED_ANNOTATION], "all");
    let mut spec = json!({"annotations": {"a": "b"}});
    mark(&mut spec, "0,1").unwrap();
    assert_eq!(
        spec["annotations"],
        json!({"a": "b", INJECTED_ANNOTATION: "0,1"})
    );
    // Only a string counts, as the tolerant views read annotations.
    assert!(!is_marked(
        &json!({"annotations": {INJECTED_ANNOTATION: 1}})
    ));
    assert_eq!(
        mark(&mut json!({"annotations": []}), "all"),
        Err(InjectError::Shape {
            pointer: "/annotations".into(),
            expected: "an object",
            found: "not an object",
        })
    );
    assert_eq!(mark(&mut json!([]), "all"), Err(InjectError::NotAnObject));
}

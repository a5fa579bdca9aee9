use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::cdi::{Device, DeviceNode, Hook, Mount};

fn node(path: &str) -> DeviceNode {
    DeviceNode {
        path: path.into(),
        host_path: None,
        kind: None,
        major: None,
        minor: None,
        file_mode: None,
        permissions: None,
        uid: None,
        gid: None,
    }
}

fn device(name: &str) -> Device {
    Device {
        name: name.into(),
        annotations: BTreeMap::new(),
        container_edits: ContainerEdits {
            device_nodes: vec![node(&format!("/dev/{name}"))],
            ..ContainerEdits::default()
        },
    }
}

/// A spec that uses no feature past 0.3.0.
fn base() -> Spec {
    Spec {
        cdi_version: "0.3.0".into(),
        kind: "nvidia.com/gpu".into(),
        annotations: BTreeMap::new(),
        devices: vec![device("gpu0"), device("gpu1")],
        container_edits: ContainerEdits::default(),
    }
}

/// A spec that uses every field, with strings YAML could misread.
fn full() -> Spec {
    let mut spec = base();
    spec.cdi_version = "0.7.0".into();
    spec.annotations.insert("note".into(), "yes".into());
    spec.devices[0].name = "0".into();
    spec.devices[0]
        .annotations
        .insert("a.b/c".into(), "null".into());
    spec.devices[1].name = "GPU-0d1c2b3a".into();
    spec.container_edits = ContainerEdits {
        env: vec![
            "A=1".into(),
            "B=".into(),
            "C=~".into(),
            "D=a: b # c".into(),
            "E=line\nbreak\t\"q\"".into(),
        ],
        device_nodes: vec![DeviceNode {
            host_path: Some("/host/dev/nvidiactl".into()),
            kind: Some("c".into()),
            major: Some(195),
            minor: Some(255),
            file_mode: Some(0o666),
            permissions: Some("rw".into()),
            uid: Some(0),
            gid: Some(44),
            ..node("/dev/nvidiactl")
        }],
        mounts: vec![Mount {
            host_path: "/usr/lib/libcuda.so.1".into(),
            container_path: "/usr/lib/libcuda.so.1".into(),
            kind: Some("bind".into()),
            options: vec!["ro".into(), "nosuid".into(), "bind".into()],
        }],
        hooks: vec![Hook {
            hook_name: "createContainer".into(),
            path: "/usr/bin/nvshim".into(),
            args: vec!["nvshim".into(), "hook".into(), "0".into(), "true".into()],
            env: vec!["PATH=/usr/bin".into()],
            timeout: Some(-1),
        }],
        additional_gids: vec![44, 0],
    };
    spec
}

#[test]
fn minimum_version_follows_the_cdi_table() {
    type Edit = fn(&mut Spec);
    let cases: [(&str, Edit, &str); 9] = [
        ("nothing", |_| {}, "0.3.0"),
        (
            "mount type",
            |s| {
                s.devices[1].container_edits.mounts.push(Mount {
                    host_path: "/a".into(),
                    container_path: "/a".into(),
                    kind: Some("bind".into()),
                    options: vec![],
                })
            },
            "0.4.0",
        ),
        ("digit name", |s| s.devices[0].name = "0".into(), "0.5.0"),
        (
            "host path",
            |s| {
                s.container_edits.device_nodes.push(DeviceNode {
                    host_path: Some("/h".into()),
                    ..node("/dev/x")
                })
            },
            "0.5.0",
        ),
        (
            "spec annotation",
            |s| drop(s.annotations.insert("a".into(), "b".into())),
            "0.6.0",
        ),
        (
            "device annotation",
            |s| drop(s.devices[1].annotations.insert("a".into(), "b".into())),
            "0.6.0",
        ),
        (
            "dotted class",
            |s| s.kind = "nvidia.com/gpu.mig".into(),
            "0.6.0",
        ),
        (
            "gids and a digit name",
            |s| {
                s.devices[0].name = "0".into();
                s.devices[1].container_edits.additional_gids.push(44);
            },
            "0.7.0",
        ),
        (
            "spec gids",
            |s| s.container_edits.additional_gids.push(1),
            "0.7.0",
        ),
    ];
    for (case, edit, want) in cases {
        let mut spec = base();
        edit(&mut spec);
        assert_eq!(minimum_version(&spec), want, "case {case}");
    }
}

#[test]
fn versions_compare_by_number() {
    assert!(version_key("0.10.0") > version_key("0.9.0"));
    assert!(version_key("1.0.0") > version_key("0.8.0"));
    assert_eq!(version_key("0.1"), None);
    assert_eq!(version_key("0.1.0.0"), None);
    assert_eq!(version_key("v0.1.0"), None);
    let keys: Vec<_> = KNOWN_VERSIONS.iter().map(|v| version_key(v)).collect();
    assert!(keys.iter().all(Option::is_some));
    assert!(keys.windows(2).all(|w| w[0] < w[1]));
}

#[test]
fn validate_rejects_what_the_cdi_library_rejects() {
    type Edit = fn(&mut Spec);
    let cases: [(&str, Edit, &str); 16] = [
        (
            "unknown version",
            |s| s.cdi_version = "0.9.0".into(),
            "unknown cdiVersion \"0.9.0\" (known: 0.1.0, 0.2.0",
        ),
        (
            "version too low",
            |s| s.devices[0].name = "0".into(),
            "spec uses features of CDI 0.5.0 but says cdiVersion 0.3.0",
        ),
        (
            "bad kind",
            |s| s.kind = "nvidia.com".into(),
            "invalid CDI kind \"nvidia.com\"",
        ),
        ("no devices", |s| s.devices.clear(), "spec has no devices"),
        (
            "bad device name",
            |s| s.devices[0].name = "gpu/0".into(),
            "invalid CDI device name \"gpu/0\"",
        ),
        (
            "duplicate",
            |s| s.devices[1].name = "gpu0".into(),
            "device \"gpu0\" is defined more than once",
        ),
        (
            "no edits",
            |s| s.devices[1].container_edits = ContainerEdits::default(),
            "device \"gpu1\" has no container edits",
        ),
        (
            "env",
            |s| s.devices[0].container_edits.env.push("=x".into()),
            "device \"gpu0\": env entry \"=x\" is not NAME=VALUE",
        ),
        (
            "env no equals",
            |s| s.container_edits.env.push("X".into()),
            "spec-level containerEdits: env entry \"X\"",
        ),
        (
            "relative node",
            |s| s.devices[0].container_edits.device_nodes[0].path = "dev/x".into(),
            "device node path \"dev/x\" is not absolute",
        ),
        (
            "node type",
            |s| s.devices[0].container_edits.device_nodes[0].kind = Some("x".into()),
            "unknown type \"x\" (valid: b, c, u, p)",
        ),
        (
            "node permissions",
            |s| s.devices[0].container_edits.device_nodes[0].permissions = Some("rwx".into()),
            "permissions \"rwx\"",
        ),
        (
            "relative mount",
            |s| {
                s.container_edits.mounts.push(Mount {
                    host_path: "/a".into(),
                    container_path: "a".into(),
                    kind: None,
                    options: vec![],
                })
            },
            "mount containerPath \"a\" is not absolute",
        ),
        (
            "empty host path",
            |s| {
                s.container_edits.mounts.push(Mount {
                    host_path: String::new(),
                    container_path: "/a".into(),
                    kind: None,
                    options: vec![],
                })
            },
            "mount at \"/a\" has an empty hostPath",
        ),
        (
            "hook name",
            |s| {
                s.container_edits.hooks.push(Hook {
                    hook_name: "preStart".into(),
                    path: "/x".into(),
                    args: vec![],
                    env: vec![],
                    timeout: None,
                })
            },
            "unknown hookName \"preStart\" (valid: prestart, createRuntime, createContainer, startContainer, poststart, poststop)",
        ),
        (
            "hook path",
            |s| {
                s.container_edits.hooks.push(Hook {
                    hook_name: "prestart".into(),
                    path: "x".into(),
                    args: vec![],
                    env: vec![],
                    timeout: None,
                })
            },
            "hook path \"x\" is not absolute",
        ),
    ];
    for (case, edit, want) in cases {
        let mut spec = base();
        edit(&mut spec);
        let err = validate(&spec).map_err(|e| e.to_string());
        let Err(err) = err else {
            panic!("case {case}: accepted");
        };
        assert!(err.contains(want), "case {case}: {err:?} lacks {want:?}");
    }
    assert!(validate(&base()).is_ok());
    assert!(validate(&full()).map_err(|e| e.to_string()).is_ok());
}

#[test]
fn parse_errors_name_the_file() {
    let json = Path::new("/etc/cdi/nvidia.json");
    let cases: [(&str, &[u8], &Path, &str); 5] = [
        ("bad json", b"{", json, "cannot parse CDI spec /etc/cdi/nvidia.json as JSON"),
        ("bad yaml", b"kind: [", Path::new("/etc/cdi/x.yaml"), "cannot parse CDI spec /etc/cdi/x.yaml as YAML"),
        ("extension", b"{}", Path::new("/etc/cdi/x.txt"), "CDI spec /etc/cdi/x.txt has an unsupported extension (valid: .json, .yaml, .yml)"),
        ("missing field", b"{\"cdiVersion\":\"0.3.0\"}", json, "/etc/cdi/nvidia.json"),
        (
            "invalid",
            br#"{"cdiVersion":"0.3.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#,
            json,
            "invalid CDI spec /etc/cdi/nvidia.json: spec uses features of CDI 0.5.0 but says cdiVersion 0.3.0",
        ),
    ];
    for (case, bytes, path, want) in cases {
        let err = parse(bytes, path).map_err(|e| e.to_string());
        let Err(err) = err else {
            panic!("case {case}: accepted");
        };
        assert!(err.contains(want), "case {case}: {err:?} lacks {want:?}");
    }
}

#[test]
fn oversized_files_are_refused_before_parsing() {
    let bytes = vec![b' '; MAX_SPEC_SIZE + 1];
    let err = parse(&bytes, Path::new("/etc/cdi/big.json")).map_err(|e| e.to_string());
    assert!(
        matches!(&err, Err(e) if e.contains("/etc/cdi/big.json") && e.contains("limit")),
        "{err:?}"
    );
}

#[test]
fn yaml_and_json_files_parse_to_the_same_spec() -> Result<(), SpecError> {
    let yaml = "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\n";
    let json = r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu","devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}}]}"#;
    let from_yaml = parse(yaml.as_bytes(), Path::new("a.yaml"))?;
    let from_yml = parse(yaml.as_bytes(), Path::new("a.yml"))?;
    let from_json = parse(json.as_bytes(), Path::new("a.json"))?;
    assert_eq!(from_yaml, from_json);
    assert_eq!(from_yml, from_json);
    assert_eq!(from_json.devices[0].name, "0");
    Ok(())
}

#[test]
fn specs_round_trip_through_json_and_yaml() -> Result<(), SpecError> {
    for (case, spec) in [("base", base()), ("full", full())] {
        let json = to_json(&spec);
        assert_eq!(json.last(), Some(&b'\n'), "case {case}");
        assert_eq!(parse(&json, Path::new("x.json"))?, spec, "case {case}");
        let yaml = to_yaml(&spec)?;
        assert_eq!(
            parse(yaml.as_bytes(), Path::new("x.yaml"))?,
            spec,
            "case {case}:\n{yaml}"
        );
    }
    Ok(())
}

proptest! {
    #[test]
    fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for path in ["x.json", "x.yaml"] {
            let _ = parse(&bytes, Path::new(path));
        }
    }

    #[test]
    fn parse_never_panics_on_near_specs(text in r#"[{}\[\]:,"a-z0-9 \n./=-]{0,200}"#) {
        let prefixed = format!("cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n{text}");
        for path in ["x.json", "x.yaml"] {
            let _ = parse(text.as_bytes(), Path::new(path));
            let _ = parse(prefixed.as_bytes(), Path::new(path));
        }
    }

    #[test]
    fn any_string_values_round_trip(value in any::<String>(), key in "[a-z][a-z0-9._/-]{0,12}") {
        let mut spec = base();
        spec.cdi_version = "0.6.0".into();
        spec.annotations.insert(key, value.clone());
        spec.devices[0].container_edits.env.push(format!("V={value}"));
        spec.devices[1].container_edits.mounts.push(Mount {
            host_path: format!("/{value}"),
            container_path: "/m".into(),
            kind: None,
            options: vec![value],
        });
        let yaml = to_yaml(&spec);
        prop_assert!(yaml.is_ok(), "{:?}", yaml);
        let yaml = yaml.unwrap_or_default();
        let back = parse(yaml.as_bytes(), Path::new("x.yaml")).map_err(|e| e.to_string());
        prop_assert_eq!(back, Ok(spec.clone()), "{}", yaml);
        let back = parse(&to_json(&spec), Path::new("x.json")).map_err(|e| e.to_string());
        prop_assert_eq!(back, Ok(spec));
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Unit tests: the read views on odd shapes, parse errors, the OCI state, and the temp-file
//! naming of `save`. Round trips over real `config.json` files are in roundtrip_tests.rs.

use std::fs;
use std::os::unix::fs::symlink;

use serde_json::json;

use super::*;

fn doc(value: serde_json::Value) -> SpecDoc {
    SpecDoc::from_value(value).expect("test documents are objects")
}

#[test]
fn parse_rejects_what_is_not_an_object() {
    let cases: [(&str, &[u8], &str); 5] = [
        (
            "empty",
            b"",
            "config.json is not valid JSON: EOF while parsing a value at line 1 column 0",
        ),
        (
            "garbage",
            b"{\"a\":\n  x}",
            "config.json is not valid JSON: expected value at line 2 column 3",
        ),
        (
            "trailing",
            b"{} {}",
            "config.json is not valid JSON: trailing characters at line 1 column 4",
        ),
        (
            "array",
            b"[]",
            "config.json must be a JSON object, found an array",
        ),
        (
            "null",
            b"null",
            "config.json must be a JSON object, found null",
        ),
    ];
    for (name, bytes, message) in cases {
        let error = SpecDoc::parse(bytes).expect_err(name);
        assert_eq!(error.to_string(), message, "case {name}");
    }
}

#[test]
fn env_reads_strings_only() {
    let cases = [
        ("no process", json!({}), vec![]),
        ("process not an object", json!({"process": 3}), vec![]),
        ("no env", json!({"process": {}}), vec![]),
        ("env a string", json!({"process": {"env": "A=1"}}), vec![]),
        (
            "env an object",
            json!({"process": {"env": {"A": "1"}}}),
            vec![],
        ),
        (
            "numbers and nulls in env",
            json!({"process": {"env": ["A=1", 2, null, {"B": 2}, "B=2"]}}),
            vec!["A=1", "B=2"],
        ),
        (
            "plain",
            json!({"process": {"env": ["PATH=/bin", "X=1"]}}),
            vec!["PATH=/bin", "X=1"],
        ),
    ];
    for (name, value, want) in cases {
        assert_eq!(doc(value).env(), want, "case {name}");
    }
}

#[test]
fn env_var_last_wins() {
    let cases = [
        ("last wins", vec!["X=1", "X=2"], "X", Some("2")),
        (
            "last wins across others",
            vec!["X=1", "Y=0", "X=3", "Z=9"],
            "X",
            Some("3"),
        ),
        ("empty value", vec!["X="], "X", Some("")),
        ("value with =", vec!["X=a=b"], "X", Some("a=b")),
        ("no = defines nothing", vec!["X"], "X", None),
        (
            "no = does not hide earlier",
            vec!["X=1", "X"],
            "X",
            Some("1"),
        ),
        ("prefix is not a match", vec!["XY=1", "X_=2"], "X", None),
        ("case matters", vec!["x=1"], "X", None),
        ("absent", vec!["A=1"], "X", None),
    ];
    for (name, env, key, want) in cases {
        let d = doc(json!({"process": {"env": env}}));
        assert_eq!(d.env_var(key), want, "case {name}");
    }
    assert_eq!(doc(json!({})).env_var("X"), None, "case no process");
}

#[test]
fn mounts_skip_what_has_no_destination() {
    let d = doc(json!({"mounts": [
        {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", 1, "nodev"]},
        {"type": "tmpfs", "source": "tmpfs"},
        "not a mount",
        {"destination": 7},
        {"destination": "/dev/shm", "type": 5, "options": "ro", "x-future": true},
        {"destination": "/data", "source": "/srv/data"}
    ]}));
    let want = vec![
        MountView {
            index: 0,
            destination: "/proc",
            source: Some("proc"),
            kind: Some("proc"),
            options: vec!["nosuid", "nodev"],
        },
        MountView {
            index: 4,
            destination: "/dev/shm",
            source: None,
            kind: None,
            options: vec![],
        },
        MountView {
            index: 5,
            destination: "/data",
            source: Some("/srv/data"),
            kind: None,
            options: vec![],
        },
    ];
    assert_eq!(d.mounts(), want);

    let cases = [
        ("no mounts", json!({})),
        ("mounts an object", json!({"mounts": {"destination": "/x"}})),
        ("mounts null", json!({"mounts": null})),
    ];
    for (name, value) in cases {
        assert_eq!(doc(value).mounts(), vec![], "case {name}");
    }
}

#[test]
fn annotations_keep_string_values_in_document_order() {
    let cases = [
        ("absent", json!({}), vec![]),
        ("an array", json!({"annotations": ["a=b"]}), vec![]),
        (
            "non-string values skipped",
            json!({"annotations": {"z": "1", "n": 2, "b": true, "o": {"x": "y"}, "nul": null, "a": "x"}}),
            vec![("z", "1"), ("a", "x")],
        ),
    ];
    for (name, value, want) in cases {
        assert_eq!(doc(value).annotations(), want, "case {name}");
    }
}

#[test]
fn bounding_capabilities_and_privilege() {
    let cases = [
        ("no process", json!({}), vec![], false),
        ("no capabilities", json!({"process": {}}), vec![], false),
        (
            "capabilities null",
            json!({"process": {"capabilities": null}}),
            vec![],
            false,
        ),
        (
            "capabilities a string",
            json!({"process": {"capabilities": "CAP_SYS_ADMIN"}}),
            vec![],
            false,
        ),
        (
            "object form",
            json!({"process": {"capabilities": {"bounding": ["CAP_KILL", "CAP_SYS_ADMIN"]}}}),
            vec!["CAP_KILL", "CAP_SYS_ADMIN"],
            true,
        ),
        (
            "object form, unprivileged",
            json!({"process": {"capabilities": {"bounding": ["CAP_KILL", "CAP_FUTURE"]}}}),
            vec!["CAP_KILL", "CAP_FUTURE"],
            false,
        ),
        (
            "only in effective is not privileged",
            json!({"process": {"capabilities": {"bounding": ["CAP_KILL"], "effective": ["CAP_SYS_ADMIN"]}}}),
            vec!["CAP_KILL"],
            false,
        ),
        (
            "no bounding set",
            json!({"process": {"capabilities": {"effective": ["CAP_SYS_ADMIN"]}}}),
            vec![],
            false,
        ),
        (
            "numbers in bounding",
            json!({"process": {"capabilities": {"bounding": [21, "CAP_CHOWN"]}}}),
            vec!["CAP_CHOWN"],
            false,
        ),
        (
            "pre-1.0.0-rc5 array form",
            json!({"process": {"capabilities": ["CAP_CHOWN", "CAP_SYS_ADMIN"]}}),
            vec!["CAP_CHOWN", "CAP_SYS_ADMIN"],
            true,
        ),
        (
            "names are exact",
            json!({"process": {"capabilities": {"bounding": ["cap_sys_admin", "SYS_ADMIN"]}}}),
            vec!["cap_sys_admin", "SYS_ADMIN"],
            false,
        ),
    ];
    for (name, value, bounding, privileged) in cases {
        let d = doc(value);
        assert_eq!(d.bounding_capabilities(), bounding, "case {name}");
        assert_eq!(d.is_privileged(), privileged, "case {name}");
    }
}

#[test]
fn root_path_reads_a_string_only() {
    let cases = [
        (
            "plain",
            json!({"root": {"path": "rootfs", "readonly": true}}),
            Some("rootfs"),
        ),
        ("absent", json!({}), None),
        ("root a string", json!({"root": "rootfs"}), None),
        ("path a number", json!({"root": {"path": 1}}), None),
    ];
    for (name, value, want) in cases {
        assert_eq!(doc(value).root_path(), want, "case {name}");
    }
}

#[test]
fn to_vec_is_compact_and_keeps_key_order() {
    let d = SpecDoc::parse(b"{ \"z\": 1,\n \"a\": {\"y\": [1, 2], \"b\": null} }").expect("parse");
    assert_eq!(
        d.to_vec().expect("to_vec"),
        br#"{"z":1,"a":{"y":[1,2],"b":null}}"#
    );
}

#[test]
fn parse_state_reads_real_and_odd_states() {
    let prestart: &[u8] =
        include_bytes!("../../tests/fixtures/config-json/state/runc-prestart.json");
    let state = parse_state(prestart).expect("runc prestart state");
    assert_eq!(
        state,
        OciState {
            oci_version: Some("1.0.2-dev".into()),
            id: "nvshim-state-capture".into(),
            status: Some("creating".into()),
            pid: Some(19446),
            bundle: "/tmp/nvcap/sb".into(),
            annotations: [("org.example.key".to_owned(), "value".to_owned())].into(),
        }
    );
    let create_container: &[u8] =
        include_bytes!("../../tests/fixtures/config-json/state/runc-createContainer.json");
    let state = parse_state(create_container).expect("runc createContainer state");
    assert_eq!(
        (state.pid, state.bundle.to_str()),
        (Some(1), Some("/tmp/nvcap/sb"))
    );

    let cases = [
        ("minimal", json!({"bundle": "/b"}), None, "/b", None),
        (
            "old bundlePath",
            json!({"id": "c", "pid": 7, "bundlePath": "/old"}),
            Some(7),
            "/old",
            None,
        ),
        (
            "bundle wins",
            json!({"bundle": "/new", "bundlePath": "/old"}),
            None,
            "/new",
            None,
        ),
        (
            "empty bundle falls back",
            json!({"bundle": "", "bundlePath": "/old"}),
            None,
            "/old",
            None,
        ),
        (
            "unknown status and extra fields",
            json!({"ociVersion": "9.9.9", "status": "hibernating", "pid": 3, "bundle": "/b", "x": [1]}),
            Some(3),
            "/b",
            Some("hibernating"),
        ),
        (
            "wrong types read as absent",
            json!({"id": 5, "status": 1, "ociVersion": false, "pid": null, "bundle": "/b", "annotations": ["a"]}),
            None,
            "/b",
            None,
        ),
    ];
    for (name, value, pid, bundle, status) in cases {
        let state = parse_state(value.to_string().as_bytes()).expect(name);
        assert_eq!(state.pid, pid, "case {name}");
        assert_eq!(state.bundle.to_str(), Some(bundle), "case {name}");
        assert_eq!(state.status.as_deref(), status, "case {name}");
    }

    let annotated = json!({"bundle": "/b", "annotations": {"s": "v", "n": 1}});
    let state = parse_state(annotated.to_string().as_bytes()).expect("annotations");
    assert_eq!(state.annotations, [("s".to_owned(), "v".to_owned())].into());
}

#[test]
fn parse_state_fails_on_what_a_hook_needs() {
    let cases: [(&str, &[u8], &str); 7] = [
        (
            "not json",
            b"{",
            "OCI state is not valid JSON: EOF while parsing an object at line 1 column 1",
        ),
        (
            "array",
            b"[]",
            "OCI state must be a JSON object, found an array",
        ),
        (
            "no bundle",
            br#"{"pid": 1}"#,
            "invalid OCI state: no bundle: neither \"bundle\" nor \"bundlePath\" is a non-empty string",
        ),
        (
            "bundle a number",
            br#"{"bundle": 1}"#,
            "invalid OCI state: no bundle: neither \"bundle\" nor \"bundlePath\" is a non-empty string",
        ),
        (
            "pid a string",
            br#"{"bundle": "/b", "pid": "12"}"#,
            "invalid OCI state: pid must be a positive process id, found \"12\"",
        ),
        (
            "pid negative",
            br#"{"bundle": "/b", "pid": -1}"#,
            "invalid OCI state: pid must be a positive process id, found -1",
        ),
        (
            "pid too large",
            br#"{"bundle": "/b", "pid": 4294967296}"#,
            "invalid OCI state: pid must be a positive process id, found 4294967296",
        ),
    ];
    for (name, bytes, message) in cases {
        let error = parse_state(bytes).expect_err(name);
        assert_eq!(error.to_string(), message, "case {name}");
    }
}

/// A bundle in a tempdir whose `config.json` holds `{"old":true}`, mode 0644.
fn bundle_with_config() -> (tempfile::TempDir, Bundle, Loaded) {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = Bundle::new(dir.path());
    fs::write(bundle.config_path(), br#"{"old":true}"#).expect("write config.json");
    let loaded = bundle.load().expect("load");
    (dir, bundle, loaded)
}

fn entries(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.expect("entry").file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn save_skips_a_taken_temp_name_and_leaves_it_alone() {
    let (dir, bundle, loaded) = bundle_with_config();
    let victim = dir.path().join("victim");
    fs::write(&victim, "precious").expect("write victim");
    symlink(&victim, dir.path().join(".t0")).expect("symlink");

    bundle
        .save_bytes(
            br#"{"new":true}"#,
            &loaded,
            [".t0".to_owned(), ".t1".to_owned()],
        )
        .expect("save with the second name");

    assert_eq!(
        fs::read(bundle.config_path()).expect("read"),
        br#"{"new":true}"#
    );
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious");
    assert!(
        fs::symlink_metadata(dir.path().join(".t0"))
            .expect(".t0")
            .is_symlink()
    );
    assert_eq!(entries(dir.path()), [".t0", "config.json", "victim"]);
}

#[test]
fn save_fails_cleanly_when_every_temp_name_is_taken() {
    let (dir, bundle, loaded) = bundle_with_config();
    let victim = dir.path().join("victim");
    fs::write(&victim, "precious").expect("write victim");
    symlink(&victim, dir.path().join(".t0")).expect("symlink");

    let error = bundle
        .save_bytes(br#"{"new":true}"#, &loaded, [".t0".to_owned()])
        .expect_err("the only name is taken");
    assert!(
        matches!(&error, BundleError::Write { path, source }
            if path.ends_with(".t0") && source.kind() == std::io::ErrorKind::AlreadyExists),
        "{error:?}"
    );
    assert_eq!(
        fs::read(bundle.config_path()).expect("read"),
        br#"{"old":true}"#
    );
    assert_eq!(fs::read_to_string(&victim).expect("victim"), "precious");
    assert_eq!(entries(dir.path()), [".t0", "config.json", "victim"]);

    let error = bundle.save_bytes(b"{}", &loaded, []).expect_err("no names");
    assert!(
        error.to_string().contains("no temp-file name to try"),
        "{error}"
    );
}

#[test]
fn save_removes_the_temp_files_of_dead_runtimes_only() {
    let (dir, bundle, loaded) = bundle_with_config();
    // A pid that has exited and been reaped: no process has it (until it is reused).
    let mut child = std::process::Command::new("true")
        .spawn()
        .expect("spawn true");
    let dead = child.id();
    child.wait().expect("wait");
    let me = std::process::id();
    let names = [
        format!(".config.json.nvshim-{dead}-0"),
        format!(".config.json.nvshim-{me}-999"),
        format!(".config.json.nvshim-{dead}-x"),
        ".config.json.nvshim-0-0".to_owned(),
        "config.json.nvshim-1-0".to_owned(),
    ];
    for name in &names {
        fs::write(dir.path().join(name), "partial").expect("write temp");
    }
    bundle
        .save(&doc(serde_json::json!({"new": true})), &loaded)
        .expect("save");
    let mut want: Vec<String> = names[1..].to_vec();
    want.push("config.json".to_owned());
    want.sort();
    assert_eq!(
        entries(dir.path()),
        want,
        "only the dead pid's well-formed temp file is removed"
    );
}

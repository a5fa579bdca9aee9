//! Unit tests of the engine transforms (pure text in, text out) and of the diff: docker,
//! CRI-O and the diff here, containerd in `containerd_tests` (with these helpers). The
//! binary, real files and real daemons are `tests/cli/configure/`'s.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use proptest::prelude::*;
use serde_json::{Value, json};

use super::{Action, ConfigureError, Outcome, crio, diff, docker};

pub(super) const RT: &str = "/usr/bin/nvidia-container-runtime";
const BOM: char = '\u{feff}';

pub(super) fn add(default: bool) -> Action<'static> {
    Action::Add {
        name: "nvidia",
        path: RT,
        set_as_default: default,
        cdi: false,
    }
}

pub(super) const UNDO: Action<'static> = Action::Remove { name: "nvidia" };

pub(super) fn file() -> &'static Path {
    Path::new("/etc/engine/config")
}

pub(super) fn written(outcome: Outcome, case: &str) -> String {
    match outcome {
        Outcome::Write(text) => text,
        other => panic!("{case}: expected a write, got {other:?}"),
    }
}

fn docker_json(old: Option<&str>, action: Action<'_>, case: &str) -> Value {
    let edited = docker::edit(old, file(), action).unwrap_or_else(|e| panic!("{case}: {e}"));
    serde_json::from_str(&written(edited.outcome, case)).unwrap()
}

fn keys(v: &Value) -> Vec<String> {
    v.as_object().unwrap().keys().cloned().collect()
}

#[test]
fn docker_adds_the_entry_nvidia_ctk_writes() {
    let cases: &[(&str, Option<&str>, Value)] = &[
        (
            "missing file",
            None,
            json!({"runtimes": {"nvidia": {"args": [], "path": RT}}}),
        ),
        (
            "empty file",
            Some(""),
            json!({"runtimes": {"nvidia": {"args": [], "path": RT}}}),
        ),
        (
            "whitespace only",
            Some(" \n\t\n"),
            json!({"runtimes": {"nvidia": {"args": [], "path": RT}}}),
        ),
        (
            "other keys kept, entry appended",
            Some(r#"{"log-driver": "json-file", "debug": true}"#),
            json!({"log-driver": "json-file", "debug": true,
                   "runtimes": {"nvidia": {"args": [], "path": RT}}}),
        ),
        (
            "existing entry updated in place, runtimeArgs kept",
            Some(
                r#"{"runtimes": {"nvidia": {"path": "/old", "runtimeArgs": ["--debug"]}, "x": {"path": "/x"}}}"#,
            ),
            json!({"runtimes": {"nvidia": {"path": RT, "runtimeArgs": ["--debug"]}, "x": {"path": "/x"}}}),
        ),
        (
            "shim-style entry replaced",
            Some(r#"{"runtimes": {"nvidia": {"runtimeType": "io.containerd.runc.v2"}}}"#),
            json!({"runtimes": {"nvidia": {"args": [], "path": RT}}}),
        ),
        (
            "non-object entry replaced",
            Some(r#"{"runtimes": {"nvidia": "/old"}}"#),
            json!({"runtimes": {"nvidia": {"args": [], "path": RT}}}),
        ),
    ];
    for (case, old, want) in cases {
        let got = docker_json(*old, add(false), case);
        assert_eq!(&got, want, "{case}");
        assert_eq!(keys(&got), keys(want), "{case}: key order");
    }
}

#[test]
fn docker_key_order_is_kept() {
    let old = r#"{"z": 1, "runtimes": {"b": {"path": "/b"}}, "a": 2, "default-runtime": "runc"}"#;
    let got = docker_json(Some(old), add(true), "order");
    assert_eq!(keys(&got), ["z", "runtimes", "a", "default-runtime"]);
    assert_eq!(got["default-runtime"], "nvidia");
    assert_eq!(keys(&got["runtimes"]), ["b", "nvidia"]);
}

#[test]
fn docker_undo_removes_only_what_names_the_runtime() {
    let cases: &[(&str, &str, Value)] = &[
        (
            "entry and default",
            r#"{"a": 1, "default-runtime": "nvidia", "runtimes": {"nvidia": {"path": "/x"}}}"#,
            json!({"a": 1}),
        ),
        (
            "another default stays",
            r#"{"default-runtime": "runsc", "runtimes": {"nvidia": {"path": "/x"}, "runsc": {"path": "/r"}}}"#,
            json!({"default-runtime": "runsc", "runtimes": {"runsc": {"path": "/r"}}}),
        ),
        (
            "a default naming us without an entry",
            r#"{"default-runtime": "nvidia"}"#,
            json!({}),
        ),
    ];
    for (case, old, want) in cases {
        assert_eq!(&docker_json(Some(old), UNDO, case), want, "{case}");
    }
    for (case, old) in [
        ("missing", None),
        ("empty", Some("")),
        (
            "nothing of ours",
            Some(r#"{"runtimes": {"x": {"path": "/x"}}}"#),
        ),
        ("runtimes not an object", Some(r#"{"runtimes": 3}"#)),
    ] {
        let edited = docker::edit(old, file(), UNDO).unwrap();
        assert_eq!(edited.outcome, Outcome::Unchanged, "{case}");
    }
}

#[test]
fn docker_unchanged_when_already_configured() {
    let old = "{\n  \"runtimes\": {\"nvidia\": {\"args\": [], \"path\": \"/usr/bin/nvidia-container-runtime\"}}\n}";
    let edited = docker::edit(Some(old), file(), add(false)).unwrap();
    assert_eq!(edited.outcome, Outcome::Unchanged);
}

#[test]
fn docker_refuses_what_it_cannot_read() {
    let cases: &[(&str, &str, usize, usize)] = &[
        ("trailing comma", "{\n  \"a\": 1,\n}\n", 3, 1),
        ("comment", "{\n  // no\n  \"a\": 1\n}", 2, 3),
        ("truncated", "{\"a\": {", 1, 7),
    ];
    for (case, text, line, column) in cases {
        match docker::edit(Some(text), file(), add(false)) {
            Err(ConfigureError::InvalidJson {
                line: l, column: c, ..
            }) => assert_eq!((l, c), (*line, *column), "{case}"),
            other => panic!("{case}: {other:?}"),
        }
    }
    for (case, text, found) in [
        ("array", "[1]", "an array"),
        ("string", "\"x\"", "a string"),
        ("null", "null", "null"),
    ] {
        match docker::edit(Some(text), file(), add(false)) {
            Err(ConfigureError::JsonNotObject { found: f, .. }) => assert_eq!(f, found, "{case}"),
            other => panic!("{case}: {other:?}"),
        }
    }
    let err = docker::edit(Some(r#"{"runtimes": []}"#), file(), add(false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/engine/config: \"runtimes\" is an array, expected an object; nothing was changed"
    );
    let err = docker::edit(Some("{,}"), file(), add(false)).unwrap_err();
    assert!(
        err.to_string().starts_with(
            "/etc/engine/config is not valid JSON: key must be a string at line 1, column 2"
        ),
        "{err}"
    );
}

#[test]
fn docker_keeps_indentation_and_bom() {
    let tabbed = "{\n\t\"a\": 1\n}\n";
    let out = written(
        docker::edit(Some(tabbed), file(), add(false))
            .unwrap()
            .outcome,
        "tabs",
    );
    assert!(out.contains("\n\t\"runtimes\": {\n\t\t\"nvidia\""), "{out}");
    let two = "{\n  \"a\": 1\n}\n";
    let out = written(
        docker::edit(Some(two), file(), add(false)).unwrap().outcome,
        "two",
    );
    assert!(out.contains("\n  \"runtimes\": {\n    \"nvidia\""), "{out}");
    let one_line = "{\"a\": 1}";
    let out = written(
        docker::edit(Some(one_line), file(), add(false))
            .unwrap()
            .outcome,
        "flat",
    );
    assert!(
        out.contains("\n    \"runtimes\""),
        "nvidia-ctk's four spaces: {out}"
    );
    assert!(out.ends_with("}\n"));
    let bom = "\u{feff}{\"a\": 1}";
    let out = written(
        docker::edit(Some(bom), file(), add(false)).unwrap().outcome,
        "bom",
    );
    assert!(out.starts_with('\u{feff}'), "{out:?}");
    serde_json::from_str::<Value>(out.trim_start_matches('\u{feff}')).unwrap();
}

#[test]
fn crio_drop_in() {
    let head = "# Written by `nvidia-ctk runtime configure` / `nvshim configure crio` (nvshim): registers\n\
         # the NVIDIA container runtime with CRI-O. `nvshim configure crio --undo` removes this file.\n\n";
    assert_eq!(
        crio::drop_in_text("nvidia", RT, true, None),
        format!(
            "{head}[crio.runtime]\n\
             default_runtime = \"nvidia\"\n\n\
             [crio.runtime.runtimes.nvidia]\n\
             runtime_path = \"/usr/bin/nvidia-container-runtime\"\n\
             runtime_type = \"oci\"\n"
        )
    );
    let plain = crio::drop_in_text("nvidia", RT, false, None);
    assert!(!plain.contains("default_runtime"), "{plain}");
    assert!(!plain.contains("[crio.runtime]\n"), "{plain}");
    let odd = crio::drop_in_text("gpu.fast", "/opt/a \"b\"", false, None);
    let doc: toml::Table = odd.parse().unwrap();
    assert_eq!(
        doc["crio"]["runtime"]["runtimes"]["gpu.fast"]["runtime_path"].as_str(),
        Some("/opt/a \"b\"")
    );
    let drop_in =
        |old: Option<&str>, action| crio::drop_in(None, file(), old, action).unwrap().outcome;
    assert_eq!(drop_in(Some(&plain), add(false)), Outcome::Unchanged);
    assert_eq!(drop_in(Some(&plain), UNDO), Outcome::Remove);
    assert_eq!(drop_in(None, UNDO), Outcome::Unchanged);
}

/// The drop-in starts from the runtime CRI-O would otherwise run (NVIDIA's order: the default
/// unless it is an NVIDIA one, runc, crun), so `monitor_path` and friends carry over.
#[test]
fn crio_drop_in_copies_the_default_runtime() {
    let source = "[crio.runtime]\ndefault_runtime = \"crun\"\n\n\
        [crio.runtime.runtimes.crun]\n# the distribution's\nruntime_path = \"/usr/libexec/crio/crun\"\n\
        runtime_root = \"/run/crun\"\nmonitor_path = \"/usr/libexec/crio/conmon\"\n\n\
        [crio.runtime.runtimes.runc]\nruntime_root = \"/run/runc\"\n";
    let out = written(
        crio::drop_in(Some(source), file(), None, add(true))
            .unwrap()
            .outcome,
        "crun default",
    );
    let doc: toml::Table = out.parse().unwrap();
    let entry = &doc["crio"]["runtime"]["runtimes"]["nvidia"];
    assert_eq!(entry["runtime_path"].as_str(), Some(RT), "{out}");
    assert_eq!(entry["runtime_type"].as_str(), Some("oci"), "{out}");
    assert_eq!(entry["runtime_root"].as_str(), Some("/run/crun"), "{out}");
    assert_eq!(
        entry["monitor_path"].as_str(),
        Some("/usr/libexec/crio/conmon"),
        "{out}"
    );
    assert!(
        !out.contains("the distribution's"),
        "comments stay behind: {out}"
    );
    assert!(
        doc["crio"]["runtime"]["runtimes"].get("crun").is_none(),
        "{out}"
    );

    // In place: the main config gets the same entry, and undo takes it out again.
    let edited = written(
        crio::edit(Some(source), file(), add(true)).unwrap().outcome,
        "in place",
    );
    let doc: toml::Table = edited.parse().unwrap();
    assert_eq!(
        doc["crio"]["runtime"]["default_runtime"].as_str(),
        Some("nvidia")
    );
    assert_eq!(
        doc["crio"]["runtime"]["runtimes"]["nvidia"]["runtime_root"].as_str(),
        Some("/run/crun")
    );
    let undone = written(
        crio::edit(Some(&edited), file(), UNDO).unwrap().outcome,
        "undo",
    );
    let doc: toml::Table = undone.parse().unwrap();
    assert!(
        doc["crio"]["runtime"]["runtimes"].get("nvidia").is_none(),
        "{undone}"
    );
    assert!(
        doc["crio"]["runtime"].get("default_runtime").is_none(),
        "{undone}"
    );
}

#[test]
fn diff_is_unified() {
    let old = "a\nb\nc\nd\ne\nf\ng\nh\ni\n";
    let new = "a\nb\nc\nd\nE\nf\ng\nh\ni\nj\n";
    assert_eq!(
        diff::unified(old, new, "x", "y"),
        "--- x\n+++ y\n@@ -2,8 +2,9 @@\n b\n c\n d\n-e\n+E\n f\n g\n h\n i\n+j\n"
    );
    assert_eq!(diff::unified(old, old, "x", "y"), "");
    assert_eq!(
        diff::unified("", "a\n", "/dev/null", "y"),
        "--- /dev/null\n+++ y\n@@ -0,0 +1,1 @@\n+a\n"
    );
    assert_eq!(
        diff::unified("a\n", "", "y", "/dev/null"),
        "--- y\n+++ /dev/null\n@@ -1,1 +0,0 @@\n-a\n"
    );
    let far = "1\n2\n3\n4\n5\n6\n7\n8\n9\n10\n";
    let two = "X\n2\n3\n4\n5\n6\n7\n8\n9\nY\n";
    assert_eq!(
        diff::unified(far, two, "x", "y"),
        "--- x\n+++ y\n@@ -1,4 +1,4 @@\n-1\n+X\n 2\n 3\n 4\n@@ -7,4 +7,4 @@\n 7\n 8\n 9\n-10\n+Y\n"
    );
}

fn json_object() -> impl Strategy<Value = serde_json::Map<String, Value>> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        "[a-z/ ]{0,8}".prop_map(Value::from),
    ];
    let value = leaf.prop_recursive(3, 16, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::from),
            prop::collection::btree_map("[a-z-]{1,6}", inner, 0..4)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop::collection::vec(("[a-z-]{1,10}", value), 0..8).prop_map(|kv| kv.into_iter().collect())
}

proptest! {
    /// Whatever the file holds, the transform answers (never panics); what it writes is JSON.
    #[test]
    fn docker_never_panics(text in ".{0,200}") {
        if let Ok(edited) = docker::edit(Some(&text), file(), add(true))
            && let Outcome::Write(out) = edited.outcome
        {
            let parsed = serde_json::from_str::<Value>(out.trim_start_matches(BOM));
            prop_assert!(parsed.is_ok(), "not JSON: {:?}", out);
        }
    }

    /// configure then undo: every other key back, in its order, with its value.
    #[test]
    fn docker_round_trip(mut config in json_object(), pretty in any::<bool>()) {
        config.shift_remove("runtimes");
        config.shift_remove("default-runtime");
        let text = if pretty {
            serde_json::to_string_pretty(&config).unwrap()
        } else {
            serde_json::to_string(&config).unwrap()
        };
        let added = docker_json(Some(&text), add(true), "add");
        prop_assert_eq!(&added["runtimes"]["nvidia"]["path"], RT);
        let added = serde_json::to_string(&added).unwrap();
        let back = docker::edit(Some(&added), file(), UNDO).unwrap();
        let back: Value = serde_json::from_str(&written(back.outcome, "undo")).unwrap();
        prop_assert_eq!(keys(&back), config.keys().cloned().collect::<Vec<_>>());
        prop_assert_eq!(back, Value::Object(config));
    }
}

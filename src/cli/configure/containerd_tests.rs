//! Unit tests of `nvshim configure containerd`'s transform (pure text in, text out): v2 and
//! v3 files, the built-in runc, comments, inline tables, quotes, refusals and undo.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;

use super::tests::{RT, UNDO, add, file, written};
use super::{Action, ConfigureError, Outcome, containerd, docker};

const V2_STOCK: &str = r#"version = 2

[plugins]
  [plugins."io.containerd.grpc.v1.cri"]
    [plugins."io.containerd.grpc.v1.cri".containerd]
      default_runtime_name = "runc"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes]

        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
          runtime_type = "io.containerd.runc.v2"

          [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
            BinaryName = ""
            SystemdCgroup = true
"#;

fn containerd_toml(old: Option<&str>, action: Action<'_>, case: &str) -> String {
    let edited = containerd::edit(old, file(), action).unwrap_or_else(|e| panic!("{case}: {e}"));
    written(edited.outcome, case)
}

fn runtime<'a>(doc: &'a toml::Table, plugin: &str, name: &str) -> &'a toml::Value {
    &doc["plugins"][plugin]["containerd"]["runtimes"][name]
}

#[test]
fn containerd_v2_entry_copies_runc_and_sets_binary_name() {
    let out = containerd_toml(Some(V2_STOCK), add(true), "v2");
    let doc: toml::Table = out.parse().unwrap();
    let cri = "io.containerd.grpc.v1.cri";
    let nvidia = runtime(&doc, cri, "nvidia");
    assert_eq!(nvidia["runtime_type"].as_str(), Some(containerd::RUNC_V2));
    assert_eq!(nvidia["options"]["BinaryName"].as_str(), Some(RT));
    assert_eq!(
        nvidia["options"]["SystemdCgroup"].as_bool(),
        Some(true),
        "runc's settings carried over"
    );
    assert_eq!(
        runtime(&doc, cri, "runc")["options"]["BinaryName"].as_str(),
        Some(""),
        "runc itself untouched"
    );
    assert_eq!(
        doc["plugins"][cri]["containerd"]["default_runtime_name"].as_str(),
        Some("nvidia")
    );
    // The new tables come right after runc's.
    let runc_at = out.find("runtimes.runc.options]").unwrap();
    let ours_at = out.find("runtimes.nvidia]").unwrap();
    assert!(runc_at < ours_at, "{out}");

    let back = containerd_toml(Some(&out), UNDO, "v2 undo");
    assert_eq!(back, V2_STOCK, "configure + undo gives the file back");
}

#[test]
fn containerd_v3_uses_the_cri_runtime_plugin() {
    let v3 = V2_STOCK
        .replace("version = 2", "version = 3")
        .replace("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime");
    let out = containerd_toml(Some(&v3), add(false), "v3");
    let doc: toml::Table = out.parse().unwrap();
    let nvidia = runtime(&doc, "io.containerd.cri.v1.runtime", "nvidia");
    assert_eq!(nvidia["options"]["BinaryName"].as_str(), Some(RT));
    assert!(
        !out.contains("io.containerd.grpc.v1.cri"),
        "nothing under the v2 plugin id: {out}"
    );
    assert_eq!(containerd_toml(Some(&out), UNDO, "v3 undo"), v3);
}

#[test]
fn containerd_declares_builtin_runc_when_the_file_lists_no_runtime() {
    for (case, old) in [
        ("missing file", None),
        ("empty file", Some("")),
        ("keys but no runtimes", Some("version = 2\noom_score = 0\n")),
    ] {
        let out = containerd_toml(old, add(false), case);
        let doc: toml::Table = out.parse().unwrap();
        assert_eq!(doc["version"].as_integer(), Some(2), "{case}");
        let cri = "io.containerd.grpc.v1.cri";
        assert_eq!(
            runtime(&doc, cri, "runc")["runtime_type"].as_str(),
            Some(containerd::RUNC_V2),
            "{case}: {out}"
        );
        assert_eq!(
            runtime(&doc, cri, "nvidia")["options"]["BinaryName"].as_str(),
            Some(RT),
            "{case}"
        );
        let back = containerd_toml(Some(&out), UNDO, case);
        let expected = old.filter(|o| !o.is_empty()).unwrap_or("version = 2\n");
        assert_eq!(
            back, expected,
            "{case}: undo removes the runc we declared too"
        );
    }
}

#[test]
fn containerd_comments_only_file_keeps_its_comments_on_top() {
    let out = containerd_toml(Some("# node config\n\n"), add(false), "comments");
    assert!(out.starts_with("# node config\n\nversion = 2\n"), "{out}");
}

#[test]
fn containerd_existing_entry_updated_in_place() {
    let old = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia]
  runtime_type = "io.containerd.runc.v2"
  privileged_without_host_devices = true
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.nvidia.options]
    BinaryName = "/old"   # keep me
"#;
    let out = containerd_toml(Some(old), add(false), "in place");
    assert_eq!(out, old.replace("\"/old\"", &format!("\"{RT}\"")));
}

#[test]
fn containerd_inline_runtimes_stay_inline() {
    let old = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }\n";
    let out = containerd_toml(Some(old), add(false), "inline");
    let doc: toml::Table = out.parse().unwrap();
    let nvidia = runtime(&doc, "io.containerd.grpc.v1.cri", "nvidia");
    assert_eq!(nvidia["options"]["BinaryName"].as_str(), Some(RT), "{out}");
    assert_eq!(out.matches('[').count(), 1, "no new headers: {out}");
}

#[test]
fn containerd_single_quotes_kept_when_replacing() {
    let old = "version = 3\n[plugins.'io.containerd.cri.v1.runtime'.containerd]\n  default_runtime_name = 'runc'  # stock\n";
    let out = containerd_toml(Some(old), add(true), "quotes");
    assert!(
        out.contains("  default_runtime_name = 'nvidia'  # stock\n"),
        "{out}"
    );
}

#[test]
fn containerd_template_skips_other_shims() {
    let old = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "kata"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata]
  runtime_type = "io.containerd.kata.v2"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.kata.options]
    ConfigPath = "/etc/kata/configuration.toml"
"#;
    let out = containerd_toml(Some(old), add(false), "kata");
    let doc: toml::Table = out.parse().unwrap();
    let nvidia = runtime(&doc, "io.containerd.grpc.v1.cri", "nvidia");
    assert!(nvidia["options"].get("ConfigPath").is_none(), "{out}");
}

#[test]
fn containerd_refuses_what_it_cannot_edit() {
    for (case, text, version) in [
        ("future", "version = 4\n", "4"),
        ("string", "version = \"2\"\n", "\"2\""),
    ] {
        match containerd::edit(Some(text), file(), add(false)) {
            Err(ConfigureError::ContainerdVersion { version: v, .. }) => {
                assert_eq!(v, version, "{case}")
            }
            other => panic!("{case}: {other:?}"),
        }
    }
    let bad = "version = 2\n\n[plugins\nx = 1\n";
    match containerd::edit(Some(bad), file(), add(false)) {
        Err(ConfigureError::InvalidToml { line, .. }) => assert_eq!(line, 3),
        other => panic!("{other:?}"),
    }
    let not_table =
        "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\nruntimes = 5\n";
    let err = containerd::edit(Some(not_table), file(), add(false)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "/etc/engine/config: `plugins.io.containerd.grpc.v1.cri.containerd.runtimes` is an \
         integer, expected a table; nothing was changed"
    );
}

#[test]
fn containerd_notes_a_disabled_cri_plugin() {
    let old = "version = 2\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n";
    let edited = containerd::edit(Some(old), file(), add(false)).unwrap();
    assert!(
        edited
            .notes
            .iter()
            .any(|n| n.contains("disables the CRI plugin")),
        "{:?}",
        edited.notes
    );
}

#[test]
fn containerd_undo_without_our_entry_is_unchanged() {
    for (case, old) in [
        ("missing", None),
        ("empty", Some("")),
        ("stock", Some(V2_STOCK)),
    ] {
        let edited = containerd::edit(old, file(), UNDO).unwrap();
        assert_eq!(edited.outcome, Outcome::Unchanged, "{case}");
    }
}

proptest! {
    /// Whatever the file holds, the transform answers; what it writes parses as TOML, has our
    /// runtime where the schema says, and undo takes it out again.
    #[test]
    fn containerd_add_then_undo(text in containerd_text(), default in any::<bool>()) {
        if let Ok(edited) = containerd::edit(Some(&text), file(), add(default))
            && let Outcome::Write(out) = edited.outcome
        {
            let doc: toml::Table = out.parse().map_err(|e| TestCaseError::fail(format!("{e}\n{out}")))?;
            let plugin = match doc.get("version").and_then(toml::Value::as_integer) {
                Some(3) => "io.containerd.cri.v1.runtime",
                Some(2) => "io.containerd.grpc.v1.cri",
                _ => "cri",
            };
            prop_assert_eq!(
                runtime(&doc, plugin, "nvidia")["options"]["BinaryName"].as_str(),
                Some(RT)
            );
            let undone = containerd::edit(Some(&out), file(), UNDO).unwrap();
            let back = match undone.outcome {
                Outcome::Write(back) => back,
                other => return Err(TestCaseError::fail(format!("{other:?}"))),
            };
            let doc: toml::Table = back.parse().unwrap();
            let containerd = doc.get("plugins").and_then(|p| p.get(plugin)).and_then(|p| p.get("containerd"));
            let runtimes = containerd.and_then(|c| c.get("runtimes"));
            prop_assert!(runtimes.and_then(|r| r.get("nvidia")).is_none(), "{}", back);
            let default_name = containerd.and_then(|c| c.get("default_runtime_name"));
            prop_assert!(default_name.and_then(|d| d.as_str()) != Some("nvidia"), "{}", back);
        }
    }
}

/// containerd configs made of lines that matter to the edit, in any order (many are invalid:
/// duplicate tables, values where tables go).
fn containerd_text() -> impl Strategy<Value = String> {
    let lines = prop::sample::select(vec![
        "",
        "# a comment",
        "x = 1",
        "[plugins]",
        "[plugins.\"io.containerd.grpc.v1.cri\"]",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd]",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes]",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]",
        "[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.nvidia]",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]",
        "[plugins.'io.containerd.cri.v1.runtime'.containerd]",
        "runtime_type = \"io.containerd.runc.v2\"  # shim",
        "runtime_type = \"io.containerd.kata.v2\"",
        "default_runtime_name = \"runc\"",
        "default_runtime_name = 'nvidia'",
        "SystemdCgroup = true",
        "BinaryName = ''",
        "options = { BinaryName = \"\" }",
        "runtimes = { runc = { runtime_type = \"io.containerd.runc.v2\" } }",
        "runtimes = 5",
        "containerd.runtimes.crun.runtime_type = \"io.containerd.runc.v2\"",
    ]);
    (
        prop::sample::select(vec!["", "version = 2\n", "version = 3\n"]),
        prop::collection::vec(lines, 0..10),
    )
        .prop_map(|(version, lines)| format!("{version}{}\n", lines.join("\n")))
}

#[test]
fn containerd_undo_resets_a_default_naming_us_without_an_entry() {
    let old = r#"version = 2
[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "nvidia"
[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
"#;
    let out = containerd_toml(Some(old), UNDO, "default only");
    assert_eq!(out, old.replace("\"nvidia\"", "\"runc\""));
}

fn with_cdi(default: bool) -> Action<'static> {
    match add(default) {
        Action::Add {
            name,
            path,
            set_as_default,
            ..
        } => Action::Add {
            name,
            path,
            set_as_default,
            cdi: true,
        },
        other => other,
    }
}

/// Version 1 (no `version`, containerd 1.x's own default) is edited under `plugins.cri`, the id
/// containerd 1.x migrates to `io.containerd.grpc.v1.cri` on load; `enable_cdi` goes on the
/// CRI plugin's table for every version.
#[test]
fn containerd_each_version_at_its_schema_path() {
    for (case, text, plugin) in [
        ("no version", "oom_score = 0\n", "cri"),
        ("version 1", "version = 1\n", "cri"),
        ("version 2", "version = 2\n", "io.containerd.grpc.v1.cri"),
        ("version 3", "version = 3\n", "io.containerd.cri.v1.runtime"),
    ] {
        let out = containerd_toml(Some(text), with_cdi(true), case);
        let doc: toml::Table = out.parse().unwrap();
        let nvidia = runtime(&doc, plugin, "nvidia");
        assert_eq!(
            nvidia["options"]["BinaryName"].as_str(),
            Some(RT),
            "{case}: {out}"
        );
        let cri = &doc["plugins"][plugin];
        assert_eq!(cri["enable_cdi"].as_bool(), Some(true), "{case}: {out}");
        assert_eq!(
            cri["containerd"]["default_runtime_name"].as_str(),
            Some("nvidia"),
            "{case}"
        );
        assert_eq!(doc["plugins"].as_table().unwrap().len(), 1, "{case}: {out}");
        assert!(out.starts_with(text), "{case}: the head stays: {out}");
    }
}

/// The drop-in: the source's CRI plugin table (containerd 1.x replaces the whole table on
/// import), our runtime in it, its version; the source itself untouched.
#[test]
fn containerd_drop_in_carries_the_cri_table() {
    let source = format!(
        "{V2_STOCK}\n[plugins.\"io.containerd.grpc.v1.cri\".cni]\n  bin_dir = \"/usr/lib/cni\"\n"
    );
    let drop = std::path::Path::new("/etc/containerd/conf.d/99-nvidia.toml");
    let edited =
        containerd::drop_in(Some(&source), file(), false, None, drop, with_cdi(true)).unwrap();
    let out = written(edited.outcome, "v2 drop-in");
    let doc: toml::Table = out.parse().unwrap();
    let cri = "io.containerd.grpc.v1.cri";
    assert_eq!(doc["version"].as_integer(), Some(2));
    assert_eq!(
        doc["plugins"][cri]["cni"]["bin_dir"].as_str(),
        Some("/usr/lib/cni")
    );
    assert_eq!(doc["plugins"][cri]["enable_cdi"].as_bool(), Some(true));
    let nvidia = runtime(&doc, cri, "nvidia");
    assert_eq!(nvidia["options"]["BinaryName"].as_str(), Some(RT));
    assert_eq!(
        nvidia["options"]["SystemdCgroup"].as_bool(),
        Some(true),
        "runc's settings"
    );
    assert_eq!(
        runtime(&doc, cri, "runc")["options"]["SystemdCgroup"].as_bool(),
        Some(true),
        "runc itself kept: 1.x would lose it otherwise"
    );
    assert!(!out.contains("\n  "), "laid out afresh: {out}");
    let again = containerd::drop_in(
        Some(&source),
        file(),
        false,
        Some(&out),
        drop,
        with_cdi(true),
    );
    assert_eq!(again.unwrap().outcome, Outcome::Unchanged);

    // Version 3 source: a version 3 drop-in under the 2.x plugin id.
    let v3 = "version = 3\n";
    let out = written(
        containerd::drop_in(Some(v3), file(), false, None, drop, add(false))
            .unwrap()
            .outcome,
        "v3",
    );
    let doc: toml::Table = out.parse().unwrap();
    assert_eq!(doc["version"].as_integer(), Some(3));
    let nvidia = runtime(&doc, "io.containerd.cri.v1.runtime", "nvidia");
    assert_eq!(nvidia["runtime_type"].as_str(), Some(containerd::RUNC_V2));
}

#[test]
fn containerd_imports_added_once_and_removed() {
    let pattern = containerd::import_pattern(std::path::Path::new(
        "/etc/containerd/conf.d/99-nvidia.toml",
    ));
    assert_eq!(pattern, "/etc/containerd/conf.d/*.toml");
    let fresh = written(
        containerd::add_import(None, file(), &pattern, 2)
            .unwrap()
            .outcome,
        "missing",
    );
    assert_eq!(
        fresh,
        "version = 2\nimports = [\"/etc/containerd/conf.d/*.toml\"]\n"
    );
    let theirs = "version = 2\nimports = [\"/opt/other/*.toml\"]\n\n[plugins]\n";
    let both = written(
        containerd::add_import(Some(theirs), file(), &pattern, 2)
            .unwrap()
            .outcome,
        "theirs",
    );
    let doc: toml::Table = both.parse().unwrap();
    assert_eq!(
        doc["imports"].as_array().unwrap().len(),
        2,
        "theirs kept, ours appended: {both}"
    );
    let again = containerd::add_import(Some(&both), file(), &pattern, 2).unwrap();
    assert_eq!(again.outcome, Outcome::Unchanged);
    let back = written(
        containerd::remove_import(Some(&both), file(), &pattern)
            .unwrap()
            .outcome,
        "remove",
    );
    assert_eq!(back, theirs);
    let bad = containerd::add_import(Some("imports = 3\n"), file(), &pattern, 2).unwrap_err();
    assert!(matches!(bad, ConfigureError::TomlType { .. }), "{bad}");
}

#[test]
fn docker_cdi_enabled_sets_features_cdi() {
    let old = "{\"features\": {\"buildkit\": true}}";
    let out = written(
        docker::edit(Some(old), file(), with_cdi(true))
            .unwrap()
            .outcome,
        "docker cdi",
    );
    let doc: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["features"]["cdi"], true, "{out}");
    assert_eq!(doc["features"]["buildkit"], true, "{out}");
    assert_eq!(doc["default-runtime"], "nvidia", "{out}");
    let bad = docker::edit(Some("{\"features\": []}"), file(), with_cdi(false)).unwrap_err();
    assert!(
        bad.to_string().contains("\"features\" is an array"),
        "{bad}"
    );
}

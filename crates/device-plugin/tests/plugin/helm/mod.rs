// SPDX-License-Identifier: Apache-2.0
//! The Helm chart (`deployments/helm/nvshim`) through the engines Helm is made of: Go's
//! text/template with sprig, in `tests/foreign/helm_render` (no helm binary is packaged
//! for Debian or PyPI). Its values against `values.schema.json` (the `jsonschema` crate,
//! draft 7 as Helm checks it), its output through `kubernetes-validate --strict`, and
//! every value its templates read present in values.yaml, the schema and the README.
//!
//! - `render`: value sets (defaults, labels and exporter with MIG, CRI-O with a driver
//!   container, a config map of two configs, MPS sharing, NVIDIA's toolkit defaults,
//!   custom placement) through `kubernetes-validate`; what the defaults deploy.
//! - `values`: what each value set puts in the objects; image env as no allocation (and
//!   its opt-outs); values the chart refuses.
//! - `installer_args`: the installer's command lines through `nvshim install`.
//! - `pod_env`: the rendered plugin, labels and exporter environments through their own
//!   resolution code.
//! - `crio_hook`: CRI-O's hook mode (no RuntimeClass) and its refusals.
//! - `real_helm`: Helm v4 itself renders every value set to the renderer's objects.
//! - here: the schema and the documentation of the values.

mod crio_hook;
pub(crate) mod installer_args;
mod pod_env;
mod real_helm;
mod render;
mod values;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

const FOREIGN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/foreign");

fn chart() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deployments/helm/nvshim")
}

/// The renderer, built with Debian's Go, sprig and yaml.v3 (GOPATH mode, no network):
/// once per test process, and only when its source is newer than the binary.
fn renderer() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let gopath = Path::new("/usr/share/gocode");
        assert!(
            gopath.join("src/github.com/Masterminds/sprig").is_dir(),
            "Debian's golang-github-masterminds-sprig-dev is needed (`.ci/run` installs it)"
        );
        let source = Path::new(FOREIGN).join("helm_render");
        let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
        let bin = tmp.join("helm-render");
        let modified = |p: &Path| fs::metadata(p).and_then(|m| m.modified()).ok();
        if modified(&bin) >= modified(&source.join("main.go")) && bin.exists() {
            return bin;
        }
        // Test processes run in parallel: each builds to its own name, then renames.
        let building = tmp.join(format!("helm-render.{}", std::process::id()));
        crate::foreign::go_build(&source, &building);
        fs::rename(&building, &bin).unwrap();
        bin
    })
}

/// Runs the renderer on the chart with `values` (YAML) over values.yaml: its stdout, or
/// its stderr when it fails.
fn run_renderer(values: &str, extra: &[&str]) -> Result<String, String> {
    run_renderer_on(&chart(), values, extra)
}

fn run_renderer_on(chart: &Path, values: &str, extra: &[&str]) -> Result<String, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    fs::write(&file, values).unwrap();
    let out = Command::new(renderer())
        .args(extra)
        .arg("-values")
        .arg(&file)
        .arg(chart)
        .output()
        .unwrap();
    if out.status.success() {
        Ok(String::from_utf8(out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The chart's values with `values` coalesced over them, as Helm's schema check sees them.
fn merged_values(values: &str) -> Value {
    let text = run_renderer(values, &["-dump-values"]).unwrap_or_else(|e| panic!("{e}"));
    serde_json::from_str(&text).unwrap()
}

fn schema() -> Value {
    serde_json::from_str(&fs::read_to_string(chart().join("values.schema.json")).unwrap()).unwrap()
}

/// The schema's complaints about `values` (empty: valid).
fn schema_errors(values: &Value) -> Vec<String> {
    let validator = jsonschema::draft7::new(&schema()).unwrap();
    validator
        .iter_errors(values)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// The renderer's guards that Helm has or that the tests rely on: a template reading a
/// value values.yaml lacks fails (Helm would print nothing), a null override empties a
/// value, and a kubeVersion the cluster does not meet is refused (as Helm does).
#[test]
fn helm_render_refuses_unknown_values_and_unmet_kube_versions() {
    let copy = tempfile::tempdir().unwrap();
    let root = copy.path().join("nvshim");
    fs::create_dir_all(root.join("templates")).unwrap();
    for name in ["Chart.yaml", "values.yaml"] {
        fs::copy(chart().join(name), root.join(name)).unwrap();
    }
    let template = root.join("templates/probe.yaml");
    fs::write(&template, "probe: {{ .Values.migStrategie }}\n").unwrap();
    let err = run_renderer_on(&root, "{}", &[]).unwrap_err();
    assert!(err.contains("migStrategie"), "{err}");

    fs::write(&template, "probe: [{{ .Values.affinity }}]\n").unwrap();
    let text = run_renderer_on(&root, "affinity: null", &[]).unwrap();
    assert!(text.contains("probe: []"), "{text}");

    let chart_yaml = fs::read_to_string(root.join("Chart.yaml")).unwrap();
    assert!(
        chart_yaml.contains("kubeVersion: \">=1.25.0-0\""),
        "{chart_yaml}"
    );
    fs::write(
        root.join("Chart.yaml"),
        chart_yaml.replace(">=1.25.0-0", ">=1.99.0-0"),
    )
    .unwrap();
    let err = run_renderer_on(&root, "{}", &[]).unwrap_err();
    assert!(err.contains("kubeVersion >=1.99.0-0"), "{err}");
}

#[test]
fn helm_default_values_pass_the_schema_and_bad_values_do_not() {
    let defaults = merged_values("{}");
    assert_eq!(schema_errors(&defaults), Vec::<String>::new());
    for (case, values, path) in [
        ("unknown MIG strategy", "migStrategy: bogus", "/migStrategy"),
        (
            "unknown engine",
            "installer:\n  runtime: podman",
            "/installer/runtime",
        ),
        ("unknown key", "migStrategie: single", ""),
        (
            "port as a string",
            "exporter:\n  port: \"9400\"",
            "/exporter/port",
        ),
        (
            "unknown device-list strategy",
            "deviceListStrategy: envvar,bogus",
            "/deviceListStrategy",
        ),
        (
            "boolean as a string",
            "failOnInitError: \"no\"",
            "/failOnInitError",
        ),
        (
            "relative toolkit dir",
            "installer:\n  toolkitDir: toolkit",
            "/installer/toolkitDir",
        ),
        (
            "interval without unit",
            "gfd:\n  sleepInterval: \"60\"",
            "/gfd/sleepInterval",
        ),
    ] {
        let errors = schema_errors(&merged_values(values));
        assert!(
            errors.iter().any(|e| e.starts_with(&format!("{path}:"))),
            "case {case}: {errors:?}"
        );
    }
}

/// Every `.Values.a.b` path the templates read, with `$x := .Values.a` aliases followed
/// (`$x.b` is `a.b`).
fn template_value_paths() -> BTreeSet<String> {
    let path_at = |text: &str| -> String {
        let end = text
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
            .unwrap_or(text.len());
        text[..end].trim_end_matches('.').to_owned()
    };
    let mut paths = BTreeSet::new();
    for entry in fs::read_dir(chart().join("templates")).unwrap() {
        let text = fs::read_to_string(entry.unwrap().path()).unwrap();
        for (at, _) in text.match_indices(".Values.") {
            paths.insert(path_at(&text[at + ".Values.".len()..]));
        }
        for (at, _) in text.match_indices(":= .Values.") {
            let name_start = text[..at].trim_end().rfind('$').unwrap();
            let name = text[name_start..at].trim();
            let target = path_at(&text[at + ":= .Values.".len()..]);
            for (use_at, _) in text.match_indices(&format!("{name}.")) {
                let rest = path_at(&text[use_at + name.len() + 1..]);
                if !rest.is_empty() {
                    paths.insert(format!("{target}.{rest}"));
                }
            }
        }
    }
    paths.retain(|p| !p.is_empty());
    paths
}

/// The schema's properties as dotted paths, each with whether it has a description and
/// whether it is a leaf (no properties of its own).
fn schema_paths(node: &Value, prefix: &str, out: &mut Vec<(String, bool, bool)>) {
    let Some(properties) = node["properties"].as_object() else {
        return;
    };
    for (key, property) in properties {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        let described = property["description"]
            .as_str()
            .is_some_and(|d| !d.is_empty());
        out.push((
            path.clone(),
            described,
            property.get("properties").is_none(),
        ));
        schema_paths(property, &path, out);
    }
}

/// The first cells of a values table (the chart's README.md, docs/helm.md): `| `path` | …`,
/// up to the next heading.
fn table_paths(file: &Path) -> BTreeSet<String> {
    let text = fs::read_to_string(file).unwrap();
    let table = text
        .split("\n## Values\n")
        .nth(1)
        .unwrap_or_else(|| panic!("{}: no ## Values", file.display()));
    table
        .split("\n#")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(path, _)| path.to_owned())
        .collect()
}

#[test]
fn helm_templates_read_only_values_the_chart_documents() {
    let values: Value =
        serde_saphyr::from_str(&fs::read_to_string(chart().join("values.yaml")).unwrap()).unwrap();
    let mut schema_entries = Vec::new();
    schema_paths(&schema(), "", &mut schema_entries);
    // What Helm itself puts in the values of a chart used as a dependency: in the schema
    // so that the root's `additionalProperties: false` accepts them, read by no template.
    let helm_injected = ["global", "enabled"];
    for key in helm_injected {
        assert!(
            schema_entries.iter().any(|(p, _, _)| p == key),
            "case {key}"
        );
    }
    schema_entries.retain(|(p, _, _)| !helm_injected.contains(&p.as_str()));
    let leaves: BTreeSet<&str> = schema_entries
        .iter()
        .filter(|(_, _, leaf)| *leaf)
        .map(|(p, _, _)| p.as_str())
        .collect();
    for (path, described, _) in &schema_entries {
        assert!(
            described,
            "case {path}: no description in values.schema.json"
        );
    }
    let readme = table_paths(&chart().join("README.md"));
    let docs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/helm.md");
    assert_eq!(
        table_paths(&docs),
        readme,
        "docs/helm.md's values table against the chart README's"
    );
    let used = template_value_paths();
    assert!(used.len() > 30, "{used:?}");
    // Paths read through a variable (`$installer := .Values.installer`) are found too.
    for aliased in ["installer.runtime", "installer.image.tag", "exporter.port"] {
        assert!(used.contains(aliased), "case {aliased}: {used:?}");
    }
    for path in &used {
        let in_values = path
            .split('.')
            .try_fold(&values, |node, key| {
                node.as_object().and_then(|m| m.get(key))
            })
            .is_some();
        assert!(
            in_values,
            "case {path}: read by a template, not in values.yaml"
        );
        assert!(
            schema_entries.iter().any(|(p, _, _)| p == path),
            "case {path}: read by a template, not in values.schema.json"
        );
        let under: Vec<&&str> = leaves
            .iter()
            .filter(|leaf| leaf.starts_with(&format!("{path}.")))
            .collect();
        assert!(
            readme.contains(path)
                || (!under.is_empty() && under.iter().all(|l| readme.contains(**l))),
            "case {path}: read by a template, not in README.md's values table"
        );
    }
    // The table and the schema describe the same values, and values.yaml sets them all.
    assert_eq!(
        readme,
        leaves
            .iter()
            .map(|l| l.to_string())
            .collect::<BTreeSet<_>>(),
        "README.md's values table against values.schema.json's leaves"
    );
    for leaf in &leaves {
        let present = leaf
            .split('.')
            .try_fold(&values, |node, key| {
                node.as_object().and_then(|m| m.get(key))
            })
            .is_some();
        assert!(
            present,
            "case {leaf}: in values.schema.json, not in values.yaml"
        );
    }
}

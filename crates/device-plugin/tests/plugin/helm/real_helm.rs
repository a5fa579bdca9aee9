// SPDX-License-Identifier: Apache-2.0
//! The test renderer against Helm itself: every value set of `render::CASES` gives the same
//! objects through `helm template` (Helm v4, built from the Go module proxy into the peers'
//! cache by `scripts/build-peers.sh`, which `.ci/run` runs before the tests), so what the
//! other chart tests assert of the renderer's output holds for Helm's. Helm also checks the
//! values against `values.schema.json` on the way. The renderer stays for what Helm does not
//! check: a template reading a value `values.yaml` lacks (Helm renders nothing there).

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

use super::render::{CASES, render};

/// The kube version the test renderer reports (`helm_render/main.go`).
const KUBE_VERSION: &str = "v1.29.0";

fn helm() -> PathBuf {
    let cache = std::env::var("NVSHIM_PEERS_CACHE")
        .unwrap_or_else(|_| "/var/cache/nvshim-ci/peers".to_owned());
    PathBuf::from(cache).join("bin/helm")
}

/// The objects of a multi-document YAML stream, empty documents left out, in (kind, name)
/// order.
fn objects(docs: Vec<Value>) -> Vec<Value> {
    let mut docs: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    docs.sort_by_key(|d| {
        (
            d["kind"].as_str().unwrap_or_default().to_owned(),
            d["metadata"]["name"]
                .as_str()
                .unwrap_or_default()
                .to_owned(),
        )
    });
    docs
}

#[test]
fn helm_template_renders_what_the_test_renderer_renders() {
    let helm = helm();
    if !helm.exists() {
        // CI builds the peers first: there, a missing Helm is a failure, not a skip.
        assert!(
            std::env::var_os("CI").is_none(),
            "no Helm at {} (scripts/build-peers.sh builds it before the tests)",
            helm.display()
        );
        eprintln!(
            "skipped: no Helm at {} (`make peers` builds it)",
            helm.display()
        );
        return;
    }
    let chart = super::chart();
    for (case, values) in CASES {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("values.yaml");
        std::fs::write(&file, values).unwrap();
        let out = Command::new(&helm)
            .args(["template", "nvshim"])
            .arg(&chart)
            .args([
                "--namespace",
                "nvshim",
                "--kube-version",
                KUBE_VERSION,
                "--values",
            ])
            .arg(&file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "case {case}: helm template: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let by_helm = objects(serde_saphyr::from_multiple(&text).unwrap());
        let by_renderer = objects(render(values).unwrap());
        let kinds = |docs: &[Value]| -> Vec<String> {
            docs.iter()
                .map(|d| format!("{}/{}", d["kind"], d["metadata"]["name"]))
                .collect()
        };
        assert_eq!(
            kinds(&by_helm),
            kinds(&by_renderer),
            "case {case}: the objects"
        );
        for (h, r) in by_helm.iter().zip(&by_renderer) {
            assert_eq!(h, r, "case {case}: {}/{}", h["kind"], h["metadata"]["name"]);
        }
    }
}

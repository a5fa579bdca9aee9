//! `nvidia-ctk cdi generate --mode csv` through the real binary on a Tegra-shaped node:
//! NVIDIA's spec shape (device `0` and `all`, each with the CSV files' nodes, mounts and
//! hooks), `--csv.file`, `--csv.ignore-pattern`, the config's `mount-spec-path` as the
//! default, a spec the CDI schema accepts, and `auto` picking csv on the Tegra node.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::process::Command;

use crate::common::cdi_schema::schema;
use nvshim_testkit::{LIB_DIR, TEGRA_DEVICES, TegraNode};
use serde_json::Value;

#[test]
fn cdi_generate_csv_mode_writes_nvidias_tegra_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let (node, ctk, config) = tegra_ctk(tmp.path());
    let generate = |extra: &[&str]| -> Value {
        let out = Command::new(&ctk)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
            .args(["cdi", "generate", "--mode", "csv", "--format", "json"])
            .args(extra)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "nvidia-ctk cdi generate --mode csv {extra:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    };

    // The roots and the CSV directory come from config.toml.
    let spec = generate(&[]);
    let names: Vec<&str> = spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["0", "all"]);
    let edits = &spec["devices"][0]["containerEdits"];
    assert_eq!(edits, &spec["devices"][1]["containerEdits"]);
    let nodes: Vec<&str> = edits["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["path"].as_str().unwrap())
        .collect();
    let mut want: Vec<String> = TEGRA_DEVICES
        .iter()
        .map(|(n, _, _)| format!("/dev/{n}"))
        .collect();
    want.sort();
    assert_eq!(nodes, want);
    let tegra = format!("/{LIB_DIR}/tegra");
    let mounts = edits["mounts"].to_string();
    assert!(
        mounts.contains(&format!("{tegra}/libcuda.so.1.1")),
        "{mounts}"
    );
    assert!(
        !mounts.contains("libnvextra"),
        "extra.csv is not a base file"
    );
    let hooks: Vec<String> = edits["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| {
            h["args"]
                .as_array()
                .unwrap()
                .iter()
                .map(|a| a.as_str().unwrap())
                .collect::<Vec<_>>()
                .join(" ")
        })
        .collect();
    let chain = format!("tegra/libcuda.so::/{LIB_DIR}/libcuda.so");
    assert!(
        hooks[0].starts_with("nvidia-cdi-hook create-symlinks") && hooks[0].contains(&chain),
        "{hooks:?}"
    );
    assert_eq!(
        hooks[1],
        format!("nvidia-cdi-hook update-ldcache --folder {tegra}")
    );
    assert_eq!(
        spec["containerEdits"]["env"][0],
        "NVIDIA_VISIBLE_DEVICES=void"
    );
    if let Some(schema) = schema("cdi_generate_csv_mode_writes_nvidias_tegra_spec") {
        assert_eq!(schema.errors(&spec), Vec::<String>::new(), "{spec:#}");
    }

    // Listed files (extra.csv too), and the sym chain left out by an ignore pattern.
    let listed = format!("{d}/drivers.csv,{d}/extra.csv", d = node.spec_dir.display());
    let spec = generate(&[
        "--csv.file",
        &listed,
        "--csv.ignore-pattern",
        "**/libcuda.so",
    ]);
    let edits = spec["devices"][0]["containerEdits"].to_string();
    assert!(edits.contains("libnvextra.so.1"), "{edits}");
    assert!(!edits.contains(&chain), "the sym line is ignored: {edits}");
    assert!(
        !edits.contains("/dev/nvmap"),
        "devices.csv is not listed: {edits}"
    );
}

/// NVIDIA's `auto` is csv on a Tegra host: the default mode needs no flag there.
#[test]
fn cdi_generate_auto_is_csv_on_tegra() {
    let tmp = tempfile::tempdir().unwrap();
    let (_node, ctk, config) = tegra_ctk(tmp.path());
    let out = Command::new(&ctk)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
        .args(["cdi", "generate", "--format", "json"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let spec: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(spec["devices"][0]["name"], "0");
    assert!(
        spec["devices"][0]["containerEdits"]
            .to_string()
            .contains("/dev/nvmap")
    );
}

/// A Tegra node in `dir`, `nvidia-ctk` (our binary under that name) and a config.toml for
/// the node with `mode = "auto"`.
fn tegra_ctk(dir: &std::path::Path) -> (TegraNode, std::path::PathBuf, std::path::PathBuf) {
    let node = TegraNode::build(&dir.join("node")).unwrap();
    let ctk = dir.join("nvidia-ctk");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nvshim"), &ctk).unwrap();
    let config = dir.join("config.toml");
    fs::write(&config, node.runtime_config("runc", "auto", None)).unwrap();
    (node, ctk, config)
}

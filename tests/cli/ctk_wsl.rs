// SPDX-License-Identifier: Apache-2.0
//! `nvidia-ctk cdi generate --mode wsl` (and `auto`, which picks it) on a WSL2-shaped node:
//! NVIDIA's WSL spec shape, the `all` device with `/dev/dxg` and the driver files with
//! `create-symlinks` and `update-ldcache` at spec level.

use std::fs;
use std::process::{Command, Output};

use crate::common::{node, stderr, stdout};
use nvshim_testkit::harness::{Node, wsl_node};
use nvshim_testkit::{DXG_MAJOR, DXG_MINOR, NodeSpec, WSL_STORE};
use serde_json::Value;

fn generate(node: &Node, mode: &str, dir: &std::path::Path) -> Output {
    let link = dir.join("nvidia-ctk");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nvshim"), &link).unwrap();
    }
    let config = dir.join(format!("config-{mode}.toml"));
    fs::write(&config, node.sim.runtime_config("runc", None)).unwrap();
    let sim = &node.sim;
    Command::new(&link)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
        .envs(sim.env())
        .args(["cdi", "generate", "--format", "json", "--mode", mode])
        .arg("--driver-root")
        .arg(&sim.driver_root)
        .arg("--dev-root")
        .arg(&sim.dir)
        .output()
        .unwrap()
}

fn hook_args<'a>(spec: &'a Value, name: &str) -> Vec<&'a str> {
    spec["containerEdits"]["hooks"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|h| h["args"].as_array())
        .filter(|args| args.get(1).and_then(Value::as_str) == Some(name))
        .flatten()
        .filter_map(Value::as_str)
        .collect()
}

#[test]
fn cdi_generate_mode_wsl_writes_nvidias_wsl_spec() {
    let wsl = wsl_node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let out = generate(&wsl, "wsl", dir.path());
    assert!(out.status.success(), "--mode wsl: {}", stderr(&out));
    let text = stdout(&out);
    let spec: Value = serde_json::from_str(&text).unwrap();
    let store = format!("/{WSL_STORE}");

    // One device, `all`, with the one node.
    let devices = spec["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 1, "{text}");
    assert_eq!(devices[0]["name"], "all");
    let nodes = devices[0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap();
    assert_eq!(nodes.len(), 1, "{text}");
    assert_eq!(nodes[0]["path"], "/dev/dxg");
    assert_eq!(
        (nodes[0]["major"].as_u64(), nodes[0]["minor"].as_u64()),
        (Some(u64::from(DXG_MAJOR)), Some(u64::from(DXG_MINOR)))
    );

    // The driver files at spec level, where NVIDIA puts its common edits.
    let mounts: Vec<&str> = spec["containerEdits"]["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    for path in [
        "/usr/lib/wsl/lib/libdxcore.so".to_owned(),
        format!("{store}/libcuda.so.1.1"),
        format!("{store}/libnvidia-ml.so.1"),
        format!("{store}/nvcubins.bin"),
        format!("{store}/nvidia-smi"),
        format!("{store}/libnvwgf2umx.so"),
    ] {
        assert!(mounts.contains(&path.as_str()), "{path} in {mounts:?}");
    }
    assert!(
        !mounts
            .iter()
            .any(|m| m.ends_with(".inf") || m.ends_with(".sys")),
        "{mounts:?}"
    );
    let links = hook_args(&spec, "create-symlinks");
    for link in [
        format!("{store}/nvidia-smi::/usr/bin/nvidia-smi"),
        format!("libcuda.so.1.1::{store}/libcuda.so.1"),
    ] {
        assert!(links.contains(&link.as_str()), "{link} in {links:?}");
    }
    let folders = hook_args(&spec, "update-ldcache");
    for folder in [store.as_str(), "/usr/lib/wsl/lib"] {
        assert!(folders.contains(&folder), "{folder} in {folders:?}");
    }
    // NVIDIA's WSL spec has neither the CUDA compat hook nor the application profile.
    for absent in ["enable-cuda-compat", "update-application-profile"] {
        assert!(hook_args(&spec, absent).is_empty(), "{absent}: {text}");
    }

    // `auto` picks wsl on this node.
    let auto = generate(&wsl, "auto", dir.path());
    assert!(auto.status.success(), "--mode auto: {}", stderr(&auto));
    assert_eq!(stdout(&auto), text, "auto is wsl on a WSL2 node");

    // `wsl` on a node with the NVIDIA module is refused, naming what it looked for.
    let standard = node(&NodeSpec::standard(1));
    let out = generate(&standard, "wsl", dir.path());
    assert_eq!(out.status.code(), Some(1), "{}", stdout(&out));
    assert!(
        stderr(&out).contains("--mode wsl needs a WSL2 node"),
        "{}",
        stderr(&out)
    );
}

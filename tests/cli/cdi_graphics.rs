//! `nvshim cdi generate` with the graphics capabilities (the default `all`): each GPU's
//! device carries its own DRM nodes and the hook that makes its `by-path` links, as
//! NVIDIA's per-GPU device entries do; the spec-level edits carry `/dev/nvidia-modeset`
//! and no DRM node. In both hook shapes: ours (`link-driver`) and NVIDIA's
//! (`create-symlinks`).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common::{node, nvshim};
use nvshim_testkit::NodeSpec;
use serde_json::Value;

fn paths(edits: &Value) -> Vec<&str> {
    edits["deviceNodes"]
        .as_array()
        .map(|nodes| nodes.iter().map(|n| n["path"].as_str().unwrap()).collect())
        .unwrap_or_default()
}

#[test]
fn each_gpu_device_carries_its_own_drm_nodes_and_by_path_links() {
    let node = node(&NodeSpec::standard(2));
    for (shape, hook_path, stage) in [
        (
            "ours",
            "/usr/bin/nvidia-container-runtime-hook",
            "link-driver",
        ),
        ("NVIDIA's", "/usr/bin/nvidia-cdi-hook", "create-symlinks"),
    ] {
        let text = crate::common::ok(
            nvshim(
                &node,
                &[
                    "cdi",
                    "generate",
                    "--format",
                    "json",
                    "--nvidia-cdi-hook-path",
                    hook_path,
                ],
            ),
            "nvshim cdi generate",
        );
        let spec: Value = serde_json::from_str(&text).unwrap();
        let common = paths(&spec["containerEdits"]);
        assert!(
            common.contains(&"/dev/nvidia-modeset"),
            "{shape}: {common:?}"
        );
        assert!(
            !common.iter().any(|p| p.starts_with("/dev/dri")),
            "{shape}: no DRM node for every device: {common:?}"
        );
        for (index, gpu) in node.sim.spec.gpus.iter().enumerate() {
            let device = spec["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["name"].as_str().and_then(|n| n.parse().ok()) == Some(index))
                .unwrap();
            let edits = &device["containerEdits"];
            let (card, render) = nvshim_testkit::drm_nodes(index);
            let mut dri: Vec<&str> = paths(edits)
                .into_iter()
                .filter(|p| p.starts_with("/dev/dri/"))
                .collect();
            dri.sort();
            assert_eq!(
                dri,
                [format!("/dev/dri/{card}"), format!("/dev/dri/{render}")],
                "{shape}: device {index}"
            );
            let hooks = edits["hooks"].to_string();
            for (kind, name) in [("card", &card), ("render", &render)] {
                let link = format!("../{name}::/dev/dri/by-path/pci-{}-{kind}", gpu.bus_id);
                assert!(
                    hooks.contains(stage) && hooks.contains(&link),
                    "{shape}: device {index} has no {stage} {link}: {hooks}"
                );
            }
        }
    }
}

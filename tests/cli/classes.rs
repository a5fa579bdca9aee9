//! CDI names of the device classes (`nvidia.com/gds=all`, `nvidia.com/imex-channel=0`,
//! …) that no spec file defines are planned in memory from the host, next to GPUs; a
//! bad one fails naming it. Through `nvshim list --json`, which plans as the runtime
//! does (but never creates a missing IMEX node: it only reads).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use crate::common::{node, nvshim, ok, stderr};
use nvshim_testkit::NodeSpec;
use serde_json::Value;

#[test]
fn class_cdi_names_are_planned_in_memory_and_bad_ones_are_named() {
    let node = node(&NodeSpec::standard(2));
    node.sim.add_device_classes().unwrap();
    let out = ok(
        nvshim(
            &node,
            &[
                "list",
                "--devices=0,nvidia.com/gds=all,runtime.nvidia.com/imex-channel=0",
                "--json",
            ],
        ),
        "list --json",
    );
    let plan: Value = serde_json::from_str(&out).unwrap();
    let nodes: Vec<&str> = plan["edits"]["deviceNodes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["path"].as_str())
        .collect();
    // GPU 0's node (on this node the two GPUs' minors are swapped).
    let gpu0 = format!("/dev/nvidia{}", node.sim.spec.gpus[0].minor);
    for want in [
        gpu0.as_str(),
        "/dev/nvidia-fs0",
        "/dev/nvidia-fs1",
        "/dev/nvidia-caps-imex-channels/channel0",
    ] {
        assert!(nodes.contains(&want), "{want} not in {nodes:?}");
    }
    assert!(
        !nodes.contains(&"/dev/gdrdrv"),
        "only what was named: {nodes:?}"
    );
    let mounts = plan["edits"]["mounts"].as_array().unwrap();
    assert!(
        mounts
            .iter()
            .any(|m| m["containerPath"] == "/etc/cufile.json"),
        "{mounts:?}"
    );
    assert_eq!(
        plan["cdi_devices"],
        serde_json::json!(["nvidia.com/gds=all", "runtime.nvidia.com/imex-channel=0"])
    );

    let cases = [
        ("nvidia.com/gds=0", ["\"nvidia.com/gds=0\"", "all"]),
        ("nvidia.com/imex-channel=x", ["\"x\"", "0-1048575"]),
        ("nvidia.com/imex-channel=2", ["channel2", "IMEX channel 2"]),
    ];
    for (name, parts) in cases {
        let out = nvshim(&node, &["list", &format!("--devices={name}")]);
        assert!(!out.status.success(), "case {name}");
        let err = stderr(&out);
        for part in parts {
            assert!(err.contains(part), "case {name}: {err:?} lacks {part:?}");
        }
    }
}

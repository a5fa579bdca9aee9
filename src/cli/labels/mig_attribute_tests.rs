// SPDX-License-Identifier: Apache-2.0
//! NVML's MIG attributes in the labels, by MIG strategy (the node builders are `tests`').

use super::tests::{a100, check, inventory, strategy, with_migs};
use super::*;
use crate::k8s_config::MigStrategy;
use crate::nvml::MigAttributes;

/// The single strategy labels the MIG devices as `nvidia.com/gpu`, with NVML's attributes
/// of their profile under `gpu.*` (its memory replacing the device's), as GFD does; the
/// mixed one puts a profile with `+` under its resource name (`+` → `.`).
#[test]
fn mig_attributes_follow_the_strategy() {
    let node = inventory(vec![
        with_migs(a100(0), &[("1g.10gb", 10), ("1g.10gb", 10)]),
        with_migs(a100(1), &[("1g.10gb", 10), ("1g.10gb+me", 10)]),
    ]);
    let one = MigAttributes {
        multiprocessors: 14,
        copy_engines: 1,
        gpu_instance_slices: 1,
        compute_instance_slices: 1,
        memory_mib: 9728,
        ..MigAttributes::default()
    };
    let me = MigAttributes {
        decoders: 1,
        jpeg_engines: 1,
        ofa_engines: 1,
        ..one
    };
    let devices = DeviceFacts {
        mig_attributes: [("1g.10gb".to_string(), one), ("1g.10gb+me".to_string(), me)].into(),
        ..DeviceFacts::default()
    };
    let single_node = inventory(vec![with_migs(
        a100(0),
        &[("1g.10gb", 10), ("1g.10gb", 10)],
    )]);
    let facts = Facts {
        inventory: &single_node,
        from_nvml: true,
        machine: None,
        devices: &devices,
    };
    let labels = compute(&facts, &strategy(MigStrategy::Single));
    check(
        "single",
        &labels,
        &[
            ("gpu.count", Some("2")),
            ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")),
            ("gpu.memory", Some("9728")),
            ("gpu.multiprocessors", Some("14")),
            ("gpu.slices.gi", Some("1")),
            ("gpu.slices.ci", Some("1")),
            ("gpu.engines.copy", Some("1")),
            ("gpu.engines.decoder", Some("0")),
        ],
    );
    let facts = Facts {
        inventory: &node,
        ..facts
    };
    let labels = compute(&facts, &strategy(MigStrategy::Mixed));
    check(
        "mixed",
        &labels,
        &[
            ("mig-1g.10gb.count", Some("3")),
            ("mig-1g.10gb.memory", Some("9728")),
            ("mig-1g.10gb.engines.ofa", Some("0")),
            ("mig-1g.10gb.me.count", Some("1")),
            ("mig-1g.10gb.me.engines.ofa", Some("1")),
            ("mig-1g.10gb.me.engines.jpeg", Some("1")),
            ("mig-1g.10gb.me.slices.gi", Some("1")),
            ("gpu.multiprocessors", None),
        ],
    );
    let facts = Facts {
        devices: &DeviceFacts::default(),
        ..facts
    };
    let labels = compute(&facts, &strategy(MigStrategy::Mixed));
    check(
        "mixed without NVML's attributes",
        &labels,
        &[
            ("mig-1g.10gb.memory", Some("10240")),
            ("mig-1g.10gb.multiprocessors", None),
        ],
    );
}

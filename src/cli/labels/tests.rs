// SPDX-License-Identifier: Apache-2.0
//! Table tests for the label computation and the interval parser.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use proptest::prelude::*;

use super::*;
use crate::inventory::{DriverInfo, Gpu, Inventory, MigDevice};
use crate::k8s_config::{MigStrategy, SharedResource, Sharing, SharingStrategy};

const GIB: u64 = 1 << 30;
const A100: &str = "NVIDIA A100-SXM4-80GB";
const T4: &str = "Tesla T4";

fn gpu(index: u32, name: &str, memory_gib: u64, cc: &str) -> Gpu {
    Gpu {
        index,
        minor: index,
        uuid: format!("GPU-{index:08x}-0000-4000-8000-000000000000"),
        bus_id: format!("0000:{:02x}:00.0", index + 7),
        name: name.to_string(),
        memory_bytes: Some(memory_gib * GIB),
        compute_capability: Some(cc.to_string()),
        brand: None,
        mig_enabled: Some(false),
        mig_devices: Vec::new(),
    }
}

pub(super) fn a100(index: u32) -> Gpu {
    gpu(index, A100, 80, "8.0")
}

fn t4(index: u32) -> Gpu {
    Gpu {
        mig_enabled: None,
        ..gpu(index, T4, 15, "7.5")
    }
}

pub(super) fn with_migs(mut gpu: Gpu, profiles: &[(&str, u64)]) -> Gpu {
    gpu.mig_enabled = Some(true);
    gpu.mig_devices = profiles
        .iter()
        .enumerate()
        .map(|(i, (profile, gib))| MigDevice {
            index: i as u32,
            gpu_instance_id: i as u32 + 1,
            compute_instance_id: 0,
            uuid: format!("MIG-{:08x}-0000-4000-8000-{i:012x}", gpu.index),
            memory_bytes: Some(gib * GIB),
            profile: (*profile).to_string(),
        })
        .collect();
    gpu
}

pub(super) fn inventory(gpus: Vec<Gpu>) -> Inventory {
    Inventory {
        driver: DriverInfo {
            version: "550.54.15".to_string(),
            cuda_version: Some("12.4".to_string()),
        },
        gpus,
    }
}

fn labels_of(inventory: &Inventory, settings: &LabelSettings) -> Labels {
    let facts = Facts {
        inventory,
        from_nvml: true,
        machine: Some("DGX A100\n"),
        devices: &DeviceFacts::default(),
    };
    let labels = compute(&facts, settings);
    for (key, value) in &labels {
        assert!(is_valid_label_key(key), "invalid key {key:?}");
        assert!(is_valid_label_value(value), "invalid value {key}={value:?}");
    }
    labels
}

pub(super) fn strategy(mig_strategy: MigStrategy) -> LabelSettings {
    LabelSettings {
        mig_strategy,
        sharing: None,
    }
}

fn time_sliced(resource: &str, replicas: u32, rename_by_default: bool) -> LabelSettings {
    shared(
        SharingStrategy::TimeSlicing,
        resource,
        replicas,
        rename_by_default,
    )
}

fn shared(
    strategy: SharingStrategy,
    resource: &str,
    replicas: u32,
    rename_by_default: bool,
) -> LabelSettings {
    LabelSettings {
        mig_strategy: MigStrategy::Mixed,
        sharing: Some(Sharing {
            strategy,
            rename_by_default,
            fail_requests_greater_than_one: false,
            resources: vec![SharedResource {
                name: resource.to_string(),
                replicas,
            }],
        }),
    }
}

/// Expected labels: name after `nvidia.com/`, `Some` value or `None` for absent.
type Want = &'static [(&'static str, Option<&'static str>)];

/// Checks `want` (`Some` = that value, `None` = absent) against the labels.
pub(super) fn check(case: &str, labels: &Labels, want: &[(&str, Option<&str>)]) {
    for (name, value) in want {
        let key = format!("{PREFIX}{name}");
        assert_eq!(
            labels.get(&key).map(String::as_str),
            *value,
            "case {case}: {key} in {labels:#?}"
        );
    }
}

#[test]
fn uniform_and_mixed_nodes() {
    let cases: [(&str, Vec<Gpu>, Want); 3] = [
        (
            "4x A100",
            (0..4).map(a100).collect(),
            &[
                ("gpu.count", Some("4")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB")),
                ("gpu.memory", Some("81920")),
                ("gpu.family", Some("ampere")),
                ("gpu.compute.major", Some("8")),
                ("gpu.compute.minor", Some("0")),
                ("gpu.replicas", Some("1")),
                ("gpu.sharing-strategy", Some("none")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.count", Some("4")),
                ("mig.capable", Some("true")),
                ("mig.strategy", None),
                ("mps.capable", Some("false")),
                ("gpu.machine", Some("DGX-A100")),
                ("cuda.driver.major", Some("550")),
                ("cuda.driver.minor", Some("54")),
                ("cuda.driver.rev", Some("15")),
                ("cuda.driver-version.full", Some("550.54.15")),
                ("cuda.runtime.major", Some("12")),
                ("cuda.runtime.minor", Some("4")),
                ("cuda.runtime-version.full", Some("12.4")),
            ],
        ),
        (
            "2x A100 + 2x T4",
            vec![a100(0), t4(1), a100(2), t4(3)],
            &[
                ("gpu.count", Some("4")),
                ("gpu.product", Some(MIXED_PRODUCT)),
                ("gpu.memory", Some("15360")),
                ("gpu.compute.major", Some("7")),
                ("gpu.compute.minor", Some("5")),
                ("gpu.family", Some("turing")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.count", Some("2")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.memory", Some("81920")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.compute.major", Some("8")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.compute.minor", Some("0")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.family", Some("ampere")),
                ("gpu.product.Tesla-T4.count", Some("2")),
                ("gpu.product.Tesla-T4.memory", Some("15360")),
                ("gpu.product.Tesla-T4.compute.major", Some("7")),
                ("gpu.product.Tesla-T4.compute.minor", Some("5")),
                ("gpu.product.Tesla-T4.family", Some("turing")),
                ("mig.capable", Some("true")),
            ],
        ),
        (
            "T4 only",
            vec![t4(0)],
            &[
                ("gpu.product", Some("Tesla-T4")),
                ("mig.capable", Some("false")),
            ],
        ),
    ];
    for (case, gpus, want) in cases {
        let labels = labels_of(&inventory(gpus), &strategy(MigStrategy::None));
        check(case, &labels, want);
    }
}

#[test]
fn the_result_does_not_depend_on_inventory_order() {
    let forward = inventory(vec![a100(0), t4(1), a100(2), t4(3)]);
    let mut backward = forward.clone();
    backward.gpus.reverse();
    let settings = strategy(MigStrategy::None);
    assert_eq!(
        labels_of(&forward, &settings),
        labels_of(&backward, &settings)
    );
}

#[test]
fn mig_strategies() {
    let mixed_node = || {
        vec![
            with_migs(
                a100(0),
                &[("1g.10gb", 10), ("1g.10gb", 10), ("3g.40gb", 40)],
            ),
            a100(1),
        ]
    };
    let all_mig = || {
        vec![
            with_migs(a100(0), &[("1g.10gb", 10), ("1g.10gb", 10)]),
            with_migs(a100(1), &[("1g.10gb", 10)]),
        ]
    };
    let cases: [(&str, MigStrategy, Vec<Gpu>, Want); 6] = [
        (
            "none: MIG GPUs are whole GPUs",
            MigStrategy::None,
            mixed_node(),
            &[("gpu.count", Some("2")), ("mig-1g.10gb.count", None)],
        ),
        (
            "mixed",
            MigStrategy::Mixed,
            mixed_node(),
            &[
                ("mig.strategy", Some("mixed")),
                ("gpu.count", Some("1")),
                ("gpu.replicas", Some("1")),
                ("mig-1g.10gb.count", Some("2")),
                ("mig-1g.10gb.memory", Some("10240")),
                (
                    "mig-1g.10gb.product",
                    Some("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),
                ),
                ("mig-1g.10gb.replicas", Some("1")),
                ("mig-1g.10gb.sharing-strategy", Some("none")),
                ("mig-3g.40gb.count", Some("1")),
            ],
        ),
        (
            "mixed, every GPU split",
            MigStrategy::Mixed,
            all_mig(),
            &[
                ("gpu.count", Some("2")),
                ("gpu.replicas", Some("0")),
                ("mig-1g.10gb.count", Some("3")),
            ],
        ),
        (
            "single",
            MigStrategy::Single,
            all_mig(),
            &[
                ("mig.strategy", Some("single")),
                ("gpu.count", Some("3")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb")),
                ("gpu.memory", Some("10240")),
                ("gpu.replicas", Some("1")),
                ("gpu.family", Some("ampere")),
                ("gpu.product.NVIDIA-A100-SXM4-80GB.count", None),
            ],
        ),
        (
            "single, MIG on and off",
            MigStrategy::Single,
            mixed_node(),
            &[
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-MIG-INVALID")),
                ("gpu.count", Some("0")),
                ("gpu.memory", Some("0")),
                ("gpu.replicas", Some("0")),
            ],
        ),
        (
            "single, no MIG",
            MigStrategy::Single,
            vec![a100(0), a100(1)],
            &[
                ("mig.strategy", Some("single")),
                ("gpu.count", Some("2")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB")),
            ],
        ),
    ];
    for (case, mig_strategy, gpus, want) in cases {
        check(
            case,
            &labels_of(&inventory(gpus), &strategy(mig_strategy)),
            want,
        );
    }
}

#[test]
fn mps() {
    let node = inventory(vec![a100(0), a100(1)]);
    let cases: [(&str, LabelSettings, Want); 3] = [
        (
            "gpu x4",
            shared(SharingStrategy::Mps, "nvidia.com/gpu", 4, false),
            &[
                ("mps.capable", Some("true")),
                ("gpu.replicas", Some("4")),
                ("gpu.sharing-strategy", Some("mps")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-SHARED")),
            ],
        ),
        (
            "gpu x4 renamed",
            shared(SharingStrategy::Mps, "nvidia.com/gpu", 4, true),
            &[
                ("mps.capable", Some("true")),
                ("gpu.sharing-strategy", Some("mps")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB")),
            ],
        ),
        (
            "time-slicing is not mps",
            time_sliced("nvidia.com/gpu", 4, false),
            &[
                ("mps.capable", Some("false")),
                ("gpu.sharing-strategy", Some("time-slicing")),
            ],
        ),
    ];
    for (case, settings, want) in cases {
        check(case, &labels_of(&node, &settings), want);
    }
}

#[test]
fn time_slicing() {
    let node = inventory(vec![with_migs(a100(0), &[("1g.10gb", 10)]), a100(1)]);
    let cases: [(&str, LabelSettings, Want); 3] = [
        (
            "gpu x4",
            time_sliced("nvidia.com/gpu", 4, false),
            &[
                ("gpu.replicas", Some("4")),
                ("gpu.sharing-strategy", Some("time-slicing")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-SHARED")),
                ("mig-1g.10gb.replicas", Some("1")),
            ],
        ),
        (
            "gpu x4 renamed",
            time_sliced("nvidia.com/gpu", 4, true),
            &[
                ("gpu.replicas", Some("4")),
                ("gpu.product", Some("NVIDIA-A100-SXM4-80GB")),
            ],
        ),
        (
            "mig x2",
            time_sliced("nvidia.com/mig-1g.10gb", 2, false),
            &[
                ("gpu.replicas", Some("1")),
                ("mig-1g.10gb.replicas", Some("2")),
                ("mig-1g.10gb.sharing-strategy", Some("time-slicing")),
                (
                    "mig-1g.10gb.product",
                    Some("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb-SHARED"),
                ),
            ],
        ),
    ];
    for (case, settings, want) in cases {
        check(case, &labels_of(&node, &settings), want);
    }
}

#[test]
fn what_procfs_cannot_tell_is_left_out() {
    let mut node = inventory(vec![a100(0)]);
    node.driver.cuda_version = None;
    node.driver.version = "550".to_string();
    for gpu in &mut node.gpus {
        gpu.memory_bytes = None;
        gpu.compute_capability = None;
        gpu.mig_enabled = None;
    }
    let facts = Facts {
        inventory: &node,
        from_nvml: false,
        machine: None,
        devices: &DeviceFacts::default(),
    };
    let labels = compute(&facts, &strategy(MigStrategy::None));
    check(
        "procfs",
        &labels,
        &[
            ("gpu.count", Some("1")),
            ("gpu.product", Some("NVIDIA-A100-SXM4-80GB")),
            ("gpu.machine", Some("unknown")),
            ("gpu.memory", None),
            ("gpu.family", None),
            ("mig.capable", None),
            ("cuda.driver.major", None),
            ("cuda.runtime.major", None),
        ],
    );
    let empty = inventory(Vec::new());
    let facts = Facts {
        inventory: &empty,
        ..facts
    };
    assert!(
        compute(&facts, &strategy(MigStrategy::None)).is_empty(),
        "no GPUs"
    );
}

#[test]
fn long_names_keep_their_suffixes() {
    let long = "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition";
    let node = inventory(vec![with_migs(
        gpu(0, long, 96, "12.0"),
        &[("1g.24gb", 24)],
    )]);
    let labels = labels_of(&node, &strategy(MigStrategy::Single));
    let product = &labels[&format!("{PREFIX}gpu.product")];
    assert!(product.ends_with("-MIG-1g.24gb"), "{product}");
    assert!(product.len() <= MAX_NAME_LEN, "{product}");
    check("long", &labels, &[("gpu.family", Some("blackwell"))]);
    let labels = labels_of(
        &inventory(vec![gpu(0, long, 96, "12.0")]),
        &LabelSettings::default(),
    );
    let model_keys: Vec<&String> = labels
        .keys()
        .filter(|k| k.starts_with("nvidia.com/gpu.product."))
        .collect();
    assert_eq!(model_keys.len(), 5, "{model_keys:?}");
}

#[test]
fn families() {
    let cases = [
        ((3, 7), "kepler"),
        ((5, 2), "maxwell"),
        ((6, 1), "pascal"),
        ((7, 0), "volta"),
        ((7, 2), "volta"),
        ((7, 5), "turing"),
        ((8, 0), "ampere"),
        ((8, 6), "ampere"),
        ((8, 9), "ada-lovelace"),
        ((9, 0), "hopper"),
        ((10, 0), "blackwell"),
        ((12, 0), "blackwell"),
        ((4, 0), "undefined"),
        ((99, 0), "undefined"),
    ];
    for ((major, minor), want) in cases {
        assert_eq!(family(major, minor), want, "case {major}.{minor}");
    }
}

#[test]
fn intervals() {
    let ok = [
        ("60s", 60_000),
        ("5m", 300_000),
        ("1h30m", 5_400_000),
        ("500ms", 500),
        ("1m0s", 60_000),
    ];
    for (text, millis) in ok {
        assert_eq!(
            parse_interval(text).unwrap(),
            Duration::from_millis(millis),
            "case {text}"
        );
    }
    for text in [
        "",
        "60",
        "s",
        "0s",
        "5x",
        "-1s",
        "1.5s",
        "99999999999999999999s",
    ] {
        let err = parse_interval(text).expect_err(text);
        assert!(
            err.to_string().contains(&format!("{text:?}")),
            "case {text}: {err}"
        );
    }
}

proptest! {
    #[test]
    fn interval_parser_never_panics(text in "\\PC{0,20}") {
        let _ = parse_interval(&text);
    }

    #[test]
    fn intervals_round_trip(h in 0u64..100, m in 0u64..100, s in 1u64..100) {
        let text = format!("{h}h{m}m{s}s");
        prop_assert_eq!(
            parse_interval(&text).unwrap(),
            Duration::from_secs(h * 3600 + m * 60 + s)
        );
    }
}

// SPDX-License-Identifier: Apache-2.0
//! `preferred`: topology-aware picks for full GPUs, spreading for replicas, errors.

use std::collections::BTreeMap;
use std::path::Path;

use super::*;
use crate::config::{DeviceIdStrategy, MigStrategy, Settings};
use crate::resources::fixtures::{gpus, inventory, mig_gpu, time_slicing};
use crate::resources::{self, Resource};
use crate::topology::Placement;

/// Case name, available, must-include, size, and what comes out.
type Case<'a, T> = (&'a str, Vec<String>, Vec<String>, usize, T);
/// The same with the topology to use.
type TopologyCase<'a> = (
    &'a str,
    &'a Topology,
    Vec<String>,
    Vec<String>,
    usize,
    Vec<&'a str>,
);

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

/// `count` GPUs with index IDs, `replicas` each when given.
fn resource(count: u32, replicas: Option<u32>) -> (Resource, ResourceIndex) {
    let mut s = Settings {
        device_id_strategy: DeviceIdStrategy::Index,
        ..Settings::default()
    };
    s.sharing = replicas.map(|r| time_slicing("nvidia.com/gpu", r, false, false));
    let mut built = resources::build(&gpus(count), &s, Path::new("/nonexistent")).unwrap();
    let r = built.remove(0);
    let index = ResourceIndex::new(&r);
    (r, index)
}

fn placements(numa: &[i64], switches: &[Option<&str>]) -> Topology {
    Topology::from_placements(
        numa.iter()
            .zip(switches)
            .zip(0u32..)
            .map(|((n, s), i)| {
                let placement = Placement {
                    numa_node: Some(*n),
                    switch: s.map(std::path::PathBuf::from),
                };
                (i, placement)
            })
            .collect(),
    )
}

/// 8 GPUs, 0–3 on NUMA node 0 and 4–7 on node 1, no switches; NVLink pairs
/// (0,2), (1,3), (4,6), (5,7) with two links each.
fn nvlink_node() -> Topology {
    placements(&[0, 0, 0, 0, 1, 1, 1, 1], &[None; 8]).with_nvlinks(BTreeMap::from([
        ((0, 2), 2),
        ((1, 3), 2),
        ((4, 6), 2),
        ((5, 7), 2),
    ]))
}

#[test]
fn full_gpus_follow_the_topology() {
    let (r, index) = resource(8, None);
    let all = strings(&["0", "1", "2", "3", "4", "5", "6", "7"]);
    let nvlink = nvlink_node();
    let pcie = placements(
        &[0, 0, 1, 1, 2],
        &[Some("/a"), Some("/b"), Some("/c"), Some("/c"), None],
    );
    let lone = Topology::default().with_nvlinks(BTreeMap::from([((0, 1), 1)]));
    let cases: Vec<TopologyCase> = vec![
        (
            "an NVLink pair, the first of equals",
            &nvlink,
            all.clone(),
            vec![],
            2,
            vec!["0", "2"],
        ),
        (
            "the NVLink pair among those left",
            &nvlink,
            strings(&["1", "3", "4", "5", "6", "7"]),
            vec![],
            2,
            vec!["1", "3"],
        ),
        (
            "must-include gets its NVLink partner",
            &nvlink,
            all.clone(),
            strings(&["5"]),
            2,
            vec!["5", "7"],
        ),
        (
            "two pairs on one socket",
            &nvlink,
            all.clone(),
            vec![],
            4,
            vec!["0", "1", "2", "3"],
        ),
        (
            "must-include across sockets",
            &nvlink,
            all.clone(),
            strings(&["0", "4"]),
            4,
            vec!["0", "2", "4", "6"],
        ),
        (
            "same switch over same NUMA node",
            &pcie,
            strings(&["0", "1", "2", "3"]),
            vec![],
            2,
            vec!["2", "3"],
        ),
        (
            "same NUMA node over nothing",
            &pcie,
            strings(&["0", "1", "2", "4"]),
            vec![],
            2,
            vec!["0", "1"],
        ),
        (
            "one GPU: the one that keeps a pair free",
            &lone,
            strings(&["0", "1", "2"]),
            vec![],
            1,
            vec!["2"],
        ),
        (
            "all of them",
            &nvlink,
            all.clone(),
            vec![],
            8,
            all.iter().map(String::as_str).collect(),
        ),
        (
            "must-include is the whole answer",
            &nvlink,
            all.clone(),
            strings(&["6", "1"]),
            2,
            vec!["1", "6"],
        ),
    ];
    for (case, topo, available, must, size, want) in cases {
        let got = preferred(&r, &index, topo, &available, &must, size).unwrap();
        assert_eq!(got, want, "{case}");
        let mut reversed = available.clone();
        reversed.reverse();
        let again = preferred(&r, &index, topo, &reversed, &must, size).unwrap();
        assert_eq!(
            again, want,
            "{case}: the order of the available list does not matter"
        );
    }
}

#[test]
fn many_gpus_go_greedy() {
    // 20 GPUs in NVLink pairs (2i, 2i+1): C(20, 10) sets is too many to try.
    let (r, index) = resource(20, None);
    let links = (0..10).map(|i| ((2 * i, 2 * i + 1), 1)).collect();
    let topo = Topology::default().with_nvlinks(links);
    let all: Vec<String> = (0..20).map(|i| i.to_string()).collect();
    let got = preferred(&r, &index, &topo, &all, &strings(&["7"]), 10).unwrap();
    assert_eq!(got.len(), 10);
    assert!(
        got.contains(&"7".to_string()) && got.contains(&"6".to_string()),
        "{got:?}"
    );
    let got = preferred(&r, &index, &topo, &all, &[], 10).unwrap();
    let want: Vec<String> = (0..10).map(|i| i.to_string()).collect();
    assert_eq!(got, want, "the best pair, then pairs");
    let got = preferred(&r, &index, &topo, &all[3..], &[], 2).unwrap();
    assert_eq!(got, ["4", "5"], "the first whole pair");
    let got = preferred(&r, &index, &topo, &all, &[], 1).unwrap();
    assert_eq!(got.len(), 1);
}

#[test]
fn replicas_spread_across_units() {
    let (r, index) = resource(4, Some(4));
    let all: Vec<String> = r.devices.iter().map(|d| d.id.clone()).collect();
    let topo = nvlink_node();
    let cases: Vec<Case<Vec<&str>>> = vec![
        (
            "one per GPU",
            all.clone(),
            vec![],
            4,
            vec!["0::0", "1::0", "2::0", "3::0"],
        ),
        (
            "then the fullest, earliest first",
            all.clone(),
            vec![],
            6,
            vec!["0::0", "0::1", "1::0", "1::1", "2::0", "3::0"],
        ),
        (
            "the unit with the most left first, then a new unit",
            strings(&["0::3", "1::3", "2::0", "2::1", "2::2", "2::3"]),
            vec![],
            2,
            vec!["0::3", "2::0"],
        ),
        (
            "must-include counts as picked",
            all.clone(),
            strings(&["1::1"]),
            3,
            vec!["0::0", "1::1", "2::0"],
        ),
        (
            "a unit twice only when no other is left",
            strings(&["3::1", "3::2", "3::3", "0::2"]),
            vec![],
            3,
            vec!["0::2", "3::1", "3::2"],
        ),
    ];
    for (case, available, must, size, want) in cases {
        let got = preferred(&r, &index, &topo, &available, &must, size).unwrap();
        assert_eq!(got, want, "{case}");
        let mut reversed = available.clone();
        reversed.reverse();
        assert_eq!(
            preferred(&r, &index, &topo, &reversed, &must, size).unwrap(),
            want,
            "{case}: deterministic"
        );
    }
}

#[test]
fn mig_devices_go_in_unit_order() {
    let s = Settings {
        mig_strategy: MigStrategy::Single,
        device_id_strategy: DeviceIdStrategy::Index,
        ..Settings::default()
    };
    let inv = inventory(vec![
        mig_gpu(0, &["1g.10gb"; 3]),
        mig_gpu(1, &["1g.10gb"; 3]),
    ]);
    let built = resources::build(&inv, &s, Path::new("/nonexistent")).unwrap();
    let index = ResourceIndex::new(&built[0]);
    let available = strings(&["1:2", "0:1", "1:0", "0:2"]);
    let got = preferred(&built[0], &index, &Topology::default(), &available, &[], 3).unwrap();
    assert_eq!(got, ["0:1", "0:2", "1:0"]);
}

#[test]
fn every_error() {
    let (r, index) = resource(4, None);
    let topo = Topology::default();
    let name = "nvidia.com/gpu".to_string();
    let one = |id: &str| IdList {
        shown: vec![id.to_string()],
        total: 1,
    };
    let cases: Vec<Case<AllocateError>> = vec![
        (
            "size 0",
            strings(&["0"]),
            vec![],
            0,
            AllocateError::ZeroSize {
                resource: name.clone(),
            },
        ),
        (
            "too few available",
            strings(&["0", "1", "1"]),
            vec![],
            3,
            AllocateError::NotEnoughAvailable {
                resource: name.clone(),
                size: 3,
                available: 2,
            },
        ),
        (
            "must-include not available",
            strings(&["0", "1"]),
            strings(&["2"]),
            1,
            AllocateError::MustIncludeNotAvailable {
                resource: name.clone(),
                ids: one("2"),
            },
        ),
        (
            "unknown in must-include",
            strings(&["0", "1"]),
            strings(&["GPU-9"]),
            1,
            AllocateError::UnknownDevices {
                resource: name.clone(),
                ids: one("GPU-9"),
                known: IdList::of(&r),
            },
        ),
        (
            "unknown in available",
            strings(&["0", "9"]),
            vec![],
            1,
            AllocateError::UnknownDevices {
                resource: name.clone(),
                ids: one("9"),
                known: IdList::of(&r),
            },
        ),
        (
            "more must-include than size",
            strings(&["0", "1", "2"]),
            strings(&["0", "1"]),
            1,
            AllocateError::MustIncludeTooMany {
                resource: name.clone(),
                must_include: 2,
                size: 1,
            },
        ),
    ];
    for (case, available, must, size, want) in cases {
        let err = preferred(&r, &index, &topo, &available, &must, size).unwrap_err();
        assert_eq!(err, want, "{case}");
    }
    let err = AllocateError::NotEnoughAvailable {
        resource: name,
        size: 3,
        available: 2,
    };
    assert_eq!(
        err.to_string(),
        "not enough available devices to satisfy allocation for nvidia.com/gpu: 3 requested, 2 available"
    );
}

#[test]
fn combinations_and_binomials() {
    let mut seen = Vec::new();
    for_each_combination(&[10, 11, 12, 13], 2, &mut |c| seen.push(c.to_vec()));
    assert_eq!(
        seen,
        [[10, 11], [10, 12], [10, 13], [11, 12], [11, 13], [12, 13]]
    );
    let cases = [
        (8, 4, 70),
        (20, 10, 184_756),
        (5, 0, 1),
        (3, 4, 0),
        (200, 100, u64::MAX),
    ];
    for (n, k, want) in cases {
        assert_eq!(binomial(n, k), want, "C({n}, {k})");
    }
}

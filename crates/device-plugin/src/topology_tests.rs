// SPDX-License-Identifier: Apache-2.0
//! `Topology`: placements from a fake sysfs PCI tree, NVLinks, pair scores.

use std::collections::BTreeMap;

use super::*;
use crate::resources::fixtures::{bus_id, gpus, place_gpu};

/// GPUs 0, 1 behind switch A on socket 0; 2 behind switch B on socket 0; 3 on a
/// root port of socket 1; 4 with no sysfs entry.
fn node(sysfs: &Path) {
    place_gpu(
        sysfs,
        &bus_id(0),
        &["0000:00:01.0", "0000:01:00.0", "0000:02:00.0"],
        "0",
    );
    place_gpu(
        sysfs,
        &bus_id(1),
        &["0000:00:01.0", "0000:01:00.0", "0000:02:01.0"],
        "0",
    );
    place_gpu(
        sysfs,
        &bus_id(2),
        &["0000:00:02.0", "0000:05:00.0", "0000:06:00.0"],
        "0\n",
    );
    place_gpu(sysfs, &bus_id(3), &["0000:00:03.0"], "1");
}

#[test]
fn placements_from_sysfs() {
    let sysfs = tempfile::tempdir().unwrap();
    node(sysfs.path());
    let topo = Topology::load(&gpus(5), sysfs.path());
    let root = std::fs::canonicalize(sysfs.path()).unwrap();
    let switch = |s: &str| Some(root.join("devices/pci0000:00").join(s));
    let cases = [
        (0, Some(0), switch("0000:00:01.0/0000:01:00.0")),
        (1, Some(0), switch("0000:00:01.0/0000:01:00.0")),
        (2, Some(0), switch("0000:00:02.0/0000:05:00.0")),
        (3, Some(1), None),
        (4, None, None),
    ];
    for (gpu, numa_node, switch) in cases {
        let want = Placement { numa_node, switch };
        assert_eq!(topo.placement(gpu), Some(&want), "GPU {gpu}");
    }
    assert_eq!(topo.placement(9), None);
}

#[test]
fn scores_rank_nvlink_switch_numa() {
    let sysfs = tempfile::tempdir().unwrap();
    node(sysfs.path());
    let topo = Topology::load(&gpus(5), sysfs.path()).with_nvlinks(BTreeMap::from([
        ((3, 2), 2),
        ((2, 3), 1),
        ((4, 4), 9),
        ((0, 4), 0),
    ]));
    let cases = [
        ("same switch", 0, 1, SAME_SWITCH_SCORE),
        ("same NUMA node", 0, 2, SAME_NUMA_SCORE),
        ("other socket", 0, 3, 0),
        ("two NVLinks (larger count kept)", 2, 3, 2 * NVLINK_SCORE),
        ("symmetric", 3, 2, 2 * NVLINK_SCORE),
        ("unknown GPU", 0, 4, 0),
        ("self", 1, 1, 0),
        ("self-links ignored", 4, 4, 0),
    ];
    for (case, a, b, want) in cases {
        assert_eq!(topo.score(a, b), want, "{case}");
    }
    assert_eq!(topo.nvlinks(2, 3), 2);
    // One NVLink beats any PCIe path.
    let linked = Topology::default().with_nvlinks(BTreeMap::from([((5, 6), 1)]));
    assert!(linked.score(5, 6) > topo.score(0, 1));
}

#[test]
fn load_never_fails() {
    let topo = Topology::load(&gpus(2), Path::new("/nonexistent-sysfs"));
    assert_eq!(topo.placement(0), Some(&Placement::default()));
    let sysfs = tempfile::tempdir().unwrap();
    crate::resources::fixtures::write_numa(sysfs.path(), &bus_id(0), "junk");
    let topo = Topology::load(&gpus(1), sysfs.path());
    assert_eq!(
        topo.placement(0),
        Some(&Placement::default()),
        "junk NUMA is unknown"
    );
}

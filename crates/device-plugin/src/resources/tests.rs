// SPDX-License-Identifier: Apache-2.0
//! `build`: MIG and ID strategies, replicas, NUMA, nodes, and its errors.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::fixtures::{
    bus_id, gpu, gpu_uuid, gpus, inventory, mig_gpu, mig_uuid, mps, time_slicing, write_numa,
};
use super::*;
use crate::config::{DeviceIdStrategy, MigStrategy, Settings, Sharing, SharingStrategy};

fn settings(mig: MigStrategy, ids: DeviceIdStrategy) -> Settings {
    Settings {
        mig_strategy: mig,
        device_id_strategy: ids,
        dev_root: PathBuf::from("/host"),
        ..Settings::default()
    }
}

fn names(resources: &[Resource]) -> Vec<&str> {
    resources.iter().map(|r| r.name.as_str()).collect()
}

fn ids(resource: &Resource) -> Vec<&str> {
    resource.devices.iter().map(|d| d.id.as_str()).collect()
}

fn assert_unique(resources: &[Resource], case: &str) {
    for r in resources {
        let set: HashSet<&str> = r.devices.iter().map(|d| d.id.as_str()).collect();
        assert_eq!(
            set.len(),
            r.devices.len(),
            "{case}: duplicate ids in {}",
            r.name
        );
    }
}

#[test]
fn eight_gpus_by_uuid_and_by_index() {
    let sysfs = tempfile::tempdir().unwrap();
    for i in 0..8 {
        write_numa(sysfs.path(), &bus_id(i), if i < 4 { "0\n" } else { "1\n" });
    }
    let inv = gpus(8);
    let cases = [
        (
            "uuid",
            DeviceIdStrategy::Uuid,
            gpu_uuid as fn(u32) -> String,
        ),
        ("index", DeviceIdStrategy::Index, |i: u32| i.to_string()),
    ];
    for (case, strategy, id_of) in cases {
        let built = build(&inv, &settings(MigStrategy::None, strategy), sysfs.path()).unwrap();
        assert_eq!(names(&built), ["nvidia.com/gpu"], "{case}");
        let r = &built[0];
        assert_eq!(r.endpoint(), "nvidia-gpu.sock", "{case}");
        assert_eq!(
            (r.replicas, r.fail_requests_greater_than_one),
            (None, false)
        );
        assert_eq!(r.devices.len(), 8, "{case}");
        for (i, d) in (0u32..).zip(&r.devices) {
            let want = Device {
                id: id_of(i),
                unit: Unit { gpu: i, mig: None },
                replica: None,
                uuid: gpu_uuid(i),
                runtime_id: id_of(i),
                numa_node: Some(if i < 4 { 0 } else { 1 }),
                bus_id: bus_id(i),
                memory_mib: Some(80 * 1024),
                nodes: vec![PathBuf::from(format!("/host/dev/nvidia{i}"))],
            };
            assert_eq!(d, &want, "{case}: GPU {i}");
        }
        assert_eq!(r.units().len(), 8, "{case}");
        assert_unique(&built, case);
    }
}

/// `sharing.timeSlicing` or `sharing.mps` of one resource.
type MakeSharing = fn(&str, u32, bool, bool) -> Sharing;

#[test]
fn time_slicing_and_mps_make_the_same_replicas() {
    let kinds: [(SharingStrategy, MakeSharing); 2] = [
        (SharingStrategy::TimeSlicing, time_slicing),
        (SharingStrategy::Mps, mps),
    ];
    for (kind, make) in kinds {
        replicas_of(kind, make);
    }
}

fn replicas_of(kind: SharingStrategy, make: MakeSharing) {
    let sysfs = tempfile::tempdir().unwrap();
    let cases = [
        (
            "rename",
            true,
            true,
            "nvidia.com/gpu.shared",
            "nvidia-gpu.shared.sock",
        ),
        (
            "keep name",
            false,
            false,
            "nvidia.com/gpu",
            "nvidia-gpu.sock",
        ),
    ];
    for (case, rename, fail, name, endpoint) in cases {
        let case = &format!("{kind:?} {case}");
        let mut s = settings(MigStrategy::None, DeviceIdStrategy::Uuid);
        s.sharing = Some(make("nvidia.com/gpu", 4, rename, fail));
        let built = build(&gpus(8), &s, sysfs.path()).unwrap();
        assert_eq!(names(&built), [name], "{case}");
        let r = &built[0];
        assert_eq!(r.endpoint(), endpoint, "{case}");
        assert_eq!(r.replicas, Some(4), "{case}");
        assert_eq!(r.sharing, Some(kind), "{case}");
        assert_eq!(r.fail_requests_greater_than_one, fail, "{case}");
        assert_eq!(r.devices.len(), 32, "{case}");
        for (k, d) in r.devices.iter().enumerate() {
            let (g, n) = (k as u32 / 4, k as u32 % 4);
            assert_eq!(d.id, format!("{}::{n}", gpu_uuid(g)), "{case}: device {k}");
            assert_eq!(d.runtime_id, gpu_uuid(g), "{case}: device {k}");
            assert_eq!(d.replica, Some(n), "{case}: device {k}");
            assert_eq!(d.unit, Unit { gpu: g, mig: None }, "{case}: device {k}");
            assert_eq!(d.numa_node, None, "{case}: no sysfs entry");
        }
        assert_eq!(r.units().len(), 8, "{case}");
        assert_unique(&built, case);
    }
    // Index IDs get the same suffix.
    let mut s = settings(MigStrategy::None, DeviceIdStrategy::Index);
    s.sharing = Some(make("nvidia.com/gpu", 2, false, false));
    let built = build(&gpus(2), &s, sysfs.path()).unwrap();
    assert_eq!(ids(&built[0]), ["0::0", "0::1", "1::0", "1::1"], "{kind:?}");
}

#[test]
fn mps_refuses_a_node_with_mig() {
    let sysfs = tempfile::tempdir().unwrap();
    // NVIDIA refuses MIG with MPS whatever the MIG strategy; none shows MIG GPUs whole.
    for strategy in [MigStrategy::None, MigStrategy::Single] {
        let mut s = settings(strategy, DeviceIdStrategy::Uuid);
        s.sharing = Some(mps("nvidia.com/gpu", 2, false, true));
        let node = inventory(vec![gpu(0), mig_gpu(1, &["1g.10gb"]), mig_gpu(2, &[])]);
        let err = build(&node, &s, sysfs.path()).unwrap_err().to_string();
        assert!(
            err.contains("sharing.mps cannot share GPUs with MIG enabled"),
            "{strategy}: {err}"
        );
        assert!(
            err.contains(&format!("1 ({}), 2 ({})", gpu_uuid(1), gpu_uuid(2))),
            "{strategy}: {err}"
        );
    }
    // Time-slicing the same node is fine.
    let mut s = settings(MigStrategy::None, DeviceIdStrategy::Uuid);
    s.sharing = Some(time_slicing("nvidia.com/gpu", 2, false, true));
    let node = inventory(vec![gpu(0), mig_gpu(1, &["1g.10gb"])]);
    assert_eq!(build(&node, &s, sysfs.path()).unwrap()[0].devices.len(), 4);
}

fn mig_node() -> nvshim::inventory::Inventory {
    inventory(vec![
        gpu(0),
        mig_gpu(1, &["1g.10gb", "1g.10gb", "2g.20gb"]),
        mig_gpu(2, &["1g.10gb+me"]),
        mig_gpu(3, &[]),
    ])
}

#[test]
fn mig_none_advertises_whole_gpus() {
    let sysfs = tempfile::tempdir().unwrap();
    let s = settings(MigStrategy::None, DeviceIdStrategy::Uuid);
    let built = build(&mig_node(), &s, sysfs.path()).unwrap();
    assert_eq!(names(&built), ["nvidia.com/gpu"]);
    let want: Vec<String> = (0..4).map(gpu_uuid).collect();
    assert_eq!(ids(&built[0]), want);
}

#[test]
fn mig_mixed_one_resource_per_profile() {
    let sysfs = tempfile::tempdir().unwrap();
    write_numa(sysfs.path(), &bus_id(1), "1");
    let s = settings(MigStrategy::Mixed, DeviceIdStrategy::Uuid);
    let built = build(&mig_node(), &s, sysfs.path()).unwrap();
    assert_eq!(
        names(&built),
        [
            "nvidia.com/gpu",
            "nvidia.com/mig-1g.10gb",
            "nvidia.com/mig-1g.10gb.me",
            "nvidia.com/mig-2g.20gb",
        ]
    );
    assert_eq!(ids(&built[0]), [gpu_uuid(0)], "MIG-off GPU stays whole");
    assert_eq!(ids(&built[1]), [mig_uuid(1, 0), mig_uuid(1, 1)]);
    assert_eq!(ids(&built[2]), [mig_uuid(2, 0)]);
    assert_eq!(ids(&built[3]), [mig_uuid(1, 2)]);
    assert_eq!(built[1].endpoint(), "nvidia-mig-1g.10gb.sock");
    let d = &built[3].devices[0];
    assert_eq!(
        d.unit,
        Unit {
            gpu: 1,
            mig: Some(2)
        }
    );
    assert_eq!(d.bus_id, bus_id(1), "the parent's bus id");
    assert_eq!(d.numa_node, Some(1), "the parent's NUMA node");
    assert_eq!(d.nodes, [PathBuf::from("/host/dev/nvidia1")]);
    assert_unique(&built, "mixed");

    let s = settings(MigStrategy::Mixed, DeviceIdStrategy::Index);
    let built = build(&mig_node(), &s, sysfs.path()).unwrap();
    assert_eq!(ids(&built[0]), ["0"]);
    assert_eq!(ids(&built[1]), ["1:0", "1:1"]);
    assert_eq!(ids(&built[3]), ["1:2"]);
}

#[test]
fn mig_mixed_time_slices_a_profile() {
    let sysfs = tempfile::tempdir().unwrap();
    let mut s = settings(MigStrategy::Mixed, DeviceIdStrategy::Index);
    s.sharing = Some(time_slicing("nvidia.com/mig-1g.10gb", 2, true, false));
    let built = build(&mig_node(), &s, sysfs.path()).unwrap();
    assert_eq!(built[1].name, "nvidia.com/mig-1g.10gb.shared");
    assert_eq!(ids(&built[1]), ["1:0::0", "1:0::1", "1:1::0", "1:1::1"]);
    assert_eq!(built[0].replicas, None, "other resources are not shared");
}

#[test]
fn mig_single() {
    let sysfs = tempfile::tempdir().unwrap();
    let node = inventory(vec![
        mig_gpu(0, &["3g.40gb", "3g.40gb"]),
        mig_gpu(1, &["3g.40gb"]),
    ]);
    for (case, strategy, want) in [
        (
            "uuid",
            DeviceIdStrategy::Uuid,
            vec![mig_uuid(0, 0), mig_uuid(0, 1), mig_uuid(1, 0)],
        ),
        (
            "index",
            DeviceIdStrategy::Index,
            vec!["0:0".into(), "0:1".into(), "1:0".into()],
        ),
    ] {
        let built = build(
            &node,
            &settings(MigStrategy::Single, strategy),
            sysfs.path(),
        )
        .unwrap();
        assert_eq!(names(&built), ["nvidia.com/gpu"], "{case}");
        assert_eq!(ids(&built[0]), want, "{case}");
    }
    // No GPU in MIG mode: whole GPUs, as with `none`.
    let s = settings(MigStrategy::Single, DeviceIdStrategy::Index);
    let built = build(&gpus(2), &s, sysfs.path()).unwrap();
    assert_eq!(ids(&built[0]), ["0", "1"]);
}

#[test]
fn mig_single_refuses_what_nvidia_refuses() {
    let sysfs = tempfile::tempdir().unwrap();
    let cases: [(&str, Vec<nvshim::inventory::Gpu>, &[&str]); 3] = [
        (
            "MIG on and off",
            vec![gpu(0), mig_gpu(1, &["1g.10gb"])],
            &["MIG is enabled on GPUs 1 (", "disabled on GPUs 0 ("],
        ),
        (
            "MIG GPU without MIG devices",
            vec![mig_gpu(0, &["1g.10gb"]), mig_gpu(1, &[])],
            &["GPUs 1 (GPU-00000001", "have none"],
        ),
        (
            "two profiles",
            vec![
                mig_gpu(0, &["1g.10gb"]),
                mig_gpu(1, &["1g.10gb", "2g.20gb"]),
            ],
            &["found 1g.10gb on GPUs 0 1, 2g.20gb on GPUs 1"],
        ),
    ];
    for (case, gpus, wants) in cases {
        let s = settings(MigStrategy::Single, DeviceIdStrategy::Uuid);
        let err = build(&inventory(gpus), &s, sysfs.path()).unwrap_err();
        let msg = err.to_string();
        for want in wants {
            assert!(msg.contains(want), "{case}: {msg:?} lacks {want:?}");
        }
    }
}

#[test]
fn bad_inventories_are_errors() {
    let sysfs = tempfile::tempdir().unwrap();
    let mut twin = gpu(1);
    twin.uuid = gpu_uuid(0);
    let s = settings(MigStrategy::None, DeviceIdStrategy::Uuid);
    let err = build(&inventory(vec![gpu(0), twin]), &s, sysfs.path()).unwrap_err();
    assert!(
        matches!(&err, ResourceError::DuplicateId { id, .. } if *id == gpu_uuid(0)),
        "duplicate uuid: {err}"
    );
    assert!(err.to_string().contains("by GPU 0 and GPU 1"), "{err}");

    let s = settings(MigStrategy::Mixed, DeviceIdStrategy::Uuid);
    let err = build(&inventory(vec![mig_gpu(0, &["1g 10gb"])]), &s, sysfs.path()).unwrap_err();
    assert!(
        matches!(&err, ResourceError::InvalidProfile { profile, .. } if profile == "1g 10gb"),
        "bad profile: {err}"
    );
}

#[test]
fn numa_node_from_sysfs() {
    let sysfs = tempfile::tempdir().unwrap();
    let cases = [
        ("zero", Some("0\n"), Ok(Some(0))),
        ("one", Some("1"), Ok(Some(1))),
        ("no affinity", Some("-1\n"), Ok(None)),
        ("missing", None, Ok(None)),
        (
            "junk",
            Some("two\n"),
            Err("\"two\" is not a NUMA node number"),
        ),
    ];
    for (i, (case, text, want)) in (0u32..).zip(cases) {
        let bus = bus_id(i);
        if let Some(text) = text {
            write_numa(sysfs.path(), &bus, text);
        }
        let got = read_numa_node(sysfs.path(), &bus).map_err(|e| e.to_string());
        match (got, want) {
            (Ok(got), Ok(want)) => assert_eq!(got, want, "{case}"),
            (Err(got), Err(want)) => {
                assert!(got.contains(want), "{case}: {got}");
                assert!(
                    got.contains(&format!("{bus}/numa_node")),
                    "{case}: names the file"
                );
            }
            (got, _) => panic!("{case}: unexpected {got:?}"),
        }
    }
    assert_eq!(
        read_numa_node(sysfs.path(), "../../etc").unwrap(),
        None,
        "no escape"
    );
    // build passes the error on.
    let s = settings(MigStrategy::None, DeviceIdStrategy::Uuid);
    assert!(build(&gpus(5), &s, sysfs.path()).is_err());
}

#[test]
fn mig_caps_nodes_from_mig_minors() {
    let sysfs = tempfile::tempdir().unwrap();
    let node = inventory(vec![mig_gpu(0, &["1g.10gb", "1g.10gb"])]);
    // GI ids are 1 and 2 in the fixture, CI 0.
    let minors = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
                  gpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n";
    let s = settings(MigStrategy::Mixed, DeviceIdStrategy::Uuid);
    let built = build_with_mig_minors(&node, &s, sysfs.path(), Some(minors)).unwrap();
    let nodes: Vec<&[PathBuf]> = built[0].devices.iter().map(|d| &d.nodes[..]).collect();
    let p = |s: &str| PathBuf::from(s);
    assert_eq!(
        nodes,
        [
            &[
                p("/host/dev/nvidia0"),
                p("/host/dev/nvidia-caps/nvidia-cap12"),
                p("/host/dev/nvidia-caps/nvidia-cap13")
            ][..],
            &[
                p("/host/dev/nvidia0"),
                p("/host/dev/nvidia-caps/nvidia-cap21"),
                p("/host/dev/nvidia-caps/nvidia-cap22")
            ][..],
        ]
    );
    let err =
        build_with_mig_minors(&node, &s, sysfs.path(), Some("gpu0/gi1/access 12\n")).unwrap_err();
    assert!(
        err.to_string().contains("\"gpu0/gi1/ci0/access\""),
        "names the missing entry: {err}"
    );
}

#[test]
fn empty_resources_are_left_out() {
    let sysfs = Path::new("/nonexistent-sysfs");
    let s = settings(MigStrategy::Mixed, DeviceIdStrategy::Uuid);
    assert!(build(&gpus(0), &s, sysfs).unwrap().is_empty(), "no GPUs");
    let built = build(&inventory(vec![mig_gpu(0, &[])]), &s, sysfs).unwrap();
    assert!(built.is_empty(), "an empty MIG GPU under mixed");
}

#[test]
fn index_finds_every_device() {
    let mut s = settings(MigStrategy::None, DeviceIdStrategy::Uuid);
    s.sharing = Some(time_slicing("nvidia.com/gpu", 3, false, false));
    let built = build(&gpus(4), &s, Path::new("/nonexistent")).unwrap();
    let index = ResourceIndex::new(&built[0]);
    assert_eq!(index.len(), 12);
    for (p, d) in built[0].devices.iter().enumerate() {
        assert_eq!(index.position(&d.id), Some(p), "{}", d.id);
    }
    assert_eq!(
        index.position(&gpu_uuid(0)),
        None,
        "a base id is not a device"
    );
}

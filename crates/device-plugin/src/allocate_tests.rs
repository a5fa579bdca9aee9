// SPDX-License-Identifier: Apache-2.0
//! `allocate`: the exact response of every device-list strategy, and every error.

use std::fs;
use std::path::Path;

use super::*;
use crate::config::{DeviceIdStrategy, DeviceListStrategy as S, MigStrategy};
use crate::resources::fixtures::{gpu_uuid, gpus, inventory, mig_gpu, time_slicing};
use crate::resources::{self, Resource, ResourceIndex};

fn strings(ids: &[&str]) -> Vec<String> {
    ids.iter().map(|s| s.to_string()).collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Only CDI allocates: `NVIDIA_VISIBLE_DEVICES=void` keeps the image's value out (CRI-O
/// puts the image's env after the CDI spec's, and the runtime takes the last).
fn void() -> BTreeMap<String, String> {
    map(&[("NVIDIA_VISIBLE_DEVICES", "void")])
}

fn all_healthy(_: Unit) -> bool {
    true
}

fn settings(strategies: &[S], dev_root: &Path) -> Settings {
    Settings {
        device_list_strategies: strategies.to_vec(),
        dev_root: dev_root.to_path_buf(),
        ..Settings::default()
    }
}

/// The one resource built from `inv` with `s`.
fn resource(inv: &nvshim::inventory::Inventory, s: &Settings) -> (Resource, ResourceIndex) {
    let mut built = resources::build(inv, s, Path::new("/nonexistent-sysfs")).unwrap();
    assert_eq!(built.len(), 1);
    let r = built.remove(0);
    let index = ResourceIndex::new(&r);
    (r, index)
}

fn mount(id: &str) -> AllocatedMount {
    AllocatedMount {
        container_path: format!("/var/run/nvidia-container-devices/{id}"),
        host_path: "/dev/null".to_string(),
        read_only: false,
    }
}

fn spec(root: &Path, path: &str) -> AllocatedDeviceSpec {
    AllocatedDeviceSpec {
        container_path: path.to_string(),
        host_path: root.join(&path[1..]).display().to_string(),
        permissions: "rw".to_string(),
    }
}

#[test]
fn every_strategy_shape() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    // Two of the four control nodes exist under the dev root.
    fs::create_dir_all(root.join("dev")).unwrap();
    fs::write(root.join("dev/nvidiactl"), "").unwrap();
    fs::write(root.join("dev/nvidia-uvm"), "").unwrap();
    let (g1, g3) = (gpu_uuid(1), gpu_uuid(3));
    let request = strings(&[&g3, &g1]);
    let ordered = format!("{g1},{g3}");
    let uid = response_uid("nvidia.com/gpu", &[&g1, &g3]);
    let cdi = strings(&[&format!("{CDI_KIND}={g1}"), &format!("{CDI_KIND}={g3}")]);
    let annotation = || {
        map(&[(
            &format!("cdi.k8s.io/nvidia-device-plugin_{uid}"),
            &cdi.join(","),
        )])
    };
    let specs = vec![
        spec(root, "/dev/nvidiactl"),
        spec(root, "/dev/nvidia-uvm"),
        spec(root, "/dev/nvidia1"),
        spec(root, "/dev/nvidia3"),
    ];
    let cases: Vec<(&str, Vec<S>, bool, ContainerAllocation)> = vec![
        (
            "envvar",
            vec![S::Envvar],
            false,
            ContainerAllocation {
                envs: map(&[("NVIDIA_VISIBLE_DEVICES", &ordered)]),
                ..Default::default()
            },
        ),
        (
            "volume-mounts",
            vec![S::VolumeMounts],
            false,
            ContainerAllocation {
                envs: map(&[(
                    "NVIDIA_VISIBLE_DEVICES",
                    "/var/run/nvidia-container-devices",
                )]),
                mounts: vec![mount(&g1), mount(&g3)],
                ..Default::default()
            },
        ),
        (
            "envvar and volume-mounts: the directory wins",
            vec![S::Envvar, S::VolumeMounts],
            false,
            ContainerAllocation {
                envs: map(&[(
                    "NVIDIA_VISIBLE_DEVICES",
                    "/var/run/nvidia-container-devices",
                )]),
                mounts: vec![mount(&g1), mount(&g3)],
                ..Default::default()
            },
        ),
        (
            "cdi-annotations",
            vec![S::CdiAnnotations],
            false,
            ContainerAllocation {
                envs: void(),
                annotations: annotation(),
                ..Default::default()
            },
        ),
        (
            "cdi-cri, device specs ignored with only CDI",
            vec![S::CdiCri],
            true,
            ContainerAllocation {
                envs: void(),
                cdi_devices: cdi.clone(),
                ..Default::default()
            },
        ),
        (
            "both CDI strategies",
            vec![S::CdiCri, S::CdiAnnotations],
            false,
            ContainerAllocation {
                envs: void(),
                annotations: annotation(),
                cdi_devices: cdi.clone(),
                ..Default::default()
            },
        ),
        (
            "envvar with device specs",
            vec![S::Envvar],
            true,
            ContainerAllocation {
                envs: map(&[("NVIDIA_VISIBLE_DEVICES", &ordered)]),
                devices: specs.clone(),
                ..Default::default()
            },
        ),
        (
            "cdi-annotations, envvar and device specs",
            vec![S::CdiAnnotations, S::Envvar],
            true,
            ContainerAllocation {
                envs: map(&[("NVIDIA_VISIBLE_DEVICES", &ordered)]),
                annotations: annotation(),
                devices: specs.clone(),
                ..Default::default()
            },
        ),
    ];
    for (case, strategies, pass_specs, want) in cases {
        let mut s = settings(&strategies, root);
        s.pass_device_specs = pass_specs;
        let (r, index) = resource(&gpus(8), &s);
        let got = allocate(&r, &index, &request, &s, &all_healthy).unwrap();
        assert_eq!(got, want, "{case}");
    }
}

/// NVIDIA's extras: the class switches as `enabled` env vars whatever the strategy
/// (CDI-only too), IMEX channels as `NVIDIA_IMEX_CHANNELS`, `imex/<id>` mounts and
/// device specs.
#[test]
fn gds_mofed_gdrcopy_and_imex_channels_by_strategy() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let g1 = gpu_uuid(1);
    let request = strings(&[&g1]);
    let imex_mount = AllocatedMount {
        container_path: "/var/run/nvidia-container-devices/imex/0".to_string(),
        host_path: "/dev/null".to_string(),
        read_only: false,
    };
    // (case, strategies, gdrcopy, gds, mofed, IMEX channels, device specs, want)
    type Case = (
        &'static str,
        Vec<S>,
        [bool; 3],
        Vec<u32>,
        bool,
        ContainerAllocation,
    );
    let cases: Vec<Case> = vec![
        (
            "envvar, gds, channel 0, device specs",
            vec![S::Envvar],
            [false, true, false],
            vec![0],
            true,
            ContainerAllocation {
                envs: map(&[
                    ("NVIDIA_GDS", "enabled"),
                    ("NVIDIA_IMEX_CHANNELS", "0"),
                    ("NVIDIA_VISIBLE_DEVICES", &g1),
                ]),
                devices: vec![
                    spec(root, "/dev/nvidia1"),
                    spec(root, "/dev/nvidia-caps-imex-channels/channel0"),
                ],
                ..Default::default()
            },
        ),
        (
            "volume-mounts, gdrcopy and mofed, channel 0",
            vec![S::VolumeMounts],
            [true, false, true],
            vec![0],
            false,
            ContainerAllocation {
                envs: map(&[
                    ("NVIDIA_GDRCOPY", "enabled"),
                    ("NVIDIA_MOFED", "enabled"),
                    (
                        "NVIDIA_VISIBLE_DEVICES",
                        "/var/run/nvidia-container-devices",
                    ),
                ]),
                mounts: vec![mount(&g1), imex_mount],
                ..Default::default()
            },
        ),
        (
            "cdi-cri only: the env vars still, no channel",
            vec![S::CdiCri],
            [true, true, true],
            vec![],
            true,
            ContainerAllocation {
                envs: map(&[
                    ("NVIDIA_GDRCOPY", "enabled"),
                    ("NVIDIA_GDS", "enabled"),
                    ("NVIDIA_MOFED", "enabled"),
                    ("NVIDIA_VISIBLE_DEVICES", "void"),
                ]),
                cdi_devices: strings(&[&format!("{CDI_KIND}={g1}")]),
                ..Default::default()
            },
        ),
        (
            "all off: nothing extra",
            vec![S::Envvar],
            [false, false, false],
            vec![],
            false,
            ContainerAllocation {
                envs: map(&[("NVIDIA_VISIBLE_DEVICES", &g1)]),
                ..Default::default()
            },
        ),
    ];
    for (case, strategies, [gdrcopy, gds, mofed], channels, pass_specs, want) in cases {
        let mut s = settings(&strategies, root);
        s.pass_device_specs = pass_specs;
        s.device_classes = crate::config::DeviceClasses {
            gdrcopy,
            gds,
            mofed,
        };
        s.imex.channel_ids = channels;
        let (r, index) = resource(&gpus(8), &s);
        let got = allocate(&r, &index, &request, &s, &all_healthy).unwrap();
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn cdi_annotation_key() {
    let root = Path::new("/");
    let mut s = settings(&[S::CdiAnnotations], root);
    s.cdi_annotation_prefix = "example.com/".to_string();
    let (r, index) = resource(&gpus(4), &s);
    let got = allocate(&r, &index, &strings(&[&gpu_uuid(0)]), &s, &all_healthy).unwrap();
    let key = got.annotations.keys().next().unwrap().clone();
    let uid = key
        .strip_prefix("example.com/nvidia-device-plugin_")
        .unwrap();
    let groups: Vec<usize> = uid.split('-').map(str::len).collect();
    assert_eq!(groups, [8, 4, 4, 4, 12], "UUID form: {uid}");
    assert!(
        uid.bytes().all(|b| b == b'-' || b.is_ascii_hexdigit()),
        "{uid}"
    );
    // A Kubernetes annotation name part is at most 63 characters.
    assert!(key.len() - "example.com/".len() <= 63, "{key}");
    let again = allocate(&r, &index, &strings(&[&gpu_uuid(0)]), &s, &all_healthy).unwrap();
    assert_eq!(again, got, "deterministic");
    let other = allocate(&r, &index, &strings(&[&gpu_uuid(1)]), &s, &all_healthy).unwrap();
    assert_ne!(
        other.annotations.keys().next(),
        Some(&key),
        "differs per device set"
    );
}

#[test]
fn replicas_and_indices_map_to_units_in_unit_order() {
    let root = Path::new("/");
    let cases = [
        (
            "uuid replicas",
            DeviceIdStrategy::Uuid,
            vec![
                format!("{}::1", gpu_uuid(2)),
                format!("{}::3", gpu_uuid(0)),
                format!("{}::0", gpu_uuid(2)),
            ],
            format!("{},{}", gpu_uuid(0), gpu_uuid(2)),
        ),
        (
            "index replicas",
            DeviceIdStrategy::Index,
            strings(&["3::0", "1::2", "3::1", "0::0"]),
            "0,1,3".to_string(),
        ),
    ];
    for (case, ids, request, want) in cases {
        let mut s = settings(&[S::Envvar, S::VolumeMounts], root);
        s.device_id_strategy = ids;
        s.sharing = Some(time_slicing("nvidia.com/gpu", 4, true, false));
        let (r, index) = resource(&gpus(4), &s);
        let got = allocate(&r, &index, &request, &s, &all_healthy).unwrap();
        let mounts: Vec<String> = got
            .mounts
            .iter()
            .map(|m| m.container_path.clone())
            .collect();
        let want_mounts: Vec<String> = want
            .split(',')
            .map(|id| format!("/var/run/nvidia-container-devices/{id}"))
            .collect();
        assert_eq!(mounts, want_mounts, "{case}");
        s.device_list_strategies = vec![S::Envvar];
        let got = allocate(&r, &index, &request, &s, &all_healthy).unwrap();
        assert_eq!(got.envs["NVIDIA_VISIBLE_DEVICES"], want, "{case}");
    }
}

#[test]
fn mig_device_specs_share_the_parent_node() {
    let root = tempfile::tempdir().unwrap();
    let root = root.path();
    let mut s = settings(&[S::Envvar], root);
    s.mig_strategy = MigStrategy::Mixed;
    s.device_id_strategy = DeviceIdStrategy::Index;
    s.pass_device_specs = true;
    let minors = "gpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
                  gpu0/gi2/access 21\ngpu0/gi2/ci0/access 22\n";
    let inv = inventory(vec![mig_gpu(0, &["1g.10gb", "1g.10gb"])]);
    let built = resources::build_with_mig_minors(&inv, &s, Path::new("/nonexistent"), Some(minors))
        .unwrap();
    let index = ResourceIndex::new(&built[0]);
    let got = allocate(
        &built[0],
        &index,
        &strings(&["0:1", "0:0"]),
        &s,
        &all_healthy,
    )
    .unwrap();
    let want = ContainerAllocation {
        envs: map(&[("NVIDIA_VISIBLE_DEVICES", "0:0,0:1")]),
        devices: vec![
            spec(root, "/dev/nvidia0"),
            spec(root, "/dev/nvidia-caps/nvidia-cap12"),
            spec(root, "/dev/nvidia-caps/nvidia-cap13"),
            spec(root, "/dev/nvidia-caps/nvidia-cap21"),
            spec(root, "/dev/nvidia-caps/nvidia-cap22"),
        ],
        ..Default::default()
    };
    assert_eq!(got, want);
}

#[test]
fn every_error() {
    let root = Path::new("/");
    let g = |i: u32| gpu_uuid(i);
    let sick = |u: Unit| u.gpu != 2;
    let unknown: Vec<String> = (0..7).map(|i| format!("GPU-x{i}")).collect();
    let name = "nvidia.com/gpu".to_string();
    let list = |ids: &[String], total: usize| IdList {
        shown: ids.iter().take(5).cloned().collect(),
        total,
    };
    let known = list(&(0..4).map(g).collect::<Vec<_>>(), 4);
    let cases: Vec<(&str, Vec<String>, AllocateError, &str)> = vec![
        (
            "empty",
            vec![],
            AllocateError::EmptyRequest {
                resource: name.clone(),
            },
            "invalid request for nvidia.com/gpu: no device ids",
        ),
        (
            "unknown",
            [vec![g(0)], unknown.clone()].concat(),
            AllocateError::UnknownDevices {
                resource: name.clone(),
                ids: list(&unknown, 7),
                known: known.clone(),
            },
            "unknown device ids \"GPU-x0\", \"GPU-x1\", \"GPU-x2\", \"GPU-x3\", \"GPU-x4\" and 2 more (known: \"GPU-00000000",
        ),
        (
            "duplicate",
            vec![g(1), g(0), g(1)],
            AllocateError::DuplicateDevices {
                resource: name.clone(),
                ids: list(&[g(1)], 1),
            },
            "given more than once: \"GPU-00000001",
        ),
        (
            "unhealthy",
            vec![g(3), g(2)],
            AllocateError::Unhealthy {
                resource: name.clone(),
                ids: list(&[g(2)], 1),
            },
            "unhealthy devices \"GPU-00000002",
        ),
    ];
    let s = settings(&[S::Envvar], root);
    let (r, index) = resource(&gpus(4), &s);
    for (case, request, want, text) in cases {
        let err = allocate(&r, &index, &request, &s, &sick).unwrap_err();
        assert_eq!(err, want, "{case}");
        assert!(err.to_string().contains(text), "{case}: {err}");
    }

    let mut s = settings(&[S::Envvar], root);
    s.sharing = Some(time_slicing("nvidia.com/gpu", 2, false, true));
    let (r, index) = resource(&gpus(2), &s);
    let request = vec![format!("{}::0", g(0)), format!("{}::0", g(1))];
    let err = allocate(&r, &index, &request, &s, &all_healthy).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid request for nvidia.com/gpu: maximum request size for shared resources is 1; found 2"
    );
    let one = allocate(&r, &index, &request[1..], &s, &all_healthy).unwrap();
    assert_eq!(
        one.envs["NVIDIA_VISIBLE_DEVICES"],
        g(1),
        "one replica is fine"
    );
}

#[test]
fn ten_thousand_ids() {
    let root = Path::new("/");
    let s = settings(&[S::Envvar], root);
    let (r, index) = resource(&gpus(8), &s);
    let unknown: Vec<String> = (0..10_000).map(|i| format!("GPU-{i}")).collect();
    let err = allocate(&r, &index, &unknown, &s, &all_healthy).unwrap_err();
    assert!(
        matches!(&err, AllocateError::UnknownDevices { ids, .. } if ids.total == 10_000 && ids.shown.len() == 5),
        "{err}"
    );
    assert!(err.to_string().contains("and 9995 more"), "{err}");

    // 10,000 known replicas, asked for in reverse: 8 GPUs in order.
    let mut s = settings(&[S::Envvar], root);
    s.sharing = Some(time_slicing("nvidia.com/gpu", 1250, false, false));
    let (r, index) = resource(&gpus(8), &s);
    let request: Vec<String> = r.devices.iter().rev().map(|d| d.id.clone()).collect();
    assert_eq!(request.len(), 10_000);
    let got = allocate(&r, &index, &request, &s, &all_healthy).unwrap();
    let want: Vec<String> = (0..8).map(gpu_uuid).collect();
    assert_eq!(got.envs["NVIDIA_VISIBLE_DEVICES"], want.join(","));
}

#[test]
fn an_index_of_another_resource_finds_nothing() {
    let root = Path::new("/");
    let s = settings(&[S::Envvar], root);
    let (r, _) = resource(&gpus(2), &s);
    let (_, other) = resource(&gpus(4), &s);
    let err = allocate(&r, &other, &strings(&[&gpu_uuid(3)]), &s, &all_healthy).unwrap_err();
    assert!(matches!(err, AllocateError::UnknownDevices { .. }), "{err}");
}

#[test]
fn the_runtime_resolves_the_plugins_cdi_kind_without_a_spec_file() {
    assert!(nvshim::select::NVIDIA_CDI_KINDS.contains(&CDI_KIND));
}

// SPDX-License-Identifier: Apache-2.0
//! `allocate` for MPS-shared resources: the daemon's pipe directory and shm, and the
//! replica's limits, on top of every device-list strategy's own answer.

use std::path::Path;

use super::*;
use crate::config::{DeviceListStrategy as S, SharingStrategy};
use crate::resources::fixtures::{gpu_uuid, gpus, mps, time_slicing};
use crate::resources::{self, Resource, ResourceIndex};

fn all_healthy(_: Unit) -> bool {
    true
}

fn mount(container: &str, host: &str) -> AllocatedMount {
    AllocatedMount {
        container_path: container.to_string(),
        host_path: host.to_string(),
        read_only: false,
    }
}

fn mps_settings(strategies: &[S], rename: bool, fail: bool) -> Settings {
    Settings {
        device_list_strategies: strategies.to_vec(),
        sharing: Some(mps("nvidia.com/gpu", 4, rename, fail)),
        mps_root: Some("/run/nvidia/mps".into()),
        ..Settings::default()
    }
}

fn resource(s: &Settings) -> (Resource, ResourceIndex) {
    let mut built = resources::build(&gpus(4), s, Path::new("/nonexistent-sysfs")).unwrap();
    let r = built.remove(0);
    assert_eq!(r.sharing, Some(SharingStrategy::Mps));
    let index = ResourceIndex::new(&r);
    (r, index)
}

/// The MPS env every answer carries for one GPU of 80 GiB shared 4 ways.
fn mps_envs(pipe: &str, mem: &str) -> Vec<(String, String)> {
    vec![
        ("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE".into(), "25".into()),
        ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT".into(), mem.into()),
        ("CUDA_MPS_PIPE_DIRECTORY".into(), pipe.into()),
    ]
}

/// Case name, strategies, expected envs, expected mounts.
type Case = (
    &'static str,
    Vec<S>,
    BTreeMap<String, String>,
    Vec<AllocatedMount>,
);

#[test]
fn every_strategy_gets_the_pipe_shm_and_limits() {
    let g2 = gpu_uuid(2);
    let pipe = mps_envs("/mps/nvidia.com/gpu/pipe", "0=20480M");
    let mps_mounts = vec![
        mount(
            "/mps/nvidia.com/gpu/pipe",
            "/run/nvidia/mps/nvidia.com/gpu/pipe",
        ),
        mount("/dev/shm", "/run/nvidia/mps/shm"),
    ];
    let with = |extra: &[(&str, &str)]| -> BTreeMap<String, String> {
        pipe.iter()
            .cloned()
            .chain(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())))
            .collect()
    };
    let mut volume_mounts = mps_mounts.clone();
    volume_mounts.push(mount(
        &format!("/var/run/nvidia-container-devices/{g2}"),
        "/dev/null",
    ));
    let cases: Vec<Case> = vec![
        (
            "envvar",
            vec![S::Envvar],
            with(&[("NVIDIA_VISIBLE_DEVICES", &g2)]),
            mps_mounts.clone(),
        ),
        (
            // MPS mounts first, as NVIDIA's plugin appends the device mounts after.
            "volume-mounts",
            vec![S::VolumeMounts],
            with(&[(
                "NVIDIA_VISIBLE_DEVICES",
                "/var/run/nvidia-container-devices",
            )]),
            volume_mounts,
        ),
        (
            // NVIDIA adds the MPS part before it stops for CDI-only strategies.
            "cdi-cri only",
            vec![S::CdiCri],
            with(&[("NVIDIA_VISIBLE_DEVICES", "void")]),
            mps_mounts.clone(),
        ),
    ];
    for (case, strategies, envs, mounts) in cases {
        let s = mps_settings(&strategies, false, true);
        let (r, index) = resource(&s);
        let got = allocate(&r, &index, &[format!("{g2}::3")], &s, &all_healthy).unwrap();
        assert_eq!(got.envs, envs, "{case}");
        assert_eq!(got.mounts, mounts, "{case}");
    }
}

#[test]
fn renamed_resource_uses_its_advertised_name() {
    let s = mps_settings(&[S::Envvar], true, true);
    let (r, index) = resource(&s);
    assert_eq!(r.name, "nvidia.com/gpu.shared");
    let got = allocate(
        &r,
        &index,
        &[format!("{}::0", gpu_uuid(0))],
        &s,
        &all_healthy,
    )
    .unwrap();
    assert_eq!(
        got.envs["CUDA_MPS_PIPE_DIRECTORY"],
        "/mps/nvidia.com/gpu.shared/pipe"
    );
    assert_eq!(
        got.mounts[0],
        mount(
            "/mps/nvidia.com/gpu.shared/pipe",
            "/run/nvidia/mps/nvidia.com/gpu.shared/pipe"
        )
    );
}

#[test]
fn several_gpus_number_their_limits_as_the_container_sees_them() {
    let s = mps_settings(&[S::Envvar], false, false);
    let (r, index) = resource(&s);
    // GPUs 3 and 1, asked for out of order: the container sees 1 as 0 and 3 as 1.
    let request = vec![format!("{}::0", gpu_uuid(3)), format!("{}::2", gpu_uuid(1))];
    let got = allocate(&r, &index, &request, &s, &all_healthy).unwrap();
    assert_eq!(
        got.envs["NVIDIA_VISIBLE_DEVICES"],
        format!("{},{}", gpu_uuid(1), gpu_uuid(3))
    );
    assert_eq!(
        got.envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"],
        "0=20480M,1=20480M"
    );
}

#[test]
fn fail_requests_greater_than_one_and_a_missing_root() {
    let s = mps_settings(&[S::Envvar], false, true);
    let (r, index) = resource(&s);
    let two = vec![format!("{}::0", gpu_uuid(0)), format!("{}::1", gpu_uuid(0))];
    let err = allocate(&r, &index, &two, &s, &all_healthy).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid request for nvidia.com/gpu: maximum request size for shared resources is 1; found 2"
    );
    let mut no_root = s.clone();
    no_root.mps_root = None;
    let err = allocate(&r, &index, &two[..1], &no_root, &all_healthy).unwrap_err();
    assert_eq!(
        err,
        AllocateError::NoMpsRoot {
            resource: "nvidia.com/gpu".into()
        }
    );
}

#[test]
fn time_slicing_gets_no_mps_part() {
    let s = Settings {
        sharing: Some(time_slicing("nvidia.com/gpu", 4, false, false)),
        mps_root: Some("/run/nvidia/mps".into()),
        ..Settings::default()
    };
    let built = resources::build(&gpus(1), &s, Path::new("/nonexistent")).unwrap();
    let index = ResourceIndex::new(&built[0]);
    let got = allocate(
        &built[0],
        &index,
        &[format!("{}::0", gpu_uuid(0))],
        &s,
        &all_healthy,
    )
    .unwrap();
    assert_eq!(
        got.envs.keys().collect::<Vec<_>>(),
        ["NVIDIA_VISIBLE_DEVICES"]
    );
    assert!(got.mounts.is_empty());
}

// SPDX-License-Identifier: Apache-2.0
//! `request::build`: where a container's device request, capabilities and requirements
//! come from, under each `config.toml` policy (NVIDIA's rules, toolkit research §4).
//! Here: which source the devices come from; the rest (unprivileged requests,
//! capabilities, requirements, errors, the JSON, a property test) is `inputs_rules_tests`,
//! with these helpers.

use crate::request::{ContainerInputs, DeviceSource, InputMount, RequestPolicy, build};

pub(super) fn inputs(env: &[&str]) -> ContainerInputs {
    ContainerInputs {
        env: env.iter().map(|s| s.to_string()).collect(),
        privileged: true,
        ..ContainerInputs::default()
    }
}

pub(super) fn mount(destination: &str, source: &str) -> InputMount {
    InputMount {
        destination: destination.into(),
        source: Some(source.into()),
    }
}

pub(super) fn annotation(k: &str, v: &str) -> (String, String) {
    (k.into(), v.into())
}

pub(super) fn swarm_policy() -> RequestPolicy {
    RequestPolicy {
        swarm_resource: vec!["DOCKER_RESOURCE_GPU".into(), "DOCKER_RESOURCE_GPU2".into()],
        ..RequestPolicy::default()
    }
}

pub(super) fn strict_policy() -> RequestPolicy {
    RequestPolicy {
        accept_envvar_when_unprivileged: false,
        accept_volume_mounts: true,
        ..swarm_policy()
    }
}

/// (case, inputs, policy, devices, source).
type DeviceCase = (
    &'static str,
    ContainerInputs,
    RequestPolicy,
    &'static str,
    DeviceSource,
);

#[test]
fn devices_come_from_the_first_source_that_has_any() {
    use DeviceSource as S;
    let dflt = RequestPolicy::default;
    let mounts_on = || RequestPolicy {
        accept_volume_mounts: true,
        ..RequestPolicy::default()
    };
    let with_mounts = |env: &[&str], mounts: Vec<InputMount>| ContainerInputs {
        mounts,
        ..inputs(env)
    };
    let with_annotations = |env: &[&str], a: Vec<(String, String)>| ContainerInputs {
        annotations: a,
        mounts: vec![mount("/var/run/nvidia-container-devices/1", "/dev/null")],
        ..inputs(env)
    };
    let cases: Vec<DeviceCase> = vec![
        ("nothing", inputs(&[]), dflt(), "void", S::None),
        (
            "env",
            inputs(&["NVIDIA_VISIBLE_DEVICES=0,1"]),
            dflt(),
            "0,1",
            S::Env,
        ),
        (
            "env last wins",
            inputs(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=2"]),
            dflt(),
            "2",
            S::Env,
        ),
        (
            "env empty",
            inputs(&["NVIDIA_VISIBLE_DEVICES="]),
            dflt(),
            "void",
            S::Env,
        ),
        (
            "env void",
            inputs(&["NVIDIA_VISIBLE_DEVICES=void"]),
            dflt(),
            "void",
            S::Env,
        ),
        (
            "env none",
            inputs(&["NVIDIA_VISIBLE_DEVICES=none"]),
            dflt(),
            "none",
            S::Env,
        ),
        (
            "entry without =",
            inputs(&["NVIDIA_VISIBLE_DEVICES", "PATH=/bin"]),
            dflt(),
            "void",
            S::None,
        ),
        (
            "legacy image",
            inputs(&["CUDA_VERSION=10.2.89"]),
            dflt(),
            "all",
            S::LegacyImage,
        ),
        (
            "legacy, empty require",
            inputs(&["CUDA_VERSION=10.2", "NVIDIA_REQUIRE_CUDA="]),
            dflt(),
            "all",
            S::LegacyImage,
        ),
        (
            "not legacy: require set",
            inputs(&["CUDA_VERSION=12.4", "NVIDIA_REQUIRE_CUDA=cuda>=12.4"]),
            dflt(),
            "void",
            S::None,
        ),
        (
            "not legacy: empty version",
            inputs(&["CUDA_VERSION="]),
            dflt(),
            "void",
            S::None,
        ),
        (
            "legacy, env set empty",
            inputs(&["CUDA_VERSION=10.2", "NVIDIA_VISIBLE_DEVICES="]),
            dflt(),
            "void",
            S::Env,
        ),
        (
            "swarm off by default",
            inputs(&["DOCKER_RESOURCE_GPU=3"]),
            dflt(),
            "void",
            S::None,
        ),
        (
            "swarm beats env",
            inputs(&["DOCKER_RESOURCE_GPU=3", "NVIDIA_VISIBLE_DEVICES=0"]),
            swarm_policy(),
            "3",
            S::SwarmResource,
        ),
        (
            "swarm concatenated in policy order",
            inputs(&["DOCKER_RESOURCE_GPU2=2", "DOCKER_RESOURCE_GPU=3, 1"]),
            swarm_policy(),
            "3,1,2",
            S::SwarmResource,
        ),
        (
            "swarm blank value",
            inputs(&["DOCKER_RESOURCE_GPU= ", "DOCKER_RESOURCE_GPU2=1"]),
            swarm_policy(),
            "1",
            S::SwarmResource,
        ),
        (
            "swarm set but empty",
            inputs(&["DOCKER_RESOURCE_GPU=", "NVIDIA_VISIBLE_DEVICES=0"]),
            swarm_policy(),
            "void",
            S::SwarmResource,
        ),
        (
            "swarm unset: env",
            inputs(&["NVIDIA_VISIBLE_DEVICES=0"]),
            swarm_policy(),
            "0",
            S::Env,
        ),
        (
            "mounts off by default",
            with_mounts(
                &[],
                vec![mount("/var/run/nvidia-container-devices/0", "/dev/null")],
            ),
            dflt(),
            "void",
            S::None,
        ),
        (
            "mounts beat env",
            with_mounts(
                &["NVIDIA_VISIBLE_DEVICES=all"],
                vec![
                    mount(
                        "/var/run/nvidia-container-devices/GPU-4e1f0000-0000-4000-8000-000000000000",
                        "/dev/null",
                    ),
                    mount("/var/run/nvidia-container-devices/1", "/dev/null"),
                ],
            ),
            mounts_on(),
            "GPU-4e1f0000-0000-4000-8000-000000000000,1",
            S::VolumeMounts,
        ),
        (
            "mounts: cdi forms",
            with_mounts(
                &[],
                vec![
                    mount(
                        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/0",
                        "/dev/null",
                    ),
                    mount(
                        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=1",
                        "/dev/null",
                    ),
                ],
            ),
            mounts_on(),
            "nvidia.com/gpu=0,nvidia.com/gpu=1",
            S::VolumeMounts,
        ),
        (
            "mounts: paths cleaned, duplicates folded",
            with_mounts(
                &[],
                vec![
                    mount(
                        "/var/run//nvidia-container-devices/./2/",
                        "/dev/../dev/null",
                    ),
                    mount("/var/run/nvidia-container-devices/2", "/dev/null"),
                ],
            ),
            mounts_on(),
            "2",
            S::VolumeMounts,
        ),
        (
            "mounts: only /dev/null sources",
            with_mounts(
                &["NVIDIA_VISIBLE_DEVICES=0"],
                vec![
                    mount("/var/run/nvidia-container-devices/1", "/tmp/x"),
                    InputMount {
                        destination: "/var/run/nvidia-container-devices/2".into(),
                        source: None,
                    },
                ],
            ),
            mounts_on(),
            "0",
            S::Env,
        ),
        (
            "mounts: root itself and look-alikes skipped",
            with_mounts(
                &["NVIDIA_VISIBLE_DEVICES=0"],
                vec![
                    mount("/var/run/nvidia-container-devices", "/dev/null"),
                    mount("/var/run/nvidia-container-devices/", "/dev/null"),
                    mount("/var/run/nvidia-container-devicesX/1", "/dev/null"),
                    mount("/run/nvidia-container-devices/1", "/dev/null"),
                ],
            ),
            mounts_on(),
            "0",
            S::Env,
        ),
        (
            "mounts: imex only falls through",
            with_mounts(
                &["NVIDIA_VISIBLE_DEVICES=0"],
                vec![mount(
                    "/var/run/nvidia-container-devices/imex/3",
                    "/dev/null",
                )],
            ),
            mounts_on(),
            "0",
            S::Env,
        ),
        (
            "mounts: all",
            with_mounts(
                &[],
                vec![mount("/var/run/nvidia-container-devices/all", "/dev/null")],
            ),
            mounts_on(),
            "all",
            S::VolumeMounts,
        ),
        (
            "annotations beat mounts and env",
            with_annotations(
                &["NVIDIA_VISIBLE_DEVICES=all"],
                vec![
                    annotation("cdi.k8s.io/b", "nvidia.com/gpu=1"),
                    annotation("cdi.k8s.io/a", "nvidia.com/gpu=0, nvidia.com/gpu=1"),
                    annotation("other.io/x", "junk"),
                ],
            ),
            mounts_on(),
            "nvidia.com/gpu=0,nvidia.com/gpu=1",
            S::CdiAnnotations,
        ),
        (
            "annotations with several prefixes, sorted by key",
            with_annotations(
                &[],
                vec![
                    annotation("z.example.com/claim", "example.com/fpga=a"),
                    annotation("cdi.k8s.io/pod", "nvidia.com/gpu=all"),
                    annotation(
                        "a.example.com/x",
                        "nvidia.com/gpu=MIG-aaaaaaaa-0000-4000-8000-000000000000",
                    ),
                ],
            ),
            RequestPolicy {
                annotation_prefixes: vec![
                    "cdi.k8s.io/".into(),
                    "a.example.com/".into(),
                    "z.example.com/".into(),
                    "".into(),
                ],
                ..RequestPolicy::default()
            },
            "nvidia.com/gpu=MIG-aaaaaaaa-0000-4000-8000-000000000000,nvidia.com/gpu=all,example.com/fpga=a",
            S::CdiAnnotations,
        ),
        (
            "annotation prefix not configured",
            with_annotations(
                &["NVIDIA_VISIBLE_DEVICES=0"],
                vec![annotation("cdi.k8s.io/a", "nvidia.com/gpu=1")],
            ),
            RequestPolicy {
                annotation_prefixes: vec![],
                ..RequestPolicy::default()
            },
            "0",
            S::Env,
        ),
    ];
    for (name, inputs, policy, want, source) in cases {
        match build(&inputs, &policy) {
            Ok(r) => {
                assert_eq!(r.devices.to_string(), want, "case {name}");
                assert_eq!(r.source, source, "case {name}");
                assert_eq!(r.ignored, None, "case {name}");
            }
            Err(e) => panic!("case {name}: {e}"),
        }
    }
}

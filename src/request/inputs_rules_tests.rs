// SPDX-License-Identifier: Apache-2.0
//! `request::build` under each `config.toml` policy: unprivileged env requests, driver
//! capabilities, `NVIDIA_REQUIRE_*` requirements, error messages, the request's JSON, and
//! a property test that it never panics. The helpers are `inputs_tests`'.

use proptest::prelude::*;

use super::inputs_tests::{annotation, inputs, mount, strict_policy, swarm_policy};
use crate::request::{
    ContainerInputs, DeviceList, DriverCapabilities, InputMount, RequestPolicy, build,
};

/// (case, env, mounts, annotations, devices, the note's variables).
type UnprivilegedCase = (
    &'static str,
    Vec<&'static str>,
    Vec<InputMount>,
    Vec<(String, String)>,
    &'static str,
    Option<Vec<&'static str>>,
);

/// (case, env, policy, (variable, requirement) pairs).
type RequirementCase = (
    &'static str,
    Vec<&'static str>,
    RequestPolicy,
    Vec<(&'static str, &'static str)>,
);

#[test]
fn unprivileged_env_requests_are_dropped_when_policy_says_so() {
    let cases: Vec<UnprivilegedCase> = vec![
        (
            "S11: env all",
            vec!["NVIDIA_VISIBLE_DEVICES=all"],
            vec![],
            vec![],
            "void",
            Some(vec!["NVIDIA_VISIBLE_DEVICES"]),
        ),
        (
            "junk is not parsed",
            vec!["NVIDIA_VISIBLE_DEVICES=junk!"],
            vec![],
            vec![],
            "void",
            Some(vec!["NVIDIA_VISIBLE_DEVICES"]),
        ),
        (
            "swarm",
            vec!["DOCKER_RESOURCE_GPU=0", "DOCKER_RESOURCE_GPU2=1"],
            vec![],
            vec![],
            "void",
            Some(vec!["DOCKER_RESOURCE_GPU", "DOCKER_RESOURCE_GPU2"]),
        ),
        (
            "legacy image",
            vec!["CUDA_VERSION=11.0"],
            vec![],
            vec![],
            "void",
            Some(vec!["CUDA_VERSION"]),
        ),
        (
            "void needs no note",
            vec!["NVIDIA_VISIBLE_DEVICES=void"],
            vec![],
            vec![],
            "void",
            None,
        ),
        (
            "mounts still work",
            vec!["NVIDIA_VISIBLE_DEVICES=all"],
            vec![mount("/var/run/nvidia-container-devices/1", "/dev/null")],
            vec![],
            "1",
            None,
        ),
        (
            "annotations still work",
            vec!["NVIDIA_VISIBLE_DEVICES=all"],
            vec![],
            vec![annotation("cdi.k8s.io/x", "nvidia.com/gpu=0")],
            "nvidia.com/gpu=0",
            None,
        ),
    ];
    for (name, env, mounts, annotations, want, note) in cases {
        let inputs = ContainerInputs {
            mounts,
            annotations,
            privileged: false,
            ..inputs(&env)
        };
        let r = match build(&inputs, &strict_policy()) {
            Ok(r) => r,
            Err(e) => panic!("case {name}: {e}"),
        };
        assert_eq!(r.devices.to_string(), want, "case {name}");
        let vars = r
            .ignored
            .as_ref()
            .map(|i| i.variables.iter().map(String::as_str).collect::<Vec<_>>());
        assert_eq!(vars, note, "case {name}");
        if let Some(i) = &r.ignored {
            let msg = i.to_string();
            assert!(
                msg.contains("accept-nvidia-visible-devices-envvar-when-unprivileged"),
                "case {name}: {msg}"
            );
        }
        // The same container, privileged, gets what it asked for.
        let privileged = ContainerInputs {
            privileged: true,
            ..inputs
        };
        let r = build(&privileged, &strict_policy()).map_err(|e| e.to_string());
        assert!(
            matches!(&r, Ok(r) if r.ignored.is_none()) || name == "junk is not parsed",
            "case {name}: {r:?}"
        );
    }
    // The default policy accepts env requests from unprivileged containers.
    let r = build(
        &ContainerInputs {
            privileged: false,
            ..inputs(&["NVIDIA_VISIBLE_DEVICES=all"])
        },
        &RequestPolicy::default(),
    );
    assert!(matches!(&r, Ok(r) if r.devices == DeviceList::All), "{r:?}");
}

#[test]
fn capabilities_follow_nvidia_rules() {
    let only = |caps: &str| RequestPolicy {
        supported_capabilities: caps.parse().unwrap_or(DriverCapabilities::EMPTY),
        ..RequestPolicy::default()
    };
    let cases: Vec<(&str, Vec<&str>, RequestPolicy, &str)> = vec![
        ("unset", vec![], RequestPolicy::default(), "compute,utility"),
        (
            "empty",
            vec!["NVIDIA_DRIVER_CAPABILITIES="],
            RequestPolicy::default(),
            "compute,utility",
        ),
        (
            "listed",
            vec!["NVIDIA_DRIVER_CAPABILITIES=video,compute"],
            RequestPolicy::default(),
            "compute,video",
        ),
        (
            "last wins",
            vec![
                "NVIDIA_DRIVER_CAPABILITIES=video",
                "NVIDIA_DRIVER_CAPABILITIES=graphics",
            ],
            RequestPolicy::default(),
            "graphics",
        ),
        (
            "all",
            vec!["NVIDIA_DRIVER_CAPABILITIES=all"],
            RequestPolicy::default(),
            "compat32,compute,display,graphics,ngx,utility,video",
        ),
        (
            "all means all supported",
            vec!["NVIDIA_DRIVER_CAPABILITIES=compute,all"],
            only("utility,compute,video"),
            "compute,utility,video",
        ),
        (
            "default limited to supported",
            vec![],
            only("utility,video"),
            "utility",
        ),
        (
            "legacy gets all supported",
            vec!["CUDA_VERSION=10.0"],
            only("utility,graphics"),
            "graphics,utility",
        ),
        (
            "legacy with caps set",
            vec!["CUDA_VERSION=10.0", "NVIDIA_DRIVER_CAPABILITIES=utility"],
            RequestPolicy::default(),
            "utility",
        ),
    ];
    for (name, mut env, policy, want) in cases {
        if !env.iter().any(|e| e.starts_with("CUDA_VERSION")) {
            env.push("NVIDIA_VISIBLE_DEVICES=0");
        }
        match build(&inputs(&env), &policy) {
            Ok(r) => assert_eq!(r.capabilities.to_string(), want, "case {name}"),
            Err(e) => panic!("case {name}: {e}"),
        }
    }
}

#[test]
fn requirements_are_collected() {
    let cases: Vec<RequirementCase> = vec![
        (
            "none",
            vec!["NVIDIA_VISIBLE_DEVICES=0"],
            RequestPolicy::default(),
            vec![],
        ),
        (
            "sorted, jetpack skipped",
            vec![
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_REQUIRE_ZZ=driver>=500",
                "NVIDIA_REQUIRE_JETPACK=csv-mounts=all",
                "NVIDIA_REQUIRE_JETPACK_HOST_MOUNTS=x",
                "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471",
                "NVIDIA_REQUIRE_ARCH=arch>=8.0",
            ],
            RequestPolicy::default(),
            vec![
                ("NVIDIA_REQUIRE_ARCH", "arch>=8.0"),
                (
                    "NVIDIA_REQUIRE_CUDA",
                    "cuda>=12.4 brand=tesla,driver>=470,driver<471",
                ),
                ("NVIDIA_REQUIRE_ZZ", "driver>=500"),
            ],
        ),
        (
            "last wins",
            vec![
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_REQUIRE_CUDA=bogus",
                "NVIDIA_REQUIRE_CUDA=cuda>=11",
            ],
            RequestPolicy::default(),
            vec![("NVIDIA_REQUIRE_CUDA", "cuda>=11")],
        ),
        (
            "legacy implied",
            vec!["CUDA_VERSION=10.2.89", "NVIDIA_REQUIRE_DRIVER=driver>=440"],
            RequestPolicy::default(),
            vec![
                ("NVIDIA_REQUIRE_DRIVER", "driver>=440"),
                ("CUDA_VERSION", "cuda>=10.2"),
            ],
        ),
        (
            "legacy major only",
            vec!["CUDA_VERSION=v11"],
            RequestPolicy::default(),
            vec![("CUDA_VERSION", "cuda>=11.0")],
        ),
        (
            "legacy prerelease",
            vec!["CUDA_VERSION=12.4.0-rc1"],
            RequestPolicy::default(),
            vec![("CUDA_VERSION", "cuda>=12.4")],
        ),
        (
            "disabled by env",
            vec![
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DISABLE_REQUIRE=True",
                "NVIDIA_REQUIRE_CUDA=junk",
            ],
            RequestPolicy::default(),
            vec![],
        ),
        (
            "disabled by env, legacy",
            vec!["CUDA_VERSION=junk", "NVIDIA_DISABLE_REQUIRE=1"],
            RequestPolicy::default(),
            vec![],
        ),
        (
            "not disabled",
            vec![
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DISABLE_REQUIRE=f",
                "NVIDIA_REQUIRE_CUDA=cuda>=11",
            ],
            RequestPolicy::default(),
            vec![("NVIDIA_REQUIRE_CUDA", "cuda>=11")],
        ),
        (
            "empty disable means false",
            vec![
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DISABLE_REQUIRE=",
                "NVIDIA_REQUIRE_CUDA=cuda>=11",
            ],
            RequestPolicy::default(),
            vec![("NVIDIA_REQUIRE_CUDA", "cuda>=11")],
        ),
        (
            "disabled by policy",
            vec![
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DISABLE_REQUIRE=junk",
                "NVIDIA_REQUIRE_CUDA=junk",
            ],
            RequestPolicy {
                disable_require: true,
                ..RequestPolicy::default()
            },
            vec![],
        ),
        (
            "not a GPU container: nothing read",
            vec![
                "NVIDIA_DRIVER_CAPABILITIES=bogus",
                "NVIDIA_REQUIRE_CUDA=junk",
                "NVIDIA_DISABLE_REQUIRE=junk",
            ],
            RequestPolicy::default(),
            vec![],
        ),
    ];
    for (name, env, policy, want) in cases {
        let r = match build(&inputs(&env), &policy) {
            Ok(r) => r,
            Err(e) => panic!("case {name}: {e}"),
        };
        let got: Vec<(String, String)> = r
            .requirements
            .iter()
            .map(|q| (q.variable.clone(), q.to_string()))
            .collect();
        let want: Vec<(String, String)> = want
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        assert_eq!(got, want, "case {name}");
    }
}

#[test]
fn errors_name_the_variable_and_the_value() {
    let mounts_on = RequestPolicy {
        accept_volume_mounts: true,
        ..swarm_policy()
    };
    let limited = RequestPolicy {
        supported_capabilities: "compute,utility"
            .parse()
            .unwrap_or(DriverCapabilities::EMPTY),
        ..RequestPolicy::default()
    };
    let cases: Vec<(&str, ContainerInputs, RequestPolicy, Vec<&str>)> = vec![
        (
            "bad device",
            inputs(&["NVIDIA_VISIBLE_DEVICES=0,x"]),
            RequestPolicy::default(),
            vec!["NVIDIA_VISIBLE_DEVICES: ", "\"x\"", "\"0,x\""],
        ),
        (
            "bad swarm device",
            inputs(&["DOCKER_RESOURCE_GPU=x", "DOCKER_RESOURCE_GPU2=0"]),
            swarm_policy(),
            vec!["DOCKER_RESOURCE_GPU: invalid device \"x\""],
        ),
        (
            "swarm none mixed with a device",
            inputs(&["DOCKER_RESOURCE_GPU=0", "DOCKER_RESOURCE_GPU2=none"]),
            swarm_policy(),
            vec!["DOCKER_RESOURCE_GPU, DOCKER_RESOURCE_GPU2: ", "\"none\""],
        ),
        (
            "unknown capability",
            inputs(&[
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DRIVER_CAPABILITIES=bogus,compute",
            ]),
            RequestPolicy::default(),
            vec![
                "NVIDIA_DRIVER_CAPABILITIES: ",
                "\"bogus\"",
                "valid: compat32",
            ],
        ),
        (
            "unsupported capability",
            inputs(&[
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_DRIVER_CAPABILITIES=compute,video",
            ]),
            limited,
            vec![
                "\"video\"",
                "NVIDIA_DRIVER_CAPABILITIES \"compute,video\"",
                "supported-driver-capabilities: compute,utility",
            ],
        ),
        (
            "bad requirement",
            inputs(&[
                "NVIDIA_VISIBLE_DEVICES=0",
                "NVIDIA_REQUIRE_CUDA=cuda>=12 cuda~12",
            ]),
            RequestPolicy::default(),
            vec!["NVIDIA_REQUIRE_CUDA", "\"cuda>=12 cuda~12\"", "\"cuda~12\""],
        ),
        (
            "bad disable",
            inputs(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_DISABLE_REQUIRE=yes"]),
            RequestPolicy::default(),
            vec!["NVIDIA_DISABLE_REQUIRE \"yes\"", "TRUE"],
        ),
        (
            "bad legacy version",
            inputs(&["CUDA_VERSION=12.04"]),
            RequestPolicy::default(),
            vec!["CUDA_VERSION \"12.04\"", "cuda>=12.4"],
        ),
        (
            "annotation not CDI",
            ContainerInputs {
                annotations: vec![annotation("cdi.k8s.io/x", "nvidia.com/gpu=0,0")],
                ..inputs(&[])
            },
            RequestPolicy::default(),
            vec![
                "\"0\"",
                "annotation \"cdi.k8s.io/x\"",
                "vendor.com/class=name",
            ],
        ),
        (
            "annotation empty element",
            ContainerInputs {
                annotations: vec![annotation("cdi.k8s.io/x", "nvidia.com/gpu=0,")],
                ..inputs(&[])
            },
            RequestPolicy::default(),
            vec!["\"\" in annotation \"cdi.k8s.io/x\""],
        ),
        (
            "bad mount device",
            ContainerInputs {
                mounts: vec![mount(
                    "/var/run/nvidia-container-devices/GPU-zz",
                    "/dev/null",
                )],
                ..inputs(&[])
            },
            mounts_on.clone(),
            vec![
                "volume mount \"/var/run/nvidia-container-devices/GPU-zz\"",
                "\"GPU-zz\"",
            ],
        ),
        (
            "bad cdi mount",
            ContainerInputs {
                mounts: vec![mount(
                    "/var/run/nvidia-container-devices/cdi/nvidia.com",
                    "/dev/null",
                )],
                ..inputs(&[])
            },
            mounts_on,
            vec![
                "\"/var/run/nvidia-container-devices/cdi/nvidia.com\"",
                "cdi/<vendor>/<class>/<name>",
            ],
        ),
    ];
    for (name, inputs, policy, needles) in cases {
        let err = match build(&inputs, &policy) {
            Ok(r) => panic!("case {name}: built {r:?}"),
            Err(e) => e.to_string(),
        };
        for needle in needles {
            assert!(
                err.contains(needle),
                "case {name}: {err:?} lacks {needle:?}"
            );
        }
    }
}

#[test]
fn request_json_shows_source_and_requirements() {
    let r = build(
        &inputs(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12"]),
        &RequestPolicy::default(),
    );
    let json = r.ok().and_then(|r| serde_json::to_value(r).ok());
    assert_eq!(
        json,
        Some(serde_json::json!({
            "devices": "0",
            "capabilities": ["compute", "utility"],
            "requirements": [{"variable": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12"}],
            "source": "env",
        }))
    );
}

fn arb_inputs() -> impl Strategy<Value = (ContainerInputs, bool)> {
    let key = prop_oneof![
        Just("NVIDIA_VISIBLE_DEVICES".to_string()),
        Just("NVIDIA_DRIVER_CAPABILITIES".to_string()),
        Just("NVIDIA_REQUIRE_CUDA".to_string()),
        Just("NVIDIA_DISABLE_REQUIRE".to_string()),
        Just("CUDA_VERSION".to_string()),
        Just("DOCKER_RESOURCE_GPU".to_string()),
        "NVIDIA_REQUIRE_[A-Z]{0,3}",
        ".{0,10}",
    ];
    let env = prop::collection::vec((key, ".{0,40}", any::<bool>()), 0..8).prop_map(|v| {
        v.into_iter()
            .map(|(k, val, eq)| {
                if eq {
                    format!("{k}={val}")
                } else {
                    format!("{k}{val}")
                }
            })
            .collect::<Vec<_>>()
    });
    let mounts = prop::collection::vec(
        (
            prop_oneof!["/var/run/nvidia-container-devices/.{0,30}", ".{0,30}"],
            prop::option::of(prop_oneof![Just("/dev/null".to_string()), ".{0,10}"]),
        ),
        0..4,
    )
    .prop_map(|v| {
        v.into_iter()
            .map(|(destination, source)| InputMount {
                destination,
                source,
            })
            .collect::<Vec<_>>()
    });
    let annotations = prop::collection::vec(
        (prop_oneof!["cdi\\.k8s\\.io/.{0,8}", ".{0,12}"], ".{0,40}"),
        0..3,
    );
    (env, mounts, annotations, any::<bool>(), any::<bool>()).prop_map(
        |(env, mounts, annotations, privileged, strict)| {
            (
                ContainerInputs {
                    env,
                    mounts,
                    annotations,
                    privileged,
                },
                strict,
            )
        },
    )
}

proptest! {
    #[test]
    fn build_never_panics((inputs, strict) in arb_inputs()) {
        let policy = if strict { strict_policy() } else { RequestPolicy::default() };
        if let Ok(r) = build(&inputs, &policy) {
            // Dropped requests are void; void requests carry no requirements.
            prop_assert!(r.ignored.is_none() || r.devices == DeviceList::Void);
            prop_assert!(r.devices != DeviceList::Void || r.requirements.is_empty());
        }
    }
}

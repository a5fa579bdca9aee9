// SPDX-License-Identifier: Apache-2.0
//! Registration, the device list, and `Allocate` for every device-list strategy
//! and id strategy.

use super::*;

// 1. Registration and the device list.

#[tokio::test]
async fn registers_and_streams_the_eight_gpus() {
    let node = node(&NodeSpec::standard(8));
    let by_index: Vec<String> = (0..8).map(|i| i.to_string()).collect();
    let cases: [(&str, &[&str], Vec<String>); 2] = [
        ("uuid", &[], uuids(&node.sim)),
        ("index", &["--device-id-strategy", "index"], by_index),
    ];
    for (case, args, want) in cases {
        let run = launch(
            &node.sim,
            Launch {
                args,
                ..Launch::default()
            },
        )
        .await;
        let registered = run.registrations(1, GENEROUS, case).await;
        let request = &registered[0].request;
        assert_eq!(request.version, "v1beta1", "case {case}");
        assert_eq!(request.endpoint, GPU_SOCKET, "case {case}");
        assert_eq!(request.resource_name, GPU_RESOURCE, "case {case}");
        let options = request.options.expect("options");
        assert!(
            options.get_preferred_allocation_available && !options.pre_start_required,
            "case {case}: {options:?}"
        );
        let mut client = run.dial(GPU_SOCKET).await;
        let served = client
            .get_device_plugin_options(Empty {})
            .await
            .unwrap()
            .into_inner();
        assert_eq!(served, options, "case {case}");

        let (_stream, list) = run.watch(GPU_SOCKET, case).await;
        assert_eq!(ids(&list), want, "case {case}");
        assert!(unhealthy(&list).is_empty(), "case {case}: {list:?}");
        assert_eq!(
            run.kubelet.registrations().len(),
            1,
            "case {case}: registered once"
        );
    }
}

// 2. Allocate for every device-list strategy × id strategy, with and without
// pass-device-specs.

/// What one container must get, as NVIDIA's plugin shapes it, for devices whose
/// runtime ids are `ids` (unit order) and whose `/dev/nvidia<minor>` are `minors`.
fn expected(
    sim: &SimNode,
    strategies: &[&str],
    pass_specs: bool,
    ids: &[String],
    minors: &[u32],
) -> ContainerAllocateResponse {
    let mut want = ContainerAllocateResponse::default();
    let has = |s: &str| strategies.contains(&s);
    let names: Vec<String> = ids.iter().map(|id| format!("{CDI_KIND}={id}")).collect();
    if has("cdi-annotations") {
        want.annotations
            .insert(format!("{CDI_ANNOTATION}{UID}"), names.join(","));
    }
    if has("cdi-cri") {
        want.cdi_devices = names
            .iter()
            .map(|name| CdiDevice { name: name.clone() })
            .collect();
    }
    // With CDI only, the CDI spec carries everything: no device specs, and
    // NVIDIA_VISIBLE_DEVICES=void so that the image's value stays out (CRI-O orders it after
    // the spec's "void").
    if strategies.iter().all(|s| s.starts_with("cdi-")) {
        want.envs.insert(VISIBLE.into(), "void".into());
        return want;
    }
    if has("envvar") {
        want.envs.insert(VISIBLE.into(), ids.join(","));
    }
    if has("volume-mounts") {
        want.envs.insert(VISIBLE.into(), VOLUME_ROOT.into());
        want.mounts = ids
            .iter()
            .map(|id| Mount {
                container_path: format!("{VOLUME_ROOT}/{id}"),
                host_path: "/dev/null".into(),
                read_only: false,
            })
            .collect();
    }
    if pass_specs {
        let gpus = minors.iter().map(|m| format!("/dev/nvidia{m}"));
        want.devices = CONTROL_NODES
            .iter()
            .map(|n| n.to_string())
            .chain(gpus)
            .map(|path| DeviceSpec {
                host_path: sim.dir.join(&path[1..]).display().to_string(),
                container_path: path,
                permissions: "rw".into(),
            })
            .collect();
    }
    want
}

/// Replaces the `<uid>` of the CDI annotation key with [`UID`] after checking that it
/// is a UUID and that the key is a valid annotation name.
fn without_uid(mut got: ContainerAllocateResponse, case: &str) -> ContainerAllocateResponse {
    got.annotations = got
        .annotations
        .into_iter()
        .map(|(key, value)| {
            let uid = key
                .strip_prefix(CDI_ANNOTATION)
                .unwrap_or_else(|| panic!("case {case}: unexpected annotation {key:?}"));
            let groups: Vec<usize> = uid.split('-').map(str::len).collect();
            assert!(
                groups == [8, 4, 4, 4, 12]
                    && uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit()),
                "case {case}: annotation key {key:?} does not end in a UUID"
            );
            let name = key.split_once('/').map_or(key.as_str(), |(_, n)| n);
            assert!(name.len() <= 63, "case {case}: {key:?} is too long a name");
            (format!("{CDI_ANNOTATION}{UID}"), value)
        })
        .collect();
    got
}

#[tokio::test]
async fn allocate_answers_every_strategy_and_id_strategy() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let minor = |i: usize| sim.spec.gpus[i].minor;
    let strategies: [&[&str]; 6] = [
        &["envvar"],
        &["volume-mounts"],
        &["cdi-annotations"],
        &["cdi-cri"],
        &["envvar", "cdi-cri"],
        &["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"],
    ];
    for list in strategies {
        for id_strategy in ["uuid", "index"] {
            for pass_specs in [false, true] {
                let case = format!("{list:?} {id_strategy} pass-device-specs={pass_specs}");
                let strategy_flag = format!("--device-list-strategy={}", list.join(","));
                let pass_flag = format!("--pass-device-specs={pass_specs}");
                let args = [
                    strategy_flag.as_str(),
                    "--device-id-strategy",
                    id_strategy,
                    pass_flag.as_str(),
                ];
                let run = launch(
                    sim,
                    Launch {
                        args: &args,
                        ..Launch::default()
                    },
                )
                .await;
                run.registrations(1, GENEROUS, &case).await;
                let id = |i: usize| match id_strategy {
                    "uuid" => uuid(i),
                    _ => i.to_string(),
                };
                // GPU 6 is /dev/nvidia7 on the standard node; requested out of order.
                let answer = run
                    .dial(GPU_SOCKET)
                    .await
                    .allocate(allocate_request(&[&[id(6), id(1)], &[id(3)]]))
                    .await
                    .unwrap_or_else(|e| panic!("case {case}: {e}\n{}", run.plugin.log()))
                    .into_inner();
                let got: Vec<ContainerAllocateResponse> = answer
                    .container_responses
                    .into_iter()
                    .map(|c| without_uid(c, &case))
                    .collect();
                let want = vec![
                    expected(
                        sim,
                        list,
                        pass_specs,
                        &[id(1), id(6)],
                        &[minor(1), minor(6)],
                    ),
                    expected(sim, list, pass_specs, &[id(3)], &[minor(3)]),
                ];
                assert_eq!(got, want, "case {case}");
            }
        }
    }
}

#[tokio::test]
async fn device_list_strategy_from_the_environment_and_the_config_file() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let file = "version: v1\nflags:\n  plugin:\n    deviceListStrategy: [cdi-cri]\n    \
                deviceIDStrategy: index\n";
    let cases: [(&str, Launch, Vec<String>, &[&str]); 3] = [
        (
            "env DEVICE_LIST_STRATEGY=volume-mounts",
            Launch {
                env: &[("DEVICE_LIST_STRATEGY", "volume-mounts")],
                ..Launch::default()
            },
            vec![uuid(2)],
            &["volume-mounts"],
        ),
        (
            "config file cdi-cri, index",
            Launch {
                config: Some(file),
                ..Launch::default()
            },
            strings(&["2"]),
            &["cdi-cri"],
        ),
        (
            "flag envvar beats env cdi-cri",
            Launch {
                args: &["--device-list-strategy", "envvar"],
                env: &[("DEVICE_LIST_STRATEGY", "cdi-cri")],
                ..Launch::default()
            },
            vec![uuid(2)],
            &["envvar"],
        ),
    ];
    for (case, how, ids, strategies) in cases {
        let run = launch(sim, how).await;
        run.registrations(1, GENEROUS, case).await;
        let answer = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[&ids]))
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .into_inner();
        let got = without_uid(answer.container_responses[0].clone(), case);
        let minor = sim.spec.gpus[2].minor;
        assert_eq!(
            got,
            expected(sim, strategies, false, &ids, &[minor]),
            "case {case}"
        );
    }
}

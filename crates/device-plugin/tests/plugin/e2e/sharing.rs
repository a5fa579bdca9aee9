// SPDX-License-Identifier: Apache-2.0
//! Time-slicing and MIG: replicas, renaming, MIG strategies.

use super::*;

// 3. Time-slicing.

#[tokio::test]
async fn time_slicing_advertises_replicas_and_maps_them_back() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let config = time_slicing(4, "");
    for (case, id_strategy) in [("uuid", "uuid"), ("index", "index")] {
        let run = launch(
            sim,
            Launch {
                args: &["--device-id-strategy", id_strategy],
                config: Some(&config),
                ..Launch::default()
            },
        )
        .await;
        let registered = run.registrations(1, GENEROUS, case).await;
        assert_eq!(
            (
                registered[0].request.resource_name.as_str(),
                registered[0].request.endpoint.as_str()
            ),
            (GPU_RESOURCE, GPU_SOCKET),
            "case {case}"
        );
        let base = |i: usize| match id_strategy {
            "uuid" => sim.spec.gpus[i].uuid.clone(),
            _ => i.to_string(),
        };
        let want: Vec<String> = (0..8)
            .flat_map(|g| (0..4).map(move |n| (g, n)))
            .map(|(g, n)| format!("{}::{n}", base(g)))
            .collect();
        let (_stream, list) = run.watch(GPU_SOCKET, case).await;
        assert_eq!(list.devices.len(), 32, "case {case}");
        assert_eq!(ids(&list), want, "case {case}");
        assert!(unhealthy(&list).is_empty(), "case {case}");

        let mut client = run.dial(GPU_SOCKET).await;
        let replica = |g: usize, n: u32| format!("{}::{n}", base(g));
        for (what, request, visible) in [
            (
                "two replicas of GPU 2",
                vec![replica(2, 3), replica(2, 1)],
                base(2),
            ),
            (
                "replicas of GPUs 5 and 2",
                vec![replica(5, 0), replica(2, 2)],
                format!("{},{}", base(2), base(5)),
            ),
        ] {
            let answer = client
                .allocate(allocate_request(&[&request]))
                .await
                .unwrap_or_else(|e| panic!("case {case} {what}: {e}"))
                .into_inner();
            let envs = &answer.container_responses[0].envs;
            assert_eq!(
                envs,
                &HashMap::from([(VISIBLE.to_string(), visible)]),
                "case {case} {what}"
            );
        }
    }
}

#[tokio::test]
async fn time_slicing_rename_by_default_and_fail_requests_greater_than_one() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();

    let case = "renameByDefault";
    let run = launch(
        sim,
        Launch {
            config: Some(&time_slicing(4, "    renameByDefault: true\n")),
            ..Launch::default()
        },
    )
    .await;
    let registered = run.registrations(1, GENEROUS, case).await;
    let request = &registered[0].request;
    assert_eq!(
        (request.resource_name.as_str(), request.endpoint.as_str()),
        ("nvidia.com/gpu.shared", "nvidia-gpu.shared.sock"),
        "case {case}"
    );
    let (_stream, list) = run.watch("nvidia-gpu.shared.sock", case).await;
    assert_eq!(list.devices.len(), 32, "case {case}");
    assert!(
        !run.socket(GPU_SOCKET).exists(),
        "case {case}: nvidia.com/gpu is not served"
    );
    assert_eq!(run.kubelet.registrations().len(), 1, "case {case}");
    drop(run);

    let case = "failRequestsGreaterThanOne";
    let run = launch(
        sim,
        Launch {
            config: Some(&time_slicing(4, "    failRequestsGreaterThanOne: true\n")),
            ..Launch::default()
        },
    )
    .await;
    run.registrations(1, GENEROUS, case).await;
    let mut client = run.dial(GPU_SOCKET).await;
    for request in [
        vec![format!("{}::0", uuid(1)), format!("{}::1", uuid(1))],
        vec![format!("{}::0", uuid(1)), format!("{}::0", uuid(4))],
    ] {
        let refused = client
            .allocate(allocate_request(&[&request]))
            .await
            .expect_err(case);
        assert_eq!(refused.code(), Code::InvalidArgument, "case {case}");
        assert!(
            refused
                .message()
                .contains("maximum request size for shared resources is 1; found 2"),
            "case {case}: {refused:?}"
        );
    }
    let one = client
        .allocate(allocate_request(&[&[format!("{}::3", uuid(1))]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        one.container_responses[0].envs.get(VISIBLE),
        Some(&uuid(1)),
        "case {case}: one replica"
    );
}

// 4. MIG.

/// Every GPU in MIG mode with two `1g.10gb` devices (GI 1 and 2, CI 0).
fn all_mig(n: usize) -> NodeSpec {
    let mut spec = NodeSpec::standard(n);
    for (g, gpu) in spec.gpus.iter_mut().enumerate() {
        gpu.mig_devices = (1..=2u32)
            .map(|gi| MigSpec {
                gpu_instance_id: gi,
                compute_instance_id: 0,
                uuid: format!("MIG-5e1f{g:04x}-{gi:04x}-4000-8000-{g:06x}{gi:06x}"),
                memory_bytes: 10 << 30,
                profile: "1g.10gb".into(),
            })
            .collect();
    }
    spec
}

#[tokio::test]
async fn mig_single_advertises_mig_devices_as_gpus() {
    let node = node(&all_mig(8));
    let sim = &node.sim;
    let migs: Vec<String> = sim
        .spec
        .gpus
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.uuid.clone()))
        .collect();
    let by_index: Vec<String> = (0..8)
        .flat_map(|g| (0..2).map(move |m| format!("{g}:{m}")))
        .collect();
    for (case, id_strategy, want) in [("uuid", "uuid", migs), ("index", "index", by_index)] {
        let run = launch(
            sim,
            Launch {
                args: &[
                    "--mig-strategy",
                    "single",
                    "--device-id-strategy",
                    id_strategy,
                ],
                ..Launch::default()
            },
        )
        .await;
        let registered = run.registrations(1, GENEROUS, case).await;
        assert_eq!(
            registered[0].request.resource_name, GPU_RESOURCE,
            "case {case}"
        );
        let (_stream, list) = run.watch(GPU_SOCKET, case).await;
        assert_eq!(ids(&list), want, "case {case}");
        let answer = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[&[want[5].clone(), want[2].clone()]]))
            .await
            .unwrap_or_else(|e| panic!("case {case}: {e}"))
            .into_inner();
        assert_eq!(
            answer.container_responses[0].envs.get(VISIBLE),
            Some(&format!("{},{}", want[2], want[5])),
            "case {case}"
        );
        assert_eq!(run.kubelet.registrations().len(), 1, "case {case}");
    }

    // A node with MIG on some GPUs only cannot be advertised with `single`.
    let case = "single on a mixed node";
    let mixed = crate::common::node(&NodeSpec::with_mig(8));
    let mut run = launch(
        &mixed.sim,
        Launch {
            args: &["--mig-strategy", "single"],
            ..Launch::default()
        },
    )
    .await;
    let status = run.plugin.exit(GENEROUS).await;
    assert!(
        status.is_some_and(|s| !s.success()),
        "case {case}: {status:?}"
    );
    let log = run.plugin.log();
    assert!(
        log.contains("mig-strategy=single needs every GPU in the same MIG mode"),
        "case {case}: {log}"
    );
}

#[tokio::test]
async fn mig_mixed_registers_one_resource_per_profile() {
    let node = node(&NodeSpec::with_mig(8));
    let sim = &node.sim;
    let gpu0 = &sim.spec.gpus[0];
    let (small, large) = (&gpu0.mig_devices[0], &gpu0.mig_devices[1]);
    assert_eq!(
        (small.profile.as_str(), large.profile.as_str()),
        ("1g.10gb", "2g.20gb")
    );
    for id_strategy in ["uuid", "index"] {
        let case = id_strategy;
        let run = launch(
            sim,
            Launch {
                args: &["--mig-strategy=mixed", "--device-id-strategy", id_strategy],
                ..Launch::default()
            },
        )
        .await;
        let mut registered: Vec<(String, String)> = run
            .registrations(3, GENEROUS, case)
            .await
            .iter()
            .map(|r| (r.request.resource_name.clone(), r.request.endpoint.clone()))
            .collect();
        registered.sort();
        assert_eq!(
            registered,
            [
                (GPU_RESOURCE.to_string(), GPU_SOCKET.to_string()),
                (
                    "nvidia.com/mig-1g.10gb".into(),
                    "nvidia-mig-1g.10gb.sock".into()
                ),
                (
                    "nvidia.com/mig-2g.20gb".into(),
                    "nvidia-mig-2g.20gb.sock".into()
                ),
            ],
            "case {case}"
        );
        let index = id_strategy == "index";
        let gpus: Vec<String> = (1..8)
            .map(|g| match index {
                true => g.to_string(),
                false => sim.spec.gpus[g].uuid.clone(),
            })
            .collect();
        let (small_id, large_id) = match index {
            true => ("0:0".to_string(), "0:1".to_string()),
            false => (small.uuid.clone(), large.uuid.clone()),
        };
        for (endpoint, want) in [
            (GPU_SOCKET, gpus),
            ("nvidia-mig-1g.10gb.sock", vec![small_id]),
            ("nvidia-mig-2g.20gb.sock", vec![large_id]),
        ] {
            let (_stream, list) = run.watch(endpoint, case).await;
            assert_eq!(ids(&list), want, "case {case} {endpoint}");
            let answer = run
                .dial(endpoint)
                .await
                .allocate(allocate_request(&[&want[..1]]))
                .await
                .unwrap_or_else(|e| panic!("case {case} {endpoint}: {e}"))
                .into_inner();
            assert_eq!(
                answer.container_responses[0].envs.get(VISIBLE),
                Some(&want[0]),
                "case {case} {endpoint}"
            );
        }
        // A MIG device is not a GPU: asking the GPU resource for it is refused.
        let refused = run
            .dial(GPU_SOCKET)
            .await
            .allocate(allocate_request(&[std::slice::from_ref(&small.uuid)]))
            .await
            .expect_err(case);
        assert_eq!(refused.code(), Code::InvalidArgument, "case {case}");
    }
}

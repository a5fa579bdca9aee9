// SPDX-License-Identifier: Apache-2.0
//! The `DevicePlugin` service: registration fields, `ListAndWatch`, `Allocate`,
//! `GetPreferredAllocation`, and bad requests.

use super::*;

#[tokio::test]
async fn registers_each_resource_with_kubelets_fields() {
    let plugin = start(vec![gpus(), shared()], None).await;
    let registered = plugin.kubelet.wait_registrations(2, WITHIN).await;
    let mut seen: Vec<(String, String)> = registered
        .iter()
        .map(|r| {
            let req = &r.request;
            assert_eq!(req.version, VERSION, "{req:?}");
            let options = req.options.expect("options");
            assert!(!options.pre_start_required, "{req:?}");
            assert!(options.get_preferred_allocation_available, "{req:?}");
            (req.resource_name.clone(), req.endpoint.clone())
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            ("nvidia.com/gpu".into(), "nvidia-gpu.sock".into()),
            (
                "nvidia.com/gpu.shared".into(),
                "nvidia-gpu.shared.sock".into()
            ),
        ]
    );
    plugin.ready(true).await;

    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let options = client
        .get_device_plugin_options(Empty {})
        .await
        .unwrap()
        .into_inner();
    assert!(options.get_preferred_allocation_available && !options.pre_start_required);
    client
        .pre_start_container(PreStartContainerRequest {
            devices_ids: vec![uuid(0)],
        })
        .await
        .unwrap();
    plugin.stop().await;
}

#[tokio::test]
async fn list_and_watch_streams_devices_and_health_flips() {
    let plugin = start(vec![gpus(), shared()], None).await;
    plugin.kubelet.wait_registrations(2, WITHIN).await;
    let mut gpu = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = gpu.list_and_watch(Empty {}).await.unwrap().into_inner();
    let mut replicas = plugin.kubelet.dial("nvidia-gpu.shared.sock").await;
    let mut shared_stream = replicas
        .list_and_watch(Empty {})
        .await
        .unwrap()
        .into_inner();

    let first = next(&mut stream).await.unwrap().unwrap();
    let ids: Vec<&str> = first.devices.iter().map(|d| d.id.as_str()).collect();
    assert_eq!(ids, (0..4).map(uuid).collect::<Vec<_>>());
    assert!(first.devices.iter().all(|d| d.health == "Healthy"));
    let numa: Vec<Option<i64>> = first
        .devices
        .iter()
        .map(|d| d.topology.as_ref().map(|t| t.nodes[0].id))
        .collect();
    assert_eq!(numa, [Some(0), Some(0), Some(1), None]);
    let first_shared = next(&mut shared_stream).await.unwrap().unwrap();
    assert_eq!(first_shared.devices.len(), 4);

    let sick = UnitHealth::Unhealthy {
        reason: "XID 79".into(),
        xid: Some(79),
    };
    assert!(plugin.node.health.set(&[Unit { gpu: 1, mig: None }], &sick));
    let flipped = next(&mut stream).await.unwrap().unwrap();
    assert_eq!(
        health_of(&flipped)
            .into_iter()
            .filter(|(_, h)| h == "Unhealthy")
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        [uuid(1)]
    );
    // Both replicas of the unit go together.
    let flipped_shared = next(&mut shared_stream).await.unwrap().unwrap();
    assert_eq!(
        health_of(&flipped_shared)
            .into_iter()
            .filter(|(_, h)| h == "Unhealthy")
            .map(|(id, _)| id)
            .collect::<Vec<_>>(),
        [format!("{}::0", uuid(1)), format!("{}::1", uuid(1))]
    );

    // An unhealthy device is refused.
    let refused = gpu
        .allocate(allocate_request(&[&[uuid(1)]]))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert!(refused.message().contains(&uuid(1)), "{refused:?}");

    assert!(
        plugin
            .node
            .health
            .set(&[Unit { gpu: 1, mig: None }], &UnitHealth::Healthy)
    );
    let recovered = next(&mut stream).await.unwrap().unwrap();
    assert!(recovered.devices.iter().all(|d| d.health == "Healthy"));
    plugin.stop().await;
}

#[tokio::test]
async fn allocate_sets_visible_devices_per_container() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let answer = client
        .allocate(allocate_request(&[&[uuid(2), uuid(0)], &[uuid(3)]]))
        .await
        .unwrap()
        .into_inner();
    let visible: Vec<Option<&String>> = answer
        .container_responses
        .iter()
        .map(|c| c.envs.get("NVIDIA_VISIBLE_DEVICES"))
        .collect();
    let first = format!("{},{}", uuid(0), uuid(2));
    assert_eq!(visible, [Some(&first), Some(&uuid(3))]);
    assert!(
        answer
            .container_responses
            .iter()
            .all(|c| c.mounts.is_empty() && c.devices.is_empty() && c.cdi_devices.is_empty())
    );

    let none = client
        .allocate(AllocateRequest::default())
        .await
        .unwrap()
        .into_inner();
    assert!(none.container_responses.is_empty());
    plugin.stop().await;
}

#[tokio::test]
async fn bad_allocate_requests_are_invalid_arguments_and_harmless() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let many_unknown: Vec<String> = (0..10_000).map(|i| format!("GPU-bogus-{i}")).collect();
    let many_same: Vec<String> = vec![uuid(0); 10_000];
    let cases: [(&str, Vec<String>, &str); 5] = [
        ("empty", vec![], "no device ids"),
        ("unknown", vec![uuid(0), "GPU-nope".into()], "GPU-nope"),
        ("duplicate", vec![uuid(1), uuid(1)], &uuid(1)),
        // Past the 8 KiB message limit: refused from the gRPC prefix, unread.
        (
            "10,000 unknown",
            many_unknown,
            "larger than the 8192-byte limit",
        ),
        (
            "10,000 duplicates",
            many_same,
            "larger than the 8192-byte limit",
        ),
    ];
    for (name, ids, names) in &cases {
        let err = client
            .allocate(allocate_request(&[&[uuid(3)], ids]))
            .await
            .expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "case {name}: {err:?}");
        assert!(err.message().contains(names), "case {name}: {err:?}");
        assert!(
            err.message().len() < 1024,
            "case {name}: the message names a few ids, not all: {} bytes",
            err.message().len()
        );
    }
    // Still serving, and still right.
    client.get_device_plugin_options(Empty {}).await.unwrap();
    let answer = client
        .allocate(allocate_request(&[&[uuid(1)]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0]
            .envs
            .get("NVIDIA_VISIBLE_DEVICES"),
        Some(&uuid(1))
    );
    plugin.stop().await;
}

#[tokio::test]
async fn preferred_allocation_honours_must_include_and_refuses_bad_input() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let all: Vec<String> = (0..4).map(uuid).collect();
    let request =
        |available: Vec<String>, must: Vec<String>, size: i32| PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: available,
                must_include_device_i_ds: must,
                allocation_size: size,
            }],
        };
    let answer = client
        .get_preferred_allocation(request(all.clone(), vec![uuid(2)], 2))
        .await
        .unwrap()
        .into_inner();
    let picked = &answer.container_responses[0].device_i_ds;
    assert_eq!(picked.len(), 2, "{picked:?}");
    assert!(picked.contains(&uuid(2)), "{picked:?}");
    assert!(picked.iter().all(|id| all.contains(id)), "{picked:?}");

    for (name, bad) in [
        ("negative size", request(all.clone(), vec![], -1)),
        ("zero size", request(all.clone(), vec![], 0)),
        ("unknown", request(vec!["GPU-nope".into()], vec![], 1)),
        ("too many", request(vec![uuid(0)], vec![], 2)),
    ] {
        let err = client.get_preferred_allocation(bad).await.expect_err(name);
        assert_eq!(err.code(), Code::InvalidArgument, "case {name}: {err:?}");
    }
    client.get_device_plugin_options(Empty {}).await.unwrap();
    plugin.stop().await;
}

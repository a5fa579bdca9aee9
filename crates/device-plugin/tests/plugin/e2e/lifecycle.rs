// SPDX-License-Identifier: Apache-2.0
//! Health events, kubelet restarts, bad input, init errors and signals.

use super::*;

// 5. Health.

#[tokio::test]
async fn xid_79_marks_gpu_3_unhealthy_and_xid_13_does_not() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid3 = sim.spec.gpus[3].uuid.clone();
    let case = "whole GPUs";
    let run = launch(sim, Launch::default()).await;
    run.registrations(1, GENEROUS, case).await;
    let (mut stream, list) = run.watch(GPU_SOCKET, case).await;
    assert!(unhealthy(&list).is_empty(), "case {case}");

    // XID 13 is an application error: nothing changes.
    append_event(sim, &format!("{uuid3} 13"));
    match tokio::time::timeout(QUIET, stream.message()).await {
        Err(_) => {}
        Ok(Ok(Some(list))) => assert!(
            unhealthy(&list).is_empty(),
            "case {case}: XID 13 changed the list: {list:?}"
        ),
        Ok(other) => panic!("case {case}: the stream ended: {other:?}"),
    }

    append_event(sim, &format!("{uuid3} 79"));
    let appended = Instant::now();
    let list = run.next(&mut stream, WITHIN, case).await;
    assert!(appended.elapsed() <= WITHIN, "case {case}");
    assert_eq!(unhealthy(&list), [uuid3.as_str()], "case {case}: {list:?}");
    assert_eq!(list.devices.len(), 8, "case {case}");

    // Kubelet would not pick it, and Allocate refuses it.
    let refused = run
        .dial(GPU_SOCKET)
        .await
        .allocate(allocate_request(&[std::slice::from_ref(&uuid3)]))
        .await
        .expect_err(case);
    assert_eq!(refused.code(), Code::InvalidArgument, "case {case}");
    assert!(
        refused.message().contains("unhealthy") && refused.message().contains(&uuid3),
        "case {case}: {refused:?}"
    );
}

#[tokio::test]
async fn xid_79_marks_every_replica_of_gpu_3_unhealthy_together() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid3 = sim.spec.gpus[3].uuid.clone();
    let case = "time-slicing, 4 replicas";
    let run = launch(
        sim,
        Launch {
            config: Some(&time_slicing(4, "")),
            ..Launch::default()
        },
    )
    .await;
    run.registrations(1, GENEROUS, case).await;
    let (mut stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 32, "case {case}");
    assert!(unhealthy(&list).is_empty(), "case {case}");

    append_event(sim, &format!("{uuid3} 79"));
    let appended = Instant::now();
    let list = run.next(&mut stream, WITHIN, case).await;
    assert!(appended.elapsed() <= WITHIN, "case {case}");
    let want: Vec<String> = (0..4).map(|n| format!("{uuid3}::{n}")).collect();
    assert_eq!(unhealthy(&list), want, "case {case}: in one update");
}

// 6. Kubelet restarts and a deleted socket.

#[tokio::test]
async fn re_registers_within_a_second_of_a_kubelet_restart_or_a_deleted_socket() {
    let node = node(&NodeSpec::standard(8));
    let mut run = launch(&node.sim, Launch::default()).await;
    run.registrations(1, GENEROUS, "start").await;
    let (mut old, _) = run.watch(GPU_SOCKET, "start").await;

    let case = "kubelet.sock deleted and re-created";
    run.kubelet.restart().await;
    let recreated = Instant::now();
    let registered = run.registrations(2, WITHIN, case).await;
    let took = registered[1].at.saturating_duration_since(recreated);
    assert!(took <= WITHIN, "case {case}: {took:?}");
    assert_eq!(
        registered[1].request.resource_name, GPU_RESOURCE,
        "case {case}"
    );
    // The stream kubelet had before its restart ends.
    match tokio::time::timeout(GENEROUS, old.message()).await {
        Ok(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "case {case}"),
        Ok(Ok(None)) => {}
        other => panic!("case {case}: the old stream goes on: {other:?}"),
    }
    let (_stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 8, "case {case}");

    let case = "our socket deleted";
    fs::remove_file(run.socket(GPU_SOCKET)).unwrap();
    let deleted = Instant::now();
    let registered = run.registrations(3, WITHIN, case).await;
    let took = registered[2].at.saturating_duration_since(deleted);
    assert!(took <= WITHIN, "case {case}: {took:?}");
    assert!(run.socket(GPU_SOCKET).exists(), "case {case}");
    let (_stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 8, "case {case}");

    let case = "kubelet down for 2 s, then back";
    run.kubelet.stop().await;
    // Long enough for the registration backoff to grow past a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.kubelet.restart().await;
    let back = Instant::now();
    let registered = run.registrations(4, WITHIN, case).await;
    let took = registered[3].at.saturating_duration_since(back);
    assert!(took <= WITHIN, "case {case}: {took:?}");
    run.alive(case);
}

// 7. Bad input.

#[tokio::test]
async fn bad_allocate_requests_are_refused_and_the_plugin_serves_on() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let mut run = launch(sim, Launch::default()).await;
    run.registrations(1, GENEROUS, "start").await;
    let mut client = run.dial(GPU_SOCKET).await;

    let unknown: Vec<String> = (0..10_000).map(|i| format!("GPU-bogus-{i}")).collect();
    let repeated = vec![uuid(0); 10_000];
    let known_then_unknown: Vec<String> = (0..10_000)
        .map(|i| match i {
            0..8 => uuid(i),
            _ => format!("GPU-more-{i}"),
        })
        .collect();
    let nine: Vec<String> = (0..9).map(|i| format!("GPU-{i}")).collect();
    // 10,000 ids are over the message limit (8 KiB for 8 GPUs): refused from the
    // gRPC prefix, before they are read.
    let limit = "larger than the 8192-byte limit";
    let cases: [(&str, Vec<String>, &str); 7] = [
        ("empty", vec![], "no device ids"),
        ("unknown", vec![uuid(0), "GPU-nope".into()], "GPU-nope"),
        ("duplicate", vec![uuid(1), uuid(2), uuid(1)], &uuid(1)),
        (
            "9 ids for 8 GPUs",
            nine,
            "9 device ids for nvidia.com/gpu, more than the 8",
        ),
        ("10,000 unknown", unknown, limit),
        ("10,000 duplicates", repeated, limit),
        ("8 known, 9,992 unknown", known_then_unknown, limit),
    ];
    for (case, ids, names) in &cases {
        let refused = client
            .allocate(allocate_request(&[&[uuid(3)], ids]))
            .await
            .expect_err(case);
        assert_eq!(
            refused.code(),
            Code::InvalidArgument,
            "case {case}: {refused:?}"
        );
        assert!(
            refused.message().contains(names),
            "case {case}: {:?} does not name {names}",
            refused.message()
        );
        assert!(
            refused.message().len() < 1024,
            "case {case}: a message of {} bytes",
            refused.message().len()
        );
        run.alive(case);
    }
    // A bad GetPreferredAllocation is refused too.
    let refused = client
        .get_preferred_allocation(PreferredAllocationRequest {
            container_requests: vec![ContainerPreferredAllocationRequest {
                available_device_i_ds: vec!["GPU-nope".into()],
                must_include_device_i_ds: vec![],
                allocation_size: 1,
            }],
        })
        .await
        .expect_err("preferred");
    assert_eq!(refused.code(), Code::InvalidArgument, "case preferred");

    run.alive("after the bad requests");
    let answer = client
        .allocate(allocate_request(&[&[uuid(5), uuid(4)]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0].envs.get(VISIBLE),
        Some(&format!("{},{}", uuid(4), uuid(5))),
        "case valid after bad"
    );
    assert_eq!(
        run.kubelet.registrations().len(),
        1,
        "bad input restarts nothing"
    );
}

// 8. Init errors.

#[tokio::test]
async fn init_errors_exit_with_a_message_unless_fail_on_init_error_is_false() {
    let node = node(&NodeSpec::standard(8));
    let empty = crate::common::node(&NodeSpec::standard(0));
    let broken = "/nonexistent/libnvidia-ml.so.1";
    let cases: [(&str, &SimNode, Launch, &str); 3] = [
        (
            "broken NVML path",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                ..Launch::default()
            },
            "cannot load NVML",
        ),
        ("no GPUs", &empty.sim, Launch::default(), "no GPUs found"),
        (
            "FAIL_ON_INIT_ERROR=true in the env",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                env: &[("FAIL_ON_INIT_ERROR", "true")],
                ..Launch::default()
            },
            "cannot load NVML",
        ),
    ];
    for (case, sim, how, why) in cases {
        let mut run = launch(sim, how).await;
        let status = run.plugin.exit(GENEROUS).await;
        let log = run.plugin.log();
        assert!(
            status.is_some_and(|s| !s.success()),
            "case {case}: {status:?}\n{log}"
        );
        assert!(
            log.contains(&format!("nvidia-device-plugin: error: {why}"))
                && log.contains("--fail-on-init-error=false"),
            "case {case}: {log}"
        );
        assert!(run.kubelet.registrations().is_empty(), "case {case}");
    }

    let cases: [(&str, &SimNode, Launch, &str); 3] = [
        (
            "--fail-on-init-error=false, broken NVML path",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                args: &["--fail-on-init-error=false"],
                ..Launch::default()
            },
            "cannot load NVML",
        ),
        (
            "FAIL_ON_INIT_ERROR=false, broken NVML path",
            &node.sim,
            Launch {
                nvml_lib: Some(broken),
                env: &[("FAIL_ON_INIT_ERROR", "false")],
                ..Launch::default()
            },
            "cannot load NVML",
        ),
        (
            "--fail-on-init-error=false, no GPUs",
            &empty.sim,
            Launch {
                args: &["--fail-on-init-error=false"],
                ..Launch::default()
            },
            "no GPUs found",
        ),
    ];
    for (case, sim, how, why) in cases {
        let mut run = launch(sim, how).await;
        assert!(
            run.plugin.wait_log("serving no devices", GENEROUS).await,
            "case {case}: says why\n{}",
            run.plugin.log()
        );
        assert!(
            run.plugin.log().contains(why),
            "case {case}: {}",
            run.plugin.log()
        );
        // Stays up: no crash loop.
        tokio::time::sleep(QUIET).await;
        run.alive(case);
        assert!(run.kubelet.registrations().is_empty(), "case {case}");
        let served: Vec<String> = fs::read_dir(run.sockets())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "kubelet.sock")
            .collect();
        assert!(served.is_empty(), "case {case}: serves {served:?}");
    }
}

// 9. Signals.

#[tokio::test]
async fn sigterm_and_sigint_exit_0_and_remove_the_socket() {
    let node = node(&NodeSpec::standard(8));
    for (case, signal) in [("SIGTERM", Signal::SIGTERM), ("SIGINT", Signal::SIGINT)] {
        let mut run = launch(&node.sim, Launch::default()).await;
        run.registrations(1, GENEROUS, case).await;
        let (mut stream, _) = run.watch(GPU_SOCKET, case).await;
        assert!(run.socket(GPU_SOCKET).exists(), "case {case}");
        run.plugin.signal(signal);
        let status = run.plugin.exit(GENEROUS).await;
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "case {case}: {status:?}\n{}",
            run.plugin.log()
        );
        assert!(
            !run.socket(GPU_SOCKET).exists(),
            "case {case}: socket left behind"
        );
        assert!(
            run.kubelet.socket().exists(),
            "case {case}: kubelet's socket is not ours"
        );
        // The open stream ended rather than hanging.
        let ended = tokio::time::timeout(GENEROUS, stream.message()).await;
        assert!(
            matches!(ended, Ok(Ok(None) | Err(_))),
            "case {case}: {ended:?}"
        );
    }
}

#[tokio::test]
async fn sighup_rereads_the_config_file_and_streams_the_new_devices() {
    let node = node(&NodeSpec::standard(8));
    let case = "replicas 2 → 4";
    let run = launch(
        &node.sim,
        Launch {
            config: Some(&time_slicing(2, "")),
            ..Launch::default()
        },
    )
    .await;
    run.registrations(1, GENEROUS, case).await;
    let (mut old, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 16, "case {case}: before SIGHUP");

    // Replace the file as config tools do: write aside, then rename over it.
    let aside = run.dir.path().join("config.yaml.new");
    fs::write(&aside, time_slicing(4, "")).unwrap();
    fs::rename(&aside, run.config()).unwrap();
    run.plugin.signal(Signal::SIGHUP);

    let registered = run.registrations(2, GENEROUS, case).await;
    assert_eq!(
        registered[1].request.resource_name, GPU_RESOURCE,
        "case {case}"
    );
    match tokio::time::timeout(GENEROUS, old.message()).await {
        Ok(Err(status)) => assert_eq!(status.code(), Code::Unavailable, "case {case}"),
        Ok(Ok(None)) => {}
        other => panic!("case {case}: the old stream goes on: {other:?}"),
    }
    let (_stream, list) = run.watch(GPU_SOCKET, case).await;
    assert_eq!(list.devices.len(), 32, "case {case}: after SIGHUP");
    let uuid0 = &node.sim.spec.gpus[0].uuid;
    assert_eq!(list.devices[3].id, format!("{uuid0}::3"), "case {case}");
}

// SPDX-License-Identifier: Apache-2.0
//! Serving over time: kubelet restarts, deleted sockets, probes, registration retries,
//! rebuilds and signals.

use super::*;

#[tokio::test]
async fn kubelet_restart_re_registers_and_ends_old_streams() {
    let mut plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    plugin.ready(true).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = client.list_and_watch(Empty {}).await.unwrap().into_inner();
    next(&mut stream).await.unwrap().unwrap();

    plugin.kubelet.restart().await;
    let restarted = Instant::now();
    let registered = plugin.kubelet.wait_registrations(2, WITHIN).await;
    assert!(registered[1].at > restarted);
    assert_eq!(registered[1].request.resource_name, "nvidia.com/gpu");
    // The old stream ends (NVIDIA's plugin ends it with UNAVAILABLE too).
    match next(&mut stream).await {
        Err(status) => assert_eq!(status.code(), Code::Unavailable, "{status:?}"),
        Ok(None) => {}
        Ok(Some(list)) => panic!("old stream still sends: {list:?}"),
    }
    plugin.ready(true).await;
    let mut again = plugin.kubelet.dial("nvidia-gpu.sock").await;
    let mut stream = again.list_and_watch(Empty {}).await.unwrap().into_inner();
    assert_eq!(next(&mut stream).await.unwrap().unwrap().devices.len(), 4);
    plugin.stop().await;
}

#[tokio::test]
async fn deleted_socket_is_served_and_registered_again() {
    let plugin = start(vec![gpus()], None).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    let socket = plugin.socket("nvidia-gpu.sock");
    std::fs::remove_file(&socket).unwrap();
    let registered = plugin.kubelet.wait_registrations(2, WITHIN).await;
    assert_eq!(registered[1].request.endpoint, "nvidia-gpu.sock");
    assert!(socket.exists());
    plugin.ready(true).await;
    let mut client = plugin.kubelet.dial("nvidia-gpu.sock").await;
    client.get_device_plugin_options(Empty {}).await.unwrap();
    plugin.stop().await;
}

#[tokio::test]
async fn stop_removes_our_sockets_only() {
    let plugin = start(vec![gpus(), shared()], None).await;
    plugin.kubelet.wait_registrations(2, WITHIN).await;
    let sockets = [
        plugin.socket("nvidia-gpu.sock"),
        plugin.socket("nvidia-gpu.shared.sock"),
    ];
    assert!(sockets.iter().all(|s| s.exists()));
    let readiness = plugin.control.readiness();
    let (_dir, kubelet) = plugin.stop().await;
    assert!(!*readiness.borrow(), "not ready once stopped");
    for socket in &sockets {
        assert!(!socket.exists(), "{} left behind", socket.display());
    }
    assert!(
        kubelet.socket().exists(),
        "kubelet's socket is not ours to remove"
    );
}

#[tokio::test]
async fn probes_follow_registration_and_kubelet() {
    let addr = free_port();
    let mut plugin = start(vec![gpus()], Some(addr)).await;
    plugin.kubelet.wait_registrations(1, WITHIN).await;
    plugin.ready(true).await;
    assert_eq!(http_status(addr, "/healthz").await, 200);
    assert_eq!(http_status(addr, "/readyz").await, 200);
    assert_eq!(http_status(addr, "/nope").await, 404);

    // Kubelet gone: registration is lost.
    plugin.kubelet.stop().await;
    plugin.ready(false).await;
    assert_eq!(http_status(addr, "/readyz").await, 503);
    assert_eq!(http_status(addr, "/healthz").await, 200);

    // Kubelet back: registered again, ready again.
    plugin.kubelet.restart().await;
    plugin.kubelet.wait_registrations(2, WITHIN).await;
    plugin.ready(true).await;
    assert_eq!(http_status(addr, "/readyz").await, 200);

    // Our socket deleted: re-served and re-registered, ready again.
    std::fs::remove_file(plugin.socket("nvidia-gpu.sock")).unwrap();
    plugin.kubelet.wait_registrations(3, WITHIN).await;
    plugin.ready(true).await;
    assert_eq!(http_status(addr, "/readyz").await, 200);
    plugin.stop().await;
}

#[tokio::test]
async fn registration_is_retried_until_kubelet_accepts() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    kubelet.refuse_next(2);
    let node = node(settings(dir.path(), true, None), vec![gpus()]);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node,
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    // Refused twice: 100 ms, then 200 ms of backoff.
    kubelet.wait_registrations(1, Duration::from_secs(2)).await;
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn kubelet_that_starts_late_is_registered_with_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let node = node(settings(dir.path(), true, None), vec![gpus()]);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node,
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    // Long enough for the backoff to exceed a second.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(!control.is_ready());
    let kubelet = FakeKubelet::start(dir.path());
    kubelet.wait_registrations(1, WITHIN).await;
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn without_a_kubelet_socket_it_serves_unregistered() {
    let dir = tempfile::tempdir().unwrap();
    // A leftover regular file where our socket goes is replaced.
    std::fs::write(dir.path().join("nvidia-gpu.sock"), b"stale").unwrap();
    let node = node(settings(dir.path(), false, None), vec![gpus()]);
    let (control, commands) = control();
    let again = node.clone();
    let served = tokio::spawn(serve(
        node,
        move || Ok::<_, std::convert::Infallible>(again.clone()),
        commands,
    ));
    let mut ready = control.readiness();
    tokio::time::timeout(WITHIN, ready.wait_for(|r| *r))
        .await
        .unwrap()
        .unwrap();
    let mut client = dial_plugin(&dir.path().join("nvidia-gpu.sock")).await;
    let answer = client
        .allocate(allocate_request(&[&[uuid(0)]]))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        answer.container_responses[0]
            .envs
            .get("NVIDIA_VISIBLE_DEVICES"),
        Some(&uuid(0))
    );
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn restart_command_rebuilds_and_a_failed_rebuild_keeps_the_old_node() {
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    let first = node(settings(dir.path(), true, None), vec![gpus()]);
    let second = node(settings(dir.path(), true, None), vec![gpus(), shared()]);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let rebuild = move || match counted.fetch_add(1, Ordering::SeqCst) {
        0 => Ok(second.clone()),
        _ => Err("config file: unknown key \"migStratgy\""),
    };
    let (control, commands) = control();
    let served = tokio::spawn(serve(first, rebuild, commands));
    kubelet.wait_registrations(1, WITHIN).await;

    assert!(control.restart());
    let registered = kubelet.wait_registrations(3, WITHIN).await;
    let mut names: Vec<&str> = registered[1..]
        .iter()
        .map(|r| r.request.resource_name.as_str())
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["nvidia.com/gpu", "nvidia.com/gpu.shared"]);

    // The next rebuild fails: the second node is served and registered again.
    assert!(control.restart());
    let registered = kubelet.wait_registrations(5, WITHIN).await;
    assert_eq!(registered.len(), 5);
    assert_eq!(calls.load(Ordering::SeqCst), 2);
    assert!(dir.path().join("nvidia-gpu.shared.sock").exists());
    assert!(control.stop());
    served.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_missing_socket_directory_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("device-plugins");
    let node = node(settings(&missing, false, None), vec![gpus()]);
    let (_control, commands) = control();
    let err = serve(node, || Err::<Node, _>("not called"), commands)
        .await
        .unwrap_err();
    match err {
        ServerError::Watch { dir, .. } => assert_eq!(dir, missing),
        other => panic!("unexpected error: {other:?}"),
    }
}

#[tokio::test]
async fn sighup_rebuilds_and_sigterm_stops() {
    use nix::sys::signal::{Signal, raise};

    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    let node = node(settings(dir.path(), true, None), vec![gpus()]);
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = calls.clone();
    let again = node.clone();
    let rebuild = move || {
        counted.fetch_add(1, Ordering::SeqCst);
        Ok::<_, std::convert::Infallible>(again.clone())
    };
    let (control, commands) = control();
    // The handlers are in place once this returns, so raising is safe.
    let signals = tokio::spawn(forward_signals(control.clone()).unwrap());
    let served = tokio::spawn(serve(node, rebuild, commands));
    kubelet.wait_registrations(1, WITHIN).await;

    raise(Signal::SIGHUP).unwrap();
    kubelet.wait_registrations(2, WITHIN).await;
    assert_eq!(calls.load(Ordering::SeqCst), 1);

    raise(Signal::SIGTERM).unwrap();
    tokio::time::timeout(Duration::from_secs(3), served)
        .await
        .expect("SIGTERM stops serve")
        .unwrap()
        .unwrap();
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
    signals.abort();
}

#[tokio::test]
async fn a_failed_start_leaves_nothing_bound() {
    let dir = tempfile::tempdir().unwrap();
    // Something that is not a socket and cannot be removed as a file.
    let blocked = dir.path().join("nvidia-gpu.shared.sock");
    std::fs::create_dir(&blocked).unwrap();
    let node = node(settings(dir.path(), false, None), vec![gpus(), shared()]);
    let (_control, commands) = control();
    let err = serve(node, || Err::<Node, _>("not called"), commands)
        .await
        .unwrap_err();
    match err {
        ServerError::Stale { path, .. } => assert_eq!(path, blocked),
        other => panic!("unexpected error: {other:?}"),
    }
    assert!(!dir.path().join("nvidia-gpu.sock").exists());
}

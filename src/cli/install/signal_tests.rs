// SPDX-License-Identifier: Apache-2.0
//! The engine's PID from its socket (as `--restart-mode signal` finds it), the systemd
//! command, and the daemon undoing the install on SIGTERM.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::tests::{Host, parse};
use super::*;

#[test]
fn the_engine_pid_comes_from_its_socket() {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixListener;
    let dir = tempfile::tempdir().unwrap();
    let me = i32::try_from(std::process::id()).unwrap();
    for (case, engine, serve) in [
        ("containerd speaks first", EngineKind::Containerd, 1),
        ("docker answers a request", EngineKind::Docker, 2),
        (
            "closes without a word: SO_PEERCRED",
            EngineKind::Containerd,
            0,
        ),
    ] {
        let path = dir.path().join(format!("{serve}.sock"));
        let listener = UnixListener::bind(&path).unwrap();
        let server = std::thread::spawn(move || {
            let (mut conn, _) = listener.accept().unwrap();
            match serve {
                1 => conn.write_all(b"\0\0\0\x04").unwrap(),
                2 => {
                    let mut buf = [0u8; 64];
                    let n = conn.read(&mut buf).unwrap();
                    assert!(buf[..n].starts_with(b"GET "));
                    conn.write_all(b"HTTP/1.0 200 OK\r\n\r\nOK").unwrap();
                }
                _ => {}
            }
        });
        let pid = restart::engine_pid(engine, &path).unwrap();
        server.join().unwrap();
        assert_eq!(pid, me, "{case}");
    }
    // containerd comes back as another process: found at once; never: an error naming why.
    let path = dir.path().join("back.sock");
    let listener = UnixListener::bind(&path).unwrap();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(b"x").unwrap();
    });
    let back = restart::wait_for_new_pid(
        EngineKind::Containerd,
        &path,
        me + 1,
        std::time::Duration::ZERO,
    );
    server.join().unwrap();
    assert_eq!(back.unwrap(), me);
    let gone = dir.path().join("gone.sock");
    let err =
        restart::wait_for_new_pid(EngineKind::Containerd, &gone, me, std::time::Duration::ZERO)
            .unwrap_err()
            .to_string();
    assert!(err.contains("exits on SIGHUP"), "{err}");
    let err = restart::engine_pid(EngineKind::Docker, &dir.path().join("none.sock")).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotFound);
    assert_eq!(
        restart::systemctl_argv(EngineKind::Containerd, Path::new("/host")),
        ["chroot", "/host", "systemctl", "restart", "containerd"]
    );
    assert_eq!(
        restart::systemctl_argv(EngineKind::Docker, Path::new("/")),
        ["systemctl", "restart", "docker"]
    );
}

#[test]
fn the_daemon_undoes_the_install_on_sigterm() {
    use nix::sys::pthread::{pthread_kill, pthread_self};
    let host = Host::new();
    host.write("/etc/docker/daemon.json", "{}\n");
    let before = host.snapshot();
    let root = host.root.path().display().to_string();
    let source = host.source.path().display().to_string();
    let argv = [
        "nvshim",
        "install",
        "--host-root",
        &root,
        "--source-dir",
        &source,
        "--runtime",
        "docker",
        "--restart-mode",
        "none",
    ]
    .map(str::to_owned);
    let (tx, rx) = std::sync::mpsc::channel();
    let daemon = std::thread::spawn(move || {
        tx.send(pthread_self()).unwrap();
        let (host_args, args) = parse(&argv.each_ref().map(String::as_str));
        let mut out = Vec::new();
        run_install(&host_args, &args, &mut out).map_err(|e| e.to_string())?;
        Ok::<_, String>(String::from_utf8(out).unwrap())
    });
    let thread = rx.recv().unwrap();
    // The pod's own ready file (the readiness probe's) comes after the host's: only once
    // this install is complete.
    let pod_ready = std::path::Path::new(super::args::POD_READY_FILE);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !pod_ready.exists() {
        assert!(std::time::Instant::now() < deadline, "no pod ready file");
        std::thread::yield_now();
    }
    assert!(
        host.path("/run/nvidia/validations/toolkit-ready").exists(),
        "the pod was ready before the host's ready file"
    );
    pthread_kill(thread, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = daemon.join().unwrap().unwrap();
    assert!(out.contains("uninstalled"), "{out}");
    assert_eq!(host.snapshot(), before);
    assert!(
        !pod_ready.exists(),
        "the pod ready file outlived the install"
    );
}

// SPDX-License-Identifier: Apache-2.0
//! `list` over a real Unix socket: grpcio's server (the gRPC C core), nobody listening,
//! a server that never answers.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use super::super::{ContainerDevices, PodResourcesError, Problem, list};
use super::{Pod, encode, two_pods, two_pods_decoded};
use crate::kubelet::pod_resources::Http2Error;

// --- against grpcio's server (the gRPC C core), on a temp socket ---

/// `tests/foreign/pod_resources_kubelet.py` serving on a temp socket: what each call
/// answers is set with [`GrpcioKubelet::answer`] and [`GrpcioKubelet::fail`].
struct GrpcioKubelet {
    dir: tempfile::TempDir,
    child: std::process::Child,
}

impl GrpcioKubelet {
    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("response.bin"), b"").unwrap();
        let script = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/foreign/pod_resources_kubelet.py"
        );
        let mut child = Command::new("python3")
            .arg(script)
            .arg(dir.path().join("kubelet.sock"))
            .arg(dir.path().join("response.bin"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run python3 {script}: {e}"));
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        assert_eq!(
            line.trim(),
            "ready",
            "the grpcio server did not start (is grpcio installed? .ci/run installs it)"
        );
        Self { dir, child }
    }

    fn answer(&self, response: &[u8]) {
        std::fs::write(self.dir.path().join("response.bin"), response).unwrap();
        let _ = std::fs::remove_file(self.dir.path().join("response.bin.fail"));
    }

    fn fail(&self, code: &str, message: &str) {
        std::fs::write(
            self.dir.path().join("response.bin.fail"),
            format!("{code}\n{message}"),
        )
        .unwrap();
    }

    fn list(&self) -> Result<Vec<ContainerDevices>, PodResourcesError> {
        list(
            &self.dir.path().join("kubelet.sock"),
            Duration::from_secs(20),
        )
    }
}

impl Drop for GrpcioKubelet {
    fn drop(&mut self) {
        drop(self.child.stdin.take());
        let _ = self.child.wait();
    }
}

#[test]
fn grpcio_server_small_large_and_failing() {
    let kubelet = GrpcioKubelet::start();
    kubelet.answer(&two_pods());
    assert_eq!(kubelet.list().unwrap(), two_pods_decoded());

    // ~1.5 MiB: far past the default 64 KiB windows, in many DATA frames
    let pods: Vec<(String, Vec<String>)> = (0..3000)
        .map(|i| {
            let gpus = (0..8)
                .map(|g| format!("GPU-{i:05}-{g}-{}", "x".repeat(40)))
                .collect();
            (format!("pod-{i:05}"), gpus)
        })
        .collect();
    let encoded = encode(
        &pods
            .iter()
            .map(|(name, gpus)| Pod {
                name,
                namespace: "bulk",
                containers: vec![("main", vec![("nvidia.com/gpu", gpus.clone())])],
            })
            .collect::<Vec<_>>(),
    );
    assert!(encoded.len() > 1024 * 1024, "{} bytes", encoded.len());
    kubelet.answer(&encoded);
    let got = kubelet.list().unwrap();
    assert_eq!(got.len(), 3000);
    assert_eq!(got[2999].pod, "pod-02999");
    assert_eq!(got[2999].device_ids, pods[2999].1);

    kubelet.fail("PERMISSION_DENIED", "not allowed: ✓");
    let error = kubelet.list().unwrap_err();
    match &error.problem {
        Problem::Http2(Http2Error::Grpc {
            code: 7,
            name: "PERMISSION_DENIED",
            message,
        }) => {
            assert_eq!(message, "not allowed: ✓");
        }
        other => panic!("unexpected {other:?}"),
    }
    let text = error.to_string();
    assert!(
        text.contains("kubelet.sock") && text.contains("PERMISSION_DENIED"),
        "{text}"
    );
}

#[test]
fn no_server_is_a_connect_error_naming_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("absent.sock");
    let error = list(&socket, Duration::from_secs(1)).unwrap_err();
    assert!(matches!(error.problem, Problem::Connect(_)), "{error:?}");
    assert!(error.to_string().contains("absent.sock"), "{error}");
}

#[test]
fn a_silent_server_hits_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("silent.sock");
    let _listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let error = list(&socket, Duration::from_millis(100)).unwrap_err();
    assert!(matches!(error.problem, Problem::Deadline(_)), "{error:?}");
}

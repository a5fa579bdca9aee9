// SPDX-License-Identifier: Apache-2.0
//! `nvshim labels --use-node-feature-api` against an API server the test starts: Python's
//! `http.server` behind `ssl`, with a CA and server certificate `openssl` makes here
//! (`fake_apiserver.py` keeps the objects and records each request). The object's
//! shape is checked against NFD's CRD schema (`tests/fixtures/nfd`).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};

use crate::labels::{Setup, parse, wait_for};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvshim_testkit::NodeSpec;
use nvshim_testkit::harness::nfd_schema;
use serde_json::{Value, json};

const TOKEN: &str = "test-token";
const NODE: &str = "gpu-node-1";
const OBJECT: &str = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-operator/nodefeatures/nvidia-features-for-gpu-node-1";
const COLLECTION: &str = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/gpu-operator/nodefeatures";

/// The fake API server, killed when dropped.
struct ApiServer {
    child: Child,
    port: u16,
    record: PathBuf,
    service_account: PathBuf,
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .current_dir(dir)
        .args(args)
        .output()
        .expect("openssl (install it: the NodeFeature test makes its certificates with it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

impl ApiServer {
    /// A CA, a server certificate for 127.0.0.1 signed by it, the service account
    /// directory (token, the CA, namespace `gpu-operator`) and the server.
    fn start(dir: &Path) -> ApiServer {
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ];
        let mut ca = vec!["req", "-x509", "-keyout", "ca.key", "-out", "ca.crt"];
        ca.extend(ec);
        ca.extend(["-subj", "/CN=test-ca", "-days", "1"]);
        openssl(dir, &ca);
        let mut csr = vec!["req", "-keyout", "srv.key", "-out", "srv.csr"];
        csr.extend(ec);
        csr.extend(["-subj", "/CN=kube-apiserver"]);
        openssl(dir, &csr);
        fs::write(
            dir.join("ext.cnf"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                "srv.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "srv.crt",
                "-days",
                "1",
                "-extfile",
                "ext.cnf",
            ],
        );
        let service_account = dir.join("serviceaccount");
        fs::create_dir_all(&service_account).unwrap();
        fs::copy(dir.join("ca.crt"), service_account.join("ca.crt")).unwrap();
        fs::write(service_account.join("token"), format!("{TOKEN}\n")).unwrap();
        fs::write(service_account.join("namespace"), "gpu-operator").unwrap();

        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/cli/fake_apiserver.py");
        let port_file = dir.join("port");
        let record = dir.join("requests.jsonl");
        let child = Command::new("python3")
            .arg(script)
            .args([dir.join("srv.crt"), dir.join("srv.key"), port_file.clone()])
            .arg(&record)
            .arg(TOKEN)
            .stdout(Stdio::null())
            .spawn()
            .expect("python3 (the fake API server)");
        let mut server = ApiServer {
            child,
            port: 0,
            record,
            service_account,
        };
        wait_for("the API server's port", || port_file.exists());
        server.port = fs::read_to_string(&port_file).unwrap().parse().unwrap();
        server
    }

    /// The requests so far, and forgets them.
    fn take(&self) -> Vec<Value> {
        let text = fs::read_to_string(&self.record).unwrap_or_default();
        let _ = fs::remove_file(&self.record);
        text.lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("KUBERNETES_SERVICE_HOST", "127.0.0.1".to_string()),
            ("KUBERNETES_SERVICE_PORT", self.port.to_string()),
            (
                "NVSHIM_SERVICE_ACCOUNT_DIR",
                self.service_account.display().to_string(),
            ),
            ("NODE_NAME", NODE.to_string()),
        ]
    }
}

fn labels_cmd(setup: &Setup, api: &ApiServer, args: &[&str]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvshim"));
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(["labels", "--use-node-feature-api", "--no-timestamp"])
        .args(["--machine-type-file", &setup.machine_file()])
        .args(args)
        .args(setup.node.sim.root_args())
        .envs(setup.node.sim.env())
        .envs(api.env());
    cmd
}

fn run(setup: &Setup, api: &ApiServer, args: &[&str]) -> Output {
    labels_cmd(setup, api, args).output().unwrap()
}

fn methods(requests: &[Value]) -> Vec<(String, String)> {
    requests
        .iter()
        .map(|r| {
            let s = |k: &str| r[k].as_str().unwrap_or_default().to_string();
            (s("method"), s("path"))
        })
        .collect()
}

fn pair(method: &str, path: &str) -> (String, String) {
    (method.to_string(), path.to_string())
}

#[test]
fn node_feature_objects_are_created_updated_and_removed() {
    let setup = Setup::new(&NodeSpec::with_mig(2));
    let api = ApiServer::start(setup.dir.path());
    let want = parse(&setup.labels(&["--output", "-", "--no-timestamp"]));

    // No object yet: GET finds none, POST creates GFD's object.
    let out = run(&setup, &api, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.stdout.is_empty(), "nothing on stdout");
    let requests = api.take();
    assert_eq!(
        methods(&requests),
        [pair("GET", OBJECT), pair("POST", COLLECTION)],
        "create"
    );
    for request in &requests {
        assert_eq!(request["authorization"], format!("Bearer {TOKEN}"));
    }
    let created = &requests[1]["body"];
    assert_eq!(requests[1]["content_type"], "application/json");
    assert_eq!(created["apiVersion"], "nfd.k8s-sigs.io/v1alpha1");
    assert_eq!(created["kind"], "NodeFeature");
    assert_eq!(
        created["metadata"],
        json!({
            "name": "nvidia-features-for-gpu-node-1",
            "labels": { "nfd.node.kubernetes.io/node-name": NODE },
        })
    );
    assert_eq!(
        created["spec"]["features"],
        json!({ "flags": {}, "attributes": {}, "instances": {} })
    );
    assert_eq!(created["spec"]["labels"], json!(want), "the file's labels");
    let errors = nfd_schema::errors(created);
    assert!(errors.is_empty(), "not a valid NodeFeature: {errors:#?}");

    // Other labels: the stored object is replaced (same resourceVersion, metadata kept).
    let out = run(&setup, &api, &["--mig-strategy", "mixed"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let requests = api.take();
    assert_eq!(
        methods(&requests),
        [pair("GET", OBJECT), pair("PUT", OBJECT)],
        "update"
    );
    let updated = &requests[1]["body"];
    assert_eq!(updated["metadata"]["resourceVersion"], "1");
    assert_eq!(
        updated["metadata"]["annotations"],
        json!({ "kept": "by updates" })
    );
    assert_eq!(
        updated["spec"]["labels"]["nvidia.com/mig.strategy"],
        "mixed"
    );
    assert!(nfd_schema::errors(updated).is_empty());

    // The same labels again: nothing to write.
    let out = run(&setup, &api, &["--mig-strategy", "mixed"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(methods(&api.take()), [pair("GET", OBJECT)], "unchanged");

    // The loop removes the object on SIGTERM, as it removes the file.
    let mut child = labels_cmd(&setup, &api, &["--sleep-interval", "1s"])
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    wait_for("the loop's first round", || {
        fs::read_to_string(&api.record).is_ok_and(|t| t.contains("\"GET\""))
    });
    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let mut status = None;
    wait_for("exit after SIGTERM", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{status:?}");
    let requests = methods(&api.take());
    assert_eq!(
        requests.last(),
        Some(&pair("DELETE", OBJECT)),
        "{requests:?}"
    );
}

#[test]
fn node_feature_failures_name_what_is_wrong() {
    let setup = Setup::new(&NodeSpec::standard(1));
    let api = ApiServer::start(setup.dir.path());

    // A wrong token: the API server's 401, with the object's name.
    fs::write(api.service_account.join("token"), "wrong\n").unwrap();
    let out = run(&setup, &api, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("nvidia-features-for-gpu-node-1") && err.contains("401"),
        "{err}"
    );
    fs::write(api.service_account.join("token"), TOKEN).unwrap();

    // A CA that did not sign the server's certificate: TLS refuses.
    fs::copy(
        api.service_account.join("ca.crt"),
        setup.dir.path().join("good-ca.crt"),
    )
    .unwrap();
    fs::copy(
        setup.dir.path().join("srv.crt"),
        api.service_account.join("ca.crt"),
    )
    .unwrap();
    let out = run(&setup, &api, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("TLS") || err.contains("certificate"), "{err}");
    fs::copy(
        setup.dir.path().join("good-ca.crt"),
        api.service_account.join("ca.crt"),
    )
    .unwrap();

    // No node name; a kubeconfig (not supported); not in a pod.
    let cases: [(&str, &[&str], &[&str], &str); 3] = [
        (
            "no node name",
            &["--node-name="],
            &["NODE_NAME"],
            "--node-name",
        ),
        (
            "kubeconfig",
            &["--kubeconfig", "/k"],
            &[],
            "--kubeconfig /k",
        ),
        (
            "not in a pod",
            &[],
            &["KUBERNETES_SERVICE_HOST"],
            "KUBERNETES_SERVICE_HOST",
        ),
    ];
    for (case, args, unset, needle) in cases {
        let mut cmd = labels_cmd(&setup, &api, args);
        for name in unset {
            cmd.env_remove(name);
        }
        let out = cmd.output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "case {case}: {err}");
        assert!(err.contains(needle), "case {case}: {err}");
    }
    assert!(
        api.take()
            .iter()
            .all(|r| r["authorization"] != "Bearer wrong" || r["method"] == "GET"),
        "a refused token goes no further than the GET"
    );
}

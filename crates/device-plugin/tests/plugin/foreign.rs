// SPDX-License-Identifier: Apache-2.0
//! The `nvidia-device-plugin` binary against gRPC clients we did not write, each
//! sending the HTTP/2 `:authority` its own way (issue 18):
//!
//! - Python's `grpcio` (gRPC C core, from PyPI) with default options plays kubelet
//!   (`tests/foreign/kubelet_grpcio.py`): it sends the socket path, percent-encoded;
//! - Debian's grpc-go 1.33, what kubelets before 1.26 linked, dialling the socket path
//!   as kubelet 1.20 does (`tests/foreign/grpcgo`): it sends the raw path;
//! - python-hyper's `h2`/`hpack` (`tests/foreign/h2_raw.py`): raw HTTP/2 requests with
//!   every authority we know of (path, percent-encoded, empty, `[::]:port`, none) and
//!   framing (Huffman or not, never-indexed, padding, priority, CONTINUATION, an empty
//!   authority added to the HPACK table, evictions in a small table).
//!
//! Each plays Register → ListAndWatch → GetPreferredAllocation → Allocate in every
//! device-list strategy. `.ci/run` installs the clients (`pip`, `apt`); a missing one
//! fails the test with its name.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::common::plugin_proc::{PluginProc, node_args};
use nvshim_device_plugin::api::{AllocateResponse, DevicePluginOptions};
use nvshim_testkit::{NodeSpec, SimNode};
use prost::Message;
use serde_json::Value;

const STRATEGIES: [&str; 4] = ["envvar", "volume-mounts", "cdi-annotations", "cdi-cri"];
const GENEROUS: Duration = Duration::from_secs(60);
const FOREIGN: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/foreign");

fn plugin_bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin"))
}

/// Fails with the missing prerequisite's name (installed by `.ci/run`).
fn require_python_modules() {
    let out = Command::new("python3")
        .args(["-c", "import grpc, grpc_tools, h2, hpack, hyperframe"])
        .output()
        .expect("python3 (installed by .ci/run)");
    assert!(
        out.status.success(),
        "Python modules grpcio, grpcio-tools and h2 are needed (`.ci/run` installs them with pip):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The Python interpreter itself (not a version manager's shim, which needs more of
/// the environment than the clients get).
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| {
        require_python_modules();
        let out = Command::new("python3")
            .args(["-c", "import sys; print(sys.executable)"])
            .output()
            .unwrap();
        PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
    })
}

/// Python stubs of our kubelet API, made by grpcio-tools' protoc, once per run.
fn python_stubs() -> &'static Path {
    static STUBS: OnceLock<PathBuf> = OnceLock::new();
    STUBS.get_or_init(|| {
        require_python_modules();
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("foreign-python-stubs");
        fs::create_dir_all(&dir).unwrap();
        let proto = concat!(env!("CARGO_MANIFEST_DIR"), "/proto/deviceplugin/v1beta1");
        let out = Command::new("python3")
            .args(["-m", "grpc_tools.protoc", "-I", proto])
            .arg(format!("--python_out={}", dir.display()))
            .arg(format!("--grpc_python_out={}", dir.display()))
            .arg("api.proto")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "protoc: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        dir
    })
}

/// `go build -o out` of the program in `source` with Debian's Go and Debian's Go sources
/// (GOPATH mode, no network), panicking with go's errors.
pub(crate) fn go_build(source: &Path, out: &Path) {
    let gopath = Path::new("/usr/share/gocode");
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let built = Command::new("go")
        .args(["build", "-o"])
        .arg(out)
        .arg(".")
        .current_dir(source)
        .env("GOPATH", gopath)
        .env("GO111MODULE", "off")
        .env("GOFLAGS", "")
        // Go's content-addressed build cache: `.ci/run` keeps one between CI runs
        // (NVSHIM_GOCACHE), so the Go libraries are compiled once per machine, not per clone.
        .env(
            "GOCACHE",
            std::env::var_os("NVSHIM_GOCACHE")
                .filter(|dir| !dir.is_empty())
                .map_or_else(|| tmp.join("foreign-gocache"), PathBuf::from),
        )
        .output()
        .expect("go (Debian's golang-go, installed by `.ci/run`)");
    assert!(
        built.status.success(),
        "go build {}: {}",
        source.display(),
        String::from_utf8_lossy(&built.stderr)
    );
}

/// The grpc-go client, built with Debian's Go and grpc-go sources (GOPATH mode, no
/// network), once per run.
fn grpc_go_client() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let gopath = Path::new("/usr/share/gocode");
        assert!(
            gopath.join("src/google.golang.org/grpc").is_dir(),
            "Debian's golang-google-grpc-dev is needed (`.ci/run` installs it)"
        );
        let bin = Path::new(env!("CARGO_TARGET_TMPDIR")).join("foreign-grpcgo");
        go_build(&Path::new(FOREIGN).join("grpcgo"), &bin);
        bin
    })
}

#[derive(Clone, Copy, Debug)]
enum Client {
    Grpcio,
    GrpcGo,
}

impl Client {
    fn start(self, sockets: &Path) -> PluginProc {
        let env = [(
            "PATH".to_string(),
            std::env::var("PATH").unwrap_or_default(),
        )];
        match self {
            Client::Grpcio => {
                let script = Path::new(FOREIGN).join("kubelet_grpcio.py");
                let args = [script, python_stubs().to_path_buf(), sockets.to_path_buf()];
                let args: Vec<String> = args.iter().map(|p| p.display().to_string()).collect();
                PluginProc::spawn(python(), &args, &env)
            }
            Client::GrpcGo => {
                let args = [sockets.display().to_string()];
                PluginProc::spawn(grpc_go_client(), &args, &env)
            }
        }
    }
}

/// What a container's `Allocate` answer holds, whichever client decoded it.
#[derive(Debug, Default, PartialEq)]
struct Answer {
    envs: BTreeMap<String, String>,
    mounts: Vec<(String, String, bool)>,
    annotations: BTreeMap<String, String>,
    cdi: Vec<String>,
}

/// One client's report of a kubelet round with the plugin.
#[derive(Debug)]
struct Round {
    register: Value,
    preferred_available: bool,
    devices: Vec<String>,
    preferred: Vec<String>,
    answer: Answer,
    refused: BTreeMap<String, String>,
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

fn string_map(v: &Value) -> BTreeMap<String, String> {
    v.as_object()
        .map(|m| {
            m.iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect()
        })
        .unwrap_or_default()
}

fn base64(text: &str) -> Vec<u8> {
    let value = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        _ => 63,
    };
    let digits: Vec<u8> = text.bytes().filter(|&c| c != b'=').map(value).collect();
    digits
        .chunks(4)
        .flat_map(|c| {
            let n = c.iter().fold(0u32, |n, &d| n << 6 | u32::from(d)) << (6 * (4 - c.len()));
            let bytes = n.to_be_bytes();
            bytes[1..c.len()].to_vec()
        })
        .collect()
}

impl Round {
    fn parse(client: Client, report: &Value) -> Self {
        let (preferred_available, answer, refused) = match client {
            Client::Grpcio => {
                let a = &report["allocate"];
                let answer = Answer {
                    envs: string_map(&a["envs"]),
                    mounts: a["mounts"]
                        .as_array()
                        .map(|m| {
                            m.iter()
                                .map(|m| {
                                    (
                                        m["container_path"].as_str().unwrap().to_string(),
                                        m["host_path"].as_str().unwrap().to_string(),
                                        m["read_only"].as_bool().unwrap_or(false),
                                    )
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    annotations: string_map(&a["annotations"]),
                    cdi: a["cdi_devices"]
                        .as_array()
                        .map(|d| {
                            d.iter()
                                .map(|d| d["name"].as_str().unwrap().to_string())
                                .collect()
                        })
                        .unwrap_or_default(),
                };
                let refused = report["refused"]
                    .as_object()
                    .unwrap()
                    .iter()
                    .map(|(k, v)| {
                        let text = format!(
                            "{}: {}",
                            v["code"].as_str().unwrap(),
                            v["details"].as_str().unwrap_or("")
                        );
                        (k.clone(), text)
                    })
                    .collect();
                let options = &report["options"]["get_preferred_allocation_available"];
                (options.as_bool().unwrap_or(false), answer, refused)
            }
            Client::GrpcGo => {
                let options =
                    DevicePluginOptions::decode(&base64(report["options"].as_str().unwrap())[..])
                        .unwrap();
                let bytes = base64(report["allocate"].as_str().unwrap());
                let response = AllocateResponse::decode(&bytes[..]).unwrap();
                let one = &response.container_responses[0];
                let answer = Answer {
                    envs: one.envs.clone().into_iter().collect(),
                    mounts: one
                        .mounts
                        .iter()
                        .map(|m| (m.container_path.clone(), m.host_path.clone(), m.read_only))
                        .collect(),
                    annotations: one.annotations.clone().into_iter().collect(),
                    cdi: one.cdi_devices.iter().map(|d| d.name.clone()).collect(),
                };
                (
                    options.get_preferred_allocation_available,
                    answer,
                    string_map(&report["refused"]),
                )
            }
        };
        Round {
            register: report["register"].clone(),
            preferred_available,
            devices: strings(&report["devices"]),
            preferred: strings(&report["preferred"]),
            answer,
            refused,
        }
    }
}

/// Starts `client` as kubelet, then the plugin with `strategy` on a 4-GPU node, and
/// returns the client's report.
async fn kubelet_round(sim: &SimNode, client: Client, strategy: &str) -> Round {
    let dir = tempfile::tempdir().unwrap();
    let sockets = dir.path().join("plugins");
    fs::create_dir(&sockets).unwrap();
    let mut kubelet = client.start(&sockets);
    let deadline = tokio::time::Instant::now() + GENEROUS;
    while !sockets.join("kubelet.sock").exists() {
        assert!(
            tokio::time::Instant::now() < deadline && kubelet.exited().is_none(),
            "{client:?} did not start serving kubelet.sock:\n{}",
            kubelet.log()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut args = node_args(sim, &sockets);
    args.extend(["--device-list-strategy".to_string(), strategy.to_string()]);
    let plugin = PluginProc::spawn(plugin_bin(), &args, &sim.env());
    let status = kubelet.exit(GENEROUS).await;
    let case = format!("{client:?} / {strategy}");
    assert!(
        status.is_some_and(|s| s.success()),
        "case {case}: client ended {status:?}:\n{}\nplugin log:\n{}",
        kubelet.log(),
        plugin.log()
    );
    let report: Value = serde_json::from_str(kubelet.stdout().trim())
        .unwrap_or_else(|e| panic!("case {case}: {e}: {:?}", kubelet.stdout()));
    Round::parse(client, &report)
}

fn check_round(round: &Round, sim: &SimNode, client: Client, strategy: &str) {
    let case = format!("{client:?} / {strategy}");
    assert_eq!(round.register["version"], "v1beta1", "case {case}");
    assert_eq!(
        round.register["resource_name"], "nvidia.com/gpu",
        "case {case}"
    );
    assert_eq!(round.register["endpoint"], "nvidia-gpu.sock", "case {case}");
    assert!(round.preferred_available, "case {case}: options");
    let uuids: Vec<String> = sim.spec.gpus.iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(round.devices, uuids, "case {case}: ListAndWatch");
    assert_eq!(
        round.preferred.len(),
        2,
        "case {case}: GetPreferredAllocation"
    );
    assert!(
        round.preferred.iter().all(|id| uuids.contains(id)),
        "case {case}"
    );
    let ids = &round.preferred;
    let answer = &round.answer;
    match strategy {
        "envvar" => {
            assert_eq!(
                answer.envs.get("NVIDIA_VISIBLE_DEVICES"),
                Some(&ids.join(",")),
                "case {case}"
            );
        }
        "volume-mounts" => {
            let root = "/var/run/nvidia-container-devices";
            assert_eq!(
                answer
                    .envs
                    .get("NVIDIA_VISIBLE_DEVICES")
                    .map(String::as_str),
                Some(root),
                "case {case}"
            );
            let want: Vec<_> = ids
                .iter()
                .map(|id| (format!("{root}/{id}"), "/dev/null".to_string(), false))
                .collect();
            assert_eq!(answer.mounts, want, "case {case}");
        }
        "cdi-annotations" => {
            assert_eq!(answer.annotations.len(), 1, "case {case}: {answer:?}");
            let (key, value) = answer.annotations.iter().next().unwrap();
            assert!(
                key.starts_with("cdi.k8s.io/nvidia-device-plugin_"),
                "case {case}: {key}"
            );
            let want: Vec<String> = ids
                .iter()
                .map(|id| format!("k8s.device-plugin.nvidia.com/gpu={id}"))
                .collect();
            assert_eq!(value, &want.join(","), "case {case}");
        }
        "cdi-cri" => {
            let want: Vec<String> = ids
                .iter()
                .map(|id| format!("k8s.device-plugin.nvidia.com/gpu={id}"))
                .collect();
            assert_eq!(answer.cdi, want, "case {case}");
        }
        other => panic!("unknown strategy {other}"),
    }
    for (name, text) in &round.refused {
        let code = text.split(':').next().unwrap_or_default();
        assert!(
            code == "INVALID_ARGUMENT" || code == "InvalidArgument",
            "case {case}: {name} refused as {text}"
        );
    }
    assert!(
        round.refused["unknown"].contains("GPU-nope"),
        "case {case}: {:?}",
        round.refused
    );
}

#[tokio::test(flavor = "current_thread")]
async fn grpcio_plays_kubelet_in_every_strategy() {
    let node = crate::common::node(&NodeSpec::standard(4));
    for strategy in STRATEGIES {
        let round = kubelet_round(&node.sim, Client::Grpcio, strategy).await;
        check_round(&round, &node.sim, Client::Grpcio, strategy);
        assert!(
            round.refused["empty"].contains("INVALID_ARGUMENT"),
            "{:?}",
            round.refused
        );
    }
}

#[tokio::test(flavor = "current_thread")]
async fn grpc_go_1_33_plays_kubelet_1_20_in_every_strategy() {
    let node = crate::common::node(&NodeSpec::standard(4));
    for strategy in STRATEGIES {
        let round = kubelet_round(&node.sim, Client::GrpcGo, strategy).await;
        check_round(&round, &node.sim, Client::GrpcGo, strategy);
    }
}

/// Every raw HTTP/2 case gets a gRPC answer (status 0) on every call of its
/// connection: no `RST_STREAM`, no `GOAWAY`.
#[tokio::test(flavor = "current_thread")]
async fn raw_http2_requests_with_every_authority_are_answered() {
    require_python_modules();
    let node = crate::common::node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let mut args = node_args(&node.sim, dir.path());
    args[1] = String::new(); // --kubelet-socket "": serve without registering
    let plugin = PluginProc::spawn(plugin_bin(), &args, &node.sim.env());
    let socket = dir.path().join("nvidia-gpu.sock");
    // "serving" is logged once the socket listens (the file exists from bind, earlier).
    assert!(
        plugin.wait_log("serving resource=", GENEROUS).await,
        "no socket:\n{}",
        plugin.log()
    );
    let out = Command::new(python())
        .arg(Path::new(FOREIGN).join("h2_raw.py"))
        .arg(&socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "h2_raw.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(lines.len() >= 15, "{lines:?}");
    for line in &lines {
        let case = line["case"].as_str().unwrap();
        let statuses = line["statuses"].as_array().unwrap();
        assert!(
            line["error"].is_null(),
            "case {case}: {line}\nplugin log:\n{}",
            plugin.log()
        );
        assert!(!statuses.is_empty(), "case {case}");
        assert!(statuses.iter().all(|s| s == 0), "case {case}: {line}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! `nvshim labels` against simulated nodes through the real binary and the mock NVML: a
//! mixed node (2× A100-80GB + 2× T4), a MIG node, the device plugin's config file, the
//! atomic feature file and the `--interval` loop.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use crate::common::{Node, node, nvshim, ok};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use nvshim::cli::labels::{is_valid_label_key, is_valid_label_value};
use nvshim_testkit::NodeSpec;

const GIB: u64 = 1 << 30;
/// How long the loop test waits for the labeller to act before failing (not a timing
/// assertion: the labeller relabels every second).
const PATIENCE: Duration = Duration::from_secs(20);

/// 2× "NVIDIA A100-SXM4-80GB" (80 GiB, 8.0) then 2× "Tesla T4" (15 GiB, 7.5), in PCI order.
fn mixed_spec() -> NodeSpec {
    let mut spec = NodeSpec::standard(4);
    for gpu in &mut spec.gpus[2..] {
        gpu.name = "Tesla T4".to_string();
        gpu.memory_bytes = 15 * GIB;
        gpu.compute_capability = (7, 5);
    }
    spec
}

pub(crate) struct Setup {
    pub(crate) node: Node,
    pub(crate) dir: tempfile::TempDir,
}

impl Setup {
    pub(crate) fn new(spec: &NodeSpec) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("product_name"), "DGX A100 \n").unwrap();
        Setup {
            node: node(spec),
            dir,
        }
    }

    pub(crate) fn machine_file(&self) -> String {
        self.dir.path().join("product_name").display().to_string()
    }

    pub(crate) fn out_dir(&self) -> PathBuf {
        self.dir.path().join("features.d")
    }

    pub(crate) fn out_file(&self) -> PathBuf {
        self.out_dir().join("nvshim")
    }

    /// `nvshim labels <args> --machine-type-file …`, asserting success; returns stdout.
    pub(crate) fn labels(&self, args: &[&str]) -> String {
        let machine = self.machine_file();
        let mut all = vec!["labels", "--machine-type-file", &machine];
        all.extend_from_slice(args);
        ok(nvshim(&self.node, &all), &format!("nvshim {all:?}"))
    }

    /// The `--interval` loop as a child process writing to [`Setup::out_file`].
    fn spawn_loop(&self) -> Child {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvshim"));
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .args(["labels", "--interval", "1s", "--machine-type-file"])
            .arg(self.machine_file())
            .arg("--output")
            .arg(self.out_file())
            .args(self.node.sim.root_args())
            .stdout(Stdio::null())
            .stderr(Stdio::inherit());
        for (k, v) in self.node.sim.env() {
            cmd.env(k, v);
        }
        cmd.spawn().unwrap()
    }
}

/// Parses `key=value` lines, checking each against Kubernetes' rules and the file's
/// sorted order.
pub(crate) fn parse(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut previous = String::new();
    for line in text.lines() {
        let (key, value) = line.split_once('=').unwrap_or_else(|| panic!("{line:?}"));
        assert!(is_valid_label_key(key), "invalid key in {line:?}");
        assert!(is_valid_label_value(value), "invalid value in {line:?}");
        assert!(key.starts_with("nvidia.com/"), "{line:?}");
        assert!(
            previous.as_str() < key,
            "{key} after {previous}: not sorted"
        );
        previous = key.to_string();
        labels.insert(key.to_string(), value.to_string());
    }
    labels
}

fn check(case: &str, labels: &BTreeMap<String, String>, want: &[(&str, Option<&str>)]) {
    for (name, value) in want {
        let key = format!("nvidia.com/{name}");
        assert_eq!(
            labels.get(&key).map(String::as_str),
            *value,
            "case {case}: {key} in {labels:#?}"
        );
    }
}

/// Waits until `done` holds, failing after [`PATIENCE`].
pub(crate) fn wait_for(what: &str, mut done: impl FnMut() -> bool) {
    let start = Instant::now();
    while !done() {
        assert!(start.elapsed() < PATIENCE, "timed out waiting for {what}");
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_mixed_node_is_labelled_from_nvml() {
    let setup = Setup::new(&mixed_spec());
    let labels = parse(&setup.labels(&["--output", "-"]));
    check(
        "2x A100 + 2x T4",
        &labels,
        &[
            ("gpu.count", Some("4")),
            // Not one model: the node-wide labels hold for every GPU it may hand out.
            ("gpu.product", Some("mixed")),
            ("gpu.memory", Some("15360")),
            ("gpu.compute.major", Some("7")),
            ("gpu.compute.minor", Some("5")),
            ("gpu.family", Some("turing")),
            ("gpu.product.NVIDIA-A100-SXM4-80GB.count", Some("2")),
            ("gpu.product.NVIDIA-A100-SXM4-80GB.memory", Some("81920")),
            ("gpu.product.NVIDIA-A100-SXM4-80GB.compute.major", Some("8")),
            ("gpu.product.NVIDIA-A100-SXM4-80GB.compute.minor", Some("0")),
            ("gpu.product.NVIDIA-A100-SXM4-80GB.family", Some("ampere")),
            ("gpu.product.Tesla-T4.count", Some("2")),
            ("gpu.product.Tesla-T4.memory", Some("15360")),
            ("gpu.product.Tesla-T4.compute.major", Some("7")),
            ("gpu.product.Tesla-T4.compute.minor", Some("5")),
            ("gpu.product.Tesla-T4.family", Some("turing")),
            ("gpu.replicas", Some("1")),
            ("gpu.sharing-strategy", Some("none")),
            ("gpu.machine", Some("DGX-A100")),
            ("mig.capable", Some("true")),
            ("mig.strategy", None),
            ("mps.capable", Some("false")),
            ("cuda.driver.major", Some("550")),
            ("cuda.driver.minor", Some("54")),
            ("cuda.driver.rev", Some("15")),
            ("cuda.runtime.major", Some("12")),
            ("cuda.runtime.minor", Some("4")),
        ],
    );
}

#[test]
fn a_uniform_node_gets_the_sanitised_product() {
    let setup = Setup::new(&NodeSpec::standard(2));
    let labels = parse(&setup.labels(&["--output", "-"]));
    check(
        "2x A100",
        &labels,
        &[
            ("gpu.count", Some("2")),
            ("gpu.product", Some("NVIDIA-A100-SXM4-80GB")),
            ("gpu.memory", Some("81920")),
            ("gpu.compute.major", Some("8")),
            ("gpu.family", Some("ampere")),
        ],
    );
}

#[test]
fn the_feature_file_is_replaced_atomically_and_only_on_change() {
    let setup = Setup::new(&mixed_spec());
    let stdout = setup.labels(&["--output", "-", "--no-timestamp"]);
    let file = setup.out_file();
    let printed = setup.labels(&["--output", file.to_str().unwrap(), "--no-timestamp"]);
    assert_eq!(printed, "", "nothing on stdout when writing a file");
    assert_eq!(fs::read_to_string(&file).unwrap(), stdout);
    let names: Vec<_> = fs::read_dir(setup.out_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, ["nvshim"], "no temp file left behind");
    let meta = fs::metadata(&file).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o644);

    // Same labels: the file is left alone (same inode).
    setup.labels(&["--output", file.to_str().unwrap(), "--no-timestamp"]);
    assert_eq!(fs::metadata(&file).unwrap().ino(), meta.ino(), "rewritten");

    // Different labels: replaced by a rename (new inode), never truncated in place.
    setup.labels(&[
        "--output",
        file.to_str().unwrap(),
        "--mig-strategy",
        "mixed",
        "--no-timestamp",
    ]);
    let after = fs::metadata(&file).unwrap();
    assert_ne!(after.ino(), meta.ino(), "not replaced");
    assert!(
        fs::read_to_string(&file)
            .unwrap()
            .contains("nvidia.com/mig.strategy=mixed\n")
    );
}

#[test]
fn mixed_mig_strategy_labels_each_profile() {
    let setup = Setup::new(&NodeSpec::with_mig(2));
    let labels = parse(&setup.labels(&["--output", "-", "--mig-strategy", "mixed"]));
    check(
        "with_mig(2), mixed",
        &labels,
        &[
            ("mig.strategy", Some("mixed")),
            ("mig.capable", Some("true")),
            ("gpu.count", Some("1")),
            ("mig-1g.10gb.count", Some("1")),
            ("mig-1g.10gb.memory", Some("10240")),
            (
                "mig-1g.10gb.product",
                Some("NVIDIA-A100-SXM4-80GB-MIG-1g.10gb"),
            ),
            ("mig-2g.20gb.count", Some("1")),
            ("mig-2g.20gb.memory", Some("20480")),
        ],
    );
    let labels = parse(&setup.labels(&["--output", "-", "--mig-strategy", "single"]));
    check(
        "with_mig(2), single: MIG on one GPU only",
        &labels,
        &[
            ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-MIG-INVALID")),
            ("gpu.count", Some("0")),
        ],
    );
}

#[test]
fn the_device_plugin_config_sets_replicas_and_the_flag_wins() {
    let setup = Setup::new(&NodeSpec::with_mig(2));
    let config = setup.dir.path().join("config.yaml");
    fs::write(
        &config,
        "version: v1\nflags:\n  migStrategy: mixed\nsharing:\n  timeSlicing:\n    resources:\n\
         \x20   - name: nvidia.com/gpu\n      replicas: 4\n",
    )
    .unwrap();
    let config = config.to_str().unwrap();
    let labels = parse(&setup.labels(&["--output", "-", "--config", config]));
    check(
        "config: mixed, 4 replicas",
        &labels,
        &[
            ("mig.strategy", Some("mixed")),
            ("gpu.count", Some("1")),
            ("gpu.replicas", Some("4")),
            ("gpu.sharing-strategy", Some("time-slicing")),
            ("gpu.product", Some("NVIDIA-A100-SXM4-80GB-SHARED")),
            ("mig-1g.10gb.replicas", Some("1")),
        ],
    );
    let flag = [
        "--output",
        "-",
        "--config",
        config,
        "--mig-strategy",
        "none",
    ];
    let labels = parse(&setup.labels(&flag));
    check(
        "flag none over file mixed",
        &labels,
        &[
            ("mig.strategy", None),
            ("gpu.count", Some("2")),
            ("mig-1g.10gb.count", None),
        ],
    );

    fs::write(
        setup.dir.path().join("bad.yaml"),
        "flags:\n  migStrategy: mixd\n",
    )
    .unwrap();
    let bad = setup.dir.path().join("bad.yaml");
    let out = nvshim(
        &setup.node,
        &["labels", "--output", "-", "--config", bad.to_str().unwrap()],
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("mixd"), "{err}");
}

#[test]
fn bad_flags_name_the_bad_value() {
    let setup = Setup::new(&NodeSpec::standard(1));
    for (case, args, needle) in [
        ("interval", ["--interval", "5x"], "5x"),
        ("zero interval", ["--interval", "0s"], "0s"),
        ("strategy", ["--mig-strategy", "half"], "half"),
    ] {
        let mut all = vec!["labels", "--output", "-"];
        all.extend_from_slice(&args);
        let out = nvshim(&setup.node, &all);
        assert!(!out.status.success(), "case {case}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "case {case}: {err}");
    }
}

/// `nvshim labels <args>` on the node with `env` added to the node's.
fn labels_with_env(setup: &Setup, args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_nvshim"));
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .arg("labels")
        .args(args)
        .args(setup.node.sim.root_args())
        .envs(env.iter().copied());
    for (k, v) in setup.node.sim.env() {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// gpu-feature-discovery's flags and `GFD_*` variables reach the binary; what nvshim
/// lacks fails by name. (The full tables are `cli::labels::gfd_tests`.)
#[test]
fn gpu_feature_discoverys_flags_and_env_vars() {
    let setup = Setup::new(&mixed_spec());
    let machine = setup.machine_file();
    let want = setup.labels(&["--output", "-", "--mig-strategy", "mixed", "--no-timestamp"]);
    let gfd = [
        "--oneshot",
        "--no-timestamp",
        "--use-node-feature-api=false",
        "--device-discovery-strategy=auto",
        "--fail-on-init-error=true",
        "--node-name=node-1",
        "--namespace=gpu-operator",
        "--machine-type-file",
        &machine,
        "--output-file=",
    ];
    let out = labels_with_env(&setup, &gfd, &[("GFD_MIG_STRATEGY", "mixed")]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout),
        want,
        "GFD's flags, stdout"
    );

    fs::create_dir_all(setup.out_dir()).unwrap();
    let file = setup.out_file();
    let out = labels_with_env(
        &setup,
        &[],
        &[
            ("GFD_ONESHOT", "true"),
            ("GFD_NO_TIMESTAMP", "true"),
            ("GFD_OUTPUT_FILE", file.to_str().unwrap()),
            ("GFD_MACHINE_TYPE_FILE", &machine),
            ("MIG_STRATEGY", "mixed"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        fs::read_to_string(&file).unwrap(),
        want,
        "GFD's env vars, file"
    );

    for (case, args, needle) in [
        (
            "NodeFeature API",
            &["--use-node-feature-api"][..],
            "--node-name",
        ),
        (
            "tegra",
            &["--device-discovery-strategy", "tegra"],
            "not supported by nvshim yet",
        ),
    ] {
        let out = labels_with_env(&setup, args, &[]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "case {case}: {err}");
        assert!(err.contains(needle), "case {case}: {err}");
    }
}

#[test]
fn the_interval_loop_relabels_on_change_and_stops_on_sigterm() {
    let setup = Setup::new(&mixed_spec());
    let file = setup.out_file();
    let mut child = setup.spawn_loop();
    let read = || fs::read_to_string(&file).unwrap_or_default();
    wait_for("the first labels", || read().contains("gpu.count=4\n"));
    let first = parse(&read());
    check(
        "loop, 4 GPUs",
        &first,
        &[("gpu.product.Tesla-T4.count", Some("2"))],
    );

    // A T4 disappears (the mock reports only GPUs whose device node exists).
    let t4 = setup.node.sim.spec.gpus[3].minor;
    fs::remove_file(setup.node.sim.dev_root.join(format!("nvidia{t4}"))).unwrap();
    wait_for("the relabel", || read().contains("gpu.count=3\n"));
    check(
        "loop, 3 GPUs",
        &parse(&read()),
        &[("gpu.product.Tesla-T4.count", Some("1"))],
    );

    kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM).unwrap();
    let mut status = None;
    wait_for("exit after SIGTERM", || {
        status = child.try_wait().unwrap();
        status.is_some()
    });
    assert!(status.unwrap().success(), "{status:?}");
    assert!(!file.exists(), "the feature file is removed on exit");
    assert_no_temp_files(&setup.out_dir());
}

fn assert_no_temp_files(dir: &Path) {
    let left: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

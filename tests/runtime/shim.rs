//! `nvidia-container-runtime` and `nvidia-container-runtime-hook` as processes, on a
//! simulated node, with a stand-in runc that records how it was exec'd. (Runs through
//! real runc, docker and containerd come with the hook-free injection work.)

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::common::{Node, node};
use nvshim_testkit::NodeSpec;
use serde_json::{Value, json};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/config-json");

struct Host {
    node: Node,
    dir: tempfile::TempDir,
}

impl Host {
    fn new(gpus: usize) -> Host {
        let node = node(&NodeSpec::standard(gpus));
        let dir = tempfile::tempdir().unwrap();
        let runc = dir.path().join("fake-runc");
        // Records argv and its own exit, then exits 7 so the test sees exec'd status.
        fs::write(
            &runc,
            "#!/bin/sh\nprintf '%s\\n' \"$@\" > \"$FAKE_RUNC_OUT\"\nexit 7\n",
        )
        .unwrap();
        fs::set_permissions(&runc, fs::Permissions::from_mode(0o755)).unwrap();
        let log = dir.path().join("runtime.log");
        let config = node.sim.runtime_config(runc.to_str().unwrap(), Some(&log));
        fs::write(dir.path().join("config.toml"), config).unwrap();
        Host { node, dir }
    }

    /// A bundle made from a fixture, with `env` replacing the NVIDIA_* variables.
    fn bundle(&self, name: &str, fixture: &str, env: &[&str]) -> PathBuf {
        let bundle = self.dir.path().join(name);
        fs::create_dir_all(&bundle).unwrap();
        let mut spec: Value =
            serde_json::from_slice(&fs::read(Path::new(FIXTURES).join(fixture)).unwrap()).unwrap();
        let list = spec["process"]["env"].as_array_mut().unwrap();
        list.retain(|v| !v.as_str().unwrap_or("").starts_with("NVIDIA_"));
        list.extend(env.iter().map(|e| json!(e)));
        // The fixtures' rootfs paths are from the machines they were captured on.
        spec["root"]["path"] = json!("rootfs");
        fs::create_dir_all(bundle.join("rootfs")).unwrap();
        fs::write(
            bundle.join("config.json"),
            serde_json::to_vec(&spec).unwrap(),
        )
        .unwrap();
        bundle
    }

    fn run(&self, bin: &str, args: &[&str], cwd: &Path, stdin: Option<&[u8]>) -> Output {
        let mut cmd = Command::new(bin);
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env(
                "NVIDIA_CTK_CONFIG_FILE_PATH",
                self.dir.path().join("config.toml"),
            )
            .env("FAKE_RUNC_OUT", self.dir.path().join("runc-argv"))
            .envs(self.node.sim.env())
            .current_dir(cwd)
            .args(args)
            .stdin(Stdio::piped());
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        if let Some(input) = stdin {
            use std::io::Write;
            child.stdin.take().unwrap().write_all(input).unwrap();
        }
        drop(child.stdin.take());
        child.wait_with_output().unwrap()
    }

    fn runtime(&self, args: &[&str]) -> Output {
        self.run(&crate::common::runtime_bin(), args, self.dir.path(), None)
    }

    fn runc_argv(&self) -> Option<Vec<String>> {
        fs::read_to_string(self.dir.path().join("runc-argv"))
            .ok()
            .map(|s| s.lines().map(String::from).collect())
    }
}

fn spec(bundle: &Path) -> Value {
    serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap()
}

fn strs<'a>(v: &'a Value, field: &str) -> Vec<&'a str> {
    v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e[field].as_str())
        .collect()
}

#[test]
fn create_injects_the_gpus_and_execs_runc_with_the_same_argv() {
    // 8 GPUs: indices 0-5 have minors 0-5 (the testkit swaps only the last two).
    let host = Host::new(8);
    let bundle = host.bundle("b", "docker-gpus.json", &["NVIDIA_VISIBLE_DEVICES=0,2"]);
    let before = spec(&bundle);
    let b = bundle.to_str().unwrap();
    let args = [
        "--root",
        "/run/x",
        "--log",
        "/tmp/unused.json",
        "--log-format",
        "json",
        "create",
        "--bundle",
        b,
        "--pid-file",
        "/tmp/p",
        "ctr1",
    ];
    let out = host.runtime(&args);
    assert_eq!(
        out.status.code(),
        Some(7),
        "runc's exit status comes back: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        host.runc_argv().unwrap(),
        args,
        "argv passes through unchanged"
    );

    let after = spec(&bundle);
    let devices = strs(&after["linux"]["devices"], "path");
    assert_eq!(
        devices,
        [
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia0",
            "/dev/nvidia2",
            "/dev/nvidiactl",
        ],
        "in path order"
    );
    let rules = after["linux"]["resources"]["devices"].as_array().unwrap();
    assert!(
        rules.iter().any(|r| r["allow"] == true
            && r["major"] == 195
            && r["minor"] == 2
            && r["access"] == "rwm"),
        "{rules:?}"
    );
    // The driver's files: one bind of the stage, a link at each usual path.
    let mounts = strs(&after["mounts"], "destination");
    assert!(
        mounts.contains(&nvshim::driver_stage::CONTAINER_DIR),
        "{mounts:?}"
    );
    for path in [
        "usr/bin/nvidia-smi",
        "usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
    ] {
        let name = Path::new(path).file_name().unwrap();
        let link = fs::read_link(bundle.join("rootfs").join(path)).unwrap();
        assert_eq!(
            link,
            Path::new(nvshim::driver_stage::CONTAINER_DIR).join(name)
        );
    }
    // dockerd's --gpus hook is gone; the spec is marked.
    assert_eq!(after["hooks"]["prestart"], json!([]), "legacy hook removed");
    // The one hook added: the driver's params, with ModifyDeviceFiles 0, in the
    // container (the simulated host driver says 1).
    let hooks = after["hooks"]["createContainer"].as_array().unwrap();
    assert_eq!(hooks.len(), 1, "{hooks:?}");
    assert_eq!(hooks[0]["args"][1], "disable-device-node-modification");
    // Told the rootfs (absolute), so it reads neither its stdin nor config.json.
    let rootfs = bundle.join("rootfs");
    assert_eq!(
        hooks[0]["args"].as_array().unwrap()[2..],
        [json!("--rootfs"), json!(rootfs.to_str().unwrap())]
    );
    assert!(
        hooks[0]["path"]
            .as_str()
            .unwrap()
            .ends_with("/nvidia-container-runtime-hook")
    );
    assert_eq!(after["annotations"]["nvshim.io/injected"], "0,2");
    // Everything we did not add is as it was (docker's own mounts first, in order).
    assert_eq!(after["process"], before["process"]);
    assert_eq!(after["root"], before["root"]);
    let n = before["mounts"].as_array().unwrap().len();
    assert_eq!(
        after["mounts"].as_array().unwrap()[..n],
        before["mounts"].as_array().unwrap()[..]
    );
    assert_eq!(after["linux"]["namespaces"], before["linux"]["namespaces"]);
    let keys = |v: &Value| v.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(
        keys(&after)[..keys(&before).len()],
        keys(&before)[..],
        "top-level key order kept"
    );
    // Atomic replace kept the mode; no temp files left.
    assert_eq!(
        fs::metadata(bundle.join("config.json")).unwrap().mode() & 0o777,
        0o644
    );
    let names: Vec<_> = fs::read_dir(&bundle)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names.len(), 2, "config.json and rootfs only: {names:?}");
    // The rootfs's linker cache now names the injected libraries.
    let cache = nvshim::ldcache::load(&bundle.join("rootfs/etc/ld.so.cache")).unwrap();
    for key in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert_eq!(
            cache.lookup(key).next().map(|e| e.value.as_str()),
            Some(format!("/usr/lib/x86_64-linux-gnu/{key}").as_str()),
            "{key}"
        );
    }
    // The debug log says what was injected.
    let log = fs::read_to_string(host.dir.path().join("runtime.log")).unwrap();
    assert!(
        log.contains("inject device node") && log.contains("/dev/nvidia2"),
        "{log}"
    );
}

#[test]
fn containers_without_gpus_are_not_rewritten() {
    let host = Host::new(2);
    for (name, env) in [
        ("unset", vec![]),
        ("void", vec!["NVIDIA_VISIBLE_DEVICES=void"]),
        ("empty", vec!["NVIDIA_VISIBLE_DEVICES="]),
    ] {
        let bundle = host.bundle(name, "docker.json", &env);
        let bytes = fs::read(bundle.join("config.json")).unwrap();
        let inode = fs::metadata(bundle.join("config.json")).unwrap().ino();
        let out = host.runtime(&["create", "--bundle", bundle.to_str().unwrap(), name]);
        assert_eq!(
            out.status.code(),
            Some(7),
            "case {name}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(
            fs::read(bundle.join("config.json")).unwrap(),
            bytes,
            "case {name}: bytes"
        );
        assert_eq!(
            fs::metadata(bundle.join("config.json")).unwrap().ino(),
            inode,
            "case {name}: not replaced"
        );
    }
}

#[test]
fn bad_requests_fail_the_create_without_touching_anything() {
    let host = Host::new(2);
    let cases = [
        ("unknown index", "NVIDIA_VISIBLE_DEVICES=9", "\"9\""),
        (
            "bad uuid",
            "NVIDIA_VISIBLE_DEVICES=GPU-nope",
            "\"GPU-nope\"",
        ),
        ("bad caps", "NVIDIA_DRIVER_CAPABILITIES=bogus", "\"bogus\""),
        ("unmet cuda", "NVIDIA_REQUIRE_CUDA=cuda>=13.0", "13.0"),
    ];
    for (name, var, needle) in cases {
        let _ = fs::remove_file(host.dir.path().join("runc-argv"));
        let env = if var.starts_with("NVIDIA_VISIBLE") {
            vec![var]
        } else {
            vec!["NVIDIA_VISIBLE_DEVICES=0", var]
        };
        let bundle = host.bundle(name, "containerd.json", &env);
        let bytes = fs::read(bundle.join("config.json")).unwrap();
        let log = host
            .dir
            .path()
            .join(format!("{}.log.json", name.replace(' ', "-")));
        let out = host.runtime(&[
            "--log",
            log.to_str().unwrap(),
            "--log-format",
            "json",
            "create",
            "-b",
            bundle.to_str().unwrap(),
            "c",
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "case {name}: {stderr}");
        assert!(
            stderr.contains(needle) && stderr.starts_with("nvidia-container-runtime: "),
            "case {name}: {stderr}"
        );
        assert!(host.runc_argv().is_none(), "case {name}: runc must not run");
        assert_eq!(
            fs::read(bundle.join("config.json")).unwrap(),
            bytes,
            "case {name}: untouched"
        );
        let entry: Value =
            serde_json::from_str(fs::read_to_string(&log).unwrap().lines().last().unwrap())
                .unwrap();
        assert_eq!(entry["level"], "error", "case {name}");
        assert!(
            entry["msg"].as_str().unwrap().contains(needle),
            "case {name}: {entry}"
        );
    }
    // The requirement check can be switched off, as with NVIDIA's toolkit.
    let bundle = host.bundle(
        "disabled",
        "containerd.json",
        &[
            "NVIDIA_VISIBLE_DEVICES=0",
            "NVIDIA_REQUIRE_CUDA=cuda>=13.0",
            "NVIDIA_DISABLE_REQUIRE=true",
        ],
    );
    let out = host.runtime(&["create", "-b", bundle.to_str().unwrap(), "c"]);
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn other_commands_pass_straight_through() {
    let host = Host::new(1);
    for args in [
        vec!["exec", "cid", "echo", "create"],
        vec!["--root", "/r", "delete", "--force", "cid"],
        vec!["state", "cid"],
        vec!["--version"],
    ] {
        let _ = fs::remove_file(host.dir.path().join("runc-argv"));
        let out = host.runtime(&args);
        assert_eq!(
            out.status.code(),
            Some(7),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert_eq!(host.runc_argv().unwrap(), args, "{args:?}");
    }
}

#[test]
fn parallel_creates_all_succeed_and_log_intact_lines() {
    let host = Host::new(8);
    let bundles: Vec<PathBuf> = (0..32)
        .map(|i| {
            host.bundle(
                &format!("p{i}"),
                "docker.json",
                &["NVIDIA_VISIBLE_DEVICES=all"],
            )
        })
        .collect();
    let children: Vec<_> = bundles
        .iter()
        .map(|b| {
            Command::new(crate::common::runtime_bin())
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env(
                    "NVIDIA_CTK_CONFIG_FILE_PATH",
                    host.dir.path().join("config.toml"),
                )
                .env(
                    "FAKE_RUNC_OUT",
                    b.join("../runc-argv-")
                        .with_extension(b.file_name().unwrap()),
                )
                .args(["create", "--bundle", b.to_str().unwrap(), "c"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(7),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    for b in &bundles {
        assert_eq!(
            strs(&spec(b)["linux"]["devices"], "path").len(),
            3 + 8,
            "{}",
            b.display()
        );
    }
    let log = fs::read_to_string(host.dir.path().join("runtime.log")).unwrap();
    let prepared: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("prepared bundle"))
        .collect();
    assert_eq!(prepared.len(), 32, "one intact line per create:\n{log}");
    assert!(
        prepared
            .iter()
            .all(|l| l.contains("Injected") && l.ends_with("}")),
        "{prepared:?}"
    );
}

#[test]
fn the_hook_is_a_no_op_after_the_runtime_and_refuses_a_pid_that_is_no_container() {
    let host = Host::new(2);
    let hook = &crate::common::hook_bin();
    let state = |b: &Path| {
        json!({"ociVersion": "1.0.2", "id": "c", "status": "creating", "pid": 1, "bundle": b})
            .to_string()
    };

    // Injected by the runtime first: nothing left to do.
    let injected = host.bundle("inj", "docker-gpus.json", &["NVIDIA_VISIBLE_DEVICES=0"]);
    host.runtime(&["create", "--bundle", injected.to_str().unwrap(), "c"]);
    let out = host.run(
        hook,
        &["prestart"],
        host.dir.path(),
        Some(state(&injected).as_bytes()),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Without the runtime the hook injects by itself (tests/hook/prestart.rs); given a
    // pid that is not a container being created, it refuses rather than touch the host.
    let plain = host.bundle("plain", "docker-gpus.json", &["NVIDIA_VISIBLE_DEVICES=0"]);
    let out = host.run(
        hook,
        &["prestart"],
        host.dir.path(),
        Some(state(&plain).as_bytes()),
    );
    assert!(!out.status.success(), "pid 1 is not a container");
    assert!(
        String::from_utf8_lossy(&out.stderr).starts_with("nvidia-container-runtime-hook"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // No GPU asked for, and the other stages: success.
    let none = host.bundle("none", "docker.json", &[]);
    let out = host.run(
        hook,
        &["prestart"],
        host.dir.path(),
        Some(state(&none).as_bytes()),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for stage in ["poststart", "poststop"] {
        assert!(
            host.run(hook, &[stage], host.dir.path(), Some(b""))
                .status
                .success(),
            "{stage}"
        );
    }
    assert!(
        !host
            .run(hook, &["bogus"], host.dir.path(), Some(b""))
            .status
            .success()
    );
}

/// The runtime binary never loads NVML: a request that needs it (here a met
/// `NVIDIA_REQUIRE_CUDA`) is handed to `nvshim runtime` next to it, which injects and
/// execs runc with the very same argv. Without the helper, the create fails and says why.
#[test]
fn requests_needing_nvml_go_through_the_nvshim_helper() {
    let host = Host::new(2);
    let env = ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=11.0"];
    let bundle = host.bundle("require", "containerd.json", &env);
    let args = [
        "--root",
        "/tmp/r",
        "create",
        "-b",
        bundle.to_str().unwrap(),
        "c",
    ];
    let out = host.runtime(&args);
    assert_eq!(
        out.status.code(),
        Some(7),
        "runc ran: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(host.runc_argv().unwrap(), args);
    // The same devices as the same request without the requirement, planned in process.
    let plain = host.bundle("plain", "containerd.json", &env[..1]);
    let out = host.runtime(&["create", "-b", plain.to_str().unwrap(), "c"]);
    assert_eq!(out.status.code(), Some(7));
    let nodes = |b: &Path| spec(b)["linux"]["devices"].clone();
    assert_eq!(nodes(&bundle), nodes(&plain));
    assert_eq!(
        nodes(&bundle).as_array().map(Vec::len),
        Some(4),
        "{}",
        nodes(&bundle)
    );
    let calls = fs::read_to_string(&host.node.sim.call_log).unwrap_or_default();
    assert!(calls.contains("nvmlInit"), "NVML was used: {calls}");

    // The same binary alone in a directory: no helper to hand the request to.
    let lonely = host.dir.path().join("lonely");
    fs::create_dir_all(&lonely).unwrap();
    let copy = lonely.join("nvidia-container-runtime");
    fs::copy(crate::common::runtime_bin(), &copy).unwrap();
    let bundle = host.bundle("require-lonely", "containerd.json", &env);
    let before = fs::read(bundle.join("config.json")).unwrap();
    let _ = fs::remove_file(host.dir.path().join("runc-argv"));
    let out = host.run(
        copy.to_str().unwrap(),
        &["create", "-b", bundle.to_str().unwrap(), "c"],
        host.dir.path(),
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("needs NVML") && stderr.contains("lonely/nvshim"),
        "{stderr}"
    );
    assert!(host.runc_argv().is_none(), "runc must not run");
    assert_eq!(fs::read(bundle.join("config.json")).unwrap(), before);
}

#[test]
fn a_runtime_started_by_a_toolkit_path_reads_the_config_beside_it() {
    // As `nvshim install` lays it out: the engine runs <toolkit>/nvidia-container-runtime,
    // a link to the binary elsewhere, and config.toml is in <toolkit>/.config.
    let host = Host::new(1);
    let toolkit = host.dir.path().join("toolkit");
    let beside = toolkit.join(".config/nvidia-container-runtime");
    fs::create_dir_all(&beside).unwrap();
    fs::copy(
        host.dir.path().join("config.toml"),
        beside.join("config.toml"),
    )
    .unwrap();
    let runtime = toolkit.join("nvidia-container-runtime");
    std::os::unix::fs::symlink(crate::common::runtime_bin(), &runtime).unwrap();
    let out = Command::new(&runtime)
        .env_clear()
        .env("PATH", "/nonexistent")
        .env("FAKE_RUNC_OUT", host.dir.path().join("runc-argv"))
        .args(["state", "cid"])
        .output()
        .unwrap();
    // Only the config beside it names the stand-in runc (PATH has none).
    assert_eq!(
        out.status.code(),
        Some(7),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(host.runc_argv().unwrap(), ["state", "cid"]);
}

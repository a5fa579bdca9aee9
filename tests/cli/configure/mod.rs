//! `nvshim configure docker|containerd|crio` end to end: the binary on a corpus of real-shaped
//! config files (`tests/fixtures/daemon-json`, `tests/fixtures/containerd`), then the engines
//! themselves loading what it wrote: a dockerd started by the test lists the runtime (and runs
//! a GPU container through it as the default), a containerd started by the test on the
//! configured `config.toml` loads the runtime into its CRI plugin, and `ctr` runs a GPU
//! container with the runtime the file names.
//!
//! `--restart` is exercised with `--dry-run` only: it would restart the system's daemons.
//!
//! The shared helpers and the docker and CRI-O tests are here; containerd's are in
//! `containerd`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{GPU_SCRIPT, Printed, node, runtime_bin};
use nvshim_testkit::{Containerd, Dockerd, NodeSpec, tar_rootfs};
use serde_json::{Map, Value};

mod containerd;
mod ctk;

const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
const IMAGE: &str = "nvshim-configure:glibc";

fn fixture(kind: &str, name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(kind)
        .join(name)
}

/// `nvshim configure <args>` with nothing inherited that could change its behaviour.
fn configure(args: &[&str]) -> Output {
    Command::new(NVSHIM)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .arg("configure")
        .args(args)
        .output()
        .unwrap()
}

fn text(out: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Runs `nvshim configure <args>`, asserts success, returns stdout.
fn ok(args: &[&str], case: &str) -> String {
    let out = configure(args);
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{case}: nvshim configure {args:?} failed ({}):\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

// ---------------------------------------------------------------------------------------------
// docker

/// The well-formed daemon.json corpus (see the fixtures' README), plus `None` for "no file".
const DAEMON_JSON: &[Option<&str>] = &[
    Some("log-driver.json"),
    Some("registry-mirrors.json"),
    Some("default-runc.json"),
    Some("nvidia-other-path.json"),
    Some("odd-whitespace.json"),
    Some("production.json"),
    Some("empty.json"),
    Some("whitespace-only.json"),
    None,
];

/// Malformed ones, with what the error must say.
const BAD_DAEMON_JSON: &[(&str, &str)] = &[
    (
        "invalid-trailing-comma.json",
        "is not valid JSON: trailing comma at line 4, column 1",
    ),
    (
        "invalid-comment.json",
        "is not valid JSON: key must be a string at line 2, column 3",
    ),
    (
        "invalid-truncated.json",
        "is not valid JSON: EOF while parsing an object at line 5",
    ),
    ("invalid-array.json", "holds an array at the top level"),
    ("invalid-string.json", "holds a string at the top level"),
    (
        "invalid-runtimes-array.json",
        "\"runtimes\" is an array, expected an object",
    ),
];

fn parse_object(text: &str) -> Map<String, Value> {
    if text.trim().is_empty() {
        return Map::new();
    }
    match serde_json::from_str(text).unwrap() {
        Value::Object(map) => map,
        other => panic!("not an object: {other}"),
    }
}

fn read_object(path: &Path) -> Map<String, Value> {
    parse_object(&fs::read_to_string(path).unwrap())
}

/// A corpus file copied to `<dir>/etc/docker/daemon.json` (or nothing there for `None`).
fn docker_case(dir: &Path, name: Option<&str>) -> (PathBuf, Option<Vec<u8>>) {
    let path = dir.join("etc/docker/daemon.json");
    let original = name.map(|n| fs::read(fixture("daemon-json", n)).unwrap());
    if let Some(bytes) = &original {
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, bytes).unwrap();
    }
    (path, original)
}

/// `original` as configure should leave it: every key in its place with its value, our entry in
/// `runtimes` (appended, or replacing an old one in place), `default-runtime` if asked.
fn expected_after_add(original: &Map<String, Value>, runtime: &str, default: bool) -> Value {
    let mut want = original.clone();
    let runtimes = want
        .entry("runtimes")
        .or_insert_with(|| Value::Object(Map::new()));
    let runtimes = runtimes.as_object_mut().unwrap();
    match runtimes.get_mut("nvidia").and_then(Value::as_object_mut) {
        Some(entry) => {
            entry.insert("path".into(), runtime.into());
        }
        None => {
            runtimes.insert(
                "nvidia".into(),
                serde_json::json!({"args": [], "path": runtime}),
            );
        }
    }
    if default {
        want.insert("default-runtime".into(), "nvidia".into());
    }
    Value::Object(want)
}

/// `original` after configure --set-as-default then --undo: our entry gone (and `runtimes` if
/// that emptied it), `default-runtime` gone (it named us); everything else as it was.
fn expected_after_undo(original: &Map<String, Value>) -> Value {
    let mut want = original.clone();
    if let Some(runtimes) = want.get_mut("runtimes").and_then(Value::as_object_mut) {
        runtimes.shift_remove("nvidia");
        if runtimes.is_empty() {
            want.shift_remove("runtimes");
        }
    }
    want.shift_remove("default-runtime");
    Value::Object(want)
}

fn keys(v: &Value) -> Vec<&String> {
    v.as_object().unwrap().keys().collect()
}

#[test]
fn docker_corpus_add_default_undo() {
    let runtime = runtime_bin();
    for name in DAEMON_JSON {
        let case = name.unwrap_or("missing file");
        let dir = tempfile::tempdir().unwrap();
        let (path, original) = docker_case(dir.path(), *name);
        let before = original
            .as_deref()
            .map(|b| parse_object(std::str::from_utf8(b).unwrap()))
            .unwrap_or_default();
        let config = s(&path);
        let backup = dir.path().join("etc/docker/daemon.json.bak");

        let out = ok(
            &["docker", "--config", config, "--runtime-path", &runtime],
            case,
        );
        assert!(
            out.contains(&format!("+++ {config}")),
            "{case}: a diff\n{out}"
        );
        assert!(out.contains("systemctl restart docker"), "{case}: {out}");
        let added = Value::Object(read_object(&path));
        let want = expected_after_add(&before, &runtime, false);
        assert_eq!(added, want, "{case}");
        assert_eq!(keys(&added), keys(&want), "{case}: key order");
        match &original {
            Some(bytes) => assert_eq!(&fs::read(&backup).unwrap(), bytes, "{case}: backup"),
            None => assert!(!backup.exists(), "{case}: nothing to back up"),
        }
        assert_eq!(
            nvshim_testkit::dir_names(path.parent().unwrap()).len(),
            1 + usize::from(original.is_some()),
            "{case}: no temp files left"
        );

        // Again: nothing to do, nothing written.
        let written = fs::read(&path).unwrap();
        let out = ok(
            &["docker", "--config", config, "--runtime-path", &runtime],
            case,
        );
        assert!(out.contains("nothing to do"), "{case}: {out}");
        assert_eq!(fs::read(&path).unwrap(), written, "{case}: untouched");

        ok(
            &[
                "docker",
                "--config",
                config,
                "--runtime-path",
                &runtime,
                "--set-as-default",
            ],
            case,
        );
        let defaulted = Value::Object(read_object(&path));
        let want = expected_after_add(&before, &runtime, true);
        assert_eq!(defaulted, want, "{case}: --set-as-default");
        assert_eq!(keys(&defaulted), keys(&want), "{case}: key order");

        ok(&["docker", "--config", config, "--undo"], case);
        let undone = Value::Object(read_object(&path));
        let want = expected_after_undo(&before);
        assert_eq!(undone, want, "{case}: --undo");
        assert_eq!(keys(&undone), keys(&want), "{case}: key order after --undo");
    }
}

#[test]
fn docker_refuses_invalid_files_and_leaves_them_byte_identical() {
    for (name, says) in BAD_DAEMON_JSON {
        for flags in [&[][..], &["--set-as-default"], &["--undo"], &["--dry-run"]] {
            let case = format!("{name} {flags:?}");
            let dir = tempfile::tempdir().unwrap();
            let (path, original) = docker_case(dir.path(), Some(name));
            let out = configure(&[&["docker", "--config", s(&path)][..], flags].concat());
            let (stdout, stderr) = text(&out);
            if *name == "invalid-runtimes-array.json" && flags == ["--undo"] {
                // Nothing of ours in it: nothing to undo, nothing to complain about.
                assert!(out.status.success(), "{case}: {stderr}");
            } else {
                assert!(!out.status.success(), "{case}: should fail\n{stdout}");
                assert!(
                    stderr.contains(s(&path)),
                    "{case}: names the file: {stderr}"
                );
                assert!(
                    stderr.contains(says),
                    "{case}: says what is wrong: {stderr}"
                );
                assert!(stderr.contains("nothing was changed"), "{case}: {stderr}");
            }
            assert_eq!(
                fs::read(&path).unwrap(),
                original.unwrap(),
                "{case}: byte-identical"
            );
            assert_eq!(
                nvshim_testkit::dir_names(path.parent().unwrap()),
                ["daemon.json"],
                "{case}: no backup, no temp file"
            );
        }
    }
}

#[test]
fn docker_dry_run_writes_nothing() {
    let runtime = runtime_bin();
    for name in [Some("log-driver.json"), Some("empty.json"), None] {
        let case = name.unwrap_or("missing file");
        let dir = tempfile::tempdir().unwrap();
        let (path, original) = docker_case(dir.path(), name);
        let out = ok(
            &[
                "docker",
                "--config",
                s(&path),
                "--runtime-path",
                &runtime,
                "--set-as-default",
                "--dry-run",
                "--restart",
            ],
            case,
        );
        assert!(
            out.contains("+    \"runtimes\"") || out.contains("+  \"runtimes\""),
            "{case}: {out}"
        );
        assert!(out.contains("dry run:"), "{case}: {out}");
        assert!(
            out.contains("dry run: would run `systemctl restart docker`"),
            "{case}: {out}"
        );
        match original {
            Some(bytes) => {
                assert_eq!(fs::read(&path).unwrap(), bytes, "{case}");
                assert_eq!(
                    nvshim_testkit::dir_names(path.parent().unwrap()),
                    ["daemon.json"],
                    "{case}"
                );
            }
            None => assert!(!dir.path().join("etc").exists(), "{case}: nothing created"),
        }
    }
}

#[test]
fn docker_keeps_mode_owner_and_symlink() {
    let dir = tempfile::tempdir().unwrap();
    let real = dir.path().join("managed/daemon.json");
    fs::create_dir_all(real.parent().unwrap()).unwrap();
    fs::write(&real, "{\"debug\": true}\n").unwrap();
    fs::set_permissions(&real, fs::Permissions::from_mode(0o640)).unwrap();
    std::os::unix::fs::chown(&real, Some(1234), Some(5678)).unwrap();
    let link = dir.path().join("daemon.json");
    symlink(&real, &link).unwrap();

    ok(&["docker", "--config", s(&link)], "symlink");
    assert!(
        fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink()
    );
    let meta = fs::metadata(&real).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o640);
    assert_eq!((meta.uid(), meta.gid()), (1234, 5678));
    assert!(read_object(&real).contains_key("runtimes"));
    let bak = fs::metadata(dir.path().join("managed/daemon.json.bak")).unwrap();
    assert_eq!(bak.mode() & 0o7777, 0o640);
    assert_eq!((bak.uid(), bak.gid()), (1234, 5678));

    // A new file (and its directory) gets the usual 0644.
    let new = dir.path().join("new/dir/daemon.json");
    ok(&["docker", "--config", s(&new)], "new file");
    assert_eq!(fs::metadata(&new).unwrap().mode() & 0o7777, 0o644);
}

/// The fixtures a dockerd started by the test loads after configure, each with whether
/// `--set-as-default` is given. (A daemon.json that sets `data-root`, `hosts` or `exec-root`
/// would clash with the flags the testkit passes; the corpus has none.)
const DOCKERD_CASES: &[(Option<&str>, bool)] = &[
    (Some("log-driver.json"), false),
    (Some("registry-mirrors.json"), false),
    (Some("default-runc.json"), true),
    (Some("nvidia-other-path.json"), false),
    (Some("odd-whitespace.json"), false),
    (Some("production.json"), true),
    (Some("empty.json"), false),
    (None, true),
];

#[test]
fn dockerd_starts_with_each_configured_file_and_lists_the_runtime() {
    let runtime = runtime_bin();
    for (name, default) in DOCKERD_CASES {
        let case = name.unwrap_or("missing file");
        let dir = tempfile::tempdir().unwrap();
        let (path, _) = docker_case(dir.path(), *name);
        let mut args = vec!["docker", "--config", s(&path), "--runtime-path", &runtime];
        if *default {
            args.push("--set-as-default");
        }
        ok(&args, case);
        // The testkit takes the file's content (it adds its own sockets, no iptables, a storage
        // driver) and hands dockerd a daemon.json with it.
        let configured = Value::Object(read_object(&path));
        let daemon = Dockerd::start(&dir.path().join("d"), &configured)
            .unwrap_or_else(|e| panic!("{case}: dockerd did not start: {e}"));
        let info = |format: &str| {
            let out = daemon
                .docker()
                .args(["info", "--format", format])
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{case}: docker info: {}",
                text(&out).1
            );
            text(&out).0.trim().to_owned()
        };
        let runtimes: Value = serde_json::from_str(&info("{{json .Runtimes}}")).unwrap();
        assert_eq!(
            runtimes["nvidia"]["path"], runtime,
            "{case}: docker info lists the runtime: {runtimes}"
        );
        // What the file names (nvidia-other-path.json already named us), else docker's runc.
        let want_default = configured["default-runtime"].as_str().unwrap_or("runc");
        if *default {
            assert_eq!(want_default, "nvidia", "{case}");
        }
        assert_eq!(info("{{.DefaultRuntime}}"), want_default, "{case}");
    }
}

#[test]
fn dockerd_runs_a_gpu_container_through_the_configured_default() {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let runtime = runtime_bin();
    let (path, _) = docker_case(dir.path(), Some("default-runc.json"));
    ok(
        &[
            "docker",
            "--config",
            s(&path),
            "--runtime-path",
            &runtime,
            "--set-as-default",
        ],
        "default-runc",
    );
    let runtime_config = dir.path().join("runtime.toml");
    fs::write(&runtime_config, node.sim.runtime_config("runc", None)).unwrap();
    let daemon = Dockerd::start_with_env(
        &dir.path().join("d"),
        &Value::Object(read_object(&path)),
        &[("NVIDIA_CTK_CONFIG_FILE_PATH", s(&runtime_config))],
    )
    .unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let tar = dir.path().join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    daemon.import(&tar, IMAGE).unwrap();

    // No --runtime flag: the default this file now names is ours. GPU 1 is /dev/nvidia1.
    let mock = format!("{}:/etc/mock-nvml.json:ro", node.sim.mock_config.display());
    let out = daemon
        .docker()
        .args(["run", "--rm", "-v", &mock])
        .args(["-e", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
        .args(["-e", "MOCK_NVML_DEV_ROOT=/dev"])
        .args(["-e", "NVIDIA_VISIBLE_DEVICES=1"])
        .args([IMAGE, "sh", "-c", GPU_SCRIPT])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "docker run: {stderr}\n{stdout}");
    let printed = Printed(stdout.clone());
    assert_eq!(printed.gpu_nodes(), ["nvidia1"], "{stdout}");
    let smi = printed.smi_lines();
    assert!(
        smi.len() == 1 && smi[0].contains(&node.sim.spec.gpus[1].uuid),
        "{smi:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// CRI-O

#[test]
fn crio_drop_in_written_and_removed() {
    let runtime = runtime_bin();
    let dir = tempfile::tempdir().unwrap();
    let conf_d = dir.path().join("crio.conf.d");
    let drop_in = conf_d.join("99-nvidia.toml");
    let main = dir.path().join("crio.conf");
    let args = [
        "crio",
        "--config-dir",
        s(&conf_d),
        "--config",
        s(&main),
        "--runtime-path",
        &runtime,
    ];

    let out = ok(&[&args[..], &["--set-as-default"]].concat(), "add");
    assert!(out.contains("systemctl restart crio"), "{out}");
    let content = fs::read_to_string(&drop_in).unwrap();
    let doc: toml::Table = content.parse().unwrap();
    let entry = &doc["crio"]["runtime"]["runtimes"]["nvidia"];
    assert_eq!(entry["runtime_path"].as_str(), Some(runtime.as_str()));
    assert_eq!(entry["runtime_type"].as_str(), Some("oci"));
    assert_eq!(
        doc["crio"]["runtime"]["default_runtime"].as_str(),
        Some("nvidia")
    );
    assert!(
        content
            .starts_with("# Written by `nvidia-ctk runtime configure` / `nvshim configure crio`"),
        "{content}"
    );

    let out = ok(&[&args[..], &["--set-as-default"]].concat(), "again");
    assert!(out.contains("nothing to do"), "{out}");
    ok(&args, "without the default");
    let doc: toml::Table = fs::read_to_string(&drop_in).unwrap().parse().unwrap();
    assert!(doc["crio"]["runtime"].get("default_runtime").is_none());
    assert_eq!(
        nvshim_testkit::dir_names(&conf_d),
        ["99-nvidia.toml"],
        "no backup where CRI-O would load it"
    );

    let out = ok(
        &["crio", "--config-dir", s(&conf_d), "--undo", "--dry-run"],
        "dry undo",
    );
    assert!(out.contains("+++ /dev/null"), "{out}");
    assert!(drop_in.exists());
    ok(&["crio", "--config-dir", s(&conf_d), "--undo"], "undo");
    assert!(!drop_in.exists());
    let out = ok(
        &["crio", "--config-dir", s(&conf_d), "--undo"],
        "undo again",
    );
    assert!(out.contains("nothing to do"), "{out}");
}

#[test]
fn undo_and_set_as_default_conflict() {
    let out = configure(&[
        "docker",
        "--config",
        "/nonexistent/x.json",
        "--undo",
        "--set-as-default",
    ]);
    assert_eq!(out.status.code(), Some(2), "a usage error");
    assert!(
        text(&out).1.contains("cannot be used with"),
        "{}",
        text(&out).1
    );
}

//! `nvshim doctor` on the simulated node: all green when the node and an engine are
//! set up, and each broken piece named with its fix.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use crate::common::{Node, node, nvshim, stderr, stdout};
use nvshim_testkit::NodeSpec;

struct Setup {
    node: Node,
    dir: tempfile::TempDir,
}

impl Setup {
    fn new() -> Setup {
        let node = node(&NodeSpec::standard(4));
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        for name in [
            "nvidia-container-runtime",
            "nvidia-container-runtime-hook",
            "nvshim",
        ] {
            fs::write(bin.join(name), "#!/bin/sh\n").unwrap();
            fs::set_permissions(bin.join(name), fs::Permissions::from_mode(0o755)).unwrap();
        }
        let setup = Setup { node, dir };
        setup.register_docker(&setup.bin().join("nvidia-container-runtime"));
        setup
    }

    fn bin(&self) -> PathBuf {
        self.dir.path().join("bin")
    }

    fn register_docker(&self, runtime: &Path) {
        let json = serde_json::json!({
            "log-driver": "json-file",
            "runtimes": {"nvidia": {"path": runtime, "args": []}}
        });
        fs::write(self.dir.path().join("daemon.json"), json.to_string()).unwrap();
    }

    /// The CDI spec directory doctor checks: empty (absent) unless a test fills it,
    /// so no test depends on the machine's /etc/cdi.
    fn cdi_dir(&self) -> PathBuf {
        self.dir.path().join("cdi")
    }

    /// `nvshim cdi generate --output <cdi dir>/<file>` for the node.
    fn generate_spec(&self, file: &str) -> PathBuf {
        fs::create_dir_all(self.cdi_dir()).unwrap();
        let path = self.cdi_dir().join(file);
        let out = nvshim(
            &self.node,
            &["cdi", "generate", "--output", &path.display().to_string()],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        path
    }

    fn doctor(&self) -> (i32, String) {
        let p = |name: &str| self.dir.path().join(name).display().to_string();
        let bin = self.bin().display().to_string();
        let cdi = self.cdi_dir().display().to_string();
        let out = nvshim(
            &self.node,
            &[
                "doctor",
                "--docker-config",
                &p("daemon.json"),
                "--containerd-config",
                &p("containerd.toml"),
                "--crio-config-dir",
                &p("crio"),
                "--bin-dir",
                &bin,
                "--cdi-spec-dir",
                &cdi,
            ],
        );
        let text = format!("{}{}", stdout(&out), stderr(&out));
        (out.status.code().unwrap(), text)
    }
}

#[test]
fn a_ready_node_is_all_green() {
    let s = Setup::new();
    let (code, text) = s.doctor();
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("FAIL") && !text.contains("warn"), "{text}");
    assert!(
        text.contains("4 GPU(s)") && text.contains("all checks passed"),
        "{text}"
    );
}

#[test]
fn a_missing_device_node_is_named_with_its_fix() {
    let s = Setup::new();
    let gone = s.node.sim.dev_root.join("nvidia1");
    fs::remove_file(&gone).unwrap();
    let (code, text) = s.doctor();
    assert_eq!(code, 1, "{text}");
    let line = text
        .lines()
        .find(|l| l.starts_with("[FAIL] device nodes"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains(&format!("{} is missing", gone.display())),
        "{line}"
    );
    assert!(text.contains("fix: nvidia-modprobe"), "{text}");
}

#[test]
fn an_unregistered_runtime_is_named_with_its_fix() {
    let cases = [
        ("no entry", serde_json::json!({"log-driver": "json-file"})),
        (
            "another path",
            serde_json::json!({"runtimes": {"nvidia": {"path": "/opt/old/nvidia-container-runtime"}}}),
        ),
    ];
    for (name, json) in cases {
        let s = Setup::new();
        fs::write(s.dir.path().join("daemon.json"), json.to_string()).unwrap();
        let (code, text) = s.doctor();
        assert_eq!(code, 1, "case {name}: {text}");
        assert!(
            text.contains("[warn] docker runtime") && text.contains("fix: nvshim configure docker"),
            "case {name}: {text}"
        );
        assert!(
            text.contains("[FAIL] runtime registered"),
            "case {name}: {text}"
        );
    }
}

#[test]
fn missing_binaries_and_a_broken_engine_config_fail() {
    let s = Setup::new();
    fs::remove_file(s.bin().join("nvshim")).unwrap();
    fs::write(
        s.dir.path().join("containerd.toml"),
        "version = 2\n[plugins\n",
    )
    .unwrap();
    let (code, text) = s.doctor();
    assert_eq!(code, 1, "{text}");
    assert!(
        text.contains("[FAIL] binaries") && text.contains("nvshim (the runtime's NVML helper"),
        "{text}"
    );
    assert!(
        text.contains("[FAIL] containerd runtime") && text.contains("is not valid TOML"),
        "{text}"
    );
}

/// The report line for `name` with status `mark`.
fn line<'a>(text: &'a str, mark: &str, name: &str) -> &'a str {
    let prefix = format!("[{mark}] {name}");
    text.lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in:\n{text}"))
}

/// The `fix:` line after the line starting with `prefix`.
fn fix_after<'a>(text: &'a str, prefix: &str) -> &'a str {
    let mut lines = text.lines().skip_while(|l| !l.starts_with(prefix));
    lines.next();
    lines
        .next()
        .and_then(|l| l.trim().strip_prefix("fix: "))
        .unwrap_or_else(|| panic!("no fix after {prefix:?} in:\n{text}"))
}

fn edit_spec(path: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let mut json: serde_json::Value = serde_json::from_slice(&fs::read(path).unwrap()).unwrap();
    edit(&mut json);
    fs::write(path, serde_json::to_vec(&json).unwrap()).unwrap();
}

#[test]
fn no_cdi_spec_is_fine() {
    let s = Setup::new();
    let (code, text) = s.doctor();
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("FAIL") && !text.contains("warn"), "{text}");
    assert!(
        line(&text, "ok  ", "CDI spec").contains("no CDI spec for nvidia.com/gpu"),
        "{text}"
    );
}

#[test]
fn a_freshly_generated_spec_is_current() {
    let s = Setup::new();
    let spec = s.generate_spec("nvidia.json");
    let (code, text) = s.doctor();
    assert_eq!(code, 0, "{text}");
    assert!(!text.contains("FAIL") && !text.contains("warn"), "{text}");
    let ok = line(&text, "ok  ", &format!("CDI spec {}", spec.display()));
    // 4 GPUs by index and by UUID, plus `all`.
    assert!(ok.ends_with(": 9 devices, current"), "{ok}");
}

#[test]
fn a_stale_spec_is_named_with_what_changed_and_its_fix() {
    type Break = fn(&Setup, &Path) -> String;
    let cases: [(&str, Break); 2] = [
        ("library gone", |s, _| {
            let lib = s
                .node
                .sim
                .lib_dir()
                .join(format!("libcuda.so.{}", s.node.sim.library_version()));
            fs::remove_file(&lib).unwrap();
            format!("{} is gone (driver upgraded?)", lib.display())
        }),
        ("GPU 3 not in the spec", |s, spec| {
            let uuid = s.node.sim.spec.gpus[3].uuid.clone();
            edit_spec(spec, |json| {
                json["devices"]
                    .as_array_mut()
                    .unwrap()
                    .retain(|d| d["name"] != "3" && d["name"] != uuid.as_str());
            });
            format!("GPU 3 ({uuid}) has no device")
        }),
    ];
    for (name, break_it) in cases {
        let s = Setup::new();
        let spec = s.generate_spec("nvidia.json");
        let want = break_it(&s, &spec);
        let (code, text) = s.doctor();
        assert_eq!(code, 1, "case {name}: {text}");
        let prefix = format!("[FAIL] CDI spec {}", spec.display());
        let bad = line(&text, "FAIL", &format!("CDI spec {}", spec.display()));
        assert!(bad.contains(&want), "case {name}: {bad}");
        let fix = fix_after(&text, &prefix);
        assert!(
            fix.starts_with(&format!(
                "nvshim cdi generate --output {} --driver-root {}",
                spec.display(),
                s.node.sim.driver_root.display()
            )),
            "case {name}: {fix}"
        );
        if name == "GPU 3 not in the spec" {
            // The printed fix, run as printed, makes the spec current again.
            let args: Vec<&str> = fix.split_whitespace().skip(1).collect();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_nvshim"))
                .env_clear()
                .envs(s.node.sim.env())
                .args(&args)
                .output()
                .unwrap();
            assert!(out.status.success(), "case {name}: {}", stderr(&out));
            let (code, text) = s.doctor();
            assert_eq!(code, 0, "case {name} after the fix: {text}");
        }
    }
}

#[test]
fn an_unparsable_spec_file_fails() {
    let s = Setup::new();
    fs::create_dir_all(s.cdi_dir()).unwrap();
    let bad = s.cdi_dir().join("bad.json");
    fs::write(&bad, "{not json").unwrap();
    let (code, text) = s.doctor();
    assert_eq!(code, 1, "{text}");
    let prefix = format!("[FAIL] CDI spec {}", bad.display());
    assert!(
        line(&text, "FAIL", &format!("CDI spec {}", bad.display())).contains("invalid JSON"),
        "{text}"
    );
    assert!(
        fix_after(&text, &prefix)
            .starts_with(&format!("nvshim cdi generate --output {}", bad.display())),
        "{text}"
    );
}

/// `--wait-for` as an init container runs it: no config file, no driver. It says what it
/// waits for at once, returns when the file appears, and on timeout exits 1 naming it.
#[test]
fn wait_for_returns_when_the_file_appears_and_names_it_on_timeout() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    use std::time::{Duration, Instant};

    let dir = tempfile::tempdir().unwrap();
    let ready = dir.path().join("toolkit-ready");
    let mut child = Command::new(env!("CARGO_BIN_EXE_nvshim"))
        .env_clear()
        .args(["doctor", "--wait-for"])
        .arg(&ready)
        .args(["--timeout", "60"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    BufReader::new(child.stdout.as_mut().unwrap())
        .read_line(&mut first)
        .unwrap();
    assert_eq!(
        first,
        format!("waiting for {} (at most 60 s)\n", ready.display())
    );
    // It is waiting now: the file appears, and it ends.
    fs::write(&ready, "").unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "still waiting for {ready:?}");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status}");

    let missing = dir.path().join("never");
    let out = Command::new(env!("CARGO_BIN_EXE_nvshim"))
        .env_clear()
        .args(["doctor", "--wait-for"])
        .arg(&missing)
        .args(["--timeout", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains(&format!("{} did not appear within 1 s", missing.display())),
        "{}",
        stderr(&out)
    );
}

//! `nvshim doctor` on the simulated node: all green when the node and an engine are
//! set up, and each broken piece named with its fix.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use common::{Node, node, nvshim, stderr, stdout};
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

    fn doctor(&self) -> (i32, String) {
        let p = |name: &str| self.dir.path().join(name).display().to_string();
        let bin = self.bin().display().to_string();
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

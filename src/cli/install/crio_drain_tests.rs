// SPDX-License-Identifier: Apache-2.0
//! CRI-O's containers that still run through the toolkit's runtime, found by their
//! monitor's command line (`conmon -c ID -r RUNTIME`): the parser on NVIDIA-free and
//! CRI-O-shaped command lines, a real process under `/proc` that looks like such a monitor,
//! and which installs make the undo wait for them first (a registered runtime, not a hook).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use proptest::prelude::*;

use super::drain;
use super::state::State;
use super::undo::registers_crio_runtime;
use super::*;

fn cmdline(args: &[&str]) -> Vec<u8> {
    args.iter().flat_map(|a| a.bytes().chain([0])).collect()
}

#[test]
fn conmon_names_its_container_and_runtime_in_either_flag_form() {
    let runtime = "/usr/local/nvidia/toolkit/nvidia-container-runtime";
    for (case, args) in [
        (
            "short flags, as CRI-O starts it",
            vec![
                "/usr/bin/conmon",
                "-b",
                "/run/containers/storage/overlay-containers/abc/userdata",
                "-c",
                "abc",
                "--exit-dir",
                "/var/run/crio/exits",
                "-r",
                runtime,
                "--runtime-arg",
                "--root=/run/runc",
                "--socket-dir-path",
                "/var/run/crio",
            ],
        ),
        (
            "long flags with =",
            vec![
                "conmon",
                "--cid=abc",
                "--runtime=/usr/local/nvidia/toolkit/nvidia-container-runtime",
            ],
        ),
        (
            "long flags",
            vec![
                "/usr/libexec/crio/conmon",
                "--runtime",
                runtime,
                "--cid",
                "abc",
            ],
        ),
    ] {
        assert_eq!(
            drain::conmon_container(&cmdline(&args)),
            Some(("abc".to_owned(), runtime.to_owned())),
            "{case}"
        );
    }
    for (case, args) in [
        (
            "not conmon",
            vec!["/usr/bin/crio", "-c", "abc", "-r", runtime],
        ),
        ("no runtime", vec!["/usr/bin/conmon", "-c", "abc"]),
        (
            "a flag without its value",
            vec!["/usr/bin/conmon", "-c", "abc", "-r"],
        ),
        ("empty", vec![]),
    ] {
        assert_eq!(drain::conmon_container(&cmdline(&args)), None, "{case}");
    }
}

/// A live process whose command line is a monitor's of `runtime` (`sh -c` keeps running with
/// `conmon` as its argv[0]: `-c` is the script, `-r` and the runtime its `$0` and `$1`).
struct FakeMonitor(std::process::Child);

impl FakeMonitor {
    fn start(runtime: &Path) -> FakeMonitor {
        let child = Command::new("/bin/sh")
            .arg0("conmon")
            .args(["-c", "sleep 30; :", "-r"])
            .arg(runtime)
            .spawn()
            .unwrap();
        FakeMonitor(child)
    }
}

impl Drop for FakeMonitor {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn a_monitor_running_a_toolkit_binary_holds_it_and_others_do_not() {
    // A toolkit path of this test's own: other tests' undos never see this monitor.
    let toolkit = PathBuf::from(format!(
        "/opt/nvshim-crio-drain-{}/toolkit",
        std::process::id()
    ));
    let proc = Path::new("/proc");
    assert_eq!(drain::conmon_holders(proc, &toolkit), Vec::<String>::new());
    let monitor = FakeMonitor::start(&toolkit.join("nvidia-container-runtime"));
    let other = FakeMonitor::start(Path::new("/usr/bin/runc"));
    let mut held = Vec::new();
    for _ in 0..100 {
        held = drain::conmon_holders(proc, &toolkit);
        if !held.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(held, ["sleep 30; :"]);
    drop(monitor);
    assert_eq!(drain::conmon_holders(proc, &toolkit), Vec::<String>::new());
    drop(other);
}

#[test]
fn only_a_crio_install_that_registered_the_runtime_waits_before_the_undo() {
    let drop_in = PathBuf::from("/etc/crio/crio.conf.d/99-nvidia.toml");
    let base = State {
        version: 1,
        owner: String::new(),
        engine: "crio".to_owned(),
        runtime_name: "nvidia".to_owned(),
        runtime_path: PathBuf::from("/usr/local/nvidia/toolkit/nvidia-container-runtime"),
        config: PathBuf::from("/etc/crio/crio.conf"),
        drop_in: Some(drop_in.clone()),
        set_as_default: false,
        cdi: false,
        socket: PathBuf::from("/var/run/crio/crio.sock"),
        restart: RestartMode::Systemd,
        ready_file: PathBuf::from("/run/nvidia/validations/toolkit-ready"),
        files: Vec::new(),
        engine_files: Vec::new(),
        saved: Vec::new(),
        dirs: Vec::new(),
    };
    let with = |engine: &str, files: Vec<PathBuf>| State {
        engine: engine.to_owned(),
        engine_files: files,
        ..base.clone()
    };
    assert!(registers_crio_runtime(&with("crio", vec![drop_in.clone()])));
    assert!(registers_crio_runtime(&with(
        "crio",
        vec![PathBuf::from("/etc/crio/crio.conf")]
    )));
    let hook = PathBuf::from("/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json");
    assert!(!registers_crio_runtime(&with("crio", vec![hook])));
    assert!(!registers_crio_runtime(&with("containerd", vec![drop_in])));
}

proptest! {
    #[test]
    fn any_command_line_parses_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = drain::conmon_container(&bytes);
    }
}

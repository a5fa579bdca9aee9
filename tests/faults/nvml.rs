//! An NVML that hangs. The mock NVML reads its config (`$MOCK_NVML_CONFIG`) in
//! `nvmlInit`; pointed at a FIFO nobody writes, that read never returns, which is what a
//! wedged driver does to every NVML call. (The mock has no sleep setting of its own.)
//!
//! - A request the runtime plans from procfs never loads NVML, so it works regardless.
//! - A request that needs NVML (`NVIDIA_REQUIRE_CUDA`) goes to `nvshim runtime`, which
//!   gives NVML `[nvshim] nvml-timeout` seconds and then fails the create, naming the
//!   limit, with config.json untouched and runc never run.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use crate::kit::{FAKE_RUNC_EXIT, Host, finish, stderr, temp_files};
use nix::sys::stat::Mode;
use nvshim_testkit::MOCK_NVML_CONFIG_ENV;
use serde_json::Value;

const GPU: &str = "NVIDIA_VISIBLE_DEVICES=0";
const REQUIRE: &str = "NVIDIA_REQUIRE_CUDA=cuda>=11.0";

fn injected(bundle: &Path) -> Option<String> {
    let spec: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    spec["annotations"]["nvshim.io/injected"]
        .as_str()
        .map(String::from)
}

#[test]
fn a_hanging_nvml_times_out_and_procfs_requests_never_wait_for_it() {
    let host = Host::new(2);
    host.write_config(&format!("{}nvml-timeout = 1\n", host.default_config()));
    let hung = host.dir.path().join("hung-nvml.json");
    nix::unistd::mkfifo(&hung, Mode::from_bits_truncate(0o644)).unwrap();
    let calls = &host.node.sim.call_log;
    let run = |case: &str, bundle: &Path, nvml: &Path| {
        host.forget_runc();
        let _ = fs::remove_file(calls);
        let b = bundle.to_str().unwrap();
        let mut cmd = host.command(&["create", "--bundle", b, "c"]);
        cmd.env(MOCK_NVML_CONFIG_ENV, nvml);
        finish(case, cmd.spawn().unwrap())
    };

    // procfs: NVML is never loaded, so its state does not matter.
    let plain = host.bundle("plain", &[GPU]);
    let out = run("plain", &plain, &hung);
    assert_eq!(out.status.code(), Some(FAKE_RUNC_EXIT), "{}", stderr(&out));
    assert_eq!(injected(&plain).as_deref(), Some("0"));
    let log = fs::read_to_string(calls).unwrap_or_default();
    assert!(!log.contains("nvmlInit"), "NVML was not loaded: {log}");

    // NVML: the helper gives up after the timeout and says why.
    let require = host.bundle("require", &[GPU, REQUIRE]);
    let before = fs::read(require.join("config.json")).unwrap();
    let out = run("require, NVML hung", &require, &hung);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.starts_with("nvidia-container-runtime: NVML did not list the GPUs within 1 s")
            && err.contains("[nvshim] nvml-timeout"),
        "{err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");
    let log = fs::read_to_string(calls).unwrap_or_default();
    assert!(log.contains("nvmlInit"), "NVML was reached and hung: {log}");
    assert!(host.runc_argv().is_none(), "runc must not run");
    assert_eq!(fs::read(require.join("config.json")).unwrap(), before);
    assert_eq!(temp_files(&require), Vec::<std::path::PathBuf>::new());

    // The same request with a working NVML, through the same deadline, goes through.
    let out = run("require, NVML fine", &require, &host.node.sim.mock_config);
    assert_eq!(out.status.code(), Some(FAKE_RUNC_EXIT), "{}", stderr(&out));
    assert_eq!(injected(&require).as_deref(), Some("0"));
}

// SPDX-License-Identifier: Apache-2.0
//! `nvshim::nvml` and the NVML inventory backend against the mock `libnvidia-ml.so.1`
//! (`tests/mock-nvml`, built by `cargo build --workspace`).
//!
//! The mock reads its config from the environment at `nvmlInit`, and one process has one
//! environment and one copy of the mock. So every test that loads the mock runs its checks
//! in a child process: the test writes a node (config, device nodes) into a tempdir, then
//! re-runs this test binary filtered to itself with the node's env set, and the child, seeing
//! its marker variable, does the checks. That works the same under `cargo test` (threads)
//! and `cargo nextest` (a process per test), and needs no `unsafe` `set_var`.
//!
//! The node and the child machinery are here; the tests are in `devices` (enumeration,
//! MIG, lookup, call errors) and `library` (loading, events, the call log, the
//! inventory, finding the library through the driver root's ld.so.cache).

use std::ffi::OsStr;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim::inventory::{self, DriverInfo, Gpu, Inventory, MigDevice};
use nvshim::ldcache::{self, Entry};
use nvshim::nvml::{
    Device, EVENT_TYPE_XID_CRITICAL_ERROR, INSTANCE_ID_NONE, Nvml, NvmlError, Return,
};
use nvshim::roots::Roots;
use serde_json::{Value, json};

/// The calling test's name as the harness lists it (module path, then `$name`): what the
/// parent filters the child run to, and what the child compares with `CHILD_ENV`.
macro_rules! test_name {
    ($name:literal) => {
        crate::test_path(module_path!(), $name)
    };
}

mod devices;
mod library;

type Error = Box<dyn std::error::Error>;
type TestResult = Result<(), Error>;

/// Set in a child to the name of the test it runs.
const CHILD_ENV: &str = "NVSHIM_NVML_MOCK_TEST";
/// Set in a child to the node's directory.
const DIR_ENV: &str = "NVSHIM_NVML_MOCK_DIR";
/// Extra per-case data for a child.
const CASE_ENV: &str = "NVSHIM_NVML_MOCK_CASE";

const DRIVER_VERSION: &str = "550.54.15";
const GIB: u64 = 1 << 30;

// The standard node: three GPUs, written to the config out of bus order, with minors that
// do not follow bus order either, so nothing passes by accident.
const UUID_B1: &str = "GPU-b1b1b1b1-0000-4000-8000-0000000000b1";
const UUID_07: &str = "GPU-07070707-0000-4000-8000-000000000007";
const UUID_0A: &str = "GPU-0a0a0a0a-0000-4000-8000-00000000000a";
const MIG_B1_1: &str = "MIG-b1b1b1b1-0001-4000-8000-000000000001";
const MIG_B1_2: &str = "MIG-b1b1b1b1-0002-4000-8000-000000000002";
const A100: &str = "NVIDIA A100-SXM4-80GB";
const T4: &str = "Tesla T4";

fn standard_gpus() -> Value {
    json!([
        {
            "name": A100, "uuid": UUID_B1, "bus_id": "00000000:B1:00.0", "minor": 0,
            "memory_total_bytes": 80 * GIB, "compute_capability": [8, 0], "mig_mode": true,
            "mig_devices": [
                { "gpu_instance_id": 1, "compute_instance_id": 0, "uuid": MIG_B1_1,
                  "memory_total_bytes": 10 * GIB, "profile": "1g.10gb" },
                { "gpu_instance_id": 2, "compute_instance_id": 0, "uuid": MIG_B1_2,
                  "memory_total_bytes": 20 * GIB, "profile": "2g.20gb" }
            ]
        },
        {
            "name": A100, "uuid": UUID_07, "bus_id": "00000000:07:00.0", "minor": 1,
            "memory_total_bytes": 80 * GIB, "memory_used_bytes": GIB,
            "compute_capability": [8, 0], "mig_mode": false
        },
        {
            "name": T4, "uuid": UUID_0A, "bus_id": "0000:0a:00.0", "minor": 2,
            "memory_total_bytes": 16 * GIB, "compute_capability": [7, 5], "mig_mode": false
        }
    ])
}

fn standard_config(node: &Node) -> Value {
    json!({
        "driver_version": DRIVER_VERSION,
        "cuda_driver_version": 12040,
        "dev_root": node.dev(),
        "gpus": standard_gpus(),
    })
}

/// This test binary, which the parent re-runs as the child.
fn test_binary() -> Result<PathBuf, String> {
    std::env::current_exe().map_err(|e| format!("cannot find the test binary: {e}"))
}

/// The mock, next to this test binary's `deps/` directory.
fn mock_library() -> Result<PathBuf, String> {
    let exe = test_binary()?;
    let profile_dir = exe.parent().and_then(Path::parent).ok_or_else(|| {
        format!(
            "test binary {} is not in <target>/<profile>/deps",
            exe.display()
        )
    })?;
    let library = profile_dir.join("libnvshim_mock_nvml.so");
    if library.is_file() {
        Ok(library)
    } else {
        Err(format!(
            "the mock NVML {} does not exist: run `cargo build --workspace` first",
            library.display()
        ))
    }
}

/// In the child process spawned for `test`: the node directory. Otherwise `None`.
fn child(test: &str) -> Option<PathBuf> {
    if std::env::var(CHILD_ENV).ok()? != test {
        return None;
    }
    std::env::var_os(DIR_ENV).map(PathBuf::from)
}

/// The shape of most tests here. In the child for `test`: runs `checks` with the node's
/// directory. Otherwise: runs that child on the node that `node` builds.
fn in_child(
    test: &str,
    node: impl FnOnce() -> Result<Node, Error>,
    checks: impl FnOnce(&Path) -> TestResult,
) -> TestResult {
    if let Some(dir) = child(test) {
        return checks(&dir);
    }
    node()?.run_child(test, &[])?;
    Ok(())
}

/// [`in_child`] for the tests that only check the mock through `nvshim::nvml`: the child
/// loads it and hands it to `checks`.
fn check_mock(
    test: &str,
    node: impl FnOnce() -> Result<Node, Error>,
    checks: impl FnOnce(&Nvml, &Path) -> TestResult,
) -> TestResult {
    in_child(test, node, |dir| checks(&load_mock()?, dir))
}

/// Creates `<dir>/nvidia<minor>` for each of `minors`: plain files, as the mock only checks
/// that they exist.
fn write_device_nodes(dir: &Path, minors: &[u32]) -> std::io::Result<()> {
    minors
        .iter()
        .try_for_each(|minor| std::fs::write(dir.join(format!("nvidia{minor}")), ""))
}

/// A scratch node: `config.json`, `dev/nvidia<minor>`, `calls.log`.
struct Node {
    dir: tempfile::TempDir,
}

impl Node {
    fn new(minors: &[u32]) -> Result<Node, Error> {
        let node = Node {
            dir: tempfile::tempdir()?,
        };
        std::fs::create_dir(node.dev())?;
        write_device_nodes(&node.dev(), minors)?;
        Ok(node)
    }

    /// All three GPUs' device nodes and the standard config.
    fn standard() -> Result<Node, Error> {
        let node = Node::new(&[0, 1, 2])?;
        node.write_config(&standard_config(&node))?;
        Ok(node)
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn dev(&self) -> PathBuf {
        self.path("dev")
    }

    fn write_config(&self, config: &Value) -> TestResult {
        std::fs::write(self.path("config.json"), serde_json::to_vec_pretty(config)?)?;
        Ok(())
    }

    /// Runs `test` in a child with this node's env plus `env` (`None` removes a variable)
    /// and fails with the child's output unless its one test passed.
    fn run_child(&self, test: &str, env: &[(&str, Option<&OsStr>)]) -> Result<String, ChildFailed> {
        let mut command = Command::new(test_binary().map_err(ChildFailed)?);
        command
            .args([test, "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, test)
            .env(DIR_ENV, self.dir.path())
            .env("MOCK_NVML_CONFIG", self.path("config.json"))
            .env("MOCK_NVML_CALL_LOG", self.path("calls.log"))
            .env_remove("MOCK_NVML_DEV_ROOT")
            .env_remove(CASE_ENV);
        for (name, value) in env {
            match value {
                Some(value) => command.env(name, value),
                None => command.env_remove(name),
            };
        }
        let output = command
            .output()
            .map_err(|e| ChildFailed(format!("cannot run the child for {test}: {e}")))?;
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() || !stdout.contains("1 passed") {
            return Err(ChildFailed(format!(
                "child for {test} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
                output.status
            )));
        }
        Ok(stderr.into_owned())
    }
}

/// A child's failure, with its output; `Debug` prints it as is, so a failed test's report
/// (which uses `Debug`) shows the child's panic message readably.
#[derive(thiserror::Error)]
#[error("{0}")]
struct ChildFailed(String);

impl std::fmt::Debug for ChildFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

fn load_mock() -> Result<Nvml, Error> {
    Ok(Nvml::load(&mock_library()?)?)
}

/// The `(function, code, message)` of a failed call, for table comparisons.
fn call_failure<T: std::fmt::Debug>(
    result: Result<T, NvmlError>,
) -> Result<(&'static str, Return, String), String> {
    match result {
        Err(NvmlError::Call {
            function,
            code,
            message,
        }) => Ok((function, code, message)),
        other => Err(format!("expected an NVML call error, got {other:?}")),
    }
}

/// The code of a failed call; see [`call_failure`].
fn failure_code<T: std::fmt::Debug>(result: Result<T, NvmlError>) -> Result<Return, String> {
    Ok(call_failure(result)?.1)
}

/// Roots with `driver` as the driver root.
fn driver_roots(driver: &Path) -> Roots {
    Roots {
        driver: driver.to_path_buf(),
        ..Roots::default()
    }
}

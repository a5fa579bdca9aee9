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
//! The node, the child machinery and the device tests (enumeration, MIG, lookup, call
//! errors) are here; `library` has the rest (loading, events, the call log, the
//! inventory, finding the library through the driver root's ld.so.cache). A test names
//! itself to the helpers by its path below this module (`library::…` there).

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

/// `test` (a test's path below this module) as the harness names it: what the parent
/// filters the child run to, and what the child finds in `CHILD_ENV`.
fn harness_name(test: &str) -> String {
    crate::test_path(module_path!(), test)
}

/// In the child process spawned for `test`: the node directory. Otherwise `None`.
fn child(test: &str) -> Option<PathBuf> {
    if std::env::var(CHILD_ENV).ok()? != harness_name(test) {
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
        let test = &harness_name(test);
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

#[test]
fn gpus_enumerate_in_pci_order() -> TestResult {
    check_mock("gpus_enumerate_in_pci_order", Node::standard, |nvml, _| {
        assert_eq!(nvml.driver_version()?, DRIVER_VERSION);
        assert_eq!(nvml.cuda_driver_version()?, 12040);
        assert_eq!(nvml.device_count()?, 3);
        // ((uuid, NVML bus id, (domain, bus, device), minor), (name, memory, capability))
        let want = [
            (
                (UUID_07, "00000000:07:00.0", (0, 0x07, 0), 1),
                (A100, (80 * GIB, 79 * GIB, GIB), (8, 0)),
            ),
            (
                (UUID_0A, "00000000:0A:00.0", (0, 0x0a, 0), 2),
                (T4, (16 * GIB, 16 * GIB, 0), (7, 5)),
            ),
            (
                (UUID_B1, "00000000:B1:00.0", (0, 0xb1, 0), 0),
                (A100, (80 * GIB, 80 * GIB, 0), (8, 0)),
            ),
        ];
        for (index, ((uuid, bus_id, location, minor), (name, memory, cc))) in
            want.into_iter().enumerate()
        {
            let case = format!("GPU {index} ({uuid})");
            let gpu = nvml.device_by_index(index as u32)?;
            assert_eq!(gpu.uuid()?, uuid, "case {case}");
            let pci = gpu.pci_info()?;
            assert_eq!(pci.bus_id, bus_id, "case {case}");
            assert_eq!((pci.domain, pci.bus, pci.device), location, "case {case}");
            assert_eq!(pci.pci_device_id & 0xffff, 0x10de, "case {case}: vendor id");
            assert_eq!(gpu.minor_number()?, minor, "case {case}");
            assert_eq!(gpu.name()?, name, "case {case}");
            let m = gpu.memory_info()?;
            assert_eq!((m.total, m.free, m.used), memory, "case {case}");
            assert_eq!(gpu.cuda_compute_capability()?, cc, "case {case}");
            assert!(!gpu.is_mig_device()?, "case {case}");
        }
        Ok(())
    })
}

#[test]
fn gpus_without_a_device_node_are_hidden() -> TestResult {
    const TEST: &str = "gpus_without_a_device_node_are_hidden";
    if child(TEST).is_some() {
        let want = std::env::var(CASE_ENV)?;
        let want: Vec<&str> = want.split(',').filter(|u| !u.is_empty()).collect();
        let nvml = load_mock()?;
        let mut got = Vec::new();
        for index in 0..nvml.device_count()? {
            got.push(nvml.device_by_index(index)?.uuid()?);
        }
        assert_eq!(got, want);
        for hidden in [UUID_07, UUID_0A, UUID_B1]
            .iter()
            .filter(|u| !want.contains(u))
        {
            let code = failure_code(nvml.device_by_uuid(hidden))?;
            assert_eq!(code, Return::NotFound, "hidden {hidden}");
        }
        return Ok(());
    }
    // (case, minors under the config's dev_root, minors under $MOCK_NVML_DEV_ROOT, visible)
    type Case<'a> = (&'a str, &'a [u32], Option<&'a [u32]>, &'a [&'a str]);
    let cases: &[Case] = &[
        ("all nodes", &[0, 1, 2], None, &[UUID_07, UUID_0A, UUID_B1]),
        ("minor 1 missing", &[0, 2], None, &[UUID_0A, UUID_B1]),
        ("no nodes", &[], None, &[]),
        ("env dev root wins", &[0, 1, 2], Some(&[1]), &[UUID_07]),
    ];
    for (case, minors, env_minors, visible) in cases {
        let node = Node::new(minors)?;
        node.write_config(&standard_config(&node))?;
        let env_dev = node.path("other-dev");
        std::fs::create_dir(&env_dev)?;
        write_device_nodes(&env_dev, env_minors.unwrap_or_default())?;
        let visible = visible.join(",");
        let mut env = vec![(CASE_ENV, Some(OsStr::new(&visible)))];
        if env_minors.is_some() {
            env.push(("MOCK_NVML_DEV_ROOT", Some(env_dev.as_os_str())));
        }
        node.run_child(TEST, &env)
            .map_err(|e| ChildFailed(format!("case {case}: {e}")))?;
    }
    Ok(())
}

#[test]
fn mig_devices_enumerate() -> TestResult {
    check_mock("mig_devices_enumerate", Node::standard, |nvml, _| {
        let a100_mig = nvml.device_by_uuid(UUID_B1)?;
        let a100 = nvml.device_by_uuid(UUID_07)?;
        let t4 = nvml.device_by_uuid(UUID_0A)?;

        // (case, device, MIG mode or error, max MIG devices or error)
        let modes = [
            ("A100 in MIG mode", a100_mig, Ok((true, true)), Ok(7)),
            ("A100 with MIG off", a100, Ok((false, false)), Ok(0)),
            ("T4 without MIG", t4, Err(Return::NotSupported), Ok(0)),
        ];
        for (case, device, mode, max) in modes {
            assert_eq!(
                device.mig_mode().map_err(|e| e.code()),
                mode.map_err(Some),
                "case {case}"
            );
            assert_eq!(
                device.max_mig_device_count().map_err(|e| e.code()),
                max.map_err(Some),
                "case {case}"
            );
        }

        // (slot, gpu instance, compute instance, uuid, name, memory)
        let want = [
            (0, 1, 0, MIG_B1_1, format!("{A100} MIG 1g.10gb"), 10 * GIB),
            (1, 2, 0, MIG_B1_2, format!("{A100} MIG 2g.20gb"), 20 * GIB),
        ];
        for (slot, gi, ci, uuid, name, memory) in want {
            let case = format!("slot {slot}");
            let mig = a100_mig.mig_device_by_index(slot)?;
            assert!(mig.is_mig_device()?, "case {case}");
            assert_eq!(mig.gpu_instance_id()?, gi, "case {case}");
            assert_eq!(mig.compute_instance_id()?, ci, "case {case}");
            assert_eq!(mig.uuid()?, uuid, "case {case}");
            assert_eq!(mig.name()?, name, "case {case}");
            assert_eq!(mig.memory_info()?.total, memory, "case {case}");
            assert_eq!(mig.parent()?, a100_mig, "case {case}");
            assert_eq!(mig.parent()?.uuid()?, UUID_B1, "case {case}");
            assert_eq!(mig.pci_info()?.bus_id, "00000000:B1:00.0", "case {case}");
        }

        let slot = |device: Device, slot| failure_code(device.mig_device_by_index(slot));
        // (case, result code, want)
        let failures = [
            ("empty slot", slot(a100_mig, 2)?, Return::NotFound),
            (
                "slot past the maximum",
                slot(a100_mig, 7)?,
                Return::InvalidArgument,
            ),
            ("MIG off", slot(a100, 0)?, Return::InvalidArgument),
            ("no MIG support", slot(t4, 0)?, Return::NotSupported),
            (
                "GPU instance id of a GPU",
                failure_code(a100.gpu_instance_id())?,
                Return::NotSupported,
            ),
            (
                "compute instance id of a GPU",
                failure_code(a100.compute_instance_id())?,
                Return::NotSupported,
            ),
            (
                "parent of a GPU",
                failure_code(a100.parent())?,
                Return::InvalidArgument,
            ),
        ];
        for (case, got, want) in failures {
            assert_eq!(got, want, "case {case}");
        }
        Ok(())
    })
}

#[test]
fn devices_are_found_by_uuid() -> TestResult {
    check_mock("devices_are_found_by_uuid", Node::standard, |nvml, _| {
        // (case, uuid, Ok(is MIG) or the error code)
        let cases = [
            ("GPU", UUID_0A, Ok(false)),
            ("MIG device", MIG_B1_2, Ok(true)),
            (
                "unknown GPU",
                "GPU-00000000-0000-0000-0000-000000000000",
                Err(Some(Return::NotFound)),
            ),
            ("interior NUL", "GPU-\0", Err(None)),
        ];
        for (case, uuid, want) in cases {
            match (nvml.device_by_uuid(uuid), want) {
                (Ok(device), Ok(is_mig)) => {
                    assert_eq!(device.uuid()?, uuid, "case {case}");
                    assert_eq!(device.is_mig_device()?, is_mig, "case {case}");
                }
                (Err(error), Err(code)) => assert_eq!(error.code(), code, "case {case}: {error}"),
                (got, want) => panic!("case {case}: got {got:?}, want {want:?}"),
            }
        }
        Ok(())
    })
}

#[test]
fn call_errors_carry_nvml_text() -> TestResult {
    check_mock("call_errors_carry_nvml_text", Node::standard, |nvml, _| {
        let t4 = nvml.device_by_uuid(UUID_0A)?;
        let cases = [
            (
                "index out of range",
                call_failure(nvml.device_by_index(99))?,
                (
                    "nvmlDeviceGetHandleByIndex_v2",
                    Return::InvalidArgument,
                    "Invalid Argument",
                ),
            ),
            (
                "unknown UUID",
                call_failure(nvml.device_by_uuid("GPU-nope"))?,
                ("nvmlDeviceGetHandleByUUID", Return::NotFound, "Not Found"),
            ),
            (
                "MIG mode of a T4",
                call_failure(t4.mig_mode())?,
                (
                    "nvmlDeviceGetMigMode",
                    Return::NotSupported,
                    "Not Supported",
                ),
            ),
        ];
        for (case, got, (function, code, message)) in cases {
            assert_eq!(got, (function, code, message.to_string()), "case {case}");
        }
        let error = nvml
            .device_by_index(99)
            .err()
            .ok_or("index 99 should fail")?;
        assert_eq!(
            error.to_string(),
            "nvmlDeviceGetHandleByIndex_v2 failed: Invalid Argument (NVML_ERROR_INVALID_ARGUMENT)"
        );
        Ok(())
    })
}

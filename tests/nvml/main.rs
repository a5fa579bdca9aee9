// SPDX-License-Identifier: Apache-2.0
//! `nvshim::nvml` and the NVML inventory backend against the mock `libnvidia-ml.so.1`
//! (`tests/mock-nvml`): enumeration, MIG, errors, events, the call log, library lookup
//! (`mock`), NVLink topology (`nvlink`) and the metrics exporter (`exporter`, whose output
//! `exposition` reads back). The mock reads its config from the environment at `nvmlInit`,
//! so each test re-runs this binary, filtered to itself, as a child with its node's env
//! ([`test_path`] names a test the way the harness lists it).

mod dashboard;
mod exporter;
mod exposition;
mod mock;
mod nvlink;
mod promql;

/// `name`, a test function in the module `module` (its `module_path!()`), as the test
/// harness names it: the module path without this crate's name, then the function.
pub fn test_path(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_crate, path)) => format!("{path}::{name}"),
        None => name.to_string(),
    }
}

/// The child's environment for a test on `sim`: the node's variables, `child_env` =
/// `test` (what tells the child it is one) and `nvml_env` = the node's NVML library.
pub fn child_env_on(
    sim: &nvshim_testkit::SimNode,
    test: &str,
    child_env: &str,
    nvml_env: &str,
) -> Vec<(String, std::ffi::OsString)> {
    let library = sim
        .lib_dir()
        .join(format!("libnvidia-ml.so.{}", sim.library_version()));
    sim.env()
        .into_iter()
        .map(|(k, v)| (k, v.into()))
        .chain([
            (child_env.to_owned(), test.into()),
            (nvml_env.to_owned(), library.into_os_string()),
        ])
        .collect()
}

/// Runs this test binary again as a child, filtered to the one test `test` (as
/// [`test_path`] names it), with `env` added and the mock's dev root taken out (the node's
/// env names it); an error with the child's output unless that test passed.
pub fn run_test_in_child<K, V>(
    test: &str,
    env: impl IntoIterator<Item = (K, V)>,
) -> Result<(), Box<dyn std::error::Error>>
where
    K: AsRef<std::ffi::OsStr>,
    V: AsRef<std::ffi::OsStr>,
{
    let output = std::process::Command::new(std::env::current_exe()?)
        .args([test, "--exact", "--nocapture", "--test-threads=1"])
        .envs(env)
        .env_remove("MOCK_NVML_DEV_ROOT")
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || !stdout.contains("1 passed") {
        return Err(format!(
            "child for {test} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            output.status
        )
        .into());
    }
    Ok(())
}

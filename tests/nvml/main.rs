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

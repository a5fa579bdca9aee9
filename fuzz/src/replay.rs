// SPDX-License-Identifier: Apache-2.0
//! Replays fuzz inputs through the targets' checks without the fuzzer. Included with
//! `#[path]` by `tests/security/fuzz_regressions.rs` (the core crate's targets) and by
//! `crates/device-plugin/tests/plugin/fuzz_regressions.rs` (the plugin's); `std` only.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// The files in `dir` but its README, sorted; none when it does not exist.
pub fn inputs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file() && p.file_name().is_some_and(|n| n != "README.md"))
        .collect();
    files.sort();
    files
}

/// A target's check: panics if the parser fails it on these bytes.
pub type Check = fn(&[u8]);

/// Runs each target's check on every file under `base/<target>/`; returns how many files
/// ran and a line for each one whose check panicked.
pub fn replay(base: &Path, targets: &[(&str, Check)]) -> (usize, Vec<String>) {
    let mut ran = 0;
    let mut failures = Vec::new();
    for (target, check) in targets {
        for path in inputs(&base.join(target)) {
            let bytes = fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            ran += 1;
            if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| check(&bytes))) {
                let message = payload
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| payload.downcast_ref::<&str>().copied())
                    .unwrap_or("(no message)");
                failures.push(format!("{target}: {}: {message}", path.display()));
            }
        }
    }
    (ran, failures)
}

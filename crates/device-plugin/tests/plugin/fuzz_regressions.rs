// SPDX-License-Identifier: Apache-2.0
//! Replays the device plugin's fuzz targets (`fuzz/src/plugin_checks.rs`) without the
//! fuzzer, as `tests/security/fuzz_regressions.rs` does for the core crate's: every seed
//! in `fuzz/corpus/<target>/` and every crash kept in
//! `tests/fixtures/fuzz-regressions/<target>/` goes through the target's check.

use std::fs;
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

#[path = "../../../../fuzz/src/plugin_checks.rs"]
mod plugin_checks;

/// The repository's root (this crate is `crates/device-plugin`).
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// A check: panics if the parser fails it on these bytes.
type Check = fn(&[u8]);

const TARGETS: &[(&str, Check)] = &[("http2_inbound", plugin_checks::http2_inbound)];

fn inputs(dir: &Path) -> Vec<PathBuf> {
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

fn replay(base: &str) -> (usize, Vec<String>) {
    let mut ran = 0;
    let mut failures = Vec::new();
    for (target, check) in TARGETS {
        for path in inputs(&Path::new(ROOT).join(base).join(target)) {
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

#[test]
fn seed_corpora_pass_the_plugin_checks() {
    let (ran, failures) = replay("fuzz/corpus");
    assert!(ran >= TARGETS.len(), "only {ran} seed inputs found");
    assert!(
        failures.is_empty(),
        "seed inputs failing:\n{}",
        failures.join("\n")
    );
}

#[test]
fn crashes_found_by_fuzzing_the_plugin_stay_fixed() {
    let (_, failures) = replay("tests/fixtures/fuzz-regressions");
    assert!(
        failures.is_empty(),
        "fuzz regressions failing:\n{}",
        failures.join("\n")
    );
}

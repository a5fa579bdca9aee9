// SPDX-License-Identifier: Apache-2.0
//! Replays the device plugin's fuzz targets (`fuzz/src/plugin_checks.rs`) without the
//! fuzzer, as `tests/security/fuzz_regressions.rs` does for the core crate's: every seed
//! in `fuzz/corpus/<target>/` and every crash kept in
//! `tests/fixtures/fuzz-regressions/<target>/` goes through the target's check.

use std::path::Path;

#[path = "../../../../fuzz/src/plugin_checks.rs"]
mod plugin_checks;
// Its `inputs` is for the core test; `replay`, `mutate` and `Check` are used here.
#[allow(dead_code)]
#[path = "../../../../fuzz/src/replay.rs"]
mod replay;

/// The repository's root (this crate is `crates/device-plugin`).
const ROOT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

const TARGETS: &[(&str, replay::Check)] = &[("http2_inbound", plugin_checks::http2_inbound)];

fn replay(base: &str) -> (usize, Vec<String>) {
    replay::replay(&Path::new(ROOT).join(base), TARGETS)
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
fn seed_variants_pass_the_plugin_checks() {
    let (ran, failures) = replay::mutate(&Path::new(ROOT).join("fuzz/corpus"), TARGETS, 3000);
    assert_eq!(ran, 3000 * TARGETS.len());
    assert!(
        failures.is_empty(),
        "seed variants failing ({} of {ran}):\n{}",
        failures.len(),
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

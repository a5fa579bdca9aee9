// SPDX-License-Identifier: Apache-2.0
//! Replays the fuzz targets' inputs without the fuzzer: every seed in `fuzz/corpus/<target>/`
//! and every crash kept in `tests/fixtures/fuzz-regressions/<target>/` goes through the same
//! check the fuzz target runs (`fuzz/src/checks.rs`: no panic, and each parser's round-trip
//! property). So a plain `cargo test` re-checks them, and a crash the fuzzer found stays
//! fixed.

use std::fs;
use std::path::Path;

#[path = "../../fuzz/src/checks.rs"]
mod checks;
#[path = "../../fuzz/src/replay.rs"]
mod replay;
// `checks::TARGETS` names the exporter's checks as `super::serve_checks`.
#[path = "../../fuzz/src/serve_checks.rs"]
mod serve_checks;

use replay::inputs;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Runs each target's check on every file under `base/<target>/` (a path from the repository root).
fn replay(base: &str) -> (usize, Vec<String>) {
    replay::replay(&Path::new(ROOT).join(base), checks::TARGETS)
}

#[test]
fn seed_corpora_pass_every_check() {
    let (ran, failures) = replay("fuzz/corpus");
    assert!(ran >= checks::TARGETS.len(), "only {ran} seed inputs found");
    assert!(
        failures.is_empty(),
        "seed inputs failing:\n{}",
        failures.join("\n")
    );
}

/// Variants of the seeds per target in [`seed_variants_pass_every_check`]: the suite's
/// stand-in for a fuzz run (`make fuzz` is the real one).
const VARIANTS_PER_TARGET: usize = 3000;

#[test]
fn seed_variants_pass_every_check() {
    let (ran, failures) = replay::mutate(
        &Path::new(ROOT).join("fuzz/corpus"),
        checks::TARGETS,
        VARIANTS_PER_TARGET,
    );
    assert_eq!(ran, VARIANTS_PER_TARGET * checks::TARGETS.len());
    assert!(
        failures.is_empty(),
        "seed variants failing ({} of {ran}):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn every_target_has_seeds() {
    for (target, _) in checks::TARGETS {
        let dir = Path::new(ROOT).join("fuzz/corpus").join(target);
        assert!(
            !inputs(&dir).is_empty(),
            "case {target}: no seeds in {}",
            dir.display()
        );
    }
}

#[test]
fn every_fuzz_target_is_replayed() {
    let dir = Path::new(ROOT).join("fuzz/fuzz_targets");
    let mut on_disk: Vec<String> = inputs(&dir)
        .iter()
        .filter_map(|p| Some(p.file_stem()?.to_str()?.to_owned()))
        .collect();
    on_disk.sort();
    let mut replayed: Vec<String> = checks::TARGETS
        .iter()
        .map(|(t, _)| t.to_string())
        .chain(checks::PLUGIN_TARGETS.iter().map(|t| t.to_string()))
        .collect();
    replayed.sort();
    assert_eq!(
        on_disk, replayed,
        "fuzz/fuzz_targets/ and checks::TARGETS + PLUGIN_TARGETS differ"
    );
    // Each target is one line around the check these tests run (so `make test` need not
    // build the targets with cargo-fuzz to know they still compile), and fuzz/Cargo.toml
    // builds it.
    let manifest = fs::read_to_string(Path::new(ROOT).join("fuzz/Cargo.toml")).unwrap();
    for target in &on_disk {
        let module = if checks::PLUGIN_TARGETS.contains(&target.as_str()) {
            "plugin_checks"
        } else {
            "checks"
        };
        let source = fs::read_to_string(dir.join(format!("{target}.rs"))).unwrap();
        let code: Vec<&str> = source
            .lines()
            .filter(|l| !l.is_empty() && !l.starts_with("//") && !l.starts_with("#!"))
            .collect();
        assert_eq!(
            code,
            [format!(
                "libfuzzer_sys::fuzz_target!(|data: &[u8]| nvshim_fuzz::{module}::{target}(data));"
            )],
            "case {target}: fuzz/fuzz_targets/{target}.rs is not the one-line wrapper"
        );
        let bin = format!("name = \"{target}\"\npath = \"fuzz_targets/{target}.rs\"");
        assert!(
            manifest.contains(&bin),
            "case {target}: fuzz/Cargo.toml has no [[bin]] with {bin:?}"
        );
    }
}

#[test]
fn crashes_found_by_fuzzing_stay_fixed() {
    let (_, failures) = replay("tests/fixtures/fuzz-regressions");
    assert!(
        failures.is_empty(),
        "fuzz regressions failing:\n{}",
        failures.join("\n")
    );
}

#[test]
fn regression_directories_name_real_targets() {
    let base = Path::new(ROOT).join("tests/fixtures/fuzz-regressions");
    let Ok(entries) = fs::read_dir(&base) else {
        return;
    };
    for entry in entries.filter_map(Result::ok) {
        if entry.path().is_dir() {
            let name = entry.file_name().to_string_lossy().into_owned();
            assert!(
                checks::TARGETS.iter().any(|(t, _)| *t == name)
                    || checks::PLUGIN_TARGETS.contains(&name.as_str()),
                "case {name}: {} is not a fuzz target's name",
                entry.path().display()
            );
        }
    }
}

/// The `config_json` check's own check: on a real spec it sees the edits applied, and it
/// notices an untouched field that changed, moved or went missing.
#[test]
fn the_rewrite_check_notices_changed_fields() {
    let path = Path::new(ROOT).join("fuzz/corpus/config_json/docker.json");
    let bytes = fs::read(&path).expect("docker.json seed");
    let original: serde_json::Value = serde_json::from_slice(&bytes).expect("docker.json");
    let edits = checks::fixed_edits();
    let mut edited = original.clone();
    nvshim::inject::apply(&mut edited, &edits).expect("edits apply to docker.json");
    assert_ne!(edited, original, "the edits changed nothing");
    assert_eq!(checks::kept_in_place(&original, &edited, &edits), Ok(()));

    type Tamper = fn(&mut serde_json::Value);
    let tamper: [(&str, Tamper); 5] = [
        ("hostname changed", |v| v["hostname"] = "other".into()),
        ("env entry dropped", |v| {
            if let Some(env) = v["process"]["env"].as_array_mut() {
                env.remove(0);
            }
        }),
        ("mount moved", |v| {
            if let Some(mounts) = v["mounts"].as_array_mut() {
                mounts.swap(0, 1);
            }
        }),
        ("key order changed", |v| {
            if let Some(root) = v.as_object_mut()
                && let Some(version) = root.shift_remove("ociVersion")
            {
                root.insert("ociVersion".into(), version);
            }
        }),
        ("linux field dropped", |v| {
            if let Some(linux) = v["linux"].as_object_mut() {
                linux.shift_remove("namespaces");
            }
        }),
    ];
    for (case, change) in tamper {
        let mut changed = edited.clone();
        change(&mut changed);
        assert!(
            checks::kept_in_place(&original, &changed, &edits).is_err(),
            "case {case}: not noticed"
        );
    }
}

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

/// Runs each target's check on `per_target` variants of its seeds under `base/<target>/`:
/// each variant is a seed with one to four random edits (a flipped bit, a byte set to one
/// that parsers treat specially, a byte inserted, a range deleted or repeated, the end cut,
/// a piece of another seed spliced in). A blind, cheap stand-in for the fuzzer inside the
/// test suite (`make fuzz` runs libFuzzer with coverage); the random stream is fixed, so a
/// failure repeats. Returns how many variants ran and a line for each one whose check
/// panicked, with the variant's bytes in hex.
pub fn mutate(base: &Path, targets: &[(&str, Check)], per_target: usize) -> (usize, Vec<String>) {
    let mut ran = 0;
    let mut failures = Vec::new();
    for (t, (target, check)) in targets.iter().enumerate() {
        let seeds: Vec<Vec<u8>> = inputs(&base.join(target))
            .iter()
            .map(|p| fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
            .collect();
        if seeds.is_empty() {
            continue;
        }
        let mut rng = SplitMix(0x6e76_7368_696d ^ ((t as u64) << 32));
        for n in 0..per_target {
            let mut data = seeds[n % seeds.len()].clone();
            for _ in 0..=rng.below(4) {
                edit(&mut data, &seeds, &mut rng);
            }
            ran += 1;
            if panic::catch_unwind(AssertUnwindSafe(|| check(&data))).is_err() {
                let hex: String = data.iter().take(512).map(|b| format!("{b:02x}")).collect();
                failures.push(format!(
                    "{target}: variant {n} ({} bytes): {hex}",
                    data.len()
                ));
            }
        }
    }
    (ran, failures)
}

/// Bytes that JSON, YAML, TOML, env lists and the ld.so.cache format give a meaning.
const SPECIAL: &[u8] = b"\0\x01\x7f\xff\"'\\{}[]:,=#&*!|>-. \t\n\r/0129aZ";

fn edit(data: &mut Vec<u8>, seeds: &[Vec<u8>], rng: &mut SplitMix) {
    let len = data.len();
    let at = rng.below(len + 1);
    match rng.below(7) {
        0 if len > 0 => data[at.min(len - 1)] ^= 1 << rng.below(8),
        1 if len > 0 => data[at.min(len - 1)] = SPECIAL[rng.below(SPECIAL.len())],
        2 => data.insert(at, SPECIAL[rng.below(SPECIAL.len())]),
        3 => {
            let end = (at + 1 + rng.below(16)).min(len);
            data.drain(at.min(end)..end);
        }
        4 => {
            let end = (at + 1 + rng.below(32)).min(len);
            let piece: Vec<u8> = data[at.min(end)..end].to_vec();
            let to = rng.below(data.len() + 1);
            data.splice(to..to, piece);
        }
        5 => data.truncate(at),
        _ => {
            let other = &seeds[rng.below(seeds.len())];
            let from = rng.below(other.len() + 1);
            let end = (from + 1 + rng.below(64)).min(other.len());
            data.splice(at..at, other[from..end].iter().copied());
        }
    }
}

/// splitmix64: a fixed, dependency-free random stream.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number below `n` (0 when `n` is 0).
    fn below(&mut self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            (self.next() % n as u64) as usize
        }
    }
}

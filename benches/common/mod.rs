//! What the process benchmarks (`create`, `hook`) share: which runtime binary, how many
//! rounds, and the statistics they print.

#![allow(dead_code)]

use std::time::Duration;

/// `$NVSHIM_BENCH_RUNTIME` (`make bench` sets it to the static build packages install)
/// or cargo's build of the runtime.
pub fn runtime() -> String {
    std::env::var("NVSHIM_BENCH_RUNTIME")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nvidia-container-runtime").to_string())
}

/// `$NVSHIM_BENCH_ROUNDS`, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("NVSHIM_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

pub fn median(v: &[Duration]) -> Duration {
    pct(v, 50)
}

/// The `p`th percentile (nearest rank below).
pub fn pct(v: &[Duration], p: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[(v.len() - 1) * p / 100]
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

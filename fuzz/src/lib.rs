// SPDX-License-Identifier: Apache-2.0
//! The checks the fuzz targets run; `tests/security/fuzz_regressions.rs` replays them on the
//! seed corpora and on every crash kept under `tests/fixtures/fuzz-regressions/`.

pub mod checks;
pub mod plugin_checks;
pub mod serve_checks;

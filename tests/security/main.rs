// SPDX-License-Identifier: Apache-2.0
//! The attack regression suite (scenarios S1–S12 of `docs/security.md`): hostile images
//! and hostile hosts against real containers through our runtime and hook, built on one
//! harness (`harness`); and the fuzz targets' seeds and every crash they ever found,
//! replayed without the fuzzer (`fuzz_regressions`). One test binary, so the library is
//! linked once for all of them.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod harness;

mod devices;
mod env;
mod fuzz_regressions;
mod leaks;
mod links;
mod mounts;
mod race;

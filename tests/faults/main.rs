// SPDX-License-Identifier: Apache-2.0
//! Faults around `nvidia-container-runtime create` on a simulated node, with the real
//! runtime binary and a stand-in runc (`kit`): unreadable or huge specs, a missing runc,
//! an unwritable log (`create`), a full or read-only disk (`disk`), `kill -9` mid-create
//! (`kill`), a hanging NVML (`nvml`). One test binary, so the library is linked once for
//! all of them.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod kit;

mod create;
mod disk;
mod kill;
mod nvml;

// SPDX-License-Identifier: Apache-2.0
//! `nvidia-container-runtime` as a process: the shim on its own, under real runc, docker,
//! containerd and podman, with CDI names, over the captured `config.json` corpus, the
//! driver's device-file parameter, a soak, and installed into a toolkit dir by `nvshim install`
//! for a containerd and a dockerd to run. One test binary, so the library is linked
//! once for all of them (`make test` reruns `shim`, `runc` and `driver_params` against the
//! static runtime and hook that packages install).

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod cdi;
mod cdi_podman;
mod classes;
mod containerd;
mod corpus;
mod docker;
mod doctor_in_container;
mod driver_params;
mod driver_stage;
mod graphics;
mod installer;
mod mig_access;
mod runc;
mod shim;
mod soak;
mod tegra;
mod wsl;

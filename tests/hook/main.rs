// SPDX-License-Identifier: Apache-2.0
//! `nvidia-container-runtime-hook`: the prestart hook under real runc and real engines,
//! against hostile images, and its cgroup device step against the real kernel. One test
//! binary, so the library is linked once for all of them (`make test` reruns `prestart`,
//! `engines` and `security` against the static hook that packages install).

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod cgroup2;
mod classes;
mod dev_char;
mod engines;
mod graphics;
mod prestart;
mod privileges;
mod security;
mod tegra;
mod wsl;

// SPDX-License-Identifier: Apache-2.0
//! The admin CLI `nvshim` through the real binary on simulated nodes: `info` and `list`,
//! `configure` (with the engines it configures), `doctor`, `labels`, the CDI specs
//! `cdi generate` writes, the packages that ship it all, the docs against the flags
//! and keys the binaries define, and the core library's dependency tree. One test binary, so the
//! library is linked once for all of them.

#![allow(clippy::expect_used, clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;

mod cdi_csv;
mod cdi_graphics;
mod cdi_hook_name;
mod cdi_schema;
mod classes;
mod configure;
mod core_deps;
mod ctk_system;
mod ctk_wsl;
mod docs_env;
mod docs_flags;
mod doctor;
mod exporter_unit;
mod info_list;
mod labels;
mod labels_gfd;
mod labels_node_feature;
mod nvidia_names;
mod packages;

//! nvshim: NVIDIA GPUs in containers.
//!
//! One idea runs through the crate: a container's GPU request becomes a list of
//! container edits (CDI-shaped: device nodes, mounts, hooks, env), and every front end
//! is a thin way of producing or applying that list.
//!
//! The modules below are declared in floors, lowest first, one group of `pub mod`
//! lines per floor: a module uses only modules on floors below its own, never one
//! beside it or above (`layering_tests` reads this file and holds the code to it).
//!
//! ```text
//! bump, files, logging, roots   leaves: the static binaries' allocator, small-file reads
//! kubelet, metrics_server       and atomic replacement, tracing set-up, host roots; a
//!                               blocking pod-resources client; a small /metrics HTTP server
//! bundle, cdi, ldcache, nvml    config.json as JSON and the OCI state; CDI wire types;
//!                               the ld.so.cache format; NVML
//! exporter                      NVML readings → dcgm-exporter's metrics (Prometheus text)
//! request                       ContainerInputs → Request: devices, capabilities, NVIDIA_REQUIRE_*
//! config, k8s_config            config.toml with NVIDIA's keys; the config file NVIDIA's
//!                               device plugin and GFD share
//! inventory                     GPUs + MIG devices + driver version (procfs or NVML)
//! select                        request × inventory → Selection
//! discover                      Selection + capabilities → HostResources (files, nodes)
//! device_nodes                  the host's NVIDIA device nodes outside any container:
//!                               listing, mknod, modprobe, /dev/char links
//! hook_contract                 the hook binaries, stages and arguments: one spelling for
//!                               the edit builders that write hooks and the hook that reads
//! edits                         HostResources → ContainerEdits (pure, stable order)
//! inject, rootfs                ContainerEdits → an OCI spec (JSON), the only spec writer
//!                               (the "already injected" mark included); safe paths
//!                               inside a container's root
//! driver_stage                  read-only driver files gathered in one host tmpfs, bound
//!                               once, linked at their usual paths (runtime create)
//! pipeline                      stage() + finish(): the one path through all of the above
//! container                     spec + config → Prepared { request, plan }, or no GPU, or
//!                               "needs NVML" (decided before planning): the front half
//!                               the runtime and the hook share
//! generate, hook, runtime       the front ends, none using another: plans → a CDI spec for
//!                               this host; the prestart hook and the createContainer hooks
//!                               of our CDI specs; the runc shim (argv, create, exec)
//! cli                           the admin CLI `nvshim`, on top of everything
//! ```
//!
//! The kubelet device plugin is its own crate (`crates/device-plugin`, with tokio, tonic
//! and hyper), built on this one; this library links no async stack, so neither do the
//! static runtime and hook (`tests/cli/core_deps.rs` holds it to that).

pub mod bump;
pub mod files;
pub mod kubelet;
pub mod logging;
pub mod metrics_server;
pub mod roots;

pub mod bundle;
pub mod cdi;
pub mod ldcache;
pub mod nvml;

// The dcgm-exporter-compatible metrics core (NVML readings to Prometheus text).
pub mod exporter;

pub mod request;

pub mod config;
pub mod k8s_config;

pub mod inventory;

pub mod select;

pub mod discover;

pub mod device_nodes;

pub mod hook_contract;

pub mod edits;

pub mod driver_stage;
pub mod inject;
pub mod rootfs;

pub mod pipeline;

pub mod container;

pub mod generate;
pub mod hook;
pub mod runtime;

pub mod cli;

pub mod container_cli;
pub mod ctk;
pub mod docker_wrapper;

#[cfg(test)]
mod layering_tests;

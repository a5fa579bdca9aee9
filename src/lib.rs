//! nvshim: NVIDIA GPUs in containers.
//!
//! One idea runs through the crate: a container's GPU request becomes a list of
//! container edits (CDI-shaped: device nodes, mounts, hooks, env), and every front end
//! is a thin way of producing or applying that list. Modules are listed in pipeline
//! order; a module uses only modules above it.
//!
//! ```text
//! roots, files, ldcache, nvml, cdi   leaves: paths, small-file reads and atomic replacement,
//!                                    the ld.so.cache format,
//!                                    NVML, CDI wire types
//! bundle                             config.json as JSON (tolerant views, atomic write), OCI state
//! request                            ContainerInputs → Request: devices, capabilities, NVIDIA_REQUIRE_*
//! config, k8s_config                 /etc/nvidia-container-runtime/config.toml, NVIDIA's keys;
//!                                    the config file NVIDIA's device plugin and GFD share
//! inventory                          GPUs + MIG devices + driver version (procfs or NVML)
//! select                             request × inventory → Selection
//! discover                           Selection + capabilities → HostResources (files, nodes)
//! edits                              HostResources → ContainerEdits (pure, stable order)
//! inject                             ContainerEdits → an OCI spec (JSON), the only spec writer
//! pipeline                           plan(): the one path through all of the above
//! runtime                            the runc shim: argv, create, low-level runtime, exec
//! hook                               the prestart hook docker's --gpus adds, and the
//!                                    createContainer hook of our CDI specs (link-driver)
//! generate                           plans → a CDI spec for this host (nvshim cdi generate)
//! logging, cli, bump                 front-end plumbing (bump: the static binaries' allocator)
//! ```
//!
//! The kubelet device plugin is its own crate (`crates/device-plugin`, with tokio, tonic
//! and hyper), built on this one; this library links no async stack, so neither do the
//! static runtime and hook (`tests/core_deps.rs` holds it to that).

pub mod files;
pub mod roots;

pub mod bundle;
pub mod cdi;
pub mod ldcache;
pub mod nvml;

pub mod request;

pub mod config;
pub mod k8s_config;

pub mod inventory;

pub mod select;

pub mod discover;

pub mod edits;

pub mod inject;
pub mod rootfs;

pub mod pipeline;

pub mod runtime;

pub mod generate;
pub mod hook;

pub mod bump;
pub mod cli;
pub mod logging;

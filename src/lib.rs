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
//! config                             /etc/nvidia-container-runtime/config.toml, NVIDIA's keys
//! inventory                          GPUs + MIG devices + driver version (procfs or NVML)
//! select                             request × inventory → Selection
//! discover                           Selection + capabilities → HostResources (files, nodes)
//! edits                              HostResources → ContainerEdits (pure, stable order)
//! hook_contract                      the hook binaries, stages and arguments: one spelling for
//!                                    the edit builders that write hooks and the hook that reads
//! inject                             ContainerEdits → an OCI spec (JSON), the only spec writer
//!                                    (the "already injected" mark included)
//! pipeline                           plan(): the one path through all of the above
//! container                          spec + config → Prepared { request, plan }, or no GPU, or
//!                                    "needs NVML" (decided before planning): the front half
//!                                    the runtime and the hook share
//! runtime                            the runc shim: argv, create, low-level runtime, exec
//! hook                               the prestart hook docker's --gpus adds, and the
//!                                    createContainer hook of our CDI specs (link-driver)
//! generate                           plans → a CDI spec for this host (nvshim cdi generate)
//! plugin                             the kubelet device plugin (its own pipeline: config,
//!                                    resources, health, allocate, preferred, server)
//! logging, cli, bump                 front-end plumbing (bump: the static binaries' allocator)
//! ```

pub mod files;
pub mod roots;

pub mod bundle;
pub mod cdi;
pub mod ldcache;
pub mod nvml;

pub mod request;

pub mod config;

pub mod inventory;

pub mod select;

pub mod discover;

pub mod edits;

pub mod hook_contract;

pub mod inject;
pub mod rootfs;

pub mod pipeline;

pub mod container;

pub mod runtime;

pub mod generate;
pub mod hook;
pub mod plugin;

pub mod bump;
pub mod cli;
pub mod logging;

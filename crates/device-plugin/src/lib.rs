// SPDX-License-Identifier: Apache-2.0
//! The kubelet device plugin behind `nvidia-device-plugin`: a crate of its own on top of
//! the core `nvshim` library (inventory, NVML, discovery, CDI), so that the async stack
//! it needs (tokio, tonic, hyper, prometheus-client) stays out of the core library and of
//! the static runtime and hook built from it.
//!
//! It advertises the node's GPUs (or MIG devices, or time-sliced or MPS replicas of them) to
//! kubelet over the v1beta1 device-plugin API and answers `Allocate` with what our
//! runtime turns into GPUs (by default `NVIDIA_VISIBLE_DEVICES`). The pieces, in order:
//!
//! ```text
//! config      flags > env > YAML file > defaults → Settings (immutable); the file's
//!             format is the core's `nvshim::k8s_config`, shared with `nvshim labels`
//! resources   Inventory × Settings → Vec<Resource> (device ids, replicas, MIG, NUMA)
//! health      NVML XID events → HealthBoard (per physical unit, recovers on re-probe)
//! http2       the :authority fix in front of h2 (any client's socket-path authority works)
//! imex        the IMEX channels that exist, checked at start
//! allocate    ids → what the container gets, by device-list strategy
//! cdi_spec    the CDI spec file that defines the names the cdi-* strategies hand out
//! mps         MPS sharing: NVIDIA's paths and limits
//! preferred   GetPreferredAllocation over a topology cached at start
//! api         the generated kubelet gRPC types and services
//! server      the DevicePlugin service, serving, registration, kubelet restarts
//! metrics     Prometheus /metrics (off by default): NVML readings per GPU, XIDs, pod
//!             labels from kubelet's pod-resources API, the server's counters
//! topology    the NVLink/PCIe topology preferred reads
//! node        the plugin's run: settings → resources → health → server, SIGHUP reloads
//! mps_daemon  the mps-control-daemon mode: start, configure, supervise, stop (no async)
//! ```
//!
//! The imports between these modules form no circle (`mps_daemon` sits on `node`, not
//! inside `mps`, which `allocate` uses), nor do `server`'s submodules' (`round` serves
//! a `service`; the options both answer with are `service`'s).
//!
//! Only `server` and `metrics` know about tokio (and `server` about the device-plugin
//! gRPC API); everything above them is plain data and functions, tested without a
//! socket.

pub mod allocate;
pub mod api;
pub mod cdi_spec;
pub mod config;
pub mod health;
pub mod imex;
/// The `:authority` fix, its own crate (sans-IO, no async stack: the fuzz target links it alone).
pub use nvshim_http2_authority as http2;
pub mod metrics;
pub mod mps;
pub mod mps_daemon;
pub mod node;
pub mod preferred;
pub mod resources;
pub mod server;
pub mod topology;

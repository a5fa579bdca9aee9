// SPDX-License-Identifier: Apache-2.0
//! MPS sharing: what NVIDIA's plugin and its `mps-control-daemon` agree on (the daemon
//! mode itself is `crate::mps_daemon`, which runs on top of `node`).
//!
//! With `sharing.mps`, every shared resource gets one MPS control daemon
//! (`nvidia-cuda-mps-control -d`) whose pipe directory is `<mpsRoot>/<resource>/pipe`
//! on the host; `Allocate` mounts that directory (and `<mpsRoot>/shm`) into the
//! container and points CUDA at it. `<resource>` is the advertised name
//! (`nvidia.com/gpu`, or `nvidia.com/gpu.shared` with `renameByDefault`), so the
//! daemon and the plugin, which both build the resources from the same settings, name
//! the same directory.
//!
//! NVIDIA's names and paths; [`Limits`]: the per-replica SM and memory shares.
//!
//! Pure here: paths and numbers from a [`Resource`]; no I/O.

use std::path::{Path, PathBuf};

use crate::resources::{Device, Resource};

/// The MPS control binary, looked up on `PATH` and in the driver root's bin dirs.
pub const CONTROL_BINARY: &str = "nvidia-cuda-mps-control";
/// The pid file the control daemon writes into its pipe directory.
pub const PID_FILE: &str = "nvidia-cuda-mps-control.pid";
/// Where the daemon's clients find its pipes.
pub const ENV_PIPE_DIRECTORY: &str = "CUDA_MPS_PIPE_DIRECTORY";
/// Where the daemon writes its logs.
pub const ENV_LOG_DIRECTORY: &str = "CUDA_MPS_LOG_DIRECTORY";
/// A client's share of the SMs, in percent.
pub const ENV_ACTIVE_THREAD_PERCENTAGE: &str = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE";
/// A client's device memory limit per device: `<ordinal>=<n>M`, comma-separated.
pub const ENV_PINNED_DEVICE_MEM_LIMIT: &str = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT";
/// The GPUs the daemon serves.
pub const ENV_CUDA_VISIBLE_DEVICES: &str = "CUDA_VISIBLE_DEVICES";
/// Where the per-resource directories appear in a container.
pub const CONTAINER_ROOT: &str = "/mps";
/// Where `<mpsRoot>/shm` is mounted in a container: MPS clients and the server share
/// memory through it.
pub const CONTAINER_SHM: &str = "/dev/shm";
/// `<mpsRoot>/<resource>/pipe`.
pub const PIPE_DIR: &str = "pipe";
/// `<mpsRoot>/<resource>/log`.
pub const LOG_DIR: &str = "log";
/// `<mpsRoot>/shm`.
pub const SHM_DIR: &str = "shm";
/// `<mpsRoot>/<resource>/.started`: written once the daemon is up and configured.
pub const STARTED_FILE: &str = ".started";
/// Control commands, as `nvidia-cuda-mps-control` reads them on stdin.
pub const SET_ACTIVE_THREAD_PERCENTAGE: &str = "set_default_active_thread_percentage";
pub const SET_PINNED_MEM_LIMIT: &str = "set_default_device_pinned_mem_limit";
pub const QUIT: &str = "quit";

/// `<root>/<resource>` on the host (or, with [`CONTAINER_ROOT`], in a container).
pub fn resource_dir(root: &Path, resource: &str) -> PathBuf {
    root.join(resource)
}

/// `<root>/<resource>/pipe`.
pub fn pipe_dir(root: &Path, resource: &str) -> PathBuf {
    resource_dir(root, resource).join(PIPE_DIR)
}

/// `<root>/<resource>/log`.
pub fn log_dir(root: &Path, resource: &str) -> PathBuf {
    resource_dir(root, resource).join(LOG_DIR)
}

/// What each replica of an MPS-shared resource may use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// `100 / replicas`, at least 1.
    pub active_thread_percentage: u32,
    /// Per device, in the order CUDA numbers the devices (ordinal, MiB per replica);
    /// devices whose memory the inventory does not know are left out.
    pub pinned_mem_mib: Vec<(usize, u64)>,
}

impl Limits {
    /// The limits for `units` (one device per GPU, in the order the daemon or the
    /// container sees them: CUDA numbers them 0, 1, … in that order) of a resource
    /// shared `replicas` ways.
    pub fn new(replicas: u32, units: &[&Device]) -> Self {
        let replicas = replicas.max(1);
        Self {
            active_thread_percentage: (100 / replicas).max(1),
            pinned_mem_mib: units
                .iter()
                .enumerate()
                .filter_map(|(ordinal, d)| {
                    d.memory_mib.map(|mib| (ordinal, mib / u64::from(replicas)))
                })
                .collect(),
        }
    }

    /// The limits for the whole resource, as its daemon applies them.
    pub fn of(resource: &Resource) -> Self {
        let mut seen = std::collections::HashSet::new();
        let units: Vec<&Device> = resource
            .devices
            .iter()
            .filter(|d| seen.insert(d.unit))
            .collect();
        Self::new(resource.replicas.unwrap_or(1), &units)
    }

    /// `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`'s value: `0=20000M,1=20000M`.
    pub fn pinned_env(&self) -> String {
        let items: Vec<String> = self
            .pinned_mem_mib
            .iter()
            .map(|(ordinal, mib)| format!("{ordinal}={mib}M"))
            .collect();
        items.join(",")
    }

    /// The control commands that make these the daemon's defaults, in NVIDIA's order
    /// of meaning (the thread share, then each device's memory).
    pub fn commands(&self) -> Vec<String> {
        let mut out = vec![format!(
            "{SET_ACTIVE_THREAD_PERCENTAGE} {}",
            self.active_thread_percentage
        )];
        for (ordinal, mib) in &self.pinned_mem_mib {
            out.push(format!("{SET_PINNED_MEM_LIMIT} {ordinal} {mib}M"));
        }
        out
    }
}

#[cfg(test)]
mod tests;

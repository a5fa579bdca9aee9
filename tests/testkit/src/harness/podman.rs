// SPDX-License-Identifier: Apache-2.0
//! podman on private storage, for the tests where podman resolves a CDI spec
//! (`tests/cdi_podman.rs`, the device plugin's `tests/plugin/cdi.rs`): the machine's
//! working flags, an image of the node's container rootfs, the run flags that hand a
//! container the mock NVML, and cleanup of what podman leaves.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::tar_rootfs;

use super::Node;

/// Fails the test, naming the package, when podman is missing.
pub fn require_podman() {
    let found = Command::new("podman").arg("--version").output();
    assert!(
        found.as_ref().is_ok_and(|o| o.status.success()),
        "podman is needed (the Debian package `podman`): {found:?}"
    );
}

/// `podman` with private storage under `dir` and the machine's working flags.
pub fn podman(dir: &Path) -> Command {
    let mut cmd = Command::new("podman");
    cmd.arg("--root")
        .arg(dir.join("root"))
        .arg("--runroot")
        .arg(dir.join("runroot"))
        .arg("--tmpdir")
        .arg(dir.join("tmp"))
        .args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"])
        .args(["--events-backend", "file"]);
    cmd
}

/// Removes the containers and unmounts what podman left under its storage `dir`.
pub struct PodmanStorage(pub PathBuf);

impl Drop for PodmanStorage {
    fn drop(&mut self) {
        let _ = podman(&self.0).args(["rm", "-af"]).output();
        let _ = podman(&self.0).args(["system", "reset", "-f"]).output();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mountinfo
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|p| Path::new(p).starts_with(&self.0))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for p in points {
            let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Storage under `dir/podman` holding `image`: the node's container rootfs (glibc,
/// `nvidia-smi` linked against the mock), imported from a tar.
pub fn storage_with_image(node: &Node, dir: &Path, image: &str) -> PodmanStorage {
    let rootfs = dir.join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let tar = dir.join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    let storage = PodmanStorage(dir.join("podman"));
    let import = podman(&storage.0)
        .arg("import")
        .arg(&tar)
        .arg(image)
        .output()
        .expect("podman");
    super::ok(import, "podman import");
    storage
}

/// `podman run` flags for a GPU container on `node`: no network, the limits this
/// machine needs, and the mock NVML's config (the mock reads its GPUs from it and
/// reports those whose `/dev/nvidia<minor>` the container has).
pub fn run_args(node: &Node) -> Vec<String> {
    let mock_volume = format!("{}:/etc/mock-nvml.json:ro", node.sim.mock_config.display());
    [
        "run",
        "--rm",
        "--network",
        "none",
        "--ulimit",
        "nofile=1024:1024",
        "--ulimit",
        "nproc=1024:1024",
        "-v",
        &mock_volume,
        "-e",
        "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
        "-e",
        "MOCK_NVML_DEV_ROOT=/dev",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

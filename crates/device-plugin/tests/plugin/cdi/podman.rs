// SPDX-License-Identifier: Apache-2.0
//! podman resolves the name `Allocate` returned from the plugin's spec in the host's
//! `/var/run/cdi`, with the driver seen by the plugin at another path.

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};
use nix::sys::signal::Signal;
use nvshim_device_plugin::config::CDI_SPEC_FILE;
use nvshim_testkit::NodeSpec;

use super::binary::{allocate, read_spec, spawn};
use super::{GENEROUS, GPU_SOCKET, KIND, host_paths};
use crate::common::kubelet::FakeKubelet;
use crate::common::podman::{podman, require_podman, run_args, storage_with_image};
use crate::common::{GPU_SCRIPT, Printed, node};
/// Held (exclusive `flock`) by every test that writes into the system's CDI directories.
const LOCK: &str = "/run/lock/nvshim-cdi-test.lock";
/// Where podman 4.3 reads specs that change at run time.
const SYSTEM_CDI_DIR: &str = "/var/run/cdi";
const IMAGE: &str = "localhost/nvshim-plugin-cdi:glibc";

/// [`SYSTEM_CDI_DIR`] claimed under [`LOCK`]. Dropping it (even on a panic, after the
/// plugin was killed and could not remove its spec) removes the spec and, if the test
/// made it, the directory, then releases the lock.
struct SystemDir {
    made_dir: bool,
    _lock: Flock<File>,
}

impl SystemDir {
    /// Takes the lock, after checking that no live spec of the plugin's kind is in
    /// [`SYSTEM_CDI_DIR`] (a real node's, which ours would replace). One whose device
    /// nodes are gone (a killed run's, on a simulated node since deleted) is removed.
    fn claim() -> SystemDir {
        fs::create_dir_all(Path::new(LOCK).parent().unwrap()).unwrap();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .unwrap();
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("{LOCK}: {e}"));
        let path = Self::spec();
        if path.exists() {
            let spec = read_spec(&path);
            let (_, nodes) = host_paths(&spec);
            assert!(
                !nodes.is_empty() && nodes.iter().all(|n| !Path::new(n).exists()),
                "refusing to run: {} is a live spec of {KIND}, which ours would replace",
                path.display()
            );
            fs::remove_file(&path).unwrap();
        }
        SystemDir {
            made_dir: !Path::new(SYSTEM_CDI_DIR).exists(),
            _lock: lock,
        }
    }

    fn spec() -> PathBuf {
        Path::new(SYSTEM_CDI_DIR).join(CDI_SPEC_FILE)
    }
}

impl Drop for SystemDir {
    fn drop(&mut self) {
        // Under the lock the file is this test's plugin's.
        let _ = fs::remove_file(Self::spec());
        if self.made_dir {
            // Fails, as it should, if something else has put a file there meanwhile.
            let _ = fs::remove_dir(SYSTEM_CDI_DIR);
        }
    }
}

/// Unmounts a bind mount when dropped (even on panic).
struct BindMount(PathBuf);

impl Drop for BindMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[tokio::test]
async fn podman_gives_the_container_the_gpu_allocate_named() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (device nodes, /var/run/cdi, podman)"
    );
    require_podman();
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let storage = storage_with_image(&node, dir.path(), IMAGE);
    let system = SystemDir::claim();

    // The plugin sees the driver at a bind mount, as in a pod; the spec must name the
    // host's paths, which stay after the view is gone.
    let view = dir.path().join("driver-root");
    fs::create_dir(&view).unwrap();
    nix::mount::mount(
        Some(&node.sim.driver_root),
        &view,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND | nix::mount::MsFlags::MS_REC,
        None::<&str>,
    )
    .unwrap();
    let mounted = BindMount(view.clone());
    let sockets = dir.path().join("plugins");
    fs::create_dir(&sockets).unwrap();
    let kubelet = FakeKubelet::start(&sockets);
    let hook = crate::common::hook_bin();
    let view_arg = view.display().to_string();
    let mut plugin = spawn(
        &node,
        &sockets,
        &[
            "--device-list-strategy=cdi-annotations,cdi-cri",
            "--cdi-spec-dir",
            SYSTEM_CDI_DIR,
            "--cdi-hook-path",
            &hook,
            "--container-driver-root",
            &view_arg,
        ],
    );
    kubelet.wait_registrations(1, GENEROUS).await;
    let uuid = node.sim.spec.gpus[2].uuid.clone();
    let names = allocate(&sockets.join(GPU_SOCKET), &[&uuid]).await;
    assert_eq!(names, [format!("{KIND}={uuid}")], "{}", plugin.log());
    drop(mounted);
    fs::remove_dir(&view).unwrap();

    let out = podman(&storage.0)
        .args(run_args(&node))
        .arg("--device")
        .arg(&names[0])
        .args([IMAGE, "sh", "-c", GPU_SCRIPT])
        .output()
        .unwrap();
    let printed = Printed(crate::common::ok(
        out,
        &format!("podman run --device {}", names[0]),
    ));
    let want = format!("nvidia{}", node.sim.spec.gpus[2].minor);
    assert_eq!(printed.gpu_nodes(), [want], "{}", printed.0);
    let smi = printed.smi_lines();
    assert!(
        smi.len() == 1 && smi[0].contains(&uuid),
        "nvidia-smi -L must list exactly {uuid}:\n{}",
        printed.0
    );

    plugin.signal(Signal::SIGTERM);
    assert!(plugin.exit(GENEROUS).await.is_some_and(|s| s.success()));
    let path = SystemDir::spec();
    assert!(!path.exists(), "{} left behind", path.display());
    drop(system);
    drop(storage);
}

//! S12: a GPU container reads `ModifyDeviceFiles: 0` in `/proc/driver/nvidia/params`,
//! so NVML inside cannot create the device nodes of GPUs it was not given.
//!
//! This machine has no NVIDIA kernel driver, so the container's procfs has no
//! `driver/nvidia`. The test gives it one the way the driver would look: a hook of
//! the test's own, run before ours in the container's mount namespace, mounts a tmpfs
//! on `<rootfs>/proc/driver` holding `nvidia/params` with `ModifyDeviceFiles: 1` (the
//! simulated host's proc root says 1 too, which is what makes our runtime add its
//! hook). Covered: the runtime's `createContainer` hook, the prestart hook, and a CDI
//! spec's hook; and that `nvcdi-disable-hooks` turns the cover off (the test can fail).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{Node, node};
use nvshim_testkit::{NodeSpec, runc_bundle};
use serde_json::{Value, json};

const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
const PATH: &str = "/usr/sbin:/usr/bin:/sbin:/bin";

struct Setup {
    node: Node,
    dir: tempfile::TempDir,
    rootfs: PathBuf,
}

fn setup() -> Setup {
    let node = node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    Setup { node, dir, rootfs }
}

static IDS: AtomicUsize = AtomicUsize::new(0);

/// The shell the simulating hook runs: the driver's procfs directory, as a tmpfs.
fn fake_driver(rootfs: &Path) -> String {
    let r = rootfs.display();
    format!(
        "mount -t tmpfs -o size=64k nvshim-test {r}/proc/driver && mkdir {r}/proc/driver/nvidia \
         && printf 'ResmanDebugLevel: 4294967295\\nModifyDeviceFiles: 1\\nDeviceFileUID: 0\\n' \
         > {r}/proc/driver/nvidia/params"
    )
}

enum Via {
    Runtime,
    Prestart,
}

impl Setup {
    fn config(&self, extra: &str) -> PathBuf {
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.path().join(format!("config-{n}.toml"));
        fs::write(&path, self.node.sim.runtime_config("runc", None) + extra).unwrap();
        path
    }

    /// Runs `cat params` in a GPU container, by `path`, with `config`.
    fn run(&self, how: Via, config: &Path, env: &str) -> Output {
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let id = format!("nvshim-params-{}-{n}", std::process::id());
        let bundle = self.dir.path().join(&id);
        let script = "cat /proc/driver/nvidia/params";
        runc_bundle(&bundle, &self.rootfs, &["sh", "-c", script], &[env]).unwrap();
        let rootfs = bundle.join("rootfs");
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        match how {
            Via::Runtime => {
                spec["hooks"] = json!({"createContainer": [{
                    "path": "/bin/sh",
                    "args": ["sh", "-c", fake_driver(&rootfs)],
                    "env": [format!("PATH={PATH}")],
                }]});
            }
            Via::Prestart => {
                // A prestart hook runs on the host side: enter the container's mount
                // namespace (the state's pid) first, then ours runs.
                let script = bundle.join("fake-driver.sh");
                fs::write(&script, fake_driver(&rootfs)).unwrap();
                let enter = format!(
                    "pid=$(sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p'); \
                     nsenter -m -t \"$pid\" sh {}",
                    script.display()
                );
                spec["hooks"] = json!({"prestart": [
                    {"path": "/bin/sh", "args": ["sh", "-c", enter], "env": [format!("PATH={PATH}")]},
                    {
                        "path": crate::common::hook_bin(),
                        "args": ["nvidia-container-runtime-hook", "prestart"],
                        "env": [format!("PATH={PATH}"), format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display())],
                    },
                ]});
            }
        }
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let program = match how {
            Via::Runtime => crate::common::runtime_bin(),
            Via::Prestart => "runc".to_owned(),
        };
        Command::new(program)
            .env_clear()
            .env("PATH", PATH)
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", config)
            .arg("--root")
            .arg(self.dir.path().join("runc-root"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .output()
            .unwrap()
    }
}

fn params(out: &Output, case: &str) -> String {
    assert!(
        out.status.success(),
        "{case}: container failed ({}):\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn s12_gpu_containers_read_modify_device_files_0() {
    let s = setup();
    let config = s.config("");
    let gpu = "NVIDIA_VISIBLE_DEVICES=0";

    let text = params(&s.run(Via::Runtime, &config, gpu), "runtime");
    assert!(text.contains("ModifyDeviceFiles: 0\n"), "runtime: {text}");
    assert!(
        text.contains("DeviceFileUID: 0\n"),
        "the rest is kept: {text}"
    );

    let text = params(&s.run(Via::Prestart, &config, gpu), "prestart hook");
    assert!(text.contains("ModifyDeviceFiles: 0\n"), "prestart: {text}");

    // CDI: a generated spec carries the same hook; mode = "cdi" applies it.
    let cdi = s.dir.path().join("cdi");
    let out = crate::common::nvshim(
        &s.node,
        &[
            "cdi",
            "generate",
            "--output",
            cdi.join("nvidia.json").to_str().unwrap(),
            "--nvidia-cdi-hook-path",
            NVSHIM,
        ],
    );
    crate::common::ok(out, "nvshim cdi generate");
    let config = s.config(&format!(
        "\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = [\"{}\"]\n",
        cdi.display()
    ));
    let text = params(
        &s.run(
            Via::Runtime,
            &config,
            "NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=0",
        ),
        "cdi spec",
    );
    assert!(text.contains("ModifyDeviceFiles: 0\n"), "cdi: {text}");
}

#[test]
fn s12_the_cover_can_be_turned_off_and_then_the_driver_shows() {
    let s = setup();
    let config = s.config(
        "\n[nvidia-container-runtime.modes.jit-cdi]\n\
         nvcdi-disable-hooks = [\"disable-device-node-modification\"]\n",
    );
    let gpu = "NVIDIA_VISIBLE_DEVICES=0";
    for (how, case) in [(Via::Runtime, "runtime"), (Via::Prestart, "prestart hook")] {
        let text = params(&s.run(how, &config, gpu), case);
        assert!(text.contains("ModifyDeviceFiles: 1\n"), "{case}: {text}");
    }
}

#[test]
fn s12_a_container_without_gpus_gets_no_hook() {
    let s = setup();
    let config = s.config("");
    let out = s.run(Via::Runtime, &config, "NVIDIA_VISIBLE_DEVICES=void");
    let text = params(&out, "void");
    assert!(text.contains("ModifyDeviceFiles: 1\n"), "void: {text}");
}

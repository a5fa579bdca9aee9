//! `NVIDIA_MIG_MONITOR_DEVICES=all` through our runtime and real runc, on a simulated
//! 2-GPU node whose GPU 0 (`/dev/nvidia1`) has MIG on with two instances: a privileged
//! container (`CAP_SYS_ADMIN` in its bounding set) gets the MIG `monitor` capability
//! node and its GPU's instance access nodes, each with a device cgroup rule; an
//! unprivileged one is refused before runc creates anything. No NVML is needed for it.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::node;
use nvshim_testkit::{
    MIG_MONITOR_MINOR, NVIDIA_CAPS_MAJOR, NodeSpec, mig_ci_minor, mig_gi_minor, runc_bundle,
};
use serde_json::Value;

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Runs `ls /dev/nvidia-caps` in bundle `id` under `dir` through our runtime, the
/// container privileged or not.
fn run(dir: &Path, rootfs: &Path, id: &str, privileged: bool) -> Output {
    let bundle = dir.join(id);
    let env = ["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_MIG_MONITOR_DEVICES=all"];
    runc_bundle(&bundle, rootfs, &["ls", "/dev/nvidia-caps"], &env).unwrap();
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    if privileged {
        let caps = &mut spec["process"]["capabilities"];
        for set in ["bounding", "effective", "permitted"] {
            caps[set]
                .as_array_mut()
                .unwrap()
                .push("CAP_SYS_ADMIN".into());
        }
    }
    fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    Command::new(crate::common::runtime_bin())
        .env_clear()
        .env("PATH", PATH)
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", dir.join("config.toml"))
        .arg("--root")
        .arg(dir.join("runc-root"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(id)
        .output()
        .unwrap()
}

#[test]
fn mig_monitor_gives_a_privileged_container_the_capability_nodes_and_refuses_others() {
    let node = node(&NodeSpec::with_mig(2));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let log = dir.path().join("runtime.log");
    fs::write(
        dir.path().join("config.toml"),
        node.sim.runtime_config("runc", Some(&log)),
    )
    .unwrap();
    let id = format!("nvshim-mig-{}", std::process::id());

    let out = run(dir.path(), &rootfs, &id, true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}\n{stdout}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    // GPU 0 is /dev/nvidia1 on a 2-GPU node; its instances are GI 1 and GI 2, CI 0 each.
    let gpu = node.sim.spec.gpus[0].minor;
    let mut want = vec![
        MIG_MONITOR_MINOR,
        mig_gi_minor(gpu, 1),
        mig_ci_minor(gpu, 1, 0),
        mig_gi_minor(gpu, 2),
        mig_ci_minor(gpu, 2, 0),
    ];
    want.sort_unstable();
    let mut got: Vec<u32> = stdout
        .split_whitespace()
        .map(|n| n.strip_prefix("nvidia-cap").unwrap().parse().unwrap())
        .collect();
    got.sort_unstable();
    assert_eq!(got, want, "not the config node (1), nor GPU 1's: {stdout}");

    let spec: Value =
        serde_json::from_slice(&fs::read(dir.path().join(&id).join("config.json")).unwrap())
            .unwrap();
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    for minor in want {
        assert!(
            rules.iter().any(|r| r["allow"] == true
                && r["major"] == NVIDIA_CAPS_MAJOR
                && r["minor"] == minor
                && r["access"] == "rwm"),
            "no cgroup rule for nvidia-cap{minor}: {rules:#?}"
        );
    }

    // Procfs and the dev root are enough: the runtime itself planned it, no NVML helper.
    let log = fs::read_to_string(&log).unwrap();
    assert!(log.contains("prepared bundle"), "{log}");
    assert!(!log.contains("NVML helper"), "{log}");

    let refused = format!("{id}-unprivileged");
    let out = run(dir.path(), &rootfs, &refused, false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("cannot set NVIDIA_MIG_MONITOR_DEVICES in a non-privileged container"),
        "{stderr}"
    );
    let state = Command::new("runc")
        .arg("--root")
        .arg(dir.path().join("runc-root"))
        .args(["state", &refused])
        .output()
        .unwrap();
    assert!(!state.status.success(), "the container must not exist");
}

//! WSL2 through `nvidia-container-runtime` and real runc, on a WSL-shaped node (`/dev/dxg`,
//! no `/proc/driver/nvidia`, NVIDIA's driver store under `/usr/lib/wsl/drivers`). The static
//! runtime cannot list WSL's GPUs (only NVML can), so it hands the create to `nvshim runtime`,
//! which plans with the mock NVML. One container checks it all: `/dev/dxg` with its cgroup
//! rule, the driver store's files where NVIDIA mounts them, `libcuda.so.1` and NVML in the
//! container's linker cache, and `nvidia-smi` (linked from `/usr/bin`) listing the GPUs.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::process::Command;

use crate::common::Printed;
use nvshim_testkit::harness::wsl_node;
use nvshim_testkit::{
    DXG_MAJOR, DXG_MINOR, GlibcRootfs, NodeSpec, WSL_STORE, WSL_STORE_EXTRAS, WSL_STORE_UNMOUNTED,
    runc_bundle,
};
use serde_json::{Value, json};

#[test]
fn a_wsl_container_gets_dxg_the_driver_store_and_libcuda_in_its_cache() {
    let node = wsl_node(&NodeSpec::standard(2));
    let sim = &node.sim;
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    GlibcRootfs::new()
        .libraries_for(sim.wsl_store().join("nvidia-smi"))
        .libraries_for(sim.wsl_store().join("libnvidia-ml.so.1"))
        .build(&rootfs)
        .unwrap();
    let log = dir.path().join("runtime.log");
    let config = dir.path().join("config.toml");
    fs::write(&config, sim.runtime_config("runc", Some(&log))).unwrap();

    let store = format!("/{WSL_STORE}");
    let script = format!(
        "ls -l /dev/dxg; echo ---; nvidia-smi -L; echo \"rc=$?\"; echo ---; ldconfig -p; \
         echo ---; readlink /usr/bin/nvidia-smi; echo ---; ls {store}"
    );
    let bundle = dir.path().join("bundle");
    let env = [
        "NVIDIA_VISIBLE_DEVICES=all",
        "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
        "MOCK_NVML_DEV_ROOT=/dev",
    ];
    runc_bundle(&bundle, &rootfs, &["sh", "-c", &script], &env).unwrap();
    let path = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    spec["mounts"].as_array_mut().unwrap().push(json!({
        "destination": "/etc/mock-nvml.json",
        "type": "bind",
        "source": sim.mock_config,
        "options": ["ro", "bind"],
    }));
    fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();

    let id = format!("nvshim-wsl-{}", std::process::id());
    let out = Command::new(crate::common::runtime_bin())
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
        .envs(sim.env())
        .arg("--root")
        .arg(dir.path().join("runc-root"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(&id)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "container failed ({}):\nstdout:\n{stdout}\nstderr:\n{}\nruntime log:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        fs::read_to_string(&log).unwrap_or_default()
    );
    let printed = Printed(stdout.clone());

    // /dev/dxg, a character device with the host's numbers, and no /dev/nvidia*.
    let dxg = printed.section(0);
    let numbers = format!("{DXG_MAJOR}, {DXG_MINOR}");
    assert!(
        dxg.starts_with('c')
            && dxg
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .contains(&numbers),
        "/dev/dxg in the container: {dxg}"
    );
    let spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let devices: Vec<&str> = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|d| d["path"].as_str())
        .collect();
    assert_eq!(devices, ["/dev/dxg"], "the one device node");
    let rule = json!({"allow": true, "type": "c", "major": DXG_MAJOR, "minor": DXG_MINOR, "access": "rwm"});
    assert!(
        spec["linux"]["resources"]["devices"]
            .as_array()
            .unwrap()
            .contains(&rule),
        "cgroup rule for /dev/dxg: {}",
        spec["linux"]["resources"]["devices"]
    );

    // nvidia-smi (the store's, through /usr/bin) loads the store's NVML and sees both GPUs.
    let smi = printed.section(1);
    for gpu in &sim.spec.gpus {
        assert!(
            smi.contains(&gpu.uuid),
            "{} in nvidia-smi -L: {smi}",
            gpu.uuid
        );
    }
    assert!(smi.contains("rc=0"), "{smi}");
    assert_eq!(
        printed.section(3).trim(),
        format!("{store}/nvidia-smi"),
        "/usr/bin/nvidia-smi links to the store"
    );

    // The linker cache: libcuda.so.1 (the soname link to libcuda.so.1.1), NVML, dxcore.
    let cache = printed.section(2);
    for (key, value) in [
        ("libcuda.so.1", format!("{store}/libcuda.so.1")),
        ("libnvidia-ml.so.1", format!("{store}/libnvidia-ml.so.1")),
        ("libdxcore.so", "/usr/lib/wsl/lib/libdxcore.so".to_owned()),
    ] {
        assert!(
            cache
                .lines()
                .any(|l| l.trim_start().starts_with(key) && l.trim_end().ends_with(&value)),
            "{key} => {value} in ldconfig -p:\n{cache}"
        );
    }

    // The store's files NVIDIA's globs take are there; the others are not.
    let listed: Vec<&str> = stdout.split("---\n").nth(4).unwrap_or("").lines().collect();
    for name in WSL_STORE_EXTRAS
        .iter()
        .chain(["libcuda.so.1.1", "nvcubins.bin"].iter())
    {
        assert!(listed.contains(name), "{name} in {store}: {listed:?}");
    }
    for name in WSL_STORE_UNMOUNTED {
        assert!(
            !listed.contains(&name),
            "{name} must not be mounted: {listed:?}"
        );
    }

    // The static runtime handed the create to `nvshim runtime`, which used NVML.
    let calls = fs::read_to_string(&sim.call_log).unwrap_or_default();
    assert!(calls.contains("nvmlInit"), "NVML listed the GPUs: {calls}");
}

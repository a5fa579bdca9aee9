//! The prestart hook alone (as dockerd's `--gpus` puts it in the spec) on a Tegra-shaped
//! node: ours plans csv mode, here picked by `auto` from the node's Tegra files (NVIDIA's
//! hook needs `skip-mode-detection` for that, then libnvidia-container reads the CSV
//! files). The nodes pass the device cgroup (`ENXIO`: no driver behind the made-up
//! majors), the libraries are found by soname, the soname link exists.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::process::Command;

use nvshim_testkit::{GlibcRootfs, LIB_DIR, TegraNode, runc_bundle};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

#[test]
fn the_hook_gives_a_tegra_container_its_csv_files() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let node = TegraNode::build(&dir.join("node")).unwrap();
    let rootfs = dir.join("rootfs");
    GlibcRootfs::new()
        .install(crate::prestart::probe(dir), "/usr/bin/openprobe")
        .build(&rootfs)
        .unwrap();
    let config = dir.join("config.toml");
    let log = dir.join("hook.log");
    fs::write(&config, node.runtime_config("runc", "auto", Some(&log))).unwrap();

    let tegra = format!("/{LIB_DIR}/tegra");
    let script = format!(
        "openprobe /dev/nvmap /dev/nvhost-ctrl /dev/nvhost-ctrl-gpu; echo ---; ldconfig -p; \
         echo ---; readlink {tegra}/libcuda.so.1"
    );
    let bundle = dir.join("bundle");
    runc_bundle(
        &bundle,
        &rootfs,
        &["sh", "-c", &script],
        &["NVIDIA_VISIBLE_DEVICES=all"],
    )
    .unwrap();
    crate::common::set_prestart_hook(
        &bundle,
        &[
            format!("PATH={PATH}"),
            format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display()),
        ],
    );
    let out = Command::new("runc")
        .env_clear()
        .env("PATH", PATH)
        .arg("--root")
        .arg(dir.join("runc-root"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(format!("nvshim-hook-tegra-{}", std::process::id()))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "container failed ({}):\nstdout:\n{stdout}\nstderr:\n{}\nlog:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr),
        fs::read_to_string(&log).unwrap_or_default()
    );
    let sections: Vec<&str> = stdout.split("---\n").collect();
    assert_eq!(
        sections[0].lines().collect::<Vec<_>>(),
        [
            "/dev/nvmap ENXIO",
            "/dev/nvhost-ctrl ENXIO",
            "/dev/nvhost-ctrl-gpu ENXIO"
        ],
        "made, and allowed by the device cgroup"
    );
    for key in ["libcuda.so.1", "libnvrm_gpu.so", "libnvos.so"] {
        let want = format!("=> {tegra}/{key}");
        assert!(
            sections[1]
                .lines()
                .any(|l| l.trim_start().starts_with(key) && l.ends_with(&want)),
            "ldconfig -p lists {key}:\n{}",
            sections[1]
        );
    }
    assert_eq!(sections[2].trim(), "libcuda.so.1.1", "the soname link");
}

//! `nvidia-container-runtime run` through real runc on a Tegra-shaped node (Jetson): in csv
//! mode the container gets the CSV files' device nodes (with device cgroup rules), libraries,
//! symlink chain and directory, and `ldconfig -p` inside finds the libraries by soname; in
//! auto mode the node is recognised as Tegra and `NVIDIA_REQUIRE_JETPACK=csv-mounts=all` adds
//! the non-base CSV file.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::Path;
use std::process::{Command, Output};

use nvshim_testkit::{
    GlibcRootfs, LIB_DIR, TEGRA_DEVICES, TEGRA_DIR, TEGRA_DIR_FILE, TEGRA_EXTRA_LIBRARY, TegraNode,
    runc_bundle,
};
use serde_json::Value;

const SCRIPT: &str = "ls /dev; echo ---; ldconfig -p; echo ---; \
    for l in /usr/lib/*/libcuda.so /usr/lib/*/tegra/libcuda.so /usr/lib/*/tegra/libcuda.so.1; \
    do readlink $l; done; \
    echo ---; cat /usr/share/nvidia-tegra/nvidia-tegra.conf /etc/nv_tegra_release";

fn run(dir: &Path, rootfs: &Path, id: &str, env: &[&str]) -> (Output, Value) {
    let bundle = dir.join(id);
    runc_bundle(&bundle, rootfs, &["sh", "-c", SCRIPT], env).unwrap();
    let out = Command::new(crate::common::runtime_bin())
        .env_clear()
        .env(
            "PATH",
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        )
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", dir.join("config.toml"))
        .arg("--root")
        .arg(dir.join("runc-root"))
        .args(["run", "--bundle"])
        .arg(&bundle)
        .arg(format!("{id}-{}", std::process::id()))
        .output()
        .unwrap();
    let spec = serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    assert!(
        out.status.success(),
        "container {id} failed ({}):\nstdout:\n{}\nstderr:\n{}\nlog:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
        fs::read_to_string(dir.join("runtime.log")).unwrap_or_default()
    );
    (out, spec)
}

fn section(out: &Output, n: usize) -> String {
    String::from_utf8_lossy(&out.stdout)
        .split("---\n")
        .nth(n)
        .unwrap_or("")
        .to_owned()
}

#[test]
fn csv_mode_gives_the_tegra_files_and_auto_picks_it_on_tegra() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let node = TegraNode::build(&dir.join("node")).unwrap();
    let rootfs = dir.join("rootfs");
    GlibcRootfs::new().build(&rootfs).unwrap();
    let config = |mode| {
        let log = dir.join("runtime.log");
        fs::write(
            dir.join("config.toml"),
            node.runtime_config("runc", mode, Some(&log)),
        )
        .unwrap();
    };

    config("csv");
    let (out, spec) = run(dir, &rootfs, "csv", &["NVIDIA_VISIBLE_DEVICES=0"]);
    let dev = section(&out, 0);
    for (name, _, _) in TEGRA_DEVICES {
        assert!(
            dev.lines().any(|l| l == name),
            "/dev/{name} in the container: {dev}"
        );
    }
    // Each node has its device cgroup rule.
    let rules = &spec["linux"]["resources"]["devices"];
    for (name, major, minor) in TEGRA_DEVICES {
        let allowed = rules.as_array().unwrap().iter().any(|r| {
            r["allow"] == true && r["type"] == "c" && r["major"] == major && r["minor"] == minor
        });
        assert!(allowed, "cgroup rule for {name} ({major}:{minor}): {rules}");
    }
    let ldconfig = section(&out, 1);
    let tegra = format!("/{LIB_DIR}/tegra");
    for (key, file) in [
        ("libcuda.so.1", "libcuda.so.1"),
        ("libnvrm_gpu.so", "libnvrm_gpu.so"),
        ("libnvos.so", "libnvos.so"),
    ] {
        let want = format!("=> {tegra}/{file}");
        assert!(
            ldconfig
                .lines()
                .any(|l| l.trim_start().starts_with(key) && l.ends_with(&want)),
            "ldconfig -p lists {key} {want}:\n{ldconfig}"
        );
    }
    assert!(
        !ldconfig.contains(TEGRA_EXTRA_LIBRARY),
        "extra.csv is not a base file"
    );
    let links: Vec<String> = section(&out, 2).lines().map(str::to_owned).collect();
    assert_eq!(
        links,
        ["tegra/libcuda.so", "libcuda.so.1.1", "libcuda.so.1.1"],
        "the sym chain and the soname link"
    );
    let files = section(&out, 3);
    assert!(
        files.starts_with("tegra\n# R36"),
        "{TEGRA_DIR}/{TEGRA_DIR_FILE} and the release file: {files}"
    );

    config("auto");
    let (out, _) = run(
        dir,
        &rootfs,
        "auto",
        &[
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_REQUIRE_JETPACK=csv-mounts=all",
        ],
    );
    assert!(
        section(&out, 0).lines().any(|l| l == "nvmap"),
        "auto picks csv on Tegra"
    );
    assert!(
        section(&out, 1).contains(&format!("{tegra}/{TEGRA_EXTRA_LIBRARY}")),
        "csv-mounts=all reads extra.csv: {}",
        section(&out, 1)
    );
}

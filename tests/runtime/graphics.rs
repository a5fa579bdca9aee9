//! `graphics` and `display` through our runtime and real runc: one GPU of the node,
//! and the container gets that GPU's DRM nodes (with cgroup rules and udev's `by-path`
//! links) and no other's, `/dev/nvidia-modeset`, the Vulkan ICD and layers the node
//! installed in `/usr/share/vulkan` (at `/etc/vulkan`), GLVND's EGL vendor file, the EGL
//! platform JSONs with their libraries in the linker cache, GBM's backend link, Xorg's
//! modules and the driver's application profiles.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;

use serde_json::Value;

use crate::runc::{ok, setup};

/// Sections: DRM nodes; by-path links; the graphics files; the library links; the
/// linker cache's EGL entries; the ICD's library.
const SCRIPT: &str = "ls /dev/dri /dev/nvidia-modeset; echo ---; \
     for l in /dev/dri/by-path/*; do echo \"$l -> $(readlink $l)\"; done; echo ---; \
     find /etc/vulkan /usr/share/glvnd /usr/share/egl /usr/share/nvidia /usr/lib/xorg ! -type d | sort; echo ---; \
     for l in /usr/lib/x86_64-linux-gnu/gbm/nvidia-drm_gbm.so /usr/lib/xorg/modules/extensions/libglxserver_nvidia.so; \
       do echo \"$l -> $(readlink $l)\"; done; echo ---; \
     ldconfig -p | grep -e egl- -e allocator; echo ---; \
     grep library_path /etc/vulkan/icd.d/nvidia_icd.json";

#[test]
fn graphics_and_display_give_one_gpus_drm_nodes_and_the_graphics_stack() {
    let e = setup();
    let gpu = &e.node.sim.spec.gpus[1];
    let (card, render) = nvshim_testkit::drm_nodes(1);
    let run = e.run_script(
        &[
            "NVIDIA_VISIBLE_DEVICES=1",
            "NVIDIA_DRIVER_CAPABILITIES=graphics,display",
        ],
        SCRIPT,
    );
    ok(&run);
    let out = run.stdout();
    let section = |n: usize| out.split("---\n").nth(n).unwrap_or("").to_owned();

    // Exactly GPU 1's DRM nodes: not card0 (the onboard VGA), not another GPU's.
    let devices = section(0);
    let mut dri: Vec<&str> = devices
        .lines()
        .filter(|l| l.starts_with("card") || l.starts_with("renderD"))
        .collect();
    dri.sort();
    assert_eq!(dri, [card.as_str(), render.as_str()], "{out}");
    assert!(devices.contains("/dev/nvidia-modeset"), "{out}");
    let links = section(1);
    for (kind, name) in [("card", &card), ("render", &render)] {
        let want = format!("/dev/dri/by-path/pci-{}-{kind} -> ../{name}", gpu.bus_id);
        assert!(links.contains(&want), "{want}:\n{out}");
    }
    assert_eq!(links.lines().count(), 2, "only GPU 1's links:\n{out}");

    let version = e.node.sim.library_version();
    let files = section(2);
    let mut want = vec![
        "/etc/vulkan/icd.d/nvidia_icd.json".to_owned(),
        "/etc/vulkan/implicit_layer.d/nvidia_layers.json".to_owned(),
        "/usr/share/glvnd/egl_vendor.d/10_nvidia.json".to_owned(),
        "/usr/lib/xorg/modules/drivers/nvidia_drv.so".to_owned(),
        format!("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{version}"),
    ];
    want.extend(
        nvshim_testkit::EGL_PLATFORMS
            .iter()
            .map(|p| format!("/usr/share/egl/egl_external_platform.d/{}", p.json)),
    );
    want.extend(
        nvshim_testkit::application_profiles(version)
            .iter()
            .map(|p| format!("/{p}")),
    );
    for path in &want {
        assert!(files.lines().any(|l| l == path), "{path} missing:\n{out}");
    }
    let links = section(3);
    assert!(
        links.contains("nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1"),
        "{out}"
    );
    assert!(
        links.contains(&format!(
            "libglxserver_nvidia.so -> libglxserver_nvidia.so.{version}"
        )),
        "{out}"
    );
    let cache = section(4);
    for platform in nvshim_testkit::EGL_PLATFORMS {
        assert!(
            cache.contains(&format!(
                "{} (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/{}",
                platform.soname(),
                platform.soname()
            )),
            "{} not in the container's cache:\n{out}",
            platform.stem
        );
    }
    assert!(cache.contains("libnvidia-allocator.so.1"), "{out}");
    assert!(section(5).contains("libGLX_nvidia.so.0"), "{out}");

    // The spec runc ran: each DRM node with its cgroup rule, and the hook that made the
    // by-path links once /dev was mounted.
    let spec: Value =
        serde_json::from_slice(&fs::read(run.bundle.join("config.json")).unwrap()).unwrap();
    let nodes: Vec<(String, i64, i64)> = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["path"].as_str().unwrap().starts_with("/dev/dri/"))
        .map(|d| {
            (
                d["path"].as_str().unwrap().to_owned(),
                d["major"].as_i64().unwrap(),
                d["minor"].as_i64().unwrap(),
            )
        })
        .collect();
    let minor = |name: &str| {
        name.trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse::<i64>()
            .unwrap()
    };
    assert_eq!(
        nodes,
        [
            (format!("/dev/dri/{card}"), 226, minor(&card)),
            (format!("/dev/dri/{render}"), 226, minor(&render)),
        ]
    );
    let modeset = spec["linux"]["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["path"] == "/dev/nvidia-modeset")
        .count();
    assert_eq!(modeset, 1, "graphics and display both name it; added once");
    let rules = spec["linux"]["resources"]["devices"].as_array().unwrap();
    for (_, major, minor) in &nodes {
        assert!(
            rules.iter().any(|r| r["allow"] == true
                && r["type"] == "c"
                && r["major"] == *major
                && r["minor"] == *minor
                && r["access"] == "rwm"),
            "no cgroup rule for 226:{minor}: {rules:?}"
        );
    }
    let hooks = spec["hooks"]["createContainer"].to_string();
    assert!(
        hooks.contains("link-driver") && hooks.contains("::/dev/dri/by-path/pci-"),
        "{hooks}"
    );
}

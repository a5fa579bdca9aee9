//! `graphics` and `display` through the prestart hook under plain runc: the hook gives
//! the container one GPU's DRM nodes past the device cgroup (and no other's),
//! `/dev/nvidia-modeset`, udev's `by-path` links in the container's `/dev`, the Vulkan
//! ICD the node keeps in `/usr/share/vulkan` (at `/etc/vulkan`) and the EGL platform
//! libraries in the linker cache.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;

use crate::prestart::setup;

/// Sections: DRM nodes; by-path links; the open probe; Vulkan and EGL files; the cache's
/// EGL platform entries.
const SCRIPT: &str = "ls /dev/dri; echo ---; \
     for l in /dev/dri/by-path/*; do echo \"$l -> $(readlink $l)\"; done; echo ---; \
     openprobe /dev/dri/card2 /dev/dri/renderD129 /dev/nvidia-modeset /dev/dri/card1; echo ---; \
     find /etc/vulkan /usr/share/egl -type f | sort; echo ---; \
     ldconfig -p | grep egl-";

#[test]
fn graphics_gives_one_gpus_drm_nodes_past_the_cgroup_and_the_vulkan_icd() {
    let e = setup();
    let gpu = &e.node.sim.spec.gpus[1];
    let (card, render) = nvshim_testkit::drm_nodes(1);
    assert_eq!((card.as_str(), render.as_str()), ("card2", "renderD129"));
    let run = e.run_with(
        &[
            "NVIDIA_VISIBLE_DEVICES=1",
            "NVIDIA_DRIVER_CAPABILITIES=graphics,utility",
        ],
        &e.config(""),
        |_, spec| spec["process"]["args"] = json!(["sh", "-c", SCRIPT]),
    );
    run.ok();
    let out = run.stdout();
    let section = |n: usize| out.split("---\n").nth(n).unwrap_or("").to_owned();
    let devices = section(0);
    let mut dri: Vec<&str> = devices.lines().filter(|l| *l != "by-path").collect();
    dri.sort();
    assert_eq!(dri, ["card2", "renderD129"], "{out}");
    let links = section(1);
    for (kind, name) in [("card", &card), ("render", &render)] {
        let want = format!("/dev/dri/by-path/pci-{}-{kind} -> ../{name}", gpu.bus_id);
        assert!(links.contains(&want), "{want}:\n{out}");
    }
    // Past the device cgroup (no driver behind the nodes: ENXIO), the others absent.
    assert_eq!(
        section(2).lines().collect::<Vec<_>>(),
        [
            "/dev/dri/card2 ENXIO",
            "/dev/dri/renderD129 ENXIO",
            "/dev/nvidia-modeset ENXIO",
            "/dev/dri/card1 ENOENT"
        ],
        "{out}"
    );
    let files = section(3);
    assert!(
        files
            .lines()
            .any(|l| l == "/etc/vulkan/icd.d/nvidia_icd.json"),
        "{out}"
    );
    for platform in nvshim_testkit::EGL_PLATFORMS {
        let json = format!("/usr/share/egl/egl_external_platform.d/{}", platform.json);
        assert!(files.lines().any(|l| l == json), "{json}:\n{out}");
        assert!(section(4).contains(&platform.soname()), "{out}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! What the node has for graphics and display, laid out as Debian's `libnvidia-gl` and
//! `xserver-xorg-video-nvidia` packages and udev leave it:
//! - `D/dev/dri`: `card<i+1>` and `renderD<128+i>` (major 226) for GPU `i`, plus `card0` of an
//!   onboard VGA at [`VGA_BUS_ID`] (not an NVIDIA GPU: discovery must never hand it out), and
//!   udev's `by-path/pci-<bus id>-card` / `-render` links to them;
//! - `D/sys/bus/pci/devices/<bus id>/drm/{card<N>,renderD<N>}`: the kernel's view of the same;
//! - in the driver root: the Vulkan ICD and layers in `/usr/share/vulkan`, GLVND's EGL vendor
//!   file, the EGL external platform JSONs and their libraries (ELF stubs with their own
//!   versions, [`EGL_PLATFORMS`]), GBM's `nvidia-drm_gbm.so` link, Xorg's modules and the
//!   driver's application profiles.

use std::path::{Path, PathBuf};

use crate::driver::LIB_DIR;
use crate::error::TestkitError;
use crate::files;
use crate::spec::NodeSpec;

/// The DRM character device major.
pub const DRM_MAJOR: u32 = 226;
/// The onboard VGA's bus id; it owns `card0`.
pub const VGA_BUS_ID: &str = "0000:03:00.0";
/// Where the EGL platform JSONs are, relative to the driver root.
pub const EGL_PLATFORM_DIR: &str = "usr/share/egl/egl_external_platform.d";
/// The Vulkan ICD, relative to the driver root (the Debian packages' place).
pub const VULKAN_ICD: &str = "usr/share/vulkan/icd.d/nvidia_icd.json";
/// The Vulkan implicit layers, relative to the driver root.
pub const VULKAN_LAYERS: &str = "usr/share/vulkan/implicit_layer.d/nvidia_layers.json";
/// GLVND's EGL vendor file, relative to the driver root.
pub const EGL_VENDOR: &str = "usr/share/glvnd/egl_vendor.d/10_nvidia.json";
/// Xorg's driver module, relative to the driver root.
pub const XORG_DRIVER: &str = "usr/lib/xorg/modules/drivers/nvidia_drv.so";
/// Xorg's GLX module directory, relative to the driver root (the file is
/// `libglxserver_nvidia.so.<V>`).
pub const XORG_EXTENSIONS: &str = "usr/lib/xorg/modules/extensions";

/// One EGL external platform: its JSON, library stem and the library's own version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EglPlatform {
    pub json: &'static str,
    pub stem: &'static str,
    pub version: &'static str,
}

impl EglPlatform {
    /// `libnvidia-egl-gbm.so.1.1.2`.
    pub fn file_name(&self) -> String {
        format!("{}.so.{}", self.stem, self.version)
    }
    /// `libnvidia-egl-gbm.so.1`: the soname, and the JSON's `library_path`.
    pub fn soname(&self) -> String {
        format!("{}.so.1", self.stem)
    }
}

/// The platforms the 550 driver packages ship.
pub const EGL_PLATFORMS: [EglPlatform; 4] = [
    EglPlatform {
        json: "10_nvidia_wayland.json",
        stem: "libnvidia-egl-wayland",
        version: "1.1.17",
    },
    EglPlatform {
        json: "15_nvidia_gbm.json",
        stem: "libnvidia-egl-gbm",
        version: "1.1.2",
    },
    EglPlatform {
        json: "20_nvidia_xcb.json",
        stem: "libnvidia-egl-xcb",
        version: "1.0.1",
    },
    EglPlatform {
        json: "20_nvidia_xlib.json",
        stem: "libnvidia-egl-xlib",
        version: "1.0.1",
    },
];

/// GPU `index`'s DRM node names: `card<index+1>`, `renderD<128+index>`.
pub fn drm_nodes(index: usize) -> (String, String) {
    (
        format!("card{}", index + 1),
        format!("renderD{}", 128 + index),
    )
}

/// The driver's application profile files for `version`, relative to the driver root.
pub fn application_profiles(version: &str) -> [String; 2] {
    [
        format!("usr/share/nvidia/nvidia-application-profiles-{version}-rc"),
        format!("usr/share/nvidia/nvidia-application-profiles-{version}-key-documentation"),
    ]
}

/// The EGL platform libraries' stubs to link: (output, soname).
pub(crate) fn stubs(lib_dir: &Path) -> Vec<(PathBuf, String)> {
    EGL_PLATFORMS
        .iter()
        .map(|p| (lib_dir.join(p.file_name()), p.soname()))
        .collect()
}

/// `D/dev/dri` (`dev_root` is `D/dev`).
pub(crate) fn build_dev(dev_root: &Path, spec: &NodeSpec) -> Result<(), TestkitError> {
    let dri = dev_root.join("dri");
    files::mkdir_all(&dri.join("by-path"))?;
    let mut nodes = vec![(VGA_BUS_ID.to_owned(), "card0".to_owned(), None)];
    for (index, gpu) in spec.gpus.iter().enumerate() {
        let (card, render) = drm_nodes(index);
        nodes.push((gpu.bus_id.clone(), card, Some(render)));
    }
    for (bus, card, render) in nodes {
        let kinds = std::iter::once(("card", card)).chain(render.map(|r| ("render", r)));
        for (kind, name) in kinds {
            let minor: u32 = name
                .trim_start_matches(|c: char| !c.is_ascii_digit())
                .parse()
                .unwrap_or_default();
            make_node(&dri.join(&name), minor)?;
            files::link(
                &format!("../{name}"),
                &dri.join(format!("by-path/pci-{bus}-{kind}")),
            )?;
        }
    }
    Ok(())
}

fn make_node(path: &Path, minor: u32) -> Result<(), TestkitError> {
    files::char_device(path, DRM_MAJOR, minor, 0o660)
}

/// `D/sys/bus/pci/devices/<bus id>/drm/...` (`dir` is `D`).
pub(crate) fn build_sysfs(dir: &Path, spec: &NodeSpec) -> Result<(), TestkitError> {
    let devices = dir.join("sys/bus/pci/devices");
    files::mkdir_all(&devices.join(VGA_BUS_ID).join("drm/card0"))?;
    for (index, gpu) in spec.gpus.iter().enumerate() {
        let (card, render) = drm_nodes(index);
        let drm = devices.join(&gpu.bus_id).join("drm");
        files::mkdir_all(&drm.join(card))?;
        files::mkdir_all(&drm.join(render))?;
    }
    Ok(())
}

/// The driver root's graphics files, besides the platform libraries' stubs (linked with the
/// driver's, before `ldconfig` runs).
pub(crate) fn build_driver(root: &Path, version: &str) -> Result<(), TestkitError> {
    let icd = "{\n    \"file_format_version\" : \"1.0.1\",\n    \"ICD\": {\n        \
         \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.3.277\"\n    }\n}\n";
    files::write(&root.join(VULKAN_ICD), icd, 0o644)?;
    let layers = "{\n    \"file_format_version\" : \"1.0.0\",\n    \"layer\": {\n        \
         \"name\": \"VK_LAYER_NV_optimus\",\n        \"type\": \"INSTANCE\",\n        \
         \"library_path\": \"libGLX_nvidia.so.0\",\n        \"api_version\" : \"1.3.277\",\n        \
         \"implementation_version\" : \"1\"\n    }\n}\n";
    files::write(&root.join(VULKAN_LAYERS), layers, 0o644)?;
    files::write(
        &root.join(EGL_VENDOR),
        platform_json("libEGL_nvidia.so.0"),
        0o644,
    )?;
    for platform in EGL_PLATFORMS {
        files::write(
            &root.join(EGL_PLATFORM_DIR).join(platform.json),
            platform_json(&platform.soname()),
            0o644,
        )?;
    }
    for path in application_profiles(version) {
        files::write(
            &root.join(path),
            "{ \"rules\": [], \"profiles\": [] }\n",
            0o644,
        )?;
    }
    files::write(&root.join(XORG_DRIVER), b"\x7fELF xorg driver stub", 0o644)?;
    files::write(
        &root
            .join(XORG_EXTENSIONS)
            .join(format!("libglxserver_nvidia.so.{version}")),
        b"\x7fELF glx module stub",
        0o644,
    )?;
    let gbm = root.join(LIB_DIR).join("gbm");
    files::mkdir_all(&gbm)?;
    files::link(
        "../libnvidia-allocator.so.1",
        &gbm.join("nvidia-drm_gbm.so"),
    )
}

fn platform_json(library: &str) -> String {
    format!(
        "{{\n    \"file_format_version\" : \"1.0.0\",\n    \"ICD\" : {{\n        \
         \"library_path\" : \"{library}\"\n    }}\n}}\n"
    )
}

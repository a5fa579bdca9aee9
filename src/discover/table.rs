//! Which driver files each capability brings, as data.
//!
//! The lists follow what NVIDIA's libnvidia-container injects per capability (its
//! `nvc_info.c` tables), so a container gets the same files under nvshim as under
//! the toolkit's legacy mode. Paths are container paths; discovery looks them up
//! under the driver root (files) or the dev root (device nodes).

use crate::request::Capability;

/// Files that one capability brings.
#[derive(Debug)]
pub struct CapabilityFiles {
    pub capability: Capability,
    /// Library stems (`libcuda` matches `libcuda.so.<driver version>`).
    pub libraries: &'static [&'static str],
    /// Executables looked up in [`BINARY_DIRS`].
    pub binaries: &'static [&'static str],
    /// Sockets and pipe directories of the driver's daemons.
    pub ipc: &'static [&'static str],
    /// Control device nodes, in the order they are listed.
    pub device_nodes: &'static [&'static str],
    /// Loader config files (ICDs), mounted when present.
    pub configs: &'static [&'static str],
}

/// Searched in this order for binaries, under the driver root.
pub const BINARY_DIRS: &[&str] = &[
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// Searched for `<stem>.so.<version>` when the driver root has no `ld.so.cache`.
pub const LIBRARY_DIRS_64: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/vdpau",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu/vdpau",
    "/usr/lib64",
    "/usr/lib64/vdpau",
    "/lib64",
    "/usr/lib",
];

/// The 32-bit counterparts, for `compat32`.
pub const LIBRARY_DIRS_32: &[&str] = &[
    "/usr/lib/i386-linux-gnu",
    "/usr/lib/i386-linux-gnu/vdpau",
    "/usr/lib32",
    "/usr/lib",
];

/// Every request that is not `void` gets this node.
pub const CONTROL_NODE: &str = "/dev/nvidiactl";

/// GSP firmware directory; `{version}` is the driver version.
pub const FIRMWARE_DIR: &str = "/lib/firmware/nvidia/{version}";

/// `/proc/driver/nvidia-caps/mig-minors`: MIG capability name → `nvidia-cap<minor>`.
pub const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";

/// Where the MIG capability device nodes live.
pub const CAPS_DIR: &str = "/dev/nvidia-caps";

// ---- graphics and display (`graphics`, `drm`): for either capability ----

/// Libraries NVIDIA's graphics modifier adds (`<stem>.so.<driver version>`): GBM's
/// `nvidia-drm_gbm.so` leads to the allocator, and Vulkan's producer gets a `.so` link.
pub const GRAPHICS_LIBRARIES: &[&str] = &["libnvidia-allocator", "libnvidia-vulkan-producer"];

/// Binaries NVIDIA's graphics modifier adds.
pub const GRAPHICS_BINARIES: &[&str] = &["nvidia-xconfig"];

/// Where loader configs are looked for, in this order, under the driver root: NVIDIA's
/// `/etc` then the XDG data dirs' default (`/usr/local/share:/usr/share`).
pub const CONFIG_DIRS: &[&str] = &["/etc", "/usr/local/share", "/usr/share"];

/// Configs mounted at `/usr/share/<name>` in the container wherever [`CONFIG_DIRS`]
/// has them, as NVIDIA's graphics discoverer does: the GLVND EGL vendor file, the EGL
/// external platforms (each names its library, see [`EGL_PLATFORM_LIBRARIES`]),
/// OptiX's data and the Xorg snippets.
pub const GRAPHICS_SHARE_CONFIGS: &[&str] = &[
    "glvnd/egl_vendor.d/10_nvidia.json",
    "egl/egl_external_platform.d/09_nvidia_wayland2.json",
    "egl/egl_external_platform.d/10_nvidia_wayland.json",
    "egl/egl_external_platform.d/15_nvidia_gbm.json",
    "egl/egl_external_platform.d/20_nvidia_xcb.json",
    "egl/egl_external_platform.d/20_nvidia_xlib.json",
    "nvidia/nvoptix.bin",
    "X11/xorg.conf.d/10-nvidia.conf",
    "X11/xorg.conf.d/nvidia-drm-outputclass.conf",
];

/// Vulkan's ICD and layers, mounted at `/etc/<name>` in the container. Looked for in
/// [`CONFIG_DIRS`] (drivers install them in `/usr/share/vulkan`, some in `/etc`), then
/// in the driver root itself (`<root>/vulkan/…`, GKE's layout). RPM packages name the
/// ICD `nvidia_icd.<arch>.json`: [`VULKAN_ARCH_ICD`].
pub const VULKAN_CONFIGS: &[&str] = &[
    "vulkan/icd.d/nvidia_icd.json",
    "vulkan/icd.d/nvidia_layers.json",
    "vulkan/implicit_layer.d/nvidia_layers.json",
];

/// The RPM packages' ICD name for this architecture.
#[cfg(target_arch = "aarch64")]
pub const VULKAN_ARCH_ICD: &str = "vulkan/icd.d/nvidia_icd.aarch64.json";
#[cfg(not(target_arch = "aarch64"))]
pub const VULKAN_ARCH_ICD: &str = "vulkan/icd.d/nvidia_icd.x86_64.json";

/// The EGL external platform libraries. They are built apart from the driver and carry
/// their own versions (`libnvidia-egl-gbm.so.1.1.2`), so they are matched as
/// `<stem>.so.<X>.<Y>…` (NVIDIA's `*.*` pattern), found through the cache key or the
/// soname link `<stem>.so.1` their JSON's `library_path` names.
pub const EGL_PLATFORM_LIBRARIES: &[&str] = &[
    "libnvidia-egl-gbm",
    "libnvidia-egl-wayland",
    "libnvidia-egl-wayland2",
    "libnvidia-egl-xcb",
    "libnvidia-egl-xlib",
];

/// GBM's backend link, in the allocator's directory: `gbm/nvidia-drm_gbm.so ->
/// ../libnvidia-allocator.so.1`.
pub const GBM_BACKEND: &str = "gbm/nvidia-drm_gbm.so";
pub const GBM_BACKEND_TARGET: &str = "../libnvidia-allocator.so.1";

/// Xorg's driver and GLX modules (`{version}`: the driver's), each taken from the first
/// of [`XORG_DIRS`] that has it; `libglxserver_nvidia.so` gets its `.so` link.
pub const XORG_MODULES: &[&str] = &["nvidia_drv.so", "libglxserver_nvidia.so.{version}"];

/// Xorg module directories relative to the driver's library directory, searched first.
pub const XORG_LIB_SUBDIRS: &[&str] = &[
    "nvidia/xorg",
    "xorg/modules/drivers",
    "xorg/modules/extensions",
    "xorg/modules/updates/drivers",
    "xorg/modules/updates/extensions",
];

/// Then these module directories, NVIDIA's list.
pub const XORG_DIRS: &[&str] = &[
    "/usr/lib/xorg/modules/drivers",
    "/usr/lib/xorg/modules/extensions",
    "/usr/lib/xorg/modules/updates/drivers",
    "/usr/lib/xorg/modules/updates/extensions",
    "/usr/lib64/xorg/modules/drivers",
    "/usr/lib64/xorg/modules/extensions",
    "/usr/lib64/xorg/modules/updates/drivers",
    "/usr/lib64/xorg/modules/updates/extensions",
    "/usr/X11R6/lib/modules/drivers",
    "/usr/X11R6/lib/modules/extensions",
    "/usr/X11R6/lib/modules/updates/drivers",
    "/usr/X11R6/lib/modules/updates/extensions",
    "/usr/X11R6/lib64/modules/drivers",
    "/usr/X11R6/lib64/modules/extensions",
    "/usr/X11R6/lib64/modules/updates/drivers",
    "/usr/X11R6/lib64/modules/updates/extensions",
];

/// `display` only: the driver's default application profiles and their key list
/// (`{version}`: the driver's), which its user-space part reads at load. An nvshim
/// addition: NVIDIA's tools mount neither.
pub const APPLICATION_PROFILES: &[&str] = &[
    "/usr/share/nvidia/nvidia-application-profiles-{version}-rc",
    "/usr/share/nvidia/nvidia-application-profiles-{version}-key-documentation",
];

/// DRM nodes live here; `by-path/pci-<bus id>-card` and `-render` link to them.
pub const DRI_DIR: &str = "/dev/dri";
/// The kernel's list of a PCI device's DRM minors (`card1`, `renderD128`), under the
/// proc root: used when the dev root has no `by-path` links (no udev).
pub const SYSFS_PCI_DEVICES: &str = "sys/bus/pci/devices";

pub const TABLE: &[CapabilityFiles] = &[
    CapabilityFiles {
        capability: Capability::Utility,
        libraries: &["libnvidia-ml", "libnvidia-cfg", "libnvidia-nscq"],
        binaries: &[
            "nvidia-smi",
            "nvidia-debugdump",
            "nvidia-persistenced",
            "nv-fabricmanager",
        ],
        ipc: &[
            "/run/nvidia-persistenced/socket",
            "/var/run/nvidia-persistenced/socket",
            "/run/nvidia-fabricmanager/socket",
            "/var/run/nvidia-fabricmanager/socket",
        ],
        device_nodes: &[],
        configs: &[],
    },
    CapabilityFiles {
        capability: Capability::Compute,
        libraries: &[
            "libcuda",
            "libcudadebugger",
            "libnvidia-opencl",
            "libnvidia-gpucomp",
            "libnvidia-ptxjitcompiler",
            "libnvidia-fatbinaryloader",
            "libnvidia-allocator",
            "libnvidia-compiler",
            "libnvidia-pkcs11",
            "libnvidia-pkcs11-openssl3",
            "libnvidia-nvvm",
            "libnvidia-tileiras",
        ],
        binaries: &["nvidia-cuda-mps-control", "nvidia-cuda-mps-server"],
        ipc: &["/tmp/nvidia-mps"],
        device_nodes: &["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools"],
        configs: &["/etc/OpenCL/vendors/nvidia.icd"],
    },
    CapabilityFiles {
        capability: Capability::Video,
        libraries: &[
            "libvdpau_nvidia",
            "libnvidia-encode",
            "libnvidia-opticalflow",
            "libnvcuvid",
        ],
        binaries: &[],
        ipc: &[],
        device_nodes: &[],
        configs: &[],
    },
    CapabilityFiles {
        capability: Capability::Graphics,
        libraries: &[
            "libnvidia-eglcore",
            "libnvidia-glcore",
            "libnvidia-tls",
            "libnvidia-glsi",
            "libnvidia-fbc",
            "libnvidia-ifr",
            "libnvidia-rtcore",
            "libnvoptix",
            "libGLX_nvidia",
            "libEGL_nvidia",
            "libGLESv2_nvidia",
            "libGLESv1_CM_nvidia",
            "libnvidia-glvkspirv",
            "libnvidia-cbl",
        ],
        binaries: &[],
        ipc: &[],
        // libnvidia-container gives it to `display` only, NVIDIA's JIT-CDI to every
        // container; nvshim to both graphics capabilities.
        device_nodes: &["/dev/nvidia-modeset"],
        // The ICDs, EGL platforms and Xorg files are found by `graphics`, in several
        // directories (see GRAPHICS_SHARE_CONFIGS).
        configs: &[],
    },
    CapabilityFiles {
        capability: Capability::Display,
        libraries: &[],
        binaries: &[],
        ipc: &[],
        device_nodes: &["/dev/nvidia-modeset"],
        configs: &[],
    },
    CapabilityFiles {
        capability: Capability::Ngx,
        libraries: &["libnvidia-ngx"],
        binaries: &[],
        ipc: &[],
        device_nodes: &[],
        configs: &[],
    },
];

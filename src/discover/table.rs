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
        device_nodes: &[],
        configs: &[
            "/etc/vulkan/icd.d/nvidia_icd.json",
            "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            "/usr/share/glvnd/egl_vendor.d/10_nvidia.json",
            "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
            "/usr/share/egl/egl_external_platform.d/10_nvidia_wayland.json",
        ],
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

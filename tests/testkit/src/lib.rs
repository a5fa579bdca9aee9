// SPDX-License-Identifier: Apache-2.0
//! A simulated GPU node for nvshim's integration tests, benchmarks and `make demo`.
//!
//! [`SimNode::build`] turns a [`NodeSpec`] into a directory `D` holding everything nvshim reads on
//! a real host, with no GPU present:
//! - `D/driver`: a driver root with real ELF library stubs for one driver version, soname links,
//!   an `ld.so.cache` written by the system `ldconfig -r`, the mock NVML as
//!   `libnvidia-ml.so.<V>`, driver binaries, GSP firmware, the persistenced socket and MPS dir;
//! - `D/dev`: character device nodes made with `mknod` (needs root);
//! - `D/proc`: `driver/nvidia/...` and the MIG capability files;
//! - `D/mock-nvml.json`: the mock NVML's config, describing the same GPUs.
//!
//! Every part is derived from the one spec, so the node is self-consistent.
//!
//! For end-to-end runs, [`GlibcRootfs`] builds a small container rootfs that runs the host's
//! dynamically linked programs, [`runc_bundle`] and [`tar_rootfs`] package it for `runc` and
//! `docker import`, and [`Dockerd`] / [`Containerd`] start private engines that never touch the
//! system's daemons.
//!
//! [`harness`] is what the integration tests of both nvshim crates (the core and the device
//! plugin) share on top of that: a node in a tempdir, output checks, podman and the CDI schema.
//!
//! This crate must not depend on `nvshim`: it is nvshim's dev-dependency and describes hosts, not
//! nvshim's view of them.

mod artifacts;
mod classes;
mod devices;
mod driver;
mod engines;
mod error;
mod files;
mod graphics;
pub mod harness;
pub mod layering;
mod mock_config;
mod mock_telemetry;
mod mps;
mod node;
mod pci;
mod procfs;
mod rootfs;
mod spec;
mod tegra;
mod wsl;

pub use artifacts::{
    Artifacts, FAKE_NVIDIA_SMI_ENV, FAKE_NVIDIA_SMI_FILE, MOCK_NVML_ENV, MOCK_NVML_FILE,
    workspace_binary,
};
pub use classes::{
    CUFILE_JSON, GDRDRV_MAJOR, IMEX_CHANNELS_MAJOR, INFINIBAND_VERBS_MAJOR, NVIDIA_FS_MAJOR,
    NVSWITCH_MAJOR, UDEV_DATA_FILE, class_nodes, proc_devices,
};
pub use devices::{DeviceNode, device_nodes};
pub use driver::{
    BINARIES, FIRMWARE, FOREIGN_LIBRARY, LIB_DIR, LIBRARIES, Library, MPS_PIPE_DIR,
    PERSISTENCED_SOCKET, STALE_LIBRARY, Soname, ldconfig,
};
pub use engines::{Containerd, Dockerd, path_with_prefix};
pub use error::TestkitError;
pub use files::dir_names;
pub use graphics::{
    DRM_MAJOR, EGL_PLATFORM_DIR, EGL_PLATFORMS, EGL_VENDOR, EglPlatform, VGA_BUS_ID, VULKAN_ICD,
    VULKAN_LAYERS, XORG_DRIVER, XORG_EXTENSIONS, application_profiles, drm_nodes,
};
pub use mock_config::{
    MockConfig, MockFabric, MockGfd, MockGpu, MockMigAttributes, MockMigDevice, MockNvLink,
    MockXidEvent,
};
pub use mock_telemetry::{
    MockEcc, MockGpm, MockMigTelemetry, MockRemappedRows, MockRetiredPages, MockTelemetry,
};
pub use mps::{FAKE_MPS_CONTROL, MPS_PID_FILE, MPS_RECORD_FILE, mps_record};
pub use node::{MOCK_CONFIG_FILE, MOCK_NVML_CALL_LOG_ENV, MOCK_NVML_CONFIG_ENV, SimNode};
pub use pci::{PCI_CLASS_3D, PCI_CLASS_VGA, SYSFS_PCI_DEVICES, make_vgpu, set_pci_class};
pub use procfs::{capability_file, version_file};
pub use rootfs::{
    BASE_LIBRARIES, BUSYBOX_APPLETS, GlibcRootfs, glibc_rootfs, runc_bundle, tar_rootfs,
};
pub use spec::{
    DEFAULT_CUDA_DRIVER_VERSION, DEFAULT_DRIVER_VERSION, GpuSpec, MIG_CONFIG_MINOR,
    MIG_MAX_COMPUTE_INSTANCES, MIG_MAX_GPU_INSTANCES, MIG_MONITOR_MINOR, MigSpec,
    NVIDIA_CAPS_MAJOR, NVIDIA_MAJOR, NVIDIA_MODESET_MINOR, NVIDIA_UVM_MAJOR, NVIDIACTL_MINOR,
    NodeSpec, mig_ci_minor, mig_gi_minor, nvml_bus_id,
};
pub use tegra::{
    TEGRA_DEVICES, TEGRA_DIR, TEGRA_DIR_FILE, TEGRA_EXTRA_LIBRARY, TEGRA_LIBRARIES,
    TEGRA_MISSING_LIBRARY, TEGRA_SPEC_DIR, TegraNode,
};
pub use wsl::{
    DXG_MAJOR, DXG_MINOR, WSL_LIB_DIR, WSL_LIB_FILES, WSL_OTHER_STORE, WSL_STORE, WSL_STORE_EXTRAS,
    WSL_STORE_FILES, WSL_STORE_UNMOUNTED,
};

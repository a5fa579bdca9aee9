// SPDX-License-Identifier: Apache-2.0
//! A WSL2-shaped node ([`SimNode::build_wsl`]): GPUs through Windows' paravirtualised driver.
//!
//! What WSL2 leaves in a distro, from the same [`NodeSpec`] as a standard node:
//! - `D/dev/dxg`, a character device (major 10, the kernel's misc devices, minor
//!   [`DXG_MINOR`]: our choice, the real one is dynamic); no `nvidia*` nodes;
//! - `D/proc` without `driver/nvidia` (no NVIDIA kernel module);
//! - `D/driver/usr/lib/wsl/lib`: [`WSL_LIB_FILES`], regular files as WSL's mount has them (so
//!   `libcuda.so.1` is a copy, not a link), `libnvidia-ml.so.1` being the mock NVML;
//! - `D/driver/usr/lib/wsl/drivers/<`[`WSL_STORE`]`>`: NVIDIA's driver store with the files
//!   NVIDIA's toolkit mounts by name, the mock NVML and fake `nvidia-smi` among them, plus
//!   [`WSL_STORE_EXTRAS`] (mounted by NVIDIA's globs) and [`WSL_STORE_UNMOUNTED`] (not);
//! - an Intel driver store without `libcuda.so.1.1`, sorting first, which must be passed over;
//! - `D/driver/etc/ld.so.cache` from `ldconfig -r` over `/usr/lib/wsl/lib` (WSL's
//!   `ld.wsl.conf`), so NVML is found as on a real distro;
//! - the mock NVML's config with `wsl: true`: every GPU visible while `dev/dxg` exists.

use std::fs;
use std::path::PathBuf;

use crate::artifacts::Artifacts;
use crate::error::{TestkitError, io_err};
use crate::mock_config::MockConfig;
use crate::node::{SCRATCH_DIR, SimNode};
use crate::spec::NodeSpec;
use crate::{driver, files};

/// `/dev/dxg`'s major: the kernel's misc character devices.
pub const DXG_MAJOR: u32 = 10;
/// `/dev/dxg`'s minor on the simulated node (dynamic on a real one).
pub const DXG_MINOR: u32 = 63;
/// WSL's library directory, relative to the driver root.
pub const WSL_LIB_DIR: &str = "usr/lib/wsl/lib";
/// NVIDIA's driver store, relative to the driver root.
pub const WSL_STORE: &str = "usr/lib/wsl/drivers/nv_dispi.inf_amd64_7c9f1d3a5e2b4c80";
/// Another vendor's driver store (no `libcuda.so.1.1`), which sorts first.
pub const WSL_OTHER_STORE: &str = "usr/lib/wsl/drivers/iigd_dch.inf_amd64_0d1e2f3a4b5c6d7e";
/// `/usr/lib/wsl/lib`: (file, soname; `None` for the mock NVML or a non-library).
pub const WSL_LIB_FILES: [(&str, Option<&str>); 7] = [
    ("libdxcore.so", Some("libdxcore.so")),
    ("libcuda.so", Some("libcuda.so.1")),
    ("libcuda.so.1", Some("libcuda.so.1")),
    ("libcuda.so.1.1", Some("libcuda.so.1")),
    ("libd3d12.so", Some("libd3d12.so")),
    ("libnvidia-ml.so.1", None),
    ("nvidia-smi", None),
];
/// The store files NVIDIA's toolkit mounts by name (`requiredDriverStoreFiles`): (file,
/// soname; `None` for the mock NVML, the fake `nvidia-smi` and data files).
pub const WSL_STORE_FILES: [(&str, Option<&str>); 8] = [
    ("libcuda.so.1.1", Some("libcuda.so.1")),
    ("libcuda_loader.so", Some("libcuda_loader.so")),
    (
        "libnvidia-ptxjitcompiler.so.1",
        Some("libnvidia-ptxjitcompiler.so.1"),
    ),
    ("libnvidia-ml.so.1", None),
    ("libnvidia-ml_loader.so", Some("libnvidia-ml_loader.so")),
    ("libnvdxgdmal.so.1", Some("libnvdxgdmal.so.1")),
    ("nvcubins.bin", None),
    ("nvidia-smi", None),
];
/// Further store files NVIDIA's globs (`*.so*`, `*.bin`, `*.dll`) mount.
pub const WSL_STORE_EXTRAS: [&str; 3] = ["libnvwgf2umx.so", "nvdlistx.dll", "nvptxJit.bin"];
/// Store files no glob takes.
pub const WSL_STORE_UNMOUNTED: [&str; 2] = ["nv_dispi.inf", "nvlddmkm.sys"];

impl SimNode {
    /// Builds the WSL2-shaped node for `spec` in `dir` (empty or absent). The GPUs' minors
    /// are unused: WSL has no `/dev/nvidia<minor>`.
    pub fn build_wsl(
        spec: &NodeSpec,
        dir: &std::path::Path,
        artifacts: &Artifacts,
    ) -> Result<SimNode, TestkitError> {
        let node = SimNode::layout(spec, dir)?;
        // The device node first: without CAP_MKNOD the build fails before the slow parts.
        files::mkdir_all(&node.dev_root)?;
        let dxg = node.dev_root.join("dxg");
        files::char_device(&dxg, DXG_MAJOR, DXG_MINOR, 0o666)?;
        files::mkdir_all(&node.proc_root)?;

        let scratch = node.dir.join(SCRATCH_DIR);
        files::mkdir_all(&scratch)?;
        build_driver(&node.driver_root, artifacts, &scratch)?;
        fs::remove_dir_all(&scratch).map_err(io_err("removing", &scratch))?;

        let event_file = node.dir.join("xid-events");
        files::write(&event_file, "", 0o644)?;
        let mut config = MockConfig::new(spec, &node.dev_root, &event_file);
        config.wsl = true;
        config.write(&node.mock_config)?;
        Ok(node)
    }

    /// NVIDIA's driver store on a node from [`SimNode::build_wsl`] (host path).
    pub fn wsl_store(&self) -> PathBuf {
        self.driver_root.join(WSL_STORE)
    }
}

fn build_driver(
    root: &std::path::Path,
    artifacts: &Artifacts,
    scratch: &std::path::Path,
) -> Result<(), TestkitError> {
    let lib = root.join(WSL_LIB_DIR);
    let store = root.join(WSL_STORE);
    let other = root.join(WSL_OTHER_STORE);
    for dir in [&lib, &store, &other] {
        files::mkdir_all(dir)?;
    }
    let mut stubs: Vec<(PathBuf, String)> = Vec::new();
    let mut place = |dir: &std::path::Path, name: &str, soname: Option<&str>| {
        let path = dir.join(name);
        match (soname, name) {
            (Some(soname), _) => {
                stubs.push((path, soname.to_owned()));
                Ok(())
            }
            (None, "libnvidia-ml.so.1") => files::copy(&artifacts.mock_nvml, &path, 0o755),
            (None, "nvidia-smi") => files::copy(&artifacts.nvidia_smi, &path, 0o755),
            (None, _) => files::write(&path, b"NVIDIA WSL data\n", 0o644),
        }
    };
    for (name, soname) in WSL_LIB_FILES {
        place(&lib, name, soname)?;
    }
    for (name, soname) in WSL_STORE_FILES {
        place(&store, name, soname)?;
    }
    for name in WSL_STORE_EXTRAS {
        let soname = name.contains(".so").then_some(name);
        place(&store, name, soname)?;
    }
    for name in WSL_STORE_UNMOUNTED {
        place(&store, name, None)?;
    }
    place(&other, "libigd12umd64.so", Some("libigd12umd64.so"))?;
    let object = driver::compile_stub(scratch)?;
    driver::link_stubs(&object, &stubs)?;
    // WSL's /etc/ld.so.conf.d/ld.wsl.conf lists /usr/lib/wsl/lib.
    files::write(&root.join("etc/ld.so.conf"), "/usr/lib/wsl/lib\n", 0o644)?;
    driver::run_ldconfig(root)
}

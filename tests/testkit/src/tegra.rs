// SPDX-License-Identifier: Apache-2.0
//! A Tegra-shaped node (Jetson): no `/proc/driver/nvidia`, an `/etc/nv_tegra_release`, and the
//! CSV mount specs that list what a container gets, as L4T installs them under
//! `/etc/nvidia-container-runtime/host-files-for-container.d`.
//!
//! [`TegraNode::build`] makes, in a directory `D`:
//! - `D/driver`: library stubs with real sonames in `<lib dir>/tegra` (`libcuda.so.1.1` whose
//!   soname is `libcuda.so.1`, `libnvrm_gpu.so`, `libnvos.so`, and `libnvextra.so.1` that only a
//!   non-base CSV file lists), a two-link chain `<lib dir>/libcuda.so -> tegra/libcuda.so ->
//!   libcuda.so.1.1`, a directory `usr/share/nvidia-tegra`, the release file, and the CSV files;
//! - `D/dev`: the `nvhost-*` and `nvmap` character nodes (needs root);
//! - `D/proc`: empty (the dGPU driver is not loaded).
//!
//! The CSV files: `devices.csv` (a glob `nvhost-*` and `nvmap`), `drivers.csv` (every `lib`,
//! the `sym` chain, the `dir`, and a library the host lacks), `l4t.csv` (a comment and a line
//! `drivers.csv` also has) and `extra.csv` (read only with `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`).

use std::path::{Path, PathBuf};

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use crate::driver::{self, LIB_DIR};
use crate::error::{TestkitError, io_err};
use crate::files;

/// Where the CSV files go, relative to the driver root (the config's `mount-spec-path` points
/// here).
pub const TEGRA_SPEC_DIR: &str = "etc/nvidia-container-runtime/host-files-for-container.d";
/// The device nodes: name under `/dev`, major, minor. Majors are made up (dynamic on boards).
pub const TEGRA_DEVICES: [(&str, u32, u32); 3] = [
    ("nvhost-ctrl", 508, 0),
    ("nvhost-ctrl-gpu", 508, 1),
    ("nvmap", 509, 0),
];
/// Libraries in `<lib dir>/tegra`: file name and soname.
pub const TEGRA_LIBRARIES: [(&str, &str); 4] = [
    ("libcuda.so.1.1", "libcuda.so.1"),
    ("libnvrm_gpu.so", "libnvrm_gpu.so"),
    ("libnvos.so", "libnvos.so"),
    ("libnvextra.so.1", "libnvextra.so.1"),
];
/// The library only `extra.csv` lists.
pub const TEGRA_EXTRA_LIBRARY: &str = "libnvextra.so.1";
/// The directory `drivers.csv` lists, relative to the driver root, and the file in it.
pub const TEGRA_DIR: &str = "usr/share/nvidia-tegra";
pub const TEGRA_DIR_FILE: &str = "nvidia-tegra.conf";
/// The library `drivers.csv` lists that the node does not have.
pub const TEGRA_MISSING_LIBRARY: &str = "libnvmissing.so";

/// A Tegra-shaped node on disk. Paths are absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TegraNode {
    pub dir: PathBuf,
    pub driver_root: PathBuf,
    /// `D/dev`: the nodes (a dev-root setting points at `D`, which holds `dev/`).
    pub dev_root: PathBuf,
    /// `D/proc`: empty.
    pub proc_root: PathBuf,
    /// `D/driver/etc/nvidia-container-runtime/host-files-for-container.d`.
    pub spec_dir: PathBuf,
}

impl TegraNode {
    /// Builds the node in `dir` (created if absent).
    pub fn build(dir: &Path) -> Result<TegraNode, TestkitError> {
        files::mkdir_all(dir)?;
        let dir = std::fs::canonicalize(dir).map_err(io_err("resolving", dir))?;
        let node = TegraNode {
            driver_root: dir.join("driver"),
            dev_root: dir.join("dev"),
            proc_root: dir.join("proc"),
            spec_dir: dir.join("driver").join(TEGRA_SPEC_DIR),
            dir,
        };
        for (name, major, minor) in TEGRA_DEVICES {
            let path = node.dev_root.join(name);
            files::mkdir_all(&node.dev_root)?;
            mknod(
                &path,
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o600),
                makedev(major.into(), minor.into()),
            )
            .map_err(|source| TestkitError::Mknod {
                path: path.clone(),
                source,
            })?;
            files::chmod(&path, 0o666)?;
        }
        files::mkdir_all(&node.proc_root)?;
        let tegra = node.lib_dir().join("tegra");
        files::mkdir_all(&tegra)?;
        let scratch = node.dir.join(".testkit-build");
        files::mkdir_all(&scratch)?;
        let object = driver::compile_stub(&scratch)?;
        let stubs: Vec<(PathBuf, String)> = TEGRA_LIBRARIES
            .iter()
            .map(|(file, soname)| (tegra.join(file), (*soname).to_owned()))
            .collect();
        driver::link_stubs(&object, &stubs)?;
        std::fs::remove_dir_all(&scratch).map_err(io_err("removing", &scratch))?;
        files::link("libcuda.so.1.1", &tegra.join("libcuda.so"))?;
        files::link("tegra/libcuda.so", &node.lib_dir().join("libcuda.so"))?;
        files::write(
            &node.driver_root.join(TEGRA_DIR).join(TEGRA_DIR_FILE),
            "tegra\n",
            0o644,
        )?;
        files::write(
            &node.driver_root.join("etc/nv_tegra_release"),
            "# R36 (release), REVISION: 4.0, GCID: 0, BOARD: generic, EABI: aarch64\n",
            0o644,
        )?;
        let lib = format!("/{LIB_DIR}/tegra");
        let csv = |name: &str, text: String| files::write(&node.spec_dir.join(name), text, 0o644);
        csv(
            "devices.csv",
            "dev, /dev/nvhost-*\ndev, /dev/nvmap\n".to_owned(),
        )?;
        csv(
            "drivers.csv",
            format!(
                "lib, {lib}/libcuda.so.1.1\nlib, {lib}/libnvrm_gpu.so\nlib, {lib}/libnvos.so\n\
                 sym, /{LIB_DIR}/libcuda.so\ndir, /{TEGRA_DIR}\nlib, {lib}/{TEGRA_MISSING_LIBRARY}\n"
            ),
        )?;
        csv("l4t.csv", format!("# L4T base\nlib, {lib}/libnvos.so\n"))?;
        csv("extra.csv", format!("lib, {lib}/{TEGRA_EXTRA_LIBRARY}\n"))?;
        Ok(node)
    }

    /// The host-architecture library directory of the driver root.
    pub fn lib_dir(&self) -> PathBuf {
        self.driver_root.join(LIB_DIR)
    }

    /// A config.toml for `nvidia-container-runtime` on this node: driver, dev and proc roots,
    /// `mode`, the CSV directory, `runtime` as the low-level runtime, a debug log when given.
    pub fn runtime_config(&self, runtime: &str, mode: &str, debug_log: Option<&Path>) -> String {
        let d = self.dir.display();
        let log = debug_log.map_or(String::new(), |p| {
            format!("debug = \"{}\"\nlog-level = \"debug\"\n", p.display())
        });
        format!(
            "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\n\n\
             [nvidia-container-runtime]\nmode = \"{mode}\"\nruntimes = [\"{runtime}\"]\n{log}\n\
             [nvidia-container-runtime.modes.csv]\nmount-spec-path = \"{}\"\n\n\
             [nvshim]\nproc-root = \"{d}\"\n",
            self.spec_dir.display()
        )
    }
}

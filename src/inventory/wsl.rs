// SPDX-License-Identifier: Apache-2.0
//! Whether the node is WSL2: GPUs through Windows' paravirtualised driver (`/dev/dxg`),
//! no NVIDIA kernel module, so no `/proc/driver/nvidia` and no `/dev/nvidia*`.
//!
//! NVIDIA decides "WSL" by `libdxcore.so` loading (go-nvlib's platform resolver, the
//! toolkit's `dxcore` package); we never load a library on the hot path, so the node's
//! shape decides: `<dev root>/dev/dxg` is a character device and
//! `<proc root>/proc/driver/nvidia` does not exist. On WSL only NVML lists the GPUs,
//! and `discover::wsl` finds the files to inject.
//!
//! A host with the NVIDIA module pays nothing for this: [`dxg_present`] is asked only
//! once procfs has found no driver, and [`detect`] only on the NVML path.

use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use crate::roots::Roots;

/// The paravirtualised GPU device, one node for every GPU (container path).
pub const DXG_NODE: &str = "/dev/dxg";
/// Where WSL mounts the Windows driver's user-space libraries (`libdxcore.so`,
/// `libcuda.so*`, `nvidia-smi`, …), as copies, not links.
pub const WSL_LIB_DIR: &str = "/usr/lib/wsl/lib";
/// Where WSL mounts the driver stores of the GPU drivers in use, one directory each
/// (`nv_dispi.inf_amd64_<hash>` for NVIDIA's).
pub const WSL_DRIVERS_DIR: &str = "/usr/lib/wsl/drivers";
/// NVIDIA's kernel module directory, absent on WSL.
const PROC_DRIVER: &str = "proc/driver/nvidia";

/// Whether the node is WSL-shaped: `/dev/dxg` present and no `/proc/driver/nvidia`
/// (two `stat`s at most; one on a host with the NVIDIA module).
pub fn detect(roots: &Roots) -> bool {
    !proc_driver(roots).exists() && dxg_present(roots)
}

/// Whether `<dev root>/dev/dxg` is a character device (one `lstat`, as discovery
/// reads device nodes: a link there is not the device). Callers that already know
/// `/proc/driver/nvidia` is missing ask this alone.
pub fn dxg_present(roots: &Roots) -> bool {
    let path = roots.dev.join(DXG_NODE.trim_start_matches('/'));
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_char_device())
}

fn proc_driver(roots: &Roots) -> PathBuf {
    roots.proc.join(PROC_DRIVER)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn roots(dir: &std::path::Path) -> Roots {
        Roots {
            driver: dir.join("driver"),
            dev: dir.to_path_buf(),
            proc: dir.to_path_buf(),
        }
    }

    #[test]
    fn wsl_needs_dxg_as_a_char_device_and_no_proc_driver() -> std::io::Result<()> {
        let dir = tempfile::tempdir()?;
        let r = roots(dir.path());
        assert!(!detect(&r), "empty node");
        std::fs::create_dir_all(dir.path().join("dev"))?;
        // A regular file is not the device (a stray file must not flip the platform).
        std::fs::write(dir.path().join("dev/dxg"), b"")?;
        assert!(!detect(&r), "dxg as a regular file");
        std::fs::remove_file(dir.path().join("dev/dxg"))?;
        std::os::unix::fs::symlink("/dev/null", dir.path().join("dev/dxg"))?;
        assert!(!detect(&r), "dxg as a link, even to a char device");
        std::fs::remove_file(dir.path().join("dev/dxg"))?;
        // The tests run as root: a real node (10:63, a misc device).
        nix::sys::stat::mknod(
            &dir.path().join("dev/dxg"),
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            nix::sys::stat::makedev(10, 63),
        )?;
        assert!(dxg_present(&r), "dxg as a char device");
        assert!(detect(&r), "dxg and no proc/driver/nvidia");
        std::fs::create_dir_all(dir.path().join("proc/driver/nvidia"))?;
        assert!(!detect(&r), "the NVIDIA module is loaded: not WSL");
        Ok(())
    }
}

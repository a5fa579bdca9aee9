//! `enable-cuda-compat`: whether the image's CUDA forward-compatibility libraries
//! should win over the host driver's.
//!
//! NVIDIA's rule: with no `--host-driver-version` there is nothing to decide;
//! otherwise the compat directory (`--cuda-compat-container-root`, default
//! `/usr/local/cuda/compat`) must hold exactly one regular `libcuda.so.<X>.<Y>…` file.
//! When that library carries NVIDIA's `.note.cuda.fwd_compatibility` ELF note (a JSON
//! object with the `Driver` branches it supports and its `CUDA Version`), the note
//! decides: the host driver's major version must be one of `Driver`, or, with no
//! driver list, the note's CUDA version must be newer than `--host-cuda-version`.
//! Without a note, its major version `<X>` must be greater than the host driver's.
//! When the rule says no, the hook is done. When it
//! says yes, the directory goes into `/etc/ld.so.conf.d/00-compat-nvshim.conf`, as
//! NVIDIA's hook records it (`00-compat-*.conf`), and `update-ldcache`, which runs
//! after it, puts the compat libraries into the cache ahead of the driver's.

use std::path::Path;

use crate::rootfs::Rootfs;
use crate::rootfs::compat::{self as rule, major};
pub use crate::rootfs::compat::{CompatNote, DEFAULT_COMPAT_ROOT, Decision, NOTE_SECTION};

use super::{StageError, container_path};

/// Decides by NVIDIA's rule (in [`crate::rootfs::compat`]) for `rootfs`, from the
/// hook's flags.
pub fn decide(
    rootfs: &Rootfs,
    host_driver_version: Option<&str>,
    host_cuda_version: Option<&str>,
    compat_root: Option<&str>,
) -> Result<Decision, StageError> {
    let Some(host) = host_driver_version.filter(|v| !v.is_empty()) else {
        return Ok(Decision::Skip("no host driver version given"));
    };
    let host_major = major(host).ok_or_else(|| StageError::DriverVersion {
        value: host.to_owned(),
    })?;
    let root = compat_root.unwrap_or(DEFAULT_COMPAT_ROOT);
    let dir_path = container_path(root).ok_or_else(|| StageError::CompatRoot {
        value: root.to_owned(),
    })?;
    if rootfs.path_fd(&dir_path)?.is_none() {
        return Ok(Decision::Skip("no CUDA compat directory in the container"));
    }
    if rootfs.path_fd(Path::new("/etc/ld.so.cache"))?.is_none() {
        return Ok(Decision::Skip("the container has no linker cache"));
    }
    Ok(rule::decide(
        rootfs,
        host_major,
        host_cuda_version.unwrap_or_default(),
        &dir_path,
    )?)
}

/// The file this hook writes in the container.
pub const CONF: &str = "/etc/ld.so.conf.d/00-compat-nvshim.conf";

/// Records `dir` for `update-ldcache` (replacing what an earlier start wrote).
pub fn apply(rootfs: &Rootfs, dir: &Path) -> Result<(), StageError> {
    let mut text = dir.to_string_lossy().into_owned();
    text.push('\n');
    rootfs.replace(Path::new(CONF), text.as_bytes(), 0o644)?;
    Ok(())
}

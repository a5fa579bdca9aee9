//! `enable-cuda-compat`: whether the image's CUDA forward-compatibility libraries
//! should win over the host driver's.
//!
//! NVIDIA's rule (without the CUDA ELF note, which this does not read yet): with no
//! `--host-driver-version` there is nothing to decide; otherwise the compat directory
//! (`--cuda-compat-container-root`, default `/usr/local/cuda/compat`) must hold
//! exactly one regular `libcuda.so.<X>.<Y>…` file, and its major version must be
//! greater than the host driver's. When the rule says no, the hook is done. When it
//! says yes, the directory goes into `/etc/ld.so.conf.d/00-compat-nvshim.conf`, as
//! NVIDIA's hook records it (`00-compat-*.conf`), and `update-ldcache`, which runs
//! after it, puts the compat libraries into the cache ahead of the driver's.

use std::path::{Path, PathBuf};

use crate::rootfs::Rootfs;

use super::ldcache::{open_dir, version_cmp};
use super::{StageError, container_path};

/// Where images keep the compat libraries.
pub const DEFAULT_COMPAT_ROOT: &str = "/usr/local/cuda/compat";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do, and why.
    Skip(&'static str),
    /// The compat libraries in this directory should be used.
    UseCompat { dir: PathBuf, library: String },
}

/// Decides by NVIDIA's rule for `rootfs`.
pub fn decide(
    rootfs: &Rootfs,
    host_driver_version: Option<&str>,
    compat_root: Option<&str>,
) -> Result<Decision, StageError> {
    let Some(host) = host_driver_version.filter(|v| !v.is_empty()) else {
        return Ok(Decision::Skip("no host driver version given"));
    };
    let host_major = major(host).ok_or_else(|| StageError::DriverVersion {
        value: host.to_owned(),
    })?;
    let root = compat_root.unwrap_or(DEFAULT_COMPAT_ROOT);
    let dir_path = container_path(root).ok_or_else(|| StageError::RelativePath {
        value: root.to_owned(),
    })?;
    let Some(mut dir) = open_dir(rootfs, &dir_path)? else {
        return Ok(Decision::Skip("no CUDA compat directory in the container"));
    };
    if rootfs.path_fd(Path::new("/etc/ld.so.cache"))?.is_none() {
        return Ok(Decision::Skip("the container has no linker cache"));
    }
    let names: Vec<String> = dir
        .iter()
        .flatten()
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
        .filter(|n| {
            n.strip_prefix("libcuda.so.")
                .is_some_and(|v| v.contains('.'))
        })
        .collect();
    let mut libs = Vec::new();
    for name in names {
        let regular = nix::sys::stat::fstatat(
            &dir,
            name.as_str(),
            nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
        if regular {
            libs.push(name);
        }
    }
    libs.sort_by(|a, b| version_cmp(a, b));
    let [library] = libs.as_slice() else {
        return Ok(Decision::Skip(if libs.is_empty() {
            "no libcuda.so.*.* in the compat directory"
        } else {
            "more than one libcuda.so.*.* in the compat directory"
        }));
    };
    let compat_major = library
        .strip_prefix("libcuda.so.")
        .and_then(major)
        .ok_or_else(|| StageError::DriverVersion {
            value: library.clone(),
        })?;
    if host_major >= compat_major {
        return Ok(Decision::Skip(
            "the compat libraries are not newer than the host driver",
        ));
    }
    Ok(Decision::UseCompat {
        dir: dir_path,
        library: library.clone(),
    })
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

fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

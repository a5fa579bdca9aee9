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

use std::path::{Path, PathBuf};

use crate::rootfs::Rootfs;

use super::ldcache::{open_dir, open_regular, version_cmp};
use super::{StageError, container_path, elf};

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
    let use_compat = match compat_note(&dir, library) {
        Some(note) => note.use_compat(host_major, host_cuda_version.unwrap_or_default()),
        None => {
            // The image's file name: one with no numeric major is not newer than anything.
            let Some(compat_major) = library.strip_prefix("libcuda.so.").and_then(major) else {
                return Ok(Decision::Skip(
                    "the compat libcuda's name has no numeric major version",
                ));
            };
            compat_major > host_major
        }
    };
    if !use_compat {
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

/// The section NVIDIA's compat `libcuda` carries.
pub const NOTE_SECTION: &str = ".note.cuda.fwd_compatibility";
const NOTE_OWNER: &str = "NVIDIA Corporation";

/// What the compat library's ELF note says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CompatNote {
    pub cuda_version: String,
    /// The driver branches (major versions) the compat libraries run on.
    pub drivers: Vec<u64>,
}

impl CompatNote {
    /// Parses the note's JSON descriptor.
    pub fn parse(desc: &[u8]) -> Option<CompatNote> {
        let value: serde_json::Value = serde_json::from_slice(desc).ok()?;
        Some(CompatNote {
            cuda_version: value
                .get("CUDA Version")
                .and_then(|v| v.as_str())
                .unwrap_or_default()
                .to_owned(),
            drivers: value
                .get("Driver")
                .and_then(|v| v.as_array())
                .map(|l| l.iter().filter_map(serde_json::Value::as_u64).collect())
                .unwrap_or_default(),
        })
    }

    /// NVIDIA's rule: the host's branch is listed; without a list, the compat CUDA
    /// version is newer than the host's.
    pub fn use_compat(&self, host_major: u32, host_cuda: &str) -> bool {
        if host_major != 0 && !self.drivers.is_empty() {
            return self.drivers.contains(&u64::from(host_major));
        }
        if self.cuda_version.is_empty() || host_cuda.is_empty() {
            return false;
        }
        match (dotted(&self.cuda_version), dotted(host_cuda)) {
            (Some(compat), Some(host)) => compat > host,
            // As Go's semver: an invalid version is lower than any valid one.
            (Some(_), None) => true,
            _ => false,
        }
    }
}

/// `12.4` as `[12, 4, 0]`; `None` unless one to three numbers.
fn dotted(version: &str) -> Option<[u64; 3]> {
    let version = version.strip_prefix('v').unwrap_or(version);
    let mut out = [0u64; 3];
    let mut parts = version.split('.');
    for slot in &mut out {
        match parts.next() {
            Some(p) => *slot = p.parse().ok()?,
            None => break,
        }
    }
    parts.next().is_none().then_some(out)
}

/// The ELF note of `library` in the already opened compat directory, if it has one.
fn compat_note(dir: &nix::dir::Dir, library: &str) -> Option<CompatNote> {
    let file = open_regular(dir, std::ffi::OsStr::new(library))?;
    let section = elf::section(&file, NOTE_SECTION)?;
    let (owner, desc) = elf::note(&section)?;
    (owner == NOTE_OWNER)
        .then(|| CompatNote::parse(&desc))
        .flatten()
}

fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

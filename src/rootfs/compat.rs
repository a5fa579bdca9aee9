//! CUDA forward compatibility: whether the image's compat libraries (NGC images ship
//! them in `/usr/local/cuda/compat`) should win over the host driver's. One rule,
//! used by the runtime, the prestart hook and the `enable-cuda-compat` CDI hook.
//!
//! NVIDIA's rule: the compat directory must hold exactly one regular
//! `libcuda.so.<X>.<Y>…` file. When that library carries NVIDIA's
//! `.note.cuda.fwd_compatibility` ELF note (a JSON object with the `Driver` branches
//! it supports and its `CUDA Version`), the note decides: the host driver's major
//! version must be one of `Driver`, or, with no driver list, the note's CUDA version
//! must be newer than the host's. Without a note, its major version `<X>` must be
//! greater than the host driver's. Every file is reached through [`Rootfs`] (no
//! symlink leads out of the image) and only regular files are opened.

use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::{self, Mode, SFlag};

use crate::config::{Config, CudaCompatMode};
use crate::ldcache::Entry;

use super::{Rootfs, RootfsError, elf};

/// Where images keep the compat libraries.
pub const DEFAULT_COMPAT_ROOT: &str = "/usr/local/cuda/compat";

/// The hook name NVIDIA's `nvcdi-disable-hooks` lists to turn this off.
pub const HOOK_NAME: &str = "enable-cuda-compat";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Nothing to do, and why.
    Skip(&'static str),
    /// The compat libraries in this directory should be used.
    UseCompat { dir: PathBuf, library: String },
}

/// Whether `config` leaves CUDA compat on: NVIDIA's opt-outs are
/// `[nvidia-container-runtime.modes.legacy] cuda-compat-mode = "disabled"` and
/// `[nvidia-container-runtime.modes.jit-cdi] nvcdi-disable-hooks` naming
/// `enable-cuda-compat` or `all`, and `[features] disable-cuda-compat-lib-hook = true`.
pub fn enabled(config: &Config) -> bool {
    let modes = &config.nvidia_container_runtime.modes;
    !config.features.disable_cuda_compat_lib_hook
        && modes.legacy.cuda_compat_mode != CudaCompatMode::Disabled
        && !modes
            .jit_cdi
            .nvcdi_disable_hooks
            .iter()
            .any(|h| h == HOOK_NAME || h == "all")
}

/// Decides by NVIDIA's rule for the compat directory `dir` (a container path) of
/// `rootfs`, on a host whose driver branch is `host_major` and CUDA version
/// `host_cuda` (empty when unknown).
pub fn decide(
    rootfs: &Rootfs,
    host_major: u32,
    host_cuda: &str,
    dir: &Path,
) -> Result<Decision, RootfsError> {
    let Some(fd) = rootfs.path_fd(dir)? else {
        return Ok(Decision::Skip("no CUDA compat directory in the container"));
    };
    let Ok(opened) = reopen(&fd, OFlag::O_RDONLY | OFlag::O_DIRECTORY) else {
        return Ok(Decision::Skip("the CUDA compat path is not a directory"));
    };
    let mut listing = nix::dir::Dir::from_fd(opened).map_err(|source| RootfsError::Path {
        root: rootfs.path().to_path_buf(),
        path: dir.to_path_buf(),
        source,
    })?;
    let names: Vec<String> = listing
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
        let regular = stat::fstatat(&listing, name.as_str(), fcntl::AtFlags::AT_SYMLINK_NOFOLLOW)
            .is_ok_and(|st| st.st_mode & libc::S_IFMT == libc::S_IFREG);
        if regular {
            libs.push(name);
        }
    }
    libs.sort();
    let [library] = libs.as_slice() else {
        return Ok(Decision::Skip(if libs.is_empty() {
            "no libcuda.so.*.* in the compat directory"
        } else {
            "more than one libcuda.so.*.* in the compat directory"
        }));
    };
    let use_compat = match compat_note(&listing, library) {
        Some(note) => note.use_compat(host_major, host_cuda),
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
        dir: dir.to_path_buf(),
        library: library.clone(),
    })
}

/// The linker cache entries that put the image's compat libraries ahead of the host
/// driver's `add`: for each of `add`'s sonames present in the default compat directory,
/// `<dir>/<soname>` with the same flags. Empty when the rule says no, when the host
/// driver version is unknown or unreadable, or when the image's compat directory cannot
/// be read (a warning: an optional feature does not fail the container).
pub fn preferred(
    rootfs: &Rootfs,
    host_driver: &str,
    host_cuda: Option<&str>,
    add: &[Entry],
) -> Vec<Entry> {
    let Some(host_major) = major(host_driver) else {
        tracing::debug!(host_driver, "CUDA compat: no host driver branch; skipped");
        return Vec::new();
    };
    let dir = Path::new(DEFAULT_COMPAT_ROOT);
    let decision = match decide(rootfs, host_major, host_cuda.unwrap_or_default(), dir) {
        Ok(decision) => decision,
        Err(e) => {
            tracing::warn!("CUDA compat skipped: {e}");
            return Vec::new();
        }
    };
    let Decision::UseCompat { dir, library } = decision else {
        tracing::debug!(?decision, "CUDA compat");
        return Vec::new();
    };
    let mut out: Vec<Entry> = Vec::new();
    for entry in add {
        let path = dir.join(&entry.key);
        if out
            .iter()
            .any(|e| e.key == entry.key && e.flags == entry.flags)
        {
            continue;
        }
        if entry.key.contains('/') || !matches!(rootfs.path_fd(&path), Ok(Some(_))) {
            continue;
        }
        out.push(Entry {
            key: entry.key.clone(),
            value: path.to_string_lossy().into_owned(),
            flags: entry.flags,
            hwcap: 0,
        });
    }
    tracing::debug!(%library, entries = out.len(), "CUDA compat libraries first");
    out
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
    let file = open_regular(dir, OsStr::new(library))?;
    let section = elf::section(&file, NOTE_SECTION)?;
    let (owner, desc) = elf::note(&section)?;
    (owner == NOTE_OWNER)
        .then(|| CompatNote::parse(&desc))
        .flatten()
}

/// A driver version's major number (`550` of `550.54.15`).
pub fn major(version: &str) -> Option<u32> {
    version.split('.').next()?.parse().ok()
}

/// Opens `name` in `dir` only if it is a regular file: resolved `O_PATH | O_NOFOLLOW`,
/// checked, then that very inode reopened (a FIFO or device swapped in is never opened).
fn open_regular(dir: &nix::dir::Dir, name: &OsStr) -> Option<File> {
    let path = fcntl::openat(
        dir,
        name,
        OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .ok()?;
    let st = stat::fstat(&path).ok()?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return None;
    }
    reopen(&path, OFlag::O_RDONLY).ok().map(File::from)
}

/// Opens the inode an `O_PATH` fd holds, through `/proc/self/fd`.
fn reopen(fd: &OwnedFd, flags: OFlag) -> Result<OwnedFd, Errno> {
    fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
}

#[cfg(test)]
#[path = "compat_tests.rs"]
mod tests;

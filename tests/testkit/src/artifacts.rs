// SPDX-License-Identifier: Apache-2.0
//! Finding the mock NVML library and the fake `nvidia-smi` that the workspace builds.

use std::path::{Path, PathBuf};

use crate::error::TestkitError;

/// File name of the mock NVML `cdylib` in the target directory.
pub const MOCK_NVML_FILE: &str = "libnvshim_mock_nvml.so";
/// File name of the fake `nvidia-smi` binary in the target directory.
pub const FAKE_NVIDIA_SMI_FILE: &str = "nvshim-fake-nvidia-smi";
/// Overrides the mock NVML's path.
pub const MOCK_NVML_ENV: &str = "NVSHIM_MOCK_NVML";
/// Overrides the fake `nvidia-smi`'s path.
pub const FAKE_NVIDIA_SMI_ENV: &str = "NVSHIM_FAKE_NVIDIA_SMI";

/// How many directories above the running executable's own to search: tests run from
/// `target/<profile>/deps/`, binaries from `target/<profile>/`.
const SEARCH_DEPTH: usize = 3;

/// The built files a node is assembled from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Artifacts {
    /// Copied to `usr/lib/x86_64-linux-gnu/libnvidia-ml.so.<V>`; its soname is `libnvidia-ml.so.1`.
    pub mock_nvml: PathBuf,
    /// Copied to `usr/bin/nvidia-smi`.
    pub nvidia_smi: PathBuf,
}

impl Artifacts {
    /// Finds both artifacts: `$NVSHIM_MOCK_NVML` / `$NVSHIM_FAKE_NVIDIA_SMI` when set, otherwise
    /// the nearest `target/<profile>/` at or above the running executable.
    pub fn locate() -> Result<Artifacts, TestkitError> {
        let exe = running_exe()?;
        let dirs = search_dirs(&exe);
        Ok(Artifacts {
            mock_nvml: find("the mock NVML", MOCK_NVML_ENV, MOCK_NVML_FILE, &dirs)?,
            nvidia_smi: find(
                "the fake nvidia-smi",
                FAKE_NVIDIA_SMI_ENV,
                FAKE_NVIDIA_SMI_FILE,
                &dirs,
            )?,
        })
    }
}

/// Another workspace binary (`file`, e.g. `nvidia-container-runtime`) built beside the
/// running test: `$env` when set, else the first `file` up the running executable's
/// directories, as for [`Artifacts::locate`]. For a test crate that runs a binary of
/// another workspace package, which cargo does not name in `CARGO_BIN_EXE_*`.
pub fn workspace_binary(
    what: &'static str,
    env: &str,
    file: &str,
) -> Result<PathBuf, TestkitError> {
    let exe = running_exe()?;
    find(what, env, file, &search_dirs(&exe))
}

fn running_exe() -> Result<PathBuf, TestkitError> {
    std::env::current_exe().map_err(|source| TestkitError::Io {
        action: "finding the running executable",
        path: PathBuf::from("/proc/self/exe"),
        source,
    })
}

/// `deps/` holds hashed copies of binaries; the plain names live in `target/<profile>/`.
fn search_dirs(exe: &Path) -> Vec<&Path> {
    exe.ancestors()
        .skip(1)
        .take(SEARCH_DEPTH + 1)
        .filter(|d| !d.ends_with("deps"))
        .collect()
}

fn find(
    what: &'static str,
    env: &str,
    file: &str,
    dirs: &[&Path],
) -> Result<PathBuf, TestkitError> {
    if let Some(path) = std::env::var_os(env).filter(|v| !v.is_empty()) {
        let path = PathBuf::from(path);
        if path.is_file() {
            return Ok(path);
        }
        return Err(TestkitError::ArtifactMissing {
            what,
            tried: vec![path],
        });
    }
    let tried: Vec<PathBuf> = dirs.iter().map(|d| d.join(file)).collect();
    match tried.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(TestkitError::ArtifactMissing { what, tried }),
    }
}

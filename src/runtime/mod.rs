//! The `nvidia-container-runtime` shim: read runc's argv, and for `create`/`run`
//! plan and inject the requested GPUs into the bundle's `config.json`; then `exec`
//! the low-level runtime with the same arguments, environment and stdio.

pub mod args;
pub mod create;
pub mod entry;
pub mod lowlevel;

use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::pipeline::NvmlAccess;
use args::Invocation;

/// Prefix of every error the shim reports, as NVIDIA's does.
pub const ERROR_PREFIX: &str = "nvidia-container-runtime";

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error(transparent)]
    Args(#[from] args::ArgsError),
    #[error(transparent)]
    Create(#[from] create::CreateError),
    #[error(transparent)]
    LowLevel(#[from] lowlevel::LowLevelError),
    #[error("cannot find the current directory (the default bundle): {0}")]
    Cwd(#[source] std::io::Error),
}

/// Edits the bundle when `invocation` creates a container. The bundle is `--bundle`,
/// relative to `cwd` as runc resolves it, or `cwd` itself.
pub fn prepare(
    invocation: &Invocation,
    cwd: &Path,
    config: &Config,
    nvml: NvmlAccess,
) -> Result<Option<create::Outcome>, RuntimeError> {
    if !invocation.creates_container() {
        return Ok(None);
    }
    let dir: PathBuf = match &invocation.bundle {
        Some(b) => cwd.join(b),
        None => cwd.to_path_buf(),
    };
    Ok(Some(create::prepare(&dir, config, nvml)?))
}

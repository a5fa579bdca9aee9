// SPDX-License-Identifier: Apache-2.0
//! The testkit's one error type: every variant names the path, command or value that failed.

use std::io;
use std::path::{Path, PathBuf};

/// Why a simulated node could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TestkitError {
    #[error("invalid node spec: {what}")]
    InvalidSpec { what: String },

    #[error("{action} {}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    #[error("node directory {} exists and is not empty", path.display())]
    DirNotEmpty { path: PathBuf },

    #[error(
        "{what} not found (tried {}); build them first with `cargo build --workspace`",
        list(tried)
    )]
    ArtifactMissing {
        what: &'static str,
        tried: Vec<PathBuf>,
    },

    #[error("no {program} found (tried {})", list(tried))]
    ProgramMissing {
        program: &'static str,
        tried: Vec<PathBuf>,
    },

    #[error("could not run `{command}`")]
    Spawn {
        command: String,
        #[source]
        source: io::Error,
    },

    #[error("`{command}` failed ({status}): {stderr}")]
    CommandFailed {
        command: String,
        status: String,
        stderr: String,
    },

    #[error(
        "creating device node {} needs the CAP_MKNOD privilege (run as root, outside a user namespace)",
        path.display()
    )]
    NeedsPrivilege {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },

    #[error("creating device node {}", path.display())]
    Mknod {
        path: PathBuf,
        #[source]
        source: nix::errno::Errno,
    },

    #[error("serialising the mock NVML config {}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{action} the JSON file {}", path.display())]
    JsonFile {
        action: &'static str,
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },

    #[error("{}: {what}", path.display())]
    Elf { path: PathBuf, what: String },

    #[error("{library}, needed by {}, is not installed on the host", elf.display())]
    LibraryNotFound { elf: PathBuf, library: String },

    #[error(
        "socket path {} is too long for a unix socket (at most {max} bytes here); use a shorter directory",
        path.display()
    )]
    SocketPathTooLong { path: PathBuf, max: usize },

    #[error("{engine} failed to start (gave up after {waited_s} s); last lines of {}:\n{tail}", log.display())]
    EngineStart {
        engine: &'static str,
        waited_s: u64,
        log: PathBuf,
        tail: String,
    },
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        return "nothing".to_owned();
    }
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Attaches the action and path to an `io::Error`.
pub(crate) fn io_err(action: &'static str, path: &Path) -> impl FnOnce(io::Error) -> TestkitError {
    let path = path.to_path_buf();
    move |source| TestkitError::Io {
        action,
        path,
        source,
    }
}

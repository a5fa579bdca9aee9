//! NVIDIA's `createContainer` hooks, as `nvidia-cdi-hook <name>` and `nvidia-ctk hook
//! <name>` run them from the specs `nvidia-ctk cdi generate` writes (ours and
//! NVIDIA's): `create-symlinks`, `update-ldcache`, `chmod`,
//! `update-application-profile` and `enable-cuda-compat`
//! (`disable-device-node-modification` is [`super::params`]).
//!
//! Each finds the container's rootfs like NVIDIA's hooks do: the OCI state (stdin, or
//! the file `--container-spec` names) gives the bundle, the bundle's `config.json`
//! gives `root.path`, relative to the bundle. runc runs `createContainer` hooks in the
//! container's mount namespace before `pivot_root`, so that path is the rootfs with
//! the spec's mounts and `/dev` in place.
//!
//! The rootfs belongs to the image: every path is resolved inside it ([`Rootfs`]:
//! `openat2(RESOLVE_IN_ROOT)` or the same walk by hand), files are written only on the
//! rootfs's own filesystem, and nothing from the image runs. `update-ldcache` does not
//! run `ldconfig` at all: it reads the libraries' ELF headers itself ([`elf`]) and
//! merges their entries into the container's `ld.so.cache` (`rootfs::linker`).

pub mod chmod;
pub mod compat;
pub use crate::rootfs::elf;
pub mod ldcache;
pub mod profile;
pub mod symlinks;

use std::io::Read;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{self, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{self, Mode};

use crate::bundle::{self, Bundle, BundleError};
use crate::rootfs::{Rootfs, RootfsError};

/// The OCI state is small; anything larger is not one.
const MAX_STATE: u64 = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum StageError {
    #[error("cannot read the OCI state from {from}: {source}")]
    State {
        from: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error(
        "the container's rootfs is {0:?}: refusing to work on the host's root (is this a \
         createContainer hook of a container?)"
    )]
    HostRoot(PathBuf),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error("{path} in the container rootfs {root}: {source}")]
    Path {
        root: PathBuf,
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error(
        "{path} in the container rootfs {root} has {links} hard links: refusing to change the \
         mode of a file whose other names may be the host's (chmod takes directories and \
         files with one link)"
    )]
    HardLink {
        root: PathBuf,
        path: PathBuf,
        links: libc::nlink_t,
    },
    #[error("invalid --mode {value:?}: expected an octal file mode such as 755 (at most 7777)")]
    Mode { value: String },
    #[error("invalid --path {value:?}: expected an absolute path in the container")]
    RelativePath { value: String },
    #[error(
        "invalid --cuda-compat-container-root {value:?}: expected an absolute directory in the \
         container, such as /usr/local/cuda/compat"
    )]
    CompatRoot { value: String },
    #[error("invalid --folder {value:?}: expected an absolute directory in the container")]
    Folder { value: String },
    #[error("invalid --host-driver-version {value:?}: expected a version such as 550.54.15")]
    DriverVersion { value: String },
}

/// The OCI state: from `container_spec` (NVIDIA's `--container-spec`) when it names a
/// file, else (absent, empty or `-`) from stdin.
pub fn read_state(container_spec: Option<&Path>) -> Result<Vec<u8>, StageError> {
    let mut state = Vec::new();
    match container_spec.filter(|p| !p.as_os_str().is_empty() && *p != Path::new("-")) {
        Some(path) => std::fs::File::open(path)
            .and_then(|f| f.take(MAX_STATE).read_to_end(&mut state))
            .map_err(|source| StageError::State {
                from: path.display().to_string(),
                source,
            })?,
        None => std::io::stdin()
            .take(MAX_STATE)
            .read_to_end(&mut state)
            .map_err(|source| StageError::State {
                from: "stdin".to_owned(),
                source,
            })?,
    };
    Ok(state)
}

/// The container's rootfs on the host, from the OCI state: `<bundle>/<root.path>`
/// (an absolute `root.path` as it is).
pub fn rootfs_path(state: &[u8]) -> Result<PathBuf, StageError> {
    let state = bundle::parse_state(state)?;
    let loaded = Bundle::new(&state.bundle).load()?;
    let root = loaded.doc.root_path().ok_or(StageError::NoRoot)?;
    let path = state.bundle.join(root);
    if path.as_os_str().is_empty() || path == Path::new("/") {
        return Err(StageError::HostRoot(path));
    }
    Ok(path)
}

/// Opens the container's rootfs named by the OCI state. The directory opened must not
/// be the host's root under another name (a symlink to `/`, enough `..`).
pub fn open_rootfs(state: &[u8]) -> Result<Rootfs, StageError> {
    let path = rootfs_path(state)?;
    let rootfs = Rootfs::open(&path)?;
    if rootfs.is_host_root()? {
        return Err(StageError::HostRoot(path));
    }
    Ok(rootfs)
}

/// An absolute container path with no `..` (the spec's, not the image's).
fn container_path(value: &str) -> Option<PathBuf> {
    let path = Path::new(value);
    (path.is_absolute()
        && !value.contains('\0')
        && path
            .components()
            .all(|c| !matches!(c, std::path::Component::ParentDir)))
    .then(|| path.to_path_buf())
}

/// Opens `path` (`O_PATH`) in the root with no symlink allowed anywhere on the way:
/// `openat2(RESOLVE_IN_ROOT | RESOLVE_NO_SYMLINKS)`, or [`walk_no_symlinks`] where the
/// kernel has no `openat2`.
fn open_no_symlinks(root: BorrowedFd<'_>, path: &Path) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_SYMLINKS);
    let relative = path.strip_prefix("/").unwrap_or(path);
    let relative = if relative.as_os_str().is_empty() {
        Path::new(".")
    } else {
        relative
    };
    match fcntl::openat2(root, relative, how) {
        Err(Errno::ENOSYS) => walk_no_symlinks(root, path),
        // The kernel asks to retry when a rename raced the lookup.
        Err(Errno::EAGAIN) => fcntl::openat2(root, relative, how),
        other => other,
    }
}

/// `RESOLVE_NO_SYMLINKS` by hand: one component at a time, each opened `O_PATH |
/// O_NOFOLLOW` relative to the previous one's fd; a symlink (magic links included) is
/// `ELOOP`, `..` is refused (`EXDEV`: container paths have none).
fn walk_no_symlinks(root: BorrowedFd<'_>, path: &Path) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut current = fcntl::openat(root, ".", flags | OFlag::O_DIRECTORY, Mode::empty())?;
    for part in path.components() {
        let name = match part {
            Component::Normal(name) => name,
            Component::ParentDir => return Err(Errno::EXDEV),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => continue,
        };
        let next = fcntl::openat(&current, name, flags, Mode::empty())?;
        let st = stat::fstat(&next)?;
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(Errno::ELOOP);
        }
        current = next;
    }
    Ok(current)
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;

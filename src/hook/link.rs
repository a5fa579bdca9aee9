//! `nvshim hook link-driver`: the `createContainer` hook of our CDI specs.
//!
//! Our runtime creates the driver's soname symlinks and merges the linker cache from
//! the host side before it execs runc (`rootfs::linker`). A CDI consumer (podman,
//! containerd, CRI-O, docker) only applies device nodes, mounts, env and hooks, so a
//! generated spec carries this one hook to do the same: it gets the links and cache
//! entries as arguments, finds the rootfs from the OCI state on stdin, and calls the
//! same `linker::install`. One process per container, where NVIDIA's specs run two
//! (`create-symlinks`, then `update-ldcache`, which itself runs `ldconfig`).
//!
//! runc runs `createContainer` hooks in the container's mount namespace after the
//! spec's mounts and before `pivot_root`, so `<bundle>/<root.path>` is the rootfs with
//! the driver files already bound in. Nothing from the image runs, and every path is
//! resolved inside the rootfs fd (`Rootfs`), never through the image's symlinks.
//!
//! Its arguments (`--link TARGET::PATH`, `--ldcache KEY=PATH@FLAGS[+HWCAP]`) are
//! encoded and parsed by `hook_contract`, and validated before anything is written.

use crate::bundle::{self, Bundle, BundleError};
use crate::discover::SymlinkEdit;
use crate::ldcache::Entry;
use crate::rootfs::linker::{self, Refresh};
use crate::rootfs::{Rootfs, RootfsError};

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error(
        "the container's rootfs is {0:?}, the host's root: refusing to write links and the \
         linker cache there (is this a createContainer hook of a container?)"
    )]
    HostRoot(std::path::PathBuf),
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Stage(#[from] super::stages::StageError),
}

/// Runs the hook: `state` is the OCI state JSON from stdin. Returns how many links
/// changed and what happened to the cache.
pub fn run(
    state: &[u8],
    links: &[SymlinkEdit],
    entries: &[Entry],
) -> Result<(usize, Refresh), LinkError> {
    let state = bundle::parse_state(state)?;
    let loaded = Bundle::new(&state.bundle).load()?;
    let root = loaded.doc.root_path().ok_or(LinkError::NoRoot)?;
    let path = state.bundle.join(root);
    let rootfs = Rootfs::open(&path)?;
    if rootfs.is_host_root()? {
        return Err(LinkError::HostRoot(path));
    }
    // CDI specs carry their own `enable-cuda-compat` hook.
    let (dev, rest) = super::stages::symlinks::split_dev(links);
    let (mut changed, refresh) = linker::install(&rootfs, &rest, entries, &[])?;
    if !dev.is_empty() {
        changed += super::stages::symlinks::run(&rootfs, &dev)?;
    }
    Ok((changed, refresh))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// A `root.path` that is the host's root, by name or another way, is refused before
    /// anything is written (the host's `/etc/ld.so.cache` and `/usr/lib` would be).
    #[test]
    fn the_host_root_is_never_a_rootfs() {
        let tmp = tempfile::tempdir().unwrap();
        let state = format!(
            r#"{{"ociVersion":"1.0.2","id":"c1","status":"creating","pid":1,"bundle":"{}"}}"#,
            tmp.path().display()
        );
        std::os::unix::fs::symlink("/", tmp.path().join("slash")).unwrap();
        for root in ["/", "slash"] {
            std::fs::write(
                tmp.path().join("config.json"),
                format!(r#"{{"ociVersion":"1.0.2","root":{{"path":"{root}"}}}}"#),
            )
            .unwrap();
            let err = run(state.as_bytes(), &[], &[]).unwrap_err().to_string();
            assert!(err.contains("host's root"), "{root}: {err}");
        }
    }
}

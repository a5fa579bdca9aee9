//! The driver's files in one mount: a staging directory on the host, bound into the
//! container once, with symlinks at the files' usual paths.
//!
//! Per-file bind mounts cost runc, on every start, a path walk in the rootfs, a mount
//! target, a `mount` and a read-only remount each: for an 8-GPU `compute,utility`
//! container that is most of what the GPU adds to a plain `runc create`. So the
//! read-only files of a plan (libraries, binaries, configs, firmware) are gathered
//! once per set of files into a small tmpfs under the stage root (default
//! `/run/nvshim/driver-stage/<key>`), each file a read-only `nosuid,nodev` bind mount
//! of the host file; the container gets that tmpfs with one recursive bind at
//! [`CONTAINER_DIR`], and each file's usual path becomes a symlink into it
//! (`/usr/bin/nvidia-smi -> /usr/lib/nvshim/nvidia-smi`). The soname links and the
//! linker cache are written as before, so `ld.so` and `ldd` name the same paths and
//! reach the same files.
//!
//! The key is a hash of the files' host paths and identities (device, inode, size,
//! times): a driver upgrade gives new identities, hence a new stage; the stale one is
//! detached when the next stage is built (running containers hold their own copy of
//! its mounts). See `host` for the mounts, the lock and the garbage collection, and
//! `docs/runtime.md` for the layout.
//!
//! A path where the image has a file of its own keeps a bind mount (a symlink would
//! replace the image's file in the rootfs for good). Sockets, pipe directories,
//! directories and anything writable stay per-file mounts.

pub mod host;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashSet};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use crate::cdi::Mount;
use crate::edits::RO_OPTIONS;

pub use host::{StageError, ensure};

/// Where the stage appears in the container. Short, so that every link's target
/// (`/usr/lib/nvshim/libnvidia-ptxjitcompiler.so.550.54.15`) stays under the 60
/// bytes ext4 keeps inside the inode: a longer one costs each link a data block.
pub const CONTAINER_DIR: &str = "/usr/lib/nvshim";

/// The stage's tree: each file's container path below it, a relative symlink to the
/// file (see [`Stage::dir_link`]).
pub const TREE_DIR: &str = "t";

/// Where a directory the image lacks may be one link to the stage's tree (see
/// [`Stage::dir_link`]): the GSP firmware's `/lib/firmware/nvidia/<version>/`, which
/// would otherwise be three new directories in most images.
pub const DIR_LINK_ROOTS: &[&str] = &["/lib/firmware", "/usr/lib/firmware"];

/// The stage's own mount: read-only, no devices, no set-uid, nothing executable on the
/// tmpfs itself (the binaries' bind mounts keep exec), submounts included, propagating
/// nowhere.
pub const STAGE_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "noexec", "rbind", "rprivate"];

/// A file to stage: its host path and where it is in the stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StageFile {
    pub host_path: PathBuf,
    /// Relative to the stage: the file's name, or `<n>/<name>` when two host files
    /// share a name.
    pub rel: PathBuf,
}

/// A stage on the host, ready to bind, and the mounts it replaces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    /// The stage directory on the host (`<stage root>/<key>`).
    pub host_dir: PathBuf,
    /// Container path → path in the stage, for each mount it replaces.
    pub links: BTreeMap<PathBuf, PathBuf>,
    /// Whether this call built it (else it was there).
    pub built: bool,
}

impl Stage {
    /// The symlinks to make in the rootfs: each file's usual path to its place under
    /// [`CONTAINER_DIR`].
    pub fn symlinks(&self) -> Vec<(PathBuf, String)> {
        self.links
            .iter()
            .map(|(path, rel)| {
                let target = Path::new(CONTAINER_DIR).join(rel);
                (path.clone(), target.display().to_string())
            })
            .collect()
    }

    /// The target for a symlink at `dir`, a directory the image lacks, in place of the
    /// links below it: the stage's tree at `dir`. `None` unless the stage has links
    /// below `dir` and none of `others` (what else goes into the rootfs: other mounts'
    /// targets, the soname links) is at or below it.
    ///
    /// Only for the firmware's directories ([`DIR_LINK_ROOTS`]): a symlink in place of
    /// a directory shows to a walk that does not follow links (`find`), and nothing in
    /// a container walks or even reads the GPU's firmware (the host's kernel loads it).
    pub fn dir_link(&self, dir: &Path, others: &[&Path]) -> Option<String> {
        if !DIR_LINK_ROOTS.iter().any(|root| dir.starts_with(root)) {
            return None;
        }
        let below = self.links.keys().any(|p| p.starts_with(dir) && p != dir);
        let clash = others.iter().any(|o| o.starts_with(dir));
        (below && !clash).then(|| {
            let inside = dir.strip_prefix("/").unwrap_or(dir);
            Path::new(CONTAINER_DIR)
                .join(TREE_DIR)
                .join(inside)
                .display()
                .to_string()
        })
    }

    /// Replaces the staged mounts in `mounts` with one bind of the stage, keeping the
    /// mounts at `occupied` (paths where the image has a file of its own).
    pub fn rewrite(&self, mounts: &mut Vec<Mount>, occupied: &[PathBuf]) {
        let keep: HashSet<&Path> = occupied.iter().map(PathBuf::as_path).collect();
        mounts.retain(|m| {
            let path = Path::new(&m.container_path);
            !self.links.contains_key(path) || keep.contains(path)
        });
        mounts.push(Mount {
            host_path: self.host_dir.display().to_string(),
            container_path: CONTAINER_DIR.into(),
            kind: Some("bind".into()),
            options: STAGE_OPTIONS.iter().map(|s| s.to_string()).collect(),
        });
    }
}

/// The mounts a stage can take: read-only binds with the driver files' options, of
/// an absolute host path to an absolute container path outside `/dev`, `/proc` and
/// `/sys` and outside the stage's own directory. Whether the host path is a regular
/// file is checked when it is staged.
pub fn eligible(mount: &Mount) -> bool {
    let container = Path::new(&mount.container_path);
    mount.kind.as_deref() == Some("bind")
        && mount
            .options
            .iter()
            .map(String::as_str)
            .eq(RO_OPTIONS.iter().copied())
        && Path::new(&mount.host_path).is_absolute()
        && container.is_absolute()
        && container.components().all(|c| c != Component::ParentDir)
        && !["/dev", "/proc", "/sys", CONTAINER_DIR]
            .iter()
            .any(|top| container.starts_with(top))
}

/// Where each of `hosts` goes in the stage (in their order; give them sorted and
/// without duplicates): its file name, or `<n>/<name>` with the smallest `n` from 1
/// where that name is free. Deterministic, so one set of files has one layout.
pub fn layout(hosts: &[&Path]) -> Vec<PathBuf> {
    let mut taken: HashSet<PathBuf> = HashSet::new();
    hosts
        .iter()
        .map(|host| {
            let name = host.file_name().unwrap_or(OsStr::new("file"));
            let mut rel = PathBuf::from(name);
            let mut n = 1u32;
            while taken.contains(&rel) {
                rel = Path::new(&n.to_string()).join(name);
                n += 1;
            }
            taken.insert(rel.clone());
            rel
        })
        .collect()
}

/// What [`key`] hashes of one file.
pub struct KeyedFile<'a> {
    pub host: &'a Path,
    pub rel: &'a Path,
    pub containers: &'a [PathBuf],
    pub identity: [u64; 6],
}

/// The stage's name for a set of files: FNV-1a (64 bits, hex) over a layout version
/// and each file's host path, place, container paths and identity. Not a security
/// boundary: every use checks each staged file's identity against the host file (see
/// `host`).
pub fn key<'a>(files: impl IntoIterator<Item = KeyedFile<'a>>) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    eat(b"nvshim-driver-stage-2\0");
    for file in files {
        eat(file.host.as_os_str().as_bytes());
        eat(b"\0");
        eat(file.rel.as_os_str().as_bytes());
        eat(b"\0");
        for container in file.containers {
            eat(container.as_os_str().as_bytes());
            eat(b"\0");
        }
        eat(b"\0");
        for n in file.identity {
            eat(&n.to_le_bytes());
        }
    }
    format!("{hash:016x}")
}

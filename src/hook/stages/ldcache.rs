//! `update-ldcache --folder D …`: the libraries in the folders, in the container's
//! linker cache.
//!
//! NVIDIA's hook runs the host's `ldconfig` against the rootfs. This one does
//! `ldconfig`'s work for the named folders only, from the host side and without
//! running anything: each `lib*.so*` regular file in a folder (listed and opened
//! inside the rootfs, never through a link out of it) has its ELF header read; a
//! library for this architecture gets its soname link in the folder when none is
//! there (as `ldconfig` makes them) and an entry `soname → folder/soname` in
//! `/etc/ld.so.cache`, merged into the image's cache in its format
//! (`rootfs::linker::refresh`). Of several files with one soname the highest version
//! wins, as with `ldconfig`. The image's other entries stay as they are; no
//! `ld.so.conf.d` file is written.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{self, AtFlags, OFlag};
use nix::sys::stat::{self, Mode, SFlag};

use crate::ldcache::Entry;
use crate::rootfs::Rootfs;
use crate::rootfs::linker::{self, Refresh};

use super::{StageError, container_path, elf};

/// What [`run`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Updated {
    /// Soname links created.
    pub links: usize,
    /// Cache entries offered (one per soname and class found).
    pub entries: Vec<Entry>,
    pub refresh: Refresh,
}

/// Parses `--folder` values: absolute container paths, no `..`.
pub fn parse_folders(values: &[String]) -> Result<Vec<PathBuf>, StageError> {
    let mut folders: Vec<PathBuf> = Vec::new();
    for value in values {
        let folder = container_path(value).ok_or_else(|| StageError::Folder {
            value: value.clone(),
        })?;
        if !folders.contains(&folder) {
            folders.push(folder);
        }
    }
    Ok(folders)
}

/// Updates the cache of `rootfs` with the libraries in `folders`. The directories
/// that `ld.so.conf.d/00-compat-*.conf` files name (what `enable-cuda-compat` writes)
/// are scanned too, and their libraries win over the folders' for the same soname,
/// as with NVIDIA's `ldconfig` run (`00-compat` sorts first).
pub fn run(rootfs: &Rootfs, folders: &[PathBuf]) -> Result<Updated, StageError> {
    let mut links = Vec::new();
    let mut entries: Vec<Entry> = Vec::new();
    for dir in compat_dirs(rootfs)? {
        scan(rootfs, &dir, &mut links, &mut entries)?;
    }
    let compat: BTreeSet<(String, i32)> =
        entries.iter().map(|e| (e.key.clone(), e.flags)).collect();
    let mut own = Vec::new();
    for folder in folders {
        scan(rootfs, folder, &mut links, &mut own)?;
    }
    entries.extend(
        own.into_iter()
            .filter(|e| !compat.contains(&(e.key.clone(), e.flags))),
    );
    links.sort();
    links.dedup_by(|a, b| a.0 == b.0);
    let made = rootfs.symlinks(links.iter().map(|(p, t)| (p.as_path(), t.as_str())))?;
    let refresh = linker::refresh(rootfs, &entries)?;
    Ok(Updated {
        links: made,
        entries,
        refresh,
    })
}

/// The soname links `folder` lacks and its cache entries, added to `links` and
/// `entries`.
fn scan(
    rootfs: &Rootfs,
    folder: &Path,
    links: &mut Vec<(PathBuf, String)>,
    entries: &mut Vec<Entry>,
) -> Result<(), StageError> {
    let Some(dir) = open_dir(rootfs, folder)? else {
        tracing::debug!(folder = %folder.display(), "not in the container, skipped");
        return Ok(());
    };
    // (soname, flags) → the file name with the highest version.
    let mut best: BTreeMap<(String, i32), String> = BTreeMap::new();
    let (libs, present) = libraries(rootfs, folder, dir)?;
    for (name, lib) in libs {
        let Some(flags) = lib.cache_flags() else {
            tracing::debug!(file = %folder.join(&name).display(), "not a library for this architecture");
            continue;
        };
        let soname = lib.soname.unwrap_or_else(|| name.clone());
        let slot = best.entry((soname, flags)).or_insert_with(|| name.clone());
        if version_cmp(&name, slot) == Ordering::Greater {
            *slot = name;
        }
    }
    for ((soname, flags), file) in best {
        let link = folder.join(&soname);
        if soname != file && !present.contains(&soname) {
            links.push((link.clone(), file));
        }
        entries.push(Entry {
            key: soname,
            value: link.to_string_lossy().into_owned(),
            flags,
            hwcap: 0,
        });
    }
    Ok(())
}

/// Where `enable-cuda-compat` (ours or NVIDIA's) records the compat directory.
pub const CONF_DIR: &str = "/etc/ld.so.conf.d";
/// The prefix and suffix of those files' names.
pub const COMPAT_CONF: (&str, &str) = ("00-compat-", ".conf");

/// Most compat directories read (`enable-cuda-compat` records one).
pub const MAX_COMPAT_DIRS: usize = 16;

/// The directories the rootfs's `00-compat-*.conf` files name, in file name order.
pub(super) fn compat_dirs(rootfs: &Rootfs) -> Result<Vec<PathBuf>, StageError> {
    let conf = Path::new(CONF_DIR);
    let Some(mut dir) = open_dir(rootfs, conf)? else {
        return Ok(Vec::new());
    };
    let mut names: Vec<String> = dir
        .iter()
        .flatten()
        .filter_map(|e| e.file_name().to_str().ok().map(str::to_owned))
        .filter(|n| n.starts_with(COMPAT_CONF.0) && n.ends_with(COMPAT_CONF.1))
        .collect();
    names.sort();
    let mut dirs = Vec::new();
    // The image writes these files: past MAX_COMPAT_DIRS lines, or as many files, the
    // rest is left out rather than read.
    for name in names.iter().take(MAX_COMPAT_DIRS) {
        // Small text files; anything that is not one is skipped.
        let Ok(Some(text)) = rootfs.read(&conf.join(name), 64 * 1024) else {
            continue;
        };
        for line in String::from_utf8_lossy(&text).lines() {
            let line = line.trim();
            if let Some(path) = container_path(line)
                && !dirs.contains(&path)
            {
                if dirs.len() == MAX_COMPAT_DIRS {
                    tracing::warn!(
                        file = %conf.join(name).display(),
                        "more than {MAX_COMPAT_DIRS} CUDA compat directories; the rest are left out"
                    );
                    return Ok(dirs);
                }
                dirs.push(path);
            }
        }
    }
    if names.len() > MAX_COMPAT_DIRS {
        tracing::warn!(
            "more than {MAX_COMPAT_DIRS} {}*{} files in {CONF_DIR}; read the first {MAX_COMPAT_DIRS}",
            COMPAT_CONF.0,
            COMPAT_CONF.1
        );
    }
    Ok(dirs)
}

/// `folder` in the rootfs, opened for listing; `None` when it does not exist.
pub(super) fn open_dir(rootfs: &Rootfs, folder: &Path) -> Result<Option<Dir>, StageError> {
    let Some(fd) = rootfs.path_fd(folder)? else {
        return Ok(None);
    };
    let dir =
        reopen(&fd, OFlag::O_RDONLY | OFlag::O_DIRECTORY).map_err(|source| StageError::Path {
            root: rootfs.path().to_path_buf(),
            path: folder.to_path_buf(),
            source,
        })?;
    Ok(Some(Dir::from_fd(dir).map_err(|source| {
        StageError::Path {
            root: rootfs.path().to_path_buf(),
            path: folder.to_path_buf(),
            source,
        }
    })?))
}

/// Opens the inode an `O_PATH` fd holds, through `/proc/self/fd`.
pub(super) fn reopen(fd: &OwnedFd, flags: OFlag) -> Result<OwnedFd, Errno> {
    fcntl::open(
        format!("/proc/self/fd/{}", fd.as_raw_fd()).as_str(),
        flags | OFlag::O_CLOEXEC | OFlag::O_NOCTTY,
        Mode::empty(),
    )
}

/// The `lib*.so*` regular files in `dir` that are ELF shared objects, by name, in
/// name order, and the names in `dir` that are anything but a symlink (a soname link
/// is never made over one of those, as `ldconfig`). Symlinks are not followed (the
/// files they lead to are listed themselves); FIFOs and devices are never opened.
type Listing = (Vec<(String, elf::Library)>, BTreeSet<String>);

fn libraries(rootfs: &Rootfs, folder: &Path, mut dir: Dir) -> Result<Listing, StageError> {
    let err = |source| StageError::Path {
        root: rootfs.path().to_path_buf(),
        path: folder.to_path_buf(),
        source,
    };
    let mut names: Vec<String> = Vec::new();
    // Every name that is not a symlink, whatever it is called: a soname (the image's
    // text) can name any of them.
    let mut present = BTreeSet::new();
    let mut unknown = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(err)?;
        let Ok(name) = entry.file_name().to_str() else {
            continue;
        };
        if (name.starts_with("lib") || name.starts_with("ld-")) && name.contains(".so") {
            names.push(name.to_owned());
            continue;
        }
        match entry.file_type() {
            Some(Type::Symlink) => {}
            Some(_) => {
                present.insert(name.to_owned());
            }
            // The filesystem does not say (no d_type): asked below.
            None => unknown.push(name.to_owned()),
        }
    }
    for name in unknown {
        let st = stat::fstatat(&dir, name.as_str(), AtFlags::AT_SYMLINK_NOFOLLOW);
        if st.is_ok_and(|st| st.st_mode & libc::S_IFMT != libc::S_IFLNK) {
            present.insert(name);
        }
    }
    names.sort();
    let mut found = Vec::new();
    for name in names {
        let os = OsStr::from_bytes(name.as_bytes());
        let kind = match stat::fstatat(&dir, os, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT,
            Err(_) => continue,
        };
        if kind != SFlag::S_IFLNK {
            present.insert(name.clone());
        }
        if kind != SFlag::S_IFREG {
            continue;
        }
        let Some(file) = open_regular(&dir, os) else {
            continue;
        };
        if let Some(lib) = elf::read(&file) {
            found.push((name, lib));
        }
    }
    Ok((found, present))
}

/// Opens `name` in `dir` for reading only if it is a regular file: resolved `O_PATH |
/// O_NOFOLLOW` first, checked, then that very inode reopened. Opening by name after a
/// check would open whatever was swapped in meanwhile (a FIFO would block; a device
/// node's open can act on the device).
pub(super) fn open_regular(dir: &Dir, name: &OsStr) -> Option<File> {
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

/// Compares file names as `ldconfig` ranks versions: runs of digits by value, the
/// rest by byte.
pub fn version_cmp(a: &str, b: &str) -> Ordering {
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    loop {
        match (a.first(), b.first()) {
            (None, None) => return Ordering::Equal,
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(x), Some(y)) if x.is_ascii_digit() && y.is_ascii_digit() => {
                let da = a.iter().take_while(|c| c.is_ascii_digit()).count();
                let db = b.iter().take_while(|c| c.is_ascii_digit()).count();
                let (na, nb) = (trim_zeros(&a[..da]), trim_zeros(&b[..db]));
                let order = na.len().cmp(&nb.len()).then_with(|| na.cmp(nb));
                if order != Ordering::Equal {
                    return order;
                }
                a = &a[da..];
                b = &b[db..];
            }
            (Some(x), Some(y)) => {
                if x != y {
                    return x.cmp(y);
                }
                a = &a[1..];
                b = &b[1..];
            }
        }
    }
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&c| c == b'0').count();
    &digits[zeros..]
}

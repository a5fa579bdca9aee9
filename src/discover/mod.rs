//! Finds the host files a request needs: device nodes (stat'd for their real
//! major/minor), the driver's libraries of the running version, binaries, IPC
//! sockets and GSP firmware.
//!
//! Reads only what the request needs: the driver root's `ld.so.cache` (parsed here,
//! never `ldconfig -p`), one `lstat` per candidate file, one `stat` per device node,
//! and `mig-minors` only when MIG devices are selected. Nothing is skipped silently:
//! what is absent goes into [`HostResources::missing`], and the pipeline decides
//! which absences are fatal.

mod arch;
pub mod classes;
pub mod csv;
mod drm;
mod graphics;
pub mod mig_access;
mod nodes;
pub mod params;
pub mod resolve;
pub mod table;
pub mod wsl;

pub use nodes::parse_mig_minors;

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::ldcache::{self, Class, LdCache};
use crate::request::{Capability, DeviceClasses, DriverCapabilities};
use crate::roots::Roots;
use crate::select::Selection;
use resolve::{Link, Resolver};
use table::{BINARY_DIRS, FIRMWARE_DIR, TABLE};

/// A character device node found under the dev root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct DeviceNode {
    /// Path in the container, e.g. `/dev/nvidia0`.
    pub path: PathBuf,
    /// Path on the host (under the dev root).
    pub host_path: PathBuf,
    pub major: u64,
    pub minor: u64,
    /// Permission bits, e.g. `0o666`.
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
}

/// What kind of file a [`HostFile`] is; decides the mount options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum FileKind {
    Library,
    Binary,
    Config,
    Firmware,
    /// A socket (mounted read-only: connecting needs no write access to the mount).
    Socket,
    /// A pipe directory (MPS), mounted writable.
    IpcDir,
    /// A device class's host file or directory (GDS's `/etc/cufile.json` and
    /// `/run/udev`): read-only, with submounts (`rbind`), as NVIDIA mounts them.
    ClassFile,
    /// A directory a Tegra CSV file lists (`dir, …`), mounted read-only.
    Directory,
}

/// A regular file (or IPC endpoint) found under the driver root.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct HostFile {
    pub kind: FileKind,
    /// Path in the container: the real file's path with the driver root stripped.
    pub path: PathBuf,
    /// Path on the host.
    pub host_path: PathBuf,
    /// Symlinks that lead to this file on the host, recreated in the container
    /// (`libcuda.so -> libcuda.so.1`, `libcuda.so.1 -> libcuda.so.550.54.15`).
    pub links: Vec<SymlinkEdit>,
    /// For a library: the linker-cache entry the container needs so `ld.so` finds it
    /// (key `libcuda.so.1`, value its container path), with the host cache's flags.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ldcache: Option<ldcache::Entry>,
}

/// A symlink to recreate: `path` points at `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SymlinkEdit {
    pub path: PathBuf,
    pub target: String,
}

/// Something the request would use that the host does not have.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Missing {
    /// What was looked for: a path, or a library stem.
    pub what: String,
    /// Why it matters (`compute`, `GPU 3`, …).
    pub needed_for: String,
    /// Whether the container cannot work without it.
    pub required: bool,
    /// What was found instead, if anything (e.g. another driver version).
    pub detail: Option<String>,
}

/// Everything discovered for one request.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct HostResources {
    /// Control nodes first, then GPUs by minor, then MIG capabilities by minor.
    pub device_nodes: Vec<DeviceNode>,
    /// Libraries, binaries, configs, firmware, IPC: in discovery order, no duplicates.
    pub files: Vec<HostFile>,
    pub missing: Vec<Missing>,
    /// Symlinks that belong to no mounted file: the DRM `by-path` links of the selected
    /// GPUs (under `/dev`, so made once the container's `/dev` exists).
    pub links: Vec<SymlinkEdit>,
}

#[cfg(test)]
impl HostResources {
    /// `(path, major, minor)` of each device node, for assertions.
    pub(crate) fn node_numbers(&self) -> Vec<(String, u64, u64)> {
        self.device_nodes
            .iter()
            .map(|n| (n.path.display().to_string(), n.major, n.minor))
            .collect()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiscoverError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot use the driver's library cache {path}: {source}")]
    LdCache {
        path: PathBuf,
        #[source]
        source: ldcache::LdCacheError,
    },
    #[error("{path}: {reason}")]
    Parse { path: PathBuf, reason: String },
}

/// What to discover.
#[derive(Debug, Clone, Copy)]
pub struct Want<'a> {
    pub driver_version: &'a str,
    pub capabilities: DriverCapabilities,
    pub selection: &'a Selection,
    /// IMEX channels and the gated classes (nothing is read for an empty set).
    pub classes: &'a DeviceClasses,
}

/// Finds the host resources for `want` under `roots`.
pub fn discover(roots: &Roots, want: Want<'_>) -> Result<HostResources, DiscoverError> {
    let mut out = HostResources::default();
    nodes::device_nodes(roots, want, &mut out)?;
    if graphics::wanted(want.capabilities) {
        drm::device_nodes(roots, want.selection, &mut out)?;
    }
    let mut resolver = Resolver::new(&roots.driver);
    if !want.classes.is_empty() {
        classes::discover(roots, want.classes, &mut resolver, &mut out)?;
    }
    let cache = libraries(roots, want, &mut resolver, &mut out)?;
    for entry in active(want.capabilities) {
        for name in entry.binaries {
            binary(name, entry.capability, &mut resolver, &mut out)?;
        }
        for path in entry.configs {
            // Loader configs are extras: absent ones are noted, never required.
            optional_file(
                path,
                FileKind::Config,
                entry.capability,
                &mut resolver,
                &mut out,
            )?;
        }
    }
    if graphics::wanted(want.capabilities) {
        graphics::files(want, cache.as_ref(), &mut resolver, &mut out)?;
    }
    for entry in active(want.capabilities) {
        ipc(entry.ipc, entry.capability, &mut resolver, &mut out)?;
    }
    firmware(want.driver_version, &mut resolver, &mut out)?;
    Ok(out)
}

fn active(caps: DriverCapabilities) -> impl Iterator<Item = &'static table::CapabilityFiles> {
    TABLE.iter().filter(move |e| caps.contains(e.capability))
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> DiscoverError + '_ {
    move |source| DiscoverError::Io {
        path: path.to_path_buf(),
        source,
    }
}

// ---- libraries ----

fn libraries(
    roots: &Roots,
    want: Want<'_>,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<Option<LdCache>, DiscoverError> {
    let cache_path = roots.driver.join("etc/ld.so.cache");
    let cache = match crate::files::read(&cache_path) {
        Ok(bytes) => {
            let cache = ldcache::parse(&bytes).map_err(|source| DiscoverError::LdCache {
                path: cache_path.clone(),
                source,
            })?;
            if cache.skipped_not_utf8 > 0 {
                tracing::debug!(
                    path = %cache_path.display(),
                    skipped = cache.skipped_not_utf8,
                    "ld.so.cache entries with non-UTF-8 names left out"
                );
            }
            Some(cache)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            tracing::debug!(path = %cache_path.display(), "no ld.so.cache; scanning the usual library directories");
            None
        }
        Err(e) => return Err(io_err(&cache_path)(e)),
    };
    let mut classes = vec![Class::Lib64];
    if want.capabilities.contains(Capability::Compat32) {
        match arch::compat32_unavailable(ldcache::Arch::NATIVE) {
            Some(missing) => out.missing.push(missing),
            None => classes.push(Class::Lib32),
        }
    }
    for class in classes {
        for entry in active(want.capabilities) {
            for stem in entry.libraries {
                library(
                    stem,
                    class,
                    entry.capability,
                    want.driver_version,
                    cache.as_ref(),
                    resolver,
                    out,
                )?;
            }
        }
    }
    Ok(cache)
}

fn library(
    stem: &str,
    class: Class,
    capability: Capability,
    version: &str,
    cache: Option<&LdCache>,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let wanted = format!("{stem}.so.{version}");
    let mut others = Vec::new();
    let mut found = None;
    let candidates: Vec<(PathBuf, Option<&ldcache::Entry>)> = match cache {
        Some(cache) => cache
            .entries
            .iter()
            .filter(|e| e.class() == class && is_stem_key(&e.key, stem))
            .map(|e| (PathBuf::from(&e.value), Some(e)))
            .collect(),
        None => {
            let dirs = arch::library_dirs(ldcache::Arch::NATIVE, class);
            dirs.iter()
                .map(|d| (Path::new(d).join(&wanted), None))
                .collect()
        }
    };
    for (candidate, entry) in candidates {
        let Some(real) = resolver.resolve(&candidate).map_err(io_err(&candidate))? else {
            continue;
        };
        let name = real
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned());
        if name.as_deref() != Some(wanted.as_str()) || !real.metadata.is_file() {
            others.push(real.path.display().to_string());
            continue;
        }
        found = Some((real, entry));
        break;
    }
    let needed_for = match class {
        Class::Lib32 => format!("{} (compat32)", capability.name()),
        _ => capability.name().to_string(),
    };
    let Some((real, entry)) = found else {
        out.missing.push(Missing {
            what: stem.to_string(),
            needed_for,
            required: false,
            detail: (!others.is_empty()).then(|| {
                format!(
                    "found only other versions than {version}: {}",
                    others.join(", ")
                )
            }),
        });
        return Ok(());
    };
    let mut links: Vec<SymlinkEdit> = real.links.iter().map(symlink_edit).collect();
    // The development link (`libcuda.so`) is not in the cache; pick it up when the
    // host has it and it leads to the same file.
    if let Some(dir) = real.path.parent() {
        let dev = dir.join(format!("{stem}.so"));
        if !links.iter().any(|l| l.path == dev)
            && let Some(dev_real) = resolver.resolve(&dev).map_err(io_err(&dev))?
            && dev_real.path == real.path
            && let Some(first) = dev_real.links.first()
        {
            links.insert(0, symlink_edit(first));
        }
    }
    let cache_entry = cache_entry(entry, class, &real.path, &links);
    push_file(out, FileKind::Library, real.path, resolver, links);
    if let (Some(entry), Some(file)) = (cache_entry, out.files.last_mut())
        && file.kind == FileKind::Library
        && file.ldcache.is_none()
    {
        file.ldcache = Some(entry);
    }
    Ok(())
}

/// The entry for the container's `ld.so.cache`: the host cache's key and flags when
/// the library was found through it, else the soname link's name with the flags
/// `ldconfig` gives this architecture's libraries of `class`.
fn cache_entry(
    entry: Option<&ldcache::Entry>,
    class: Class,
    real: &Path,
    links: &[SymlinkEdit],
) -> Option<ldcache::Entry> {
    if let Some(entry) = entry {
        return Some(entry.clone());
    }
    let real_name = real.file_name()?.to_str()?;
    // `libcuda.so.1`, not the development link `libcuda.so` nor the file itself.
    let soname = links.iter().find(|l| {
        l.path
            .file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n != real_name && n.contains(".so.") && !n.ends_with(".so"))
    })?;
    Some(ldcache::Entry {
        key: soname.path.file_name()?.to_str()?.to_string(),
        value: soname.path.to_str()?.to_string(),
        flags: ldcache::native_flags(class)?,
        hwcap: 0,
    })
}

fn symlink_edit(link: &Link) -> SymlinkEdit {
    SymlinkEdit {
        path: link.path.clone(),
        target: link.target.clone(),
    }
}

/// `libcuda.so.1` and `libcuda.so` are keys for stem `libcuda`; `libcudadebugger.so.1`
/// is not.
fn is_stem_key(key: &str, stem: &str) -> bool {
    key.strip_prefix(stem)
        .and_then(|rest| rest.strip_prefix(".so"))
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('.'))
}

fn push_file(
    out: &mut HostResources,
    kind: FileKind,
    path: PathBuf,
    resolver: &Resolver<'_>,
    links: Vec<SymlinkEdit>,
) {
    // Byte comparison: resolved paths are normal, and `Path`'s `==` walks components.
    if out
        .files
        .iter()
        .any(|f| f.path.as_os_str() == path.as_os_str())
    {
        return;
    }
    out.files.push(HostFile {
        kind,
        host_path: resolver.host(&path),
        path,
        links,
        ldcache: None,
    });
}

// ---- binaries, configs, IPC, firmware ----

fn binary(
    name: &str,
    capability: Capability,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    for dir in BINARY_DIRS {
        let candidate = Path::new(dir).join(name);
        if let Some(real) = resolver.resolve(&candidate).map_err(io_err(&candidate))?
            && real.metadata.is_file()
            && real.metadata.permissions().mode() & 0o111 != 0
        {
            // Mounted where it was found, so `/usr/bin/nvidia-smi` stays on PATH even
            // when the host's copy is a link into `/opt`.
            let links = real.links.iter().map(symlink_edit).collect();
            push_file(out, FileKind::Binary, real.path, resolver, links);
            return Ok(());
        }
    }
    out.missing.push(Missing {
        what: name.to_string(),
        needed_for: capability.name().to_string(),
        required: false,
        detail: None,
    });
    Ok(())
}

fn optional_file(
    path: &str,
    kind: FileKind,
    capability: Capability,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    match resolver
        .resolve(Path::new(path))
        .map_err(io_err(Path::new(path)))?
    {
        Some(real) if real.metadata.is_file() => {
            push_file(out, kind, real.path, resolver, Vec::new())
        }
        _ => out.missing.push(Missing {
            what: path.to_string(),
            needed_for: capability.name().to_string(),
            required: false,
            detail: None,
        }),
    }
    Ok(())
}

/// The first existing path of each daemon (`/run/...` or `/var/run/...`).
fn ipc(
    paths: &[&str],
    capability: Capability,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let mut seen_daemon: Vec<&str> = Vec::new();
    for path in paths {
        let daemon = path.trim_start_matches("/var").trim_end_matches("/socket");
        if seen_daemon.contains(&daemon) {
            continue;
        }
        let Some(real) = resolver
            .resolve(Path::new(path))
            .map_err(io_err(Path::new(path)))?
        else {
            continue;
        };
        let kind = if real.metadata.file_type().is_socket() {
            FileKind::Socket
        } else if real.metadata.is_dir() {
            FileKind::IpcDir
        } else {
            continue;
        };
        seen_daemon.push(daemon);
        push_file(out, kind, real.path, resolver, Vec::new());
    }
    // Daemons that are not running are normal; note them for `nvshim list`.
    for path in paths.iter().filter(|p| !p.starts_with("/var/")) {
        let daemon = path.trim_end_matches("/socket");
        if !seen_daemon.contains(&daemon) {
            out.missing.push(Missing {
                what: path.to_string(),
                needed_for: capability.name().to_string(),
                required: false,
                detail: Some("daemon not running".into()),
            });
        }
    }
    Ok(())
}

fn firmware(
    version: &str,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let dir = PathBuf::from(FIRMWARE_DIR.replace("{version}", version));
    let Some(real) = resolver.resolve(&dir).map_err(io_err(&dir))? else {
        out.missing.push(Missing {
            what: dir.display().to_string(),
            needed_for: "GSP firmware".into(),
            required: false,
            detail: None,
        });
        return Ok(());
    };
    if !real.metadata.is_dir() {
        return Ok(());
    }
    let host = resolver.host(&real.path);
    let mut names: Vec<String> = fs::read_dir(&host)
        .map_err(io_err(&host))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".bin"))
        .collect();
    names.sort();
    for name in names {
        let path = real.path.join(&name);
        if let Some(file) = resolver.resolve(&path).map_err(io_err(&path))?
            && file.metadata.is_file()
        {
            push_file(out, FileKind::Firmware, file.path, resolver, Vec::new());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_keys_match_their_stem_only() {
        let cases = [
            ("libcuda.so.1", "libcuda", true),
            ("libcuda.so", "libcuda", true),
            ("libcudadebugger.so.1", "libcuda", false),
            ("libnvidia-nvvm70.so.4", "libnvidia-nvvm", false),
            ("libnvidia-nvvm.so.4", "libnvidia-nvvm", true),
            ("libcuda.sox", "libcuda", false),
        ];
        for (key, stem, want) in cases {
            assert_eq!(is_stem_key(key, stem), want, "case {key} / {stem}");
        }
    }

    #[test]
    fn mig_minors_parse() {
        let text = "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\nbroken\n";
        let parsed = parse_mig_minors(text);
        assert_eq!(
            parsed,
            [
                ("config", 1),
                ("monitor", 2),
                ("gpu0/gi1/access", 12),
                ("gpu0/gi1/ci0/access", 13)
            ]
        );
    }
}

// SPDX-License-Identifier: Apache-2.0
//! WSL2's driver files: what a container needs to use the GPUs through Windows'
//! paravirtualised driver, as NVIDIA's toolkit injects them (`pkg/nvcdi/driver-wsl.go`,
//! the default JIT-CDI path since v1.18).
//!
//! - `/dev/dxg`, the one device node of every GPU, when a GPU is selected;
//! - `libdxcore.so` from `/usr/lib/wsl/lib`;
//! - from NVIDIA's driver store (`/usr/lib/wsl/drivers/<dir>`), mounted at the same
//!   path: the files NVIDIA requires ([`REQUIRED_STORE_FILES`]), then every other
//!   `*.so*`, `*.bin` and `*.dll` there;
//! - `/usr/bin/nvidia-smi` → the store's `nvidia-smi`, and each library's soname link
//!   (`libcuda.so.1` → `libcuda.so.1.1`) with its linker-cache entry: what NVIDIA's
//!   `create-symlinks` and `update-ldcache` (ldconfig over the two directories) leave.
//!
//! The driver store: NVIDIA asks dxcore for the adapters' driver store paths and keeps
//! the first holding `libcuda.so.1.1`. We load no library here, so we look in each
//! directory of `/usr/lib/wsl/drivers` (WSL mounts only the stores of drivers in use
//! there), in name order, for the same file: the first that holds it is NVIDIA's store.
//!
//! Capabilities do not filter: NVIDIA's WSL discovery has none, and the store is the
//! compute/utility driver. Sonames come from the file names (`lib<x>.so.<major>[.…]`),
//! the convention every library in NVIDIA's store follows; nothing is opened.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::resolve::Resolver;
use super::{
    DiscoverError, FileKind, HostFile, HostResources, Missing, SymlinkEdit, Want, io_err, nodes,
};
use crate::inventory::wsl::{DXG_NODE, WSL_DRIVERS_DIR, WSL_LIB_DIR};
use crate::ldcache::{self, Class};
use crate::roots::Roots;

/// The file that marks NVIDIA's driver store (NVIDIA's `getNVIDIADriverStorePath`).
pub const STORE_MARKER: &str = "libcuda.so.1.1";
/// The store files NVIDIA mounts by name (`requiredDriverStoreFiles`), in its order.
pub const REQUIRED_STORE_FILES: [&str; 8] = [
    "libcuda.so.1.1",
    "libcuda_loader.so",
    "libnvidia-ptxjitcompiler.so.1",
    "libnvidia-ml.so.1",
    "libnvidia-ml_loader.so",
    "libnvdxgdmal.so.1",
    "nvcubins.bin",
    "nvidia-smi",
];
/// From [`WSL_LIB_DIR`] (NVIDIA's `dxcoreLibraries`).
pub const DXCORE_LIBRARIES: [&str; 1] = ["libdxcore.so"];
/// Where `nvidia-smi` is linked from, so it is on `PATH`.
pub const NVIDIA_SMI_LINK: &str = "/usr/bin/nvidia-smi";
/// What every WSL file is needed for, in `missing`.
const NEEDED_FOR: &str = "WSL2";

/// Finds the WSL2 resources for `want` under `roots`.
pub fn discover(roots: &Roots, want: Want<'_>) -> Result<HostResources, DiscoverError> {
    let mut out = HostResources::default();
    if !want.selection.gpus.is_empty() || !want.selection.mig_devices.is_empty() {
        nodes::node(roots, DXG_NODE, "the GPUs (WSL2)", true, &mut out)?;
    }
    let mut resolver = Resolver::new(&roots.driver);
    for name in DXCORE_LIBRARIES {
        let path = Path::new(WSL_LIB_DIR).join(name);
        file(&path, false, &mut resolver, &mut out)?;
    }
    let Some(store) = driver_store(&roots.driver)? else {
        out.missing.push(Missing {
            what: format!("{WSL_DRIVERS_DIR}/*/{STORE_MARKER}"),
            needed_for: NEEDED_FOR.into(),
            required: true,
            detail: Some(format!(
                "no NVIDIA driver store: no directory of {WSL_DRIVERS_DIR} under the driver \
                 root {} holds {STORE_MARKER} (is the Windows NVIDIA driver installed?)",
                roots.driver.display()
            )),
        });
        return Ok(out);
    };
    // "Required" is NVIDIA's word: an absent one is logged and skipped there (older
    // drivers lack `libnvdxgdmal.so.1`), so it is noted, not fatal. `libcuda.so.1.1`
    // is there: it is what made the directory the store.
    for name in REQUIRED_STORE_FILES {
        file(&store.join(name), false, &mut resolver, &mut out)?;
    }
    for name in additional_files(&resolver.host(&store))? {
        file(&store.join(name), false, &mut resolver, &mut out)?;
    }
    Ok(out)
}

/// NVIDIA's driver store: the first directory of [`WSL_DRIVERS_DIR`] (in name order)
/// holding [`STORE_MARKER`], as a container path. Others holding it are logged.
pub fn driver_store(driver_root: &Path) -> Result<Option<PathBuf>, DiscoverError> {
    let drivers = driver_root.join(WSL_DRIVERS_DIR.trim_start_matches('/'));
    let entries = match fs::read_dir(&drivers) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(io_err(&drivers)(e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| {
            // `symlink_metadata`: a link in the store could point anywhere on the host.
            fs::symlink_metadata(drivers.join(name).join(STORE_MARKER)).is_ok_and(|m| m.is_file())
        })
        .collect();
    names.sort();
    let mut stores = names.into_iter();
    let Some(first) = stores.next() else {
        return Ok(None);
    };
    let others: Vec<String> = stores.collect();
    if !others.is_empty() {
        tracing::warn!(using = %first, ?others, "several NVIDIA driver stores in {WSL_DRIVERS_DIR}; using the first");
    }
    Ok(Some(Path::new(WSL_DRIVERS_DIR).join(first)))
}

/// The store's other files NVIDIA mounts (`*.so*`, `*.bin`, `*.dll`), by name, less
/// [`REQUIRED_STORE_FILES`].
fn additional_files(store: &Path) -> Result<Vec<String>, DiscoverError> {
    let mut names: Vec<String> = fs::read_dir(store)
        .map_err(io_err(store))?
        .filter_map(Result::ok)
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|name| is_additional(name))
        .collect();
    names.sort();
    Ok(names)
}

/// Whether NVIDIA's globs `*.so*`, `*.bin`, `*.dll` take `name` and it is not one of
/// the required files.
pub fn is_additional(name: &str) -> bool {
    (name.contains(".so") || name.ends_with(".bin") || name.ends_with(".dll"))
        && !REQUIRED_STORE_FILES.contains(&name)
}

/// A library's soname from its file name: `libcuda.so.1.1` → `libcuda.so.1`;
/// `libnvidia-ml.so.1` and `libdxcore.so` are their own.
pub fn soname(name: &str) -> &str {
    match name.split_once(".so.") {
        Some((stem, version)) => {
            let major = version.split('.').next().unwrap_or(version);
            &name[..stem.len() + ".so.".len() + major.len()]
        }
        None => name,
    }
}

/// One regular file at `path` (a container path): mounted where it is, with the soname
/// link and cache entry of a library and the `PATH` link of `nvidia-smi`. An absent one
/// is noted in `missing`.
fn file(
    path: &Path,
    required: bool,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let found = resolver.resolve(path).map_err(io_err(path))?;
    let Some(real) = found.filter(|r| r.metadata.is_file()) else {
        out.missing.push(Missing {
            what: path.display().to_string(),
            needed_for: NEEDED_FOR.into(),
            required,
            detail: None,
        });
        return Ok(());
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let dir = path.parent().unwrap_or(Path::new("/"));
    let mut links = Vec::new();
    let mut ldcache = None;
    let kind = if name == "nvidia-smi" {
        links.push(SymlinkEdit {
            path: PathBuf::from(NVIDIA_SMI_LINK),
            target: path.display().to_string(),
        });
        FileKind::Binary
    } else if name.contains(".so") {
        if name.starts_with("lib") {
            let soname = soname(name);
            let key_path = dir.join(soname);
            if soname != name {
                links.push(SymlinkEdit {
                    path: key_path.clone(),
                    target: name.to_owned(),
                });
            }
            ldcache = ldcache::native_flags(Class::Lib64).map(|flags| ldcache::Entry {
                key: soname.to_owned(),
                value: key_path.display().to_string(),
                flags,
                hwcap: 0,
            });
        }
        FileKind::Library
    } else {
        FileKind::Config
    };
    // Mounted at the path asked for (the store's name), the content of the real file.
    if out.files.iter().any(|f| f.path == path) {
        return Ok(());
    }
    out.files.push(HostFile {
        kind,
        path: path.to_path_buf(),
        host_path: resolver.host(&real.path),
        links,
        ldcache,
    });
    Ok(())
}

#[cfg(test)]
mod tests;

//! Planning in CSV mode (Jetson / Tegra): the host files the board's CSV mount specs
//! list ([`discover::csv`]) become the container's edits, whatever GPU ids were asked
//! for: NVIDIA's `csv` mode injects the whole list for any request but `void`, since
//! an integrated GPU is one device shared by everything on the board.
//!
//! The part `discover` cannot do is the linker's: each library's `DT_SONAME` (read
//! with `rootfs::elf`, bounded, never trusting the file) gives its `ld.so.cache` entry
//! and the soname link `ldconfig` would make. NVIDIA runs `ldconfig` in the container
//! for this (its `update-ldcache` hook); we write the cache from the host side, as for
//! the dGPU driver (`rootfs::linker`).
//!
//! `NVIDIA_REQUIRE_*` is not checked here: NVIDIA checks it against the CUDA version
//! `libcuda` reports when loaded into the runtime, and our runtime loads no library.
//! The skipped requirements are logged.

use std::fs::File;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use super::{Context, PipelineError, Plan};
use crate::discover::csv::{self, CsvSource};
use crate::discover::{FileKind, HostFile, HostResources, SymlinkEdit};
use crate::edits;
use crate::ldcache::Entry;
use crate::request::{DeviceList, Request};
use crate::rootfs::elf;
use crate::select::Selection;

/// Plans `request` from the CSV files `source` names, on `ctx`'s roots.
pub fn plan(ctx: &Context, request: &Request, source: &CsvSource) -> Result<Plan, PipelineError> {
    let mut plan = Plan {
        request: request.clone(),
        backend: None,
        driver: None,
        selection: Selection::default(),
        edits: Default::default(),
        ldcache: Vec::new(),
        symlinks: Vec::new(),
        missing: Vec::new(),
        modify_device_files: false,
        cdi_devices: Vec::new(),
    };
    if request.devices == DeviceList::Void {
        return Ok(plan);
    }
    if !request.requirements.is_empty() {
        let variables: Vec<&str> = request
            .requirements
            .iter()
            .map(|r| r.variable.as_str())
            .collect();
        tracing::warn!(
            ?variables,
            "csv mode: NVIDIA_REQUIRE_* is not checked (it needs libcuda loaded into the runtime)"
        );
    }
    let files = csv::load(&source.files)?;
    let mut resources = csv::discover(&ctx.roots, &files, &source.ignore)?;
    link_libraries(&mut resources);
    plan.edits = edits::build(&resources);
    // A `dir` mount brings the host's own entries, links included, and is read-only:
    // a link under it is neither needed nor creatable (the prestart hook makes links
    // after mounting).
    let dirs: Vec<(&Path, &Path)> = resources
        .files
        .iter()
        .filter(|f| f.kind == FileKind::Directory)
        .map(|f| (f.path.as_path(), f.host_path.as_path()))
        .collect();
    // Where a link under such a directory would go, on the host: `None` if not under one.
    let on_host = |path: &Path| {
        dirs.iter().find_map(|(dir, host)| {
            let rest = path.strip_prefix(dir).ok()?;
            Some(host.join(rest))
        })
    };
    plan.symlinks = edits::symlinks(&resources)
        .into_iter()
        .filter(|l| on_host(&l.path).is_none())
        .collect();
    plan.ldcache = resources
        .files
        .iter()
        .filter_map(|f| {
            let mut entry = f.ldcache.clone()?;
            // A soname link the directory lacks: the entry names the file itself.
            if on_host(Path::new(&entry.value))
                .is_some_and(|host| std::fs::symlink_metadata(host).is_err())
            {
                entry.value = f.path.to_string_lossy().into_owned();
            }
            Some(entry)
        })
        .collect();
    tracing::debug!(
        csv_files = files.len(),
        nodes = plan.edits.device_nodes.len(),
        mounts = plan.edits.mounts.len(),
        links = plan.symlinks.len(),
        "planned csv-mode edits"
    );
    plan.missing = resources.missing;
    Ok(plan)
}

/// Gives every library its linker-cache entry and soname link, as `ldconfig` in the
/// container would; and `libcuda.so -> libcuda.so.1` beside `libcuda`, the
/// development link NVIDIA's Tegra mode adds because programs `dlopen` it.
pub fn link_libraries(resources: &mut HostResources) {
    for file in resources
        .files
        .iter_mut()
        .filter(|f| f.kind == FileKind::Library)
    {
        let Some((dir, name)) = file
            .path
            .parent()
            .zip(file.path.file_name().and_then(|n| n.to_str()))
        else {
            continue;
        };
        let (dir, name) = (dir.to_path_buf(), name.to_owned());
        let Some((key, flags)) = soname(&file.host_path, &name) else {
            tracing::debug!(path = %file.path.display(), "not a shared library of this architecture; no cache entry");
            continue;
        };
        if key != name {
            add_link(file, dir.join(&key), &name);
        }
        if name.starts_with("libcuda.so") && key == "libcuda.so.1" {
            add_link(file, dir.join("libcuda.so"), "libcuda.so.1");
        }
        file.ldcache = Some(Entry {
            value: dir.join(&key).to_string_lossy().into_owned(),
            key,
            flags,
            hwcap: 0,
        });
    }
}

fn add_link(file: &mut HostFile, path: std::path::PathBuf, target: &str) {
    if file.path != path && !file.links.iter().any(|l| l.path == path) {
        file.links.push(SymlinkEdit {
            path,
            target: target.to_owned(),
        });
    }
}

/// The cache key (`DT_SONAME`, else the file name, as `ldconfig`) and flags of the
/// library at `host`; `None` for a file that is not a shared library `ld.so` here
/// would load.
fn soname(host: &Path, name: &str) -> Option<(String, i32)> {
    let file = File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(host)
        .ok()?;
    let library = elf::read(&file)?;
    let flags = library.cache_flags()?;
    let key = library
        .soname
        .filter(|s| !s.is_empty() && !s.contains('/'))
        .unwrap_or_else(|| name.to_owned());
    Some((key, flags))
}

#[cfg(test)]
mod tests;

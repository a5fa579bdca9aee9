// SPDX-License-Identifier: Apache-2.0
//! The binaries in the toolkit directory, switched all at once:
//!
//! ```text
//! <toolkit>/versions/<id>/nvidia-container-runtime     copies, fsynced (id: their content hash)
//!                        /nvidia-container-runtime-hook
//!                        /nvshim
//!                        /nvidia-ctk -> nvshim, nvidia-cdi-hook -> nvshim
//!                        /.config -> ../../.config      (config.toml, found beside argv[0])
//! <toolkit>/current -> versions/<id>                    replaced by one rename(2)
//! <toolkit>/nvidia-container-runtime -> current/nvidia-container-runtime   (every name)
//! ```
//!
//! An engine starting the runtime resolves `current` once, at `exec`: it runs the old set
//! or the new one, never a mix or a half-written file. The runtime finds the hook and
//! `nvshim` beside its resolved path (`/proc/self/exe`), so one container stays within
//! one version; the previous version is kept for a create that resolved it just before
//! the switch, older ones are deleted.

use std::fs::{self, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, symlink};
use std::path::{Path, PathBuf};

use super::InstallError;
use super::state::{SavedFile, State};
use crate::cli::configure::under_root;
use crate::config::BESIDE_DIR;
use crate::container::NVML_HELPER;
use crate::hook_contract::{CDI_HOOK_BINARY, CTK_BINARY, HOOK_BINARY};

/// The runtime's name, as engines are configured with it.
pub const RUNTIME_BINARY: &str = "nvidia-container-runtime";
/// Copied from the source directory.
pub const COPIED: [&str; 3] = [RUNTIME_BINARY, HOOK_BINARY, NVML_HELPER];
/// Links to `nvshim` in each version (it is those tools under their names).
pub const NVSHIM_NAMES: [&str; 2] = [CTK_BINARY, CDI_HOOK_BINARY];
pub const VERSIONS_DIR: &str = "versions";
pub const CURRENT_LINK: &str = "current";
/// Where files that were in the way of the toolkit's names are kept until the undo.
pub const SAVED_DIR: &str = ".nvshim-saved";

/// Every name the toolkit directory offers.
pub fn stable_names() -> impl Iterator<Item = &'static str> {
    COPIED.into_iter().chain(NVSHIM_NAMES)
}

/// What [`install`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Installed {
    pub version: String,
    /// The version `current` named before, when the install switched it.
    pub previous: Option<String>,
    /// False when the same binaries were in place already.
    pub changed: bool,
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(io::Error) -> InstallError + use<> {
    let path = path.to_path_buf();
    move |source| InstallError::Io { what, path, source }
}

/// The content hash naming a version: FNV-1a over each file's name, length and bytes.
/// Not a security boundary (the files are compared byte for byte before reuse), only a
/// name that is the same for the same binaries from any build of the installer.
pub fn version_id(files: &[(&str, Vec<u8>)]) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for b in bytes {
            hash ^= u64::from(*b);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
    };
    for (name, bytes) in files {
        eat(name.as_bytes());
        eat(&(bytes.len() as u64).to_le_bytes());
        eat(bytes);
    }
    format!("{hash:016x}")
}

/// The binaries to install, read from `source`.
pub fn read_sources(source: &Path) -> Result<Vec<(&'static str, Vec<u8>)>, InstallError> {
    COPIED
        .iter()
        .map(|name| {
            let path = source.join(name);
            fs::read(&path)
                .map(|bytes| (*name, bytes))
                .map_err(|e| InstallError::Source {
                    dir: source.to_path_buf(),
                    missing: path,
                    reason: e.to_string(),
                })
        })
        .collect()
}

/// `here` (a path under `root`) as a host path, for the record.
pub fn on_host(root: &Path, here: &Path) -> PathBuf {
    match here.strip_prefix(root) {
        Ok(rel) => Path::new("/").join(rel),
        Err(_) => here.to_path_buf(),
    }
}

/// Creates `dir` (a path under `root`) and its missing parents, recording each one
/// created in `state` (as a host path).
pub fn create_dirs(root: &Path, dir: &Path, state: &mut State) -> Result<(), InstallError> {
    let mut missing = Vec::new();
    let mut at = dir;
    while !at.exists() {
        missing.push(at.to_path_buf());
        match at.parent() {
            Some(p) => at = p,
            None => break,
        }
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => state.record_dir(&on_host(root, d)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err("create directory", d)(e)),
        }
    }
    Ok(())
}

/// Installs `sources` under `toolkit` (a path here, under the host root `root`) and
/// switches every name to them.
pub fn install(
    root: &Path,
    toolkit: &Path,
    sources: &[(&'static str, Vec<u8>)],
    state: &mut State,
) -> Result<Installed, InstallError> {
    let id = version_id(sources);
    let versions = toolkit.join(VERSIONS_DIR);
    create_dirs(root, &versions, state)?;
    let dir = versions.join(&id);
    if dir.exists() && !holds(&dir, sources) {
        // A damaged copy (a crash mid-install): never reuse it.
        let stale = versions.join(format!(".stale-{id}-{}", std::process::id()));
        fs::rename(&dir, &stale).map_err(io_err("move aside", &dir))?;
        fs::remove_dir_all(&stale).map_err(io_err("remove", &stale))?;
    }
    if !dir.exists() {
        build_version(&versions, &id, sources)?;
    }
    let current = toolkit.join(CURRENT_LINK);
    let target = PathBuf::from(VERSIONS_DIR).join(&id);
    let before = fs::read_link(&current).ok();
    let previous = before
        .as_ref()
        .filter(|t| **t != target)
        .and_then(|t| t.file_name())
        .map(|n| n.to_string_lossy().into_owned());
    let switched = before.as_deref() != Some(target.as_path());
    if switched {
        replace_link(&current, &target)?;
    }
    let mut named = false;
    for name in stable_names() {
        named |= link_name(root, toolkit, name, state)?;
    }
    sync_dir(toolkit)?;
    if switched {
        prune(&versions, &id, previous.as_deref())?;
    }
    Ok(Installed {
        version: id,
        previous,
        changed: switched || named,
    })
}

/// Whether `dir` holds exactly `sources`.
fn holds(dir: &Path, sources: &[(&'static str, Vec<u8>)]) -> bool {
    sources
        .iter()
        .all(|(name, bytes)| fs::read(dir.join(name)).is_ok_and(|b| b == *bytes))
        && NVSHIM_NAMES
            .iter()
            .all(|n| fs::read_link(dir.join(n)).is_ok_and(|t| t == Path::new(NVML_HELPER)))
}

/// Writes a version into a temp directory, fsyncs it, and renames it into place.
fn build_version(
    versions: &Path,
    id: &str,
    sources: &[(&'static str, Vec<u8>)],
) -> Result<(), InstallError> {
    let temp = versions.join(format!(".tmp-{id}-{}", std::process::id()));
    if temp.exists() {
        fs::remove_dir_all(&temp).map_err(io_err("remove", &temp))?;
    }
    fs::create_dir(&temp).map_err(io_err("create directory", &temp))?;
    for (name, bytes) in sources {
        let path = temp.join(name);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&path)
            .map_err(io_err("create", &path))?;
        io::Write::write_all(&mut file, bytes).map_err(io_err("write", &path))?;
        file.sync_all().map_err(io_err("sync", &path))?;
    }
    for name in NVSHIM_NAMES {
        let path = temp.join(name);
        symlink(NVML_HELPER, &path).map_err(io_err("link", &path))?;
    }
    let config = temp.join(BESIDE_DIR);
    let up = Path::new("..").join("..").join(BESIDE_DIR);
    symlink(&up, &config).map_err(io_err("link", &config))?;
    sync_dir(&temp)?;
    let dir = versions.join(id);
    fs::rename(&temp, &dir).map_err(io_err("rename into place", &dir))?;
    sync_dir(versions)
}

/// Points `link` at `target` by renaming a new link over it.
fn replace_link(link: &Path, target: &Path) -> Result<(), InstallError> {
    let name = link
        .file_name()
        .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
    let temp = link.with_file_name(format!(".{name}.nvshim-{}", std::process::id()));
    let _ = fs::remove_file(&temp);
    symlink(target, &temp).map_err(io_err("link", &temp))?;
    fs::rename(&temp, link).map_err(io_err("rename into place", link))
}

/// Makes `<toolkit>/<name>` the link `current/<name>`; a file of someone else's there is
/// moved aside first (and recorded). True when something changed.
fn link_name(
    root: &Path,
    toolkit: &Path,
    name: &str,
    state: &mut State,
) -> Result<bool, InstallError> {
    let path = toolkit.join(name);
    let host = on_host(root, &path);
    let target = Path::new(CURRENT_LINK).join(name);
    match fs::read_link(&path) {
        Ok(t) if t == target => return Ok(false),
        _ => {}
    }
    if fs::symlink_metadata(&path).is_ok() && !state.saved.iter().any(|s| s.path == host) {
        let saved_dir = toolkit.join(SAVED_DIR);
        create_dirs(root, &saved_dir, state)?;
        let saved_as = saved_dir.join(name);
        fs::rename(&path, &saved_as).map_err(io_err("move aside", &path))?;
        state.saved.push(SavedFile {
            path: host,
            saved_as: on_host(root, &saved_as),
        });
    }
    replace_link(&path, &target)?;
    Ok(true)
}

/// Deletes every version but `keep` and `previous`.
fn prune(versions: &Path, keep: &str, previous: Option<&str>) -> Result<(), InstallError> {
    let entries = fs::read_dir(versions).map_err(io_err("read", versions))?;
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == keep || Some(name.as_str()) == previous || name.starts_with(".tmp-") {
            continue;
        }
        let path = entry.path();
        fs::remove_dir_all(&path).map_err(io_err("remove", &path))?;
    }
    Ok(())
}

/// Takes the binaries out again: the names (only links of ours), `current`, every
/// version; files that were moved aside come back.
pub fn remove(root: &Path, toolkit: &Path, state: &State) -> Result<(), InstallError> {
    for name in stable_names() {
        let path = toolkit.join(name);
        if fs::read_link(&path).is_ok_and(|t| t == Path::new(CURRENT_LINK).join(name)) {
            fs::remove_file(&path).map_err(io_err("remove", &path))?;
        }
    }
    let current = toolkit.join(CURRENT_LINK);
    if fs::symlink_metadata(&current).is_ok() {
        fs::remove_file(&current).map_err(io_err("remove", &current))?;
    }
    let versions = toolkit.join(VERSIONS_DIR);
    if versions.exists() {
        fs::remove_dir_all(&versions).map_err(io_err("remove", &versions))?;
    }
    for saved in &state.saved {
        let (from, to) = (
            under_root(root, &saved.saved_as),
            under_root(root, &saved.path),
        );
        if fs::symlink_metadata(&from).is_ok() {
            fs::rename(&from, &to).map_err(io_err("put back", &to))?;
        }
    }
    sync_dir(toolkit)
}

fn sync_dir(dir: &Path) -> Result<(), InstallError> {
    crate::files::write::sync_dir(dir).map_err(io_err("sync", dir))
}

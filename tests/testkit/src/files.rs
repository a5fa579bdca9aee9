// SPDX-License-Identifier: Apache-2.0
//! Filesystem primitives for the node builders, each turning `io::Error` into a [`TestkitError`]
//! that names the path.

use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use crate::error::{TestkitError, io_err};

pub(crate) fn mkdir_all(path: &Path) -> Result<(), TestkitError> {
    fs::create_dir_all(path).map_err(io_err("creating directory", path))
}

/// Writes `contents` to `path` (creating parent directories) and sets `mode`.
pub(crate) fn write(
    path: &Path,
    contents: impl AsRef<[u8]>,
    mode: u32,
) -> Result<(), TestkitError> {
    if let Some(parent) = path.parent() {
        mkdir_all(parent)?;
    }
    fs::write(path, contents).map_err(io_err("writing", path))?;
    chmod(path, mode)
}

pub(crate) fn chmod(path: &Path, mode: u32) -> Result<(), TestkitError> {
    fs::set_permissions(path, fs::Permissions::from_mode(mode)).map_err(io_err("chmod", path))
}

/// Copies `from` to `to` and sets `mode`.
pub(crate) fn copy(from: &Path, to: &Path, mode: u32) -> Result<(), TestkitError> {
    if let Some(parent) = to.parent() {
        mkdir_all(parent)?;
    }
    fs::copy(from, to).map_err(io_err("copying", from))?;
    chmod(to, mode)
}

/// Creates the symlink `link` → `target` (`target` is stored as given, usually relative).
pub(crate) fn link(target: &str, link: &Path) -> Result<(), TestkitError> {
    symlink(target, link).map_err(io_err("creating symlink", link))
}

/// Makes the character device `major:minor` at `path` with `mode` (set after `mknod`, whose
/// mode the umask filters). Without `CAP_MKNOD` the error says the node needs privilege.
pub(crate) fn char_device(
    path: &Path,
    major: u32,
    minor: u32,
    mode: u32,
) -> Result<(), TestkitError> {
    use nix::errno::Errno;
    use nix::sys::stat::{Mode, SFlag, makedev, mknod};
    let dev = makedev(u64::from(major), u64::from(minor));
    mknod(path, SFlag::S_IFCHR, Mode::from_bits_truncate(0o600), dev).map_err(|source| {
        if source == Errno::EPERM {
            TestkitError::NeedsPrivilege {
                path: path.to_path_buf(),
                source,
            }
        } else {
            TestkitError::Mknod {
                path: path.to_path_buf(),
                source,
            }
        }
    })?;
    chmod(path, mode)
}

/// The names in `dir`, sorted: what a test compares before and after to see that nothing
/// was left beside a file (a `.bak`, a temp file). Panics when `dir` cannot be read.
pub fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
        .map(|e| {
            e.unwrap_or_else(|e| panic!("read_dir {}: {e}", dir.display()))
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect();
    names.sort();
    names
}

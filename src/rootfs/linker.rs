//! The container's linker cache, refreshed from the host side.
//!
//! NVIDIA's toolkit runs `ldconfig` in a `createContainer` hook on every start (one
//! process, ~10 ms, and the binary it runs has been an attack surface). We already
//! parse and write `ld.so.cache`, and we know exactly which libraries we inject: so
//! the rootfs's `/etc/ld.so.cache` is read through [`Rootfs`] (never following the
//! image's symlinks out), the injected libraries' entries are merged in, and the
//! file is replaced atomically, in the format it had. Nothing from the image runs.
//!
//! The file stays a regular file of the rootfs, so an `ldconfig` run later inside
//! the container still works (a cache bind-mounted over `/etc/ld.so.cache` could not
//! be renamed over).

use std::path::Path;

use crate::discover::SymlinkEdit;
use crate::ldcache::{self, Entry, Format, GENERATOR, LdCache};

use super::{Rootfs, RootfsError};

/// Where `ld.so` reads its cache.
pub const CACHE_PATH: &str = "/etc/ld.so.cache";

/// What [`refresh`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refresh {
    /// The cache already had every entry (or there was nothing to add).
    Unchanged,
    /// The cache was written with `entries` entries in `format`.
    Written {
        entries: usize,
        format: Format,
        /// Whether the image had a cache we could read (else it was started afresh).
        had_cache: bool,
    },
}

/// The part of an injection that lives in the rootfs itself, shared by the runtime and
/// the prestart hook: the driver's symlinks, then the linker cache merge. Returns how
/// many links changed and what happened to the cache. `prefer`: entries that go
/// ahead of `add`'s with the same soname (the image's CUDA compat libraries, see
/// [`super::compat::preferred`]).
pub fn install(
    rootfs: &Rootfs,
    links: &[SymlinkEdit],
    add: &[Entry],
    prefer: &[Entry],
) -> Result<(usize, Refresh), RootfsError> {
    let changed = rootfs.symlinks(links.iter().map(|l| (l.path.as_path(), l.target.as_str())))?;
    let refresh = refresh_preferring(rootfs, add, prefer)?;
    tracing::debug!(rootfs = %rootfs.path().display(), ?refresh, "container linker cache");
    Ok((changed, refresh))
}

/// Adds `add` to the rootfs's linker cache. An entry replaces the image's entries
/// with the same key and flags (e.g. a stale `libcuda.so.1` from a CUDA compat
/// package), so `ld.so` finds the host driver's library.
pub fn refresh(rootfs: &Rootfs, add: &[Entry]) -> Result<Refresh, RootfsError> {
    refresh_preferring(rootfs, add, &[])
}

/// [`refresh`], with `prefer`'s entries ahead of `add`'s for the same soname: `ld.so`
/// takes the first usable entry of a key.
pub fn refresh_preferring(
    rootfs: &Rootfs,
    add: &[Entry],
    prefer: &[Entry],
) -> Result<Refresh, RootfsError> {
    if add.is_empty() && prefer.is_empty() {
        return Ok(Refresh::Unchanged);
    }
    let path = Path::new(CACHE_PATH);
    let existing = match rootfs.read(path, ldcache::MAX_FILE_SIZE)? {
        Some(bytes) => match ldcache::parse(&bytes) {
            Ok(cache) => Some(cache),
            Err(e) => {
                // ld.so ignores a cache it cannot read; so may we, and start afresh.
                tracing::warn!(rootfs = %rootfs.path().display(), "the image's {CACHE_PATH} is unreadable ({e}); writing a new one");
                None
            }
        },
        None => None,
    };
    let had_cache = existing.is_some();
    let LdCache {
        entries: old,
        format,
        ..
    } = existing.unwrap_or_default();
    let merged = merge(&old, add, prefer);
    if merged == old {
        return Ok(Refresh::Unchanged);
    }
    let bytes = ldcache::write_with_generator(format, &merged, GENERATOR);
    rootfs.replace(path, &bytes, 0o644)?;
    for entry in prefer.iter().chain(add) {
        tracing::debug!(key = %entry.key, value = %entry.value, "linker cache entry");
    }
    Ok(Refresh::Written {
        entries: merged.len(),
        format,
        had_cache,
    })
}

/// `old` without the entries `prefer` and `add` supersede, plus `prefer` then `add`,
/// in `ldconfig`'s order. The sort is stable, so of entries with the same key and
/// flags, `prefer`'s come first.
pub fn merge(old: &[Entry], add: &[Entry], prefer: &[Entry]) -> Vec<Entry> {
    let mut merged: Vec<Entry> = prefer.to_vec();
    merged.dedup();
    merged.extend(
        old.iter()
            .filter(|e| {
                !prefer
                    .iter()
                    .chain(add)
                    .any(|a| a.key == e.key && a.flags == e.flags && a.hwcap == e.hwcap)
            })
            .cloned(),
    );
    for entry in add {
        if !merged.contains(entry) {
            merged.push(entry.clone());
        }
    }
    ldcache::sort_like_ldconfig(&mut merged);
    merged
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;
    use crate::ldcache::{FLAG_ELF_LIBC6, FLAG_X8664_LIB64};

    const LIB64: i32 = FLAG_ELF_LIBC6 | FLAG_X8664_LIB64;

    fn entry(key: &str, value: &str) -> Entry {
        Entry {
            key: key.into(),
            value: value.into(),
            flags: LIB64,
            hwcap: 0,
        }
    }

    fn ours() -> Vec<Entry> {
        vec![
            entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
            entry(
                "libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
            ),
        ]
    }

    #[test]
    fn merges_into_the_images_cache_in_its_format_then_leaves_it() {
        let tmp = tempfile::tempdir().unwrap();
        fs::create_dir_all(tmp.path().join("etc")).unwrap();
        let image = vec![
            entry("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            entry("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
        ];
        fs::write(
            tmp.path().join("etc/ld.so.cache"),
            ldcache::write_compat(&image),
        )
        .unwrap();
        let rootfs = Rootfs::open(tmp.path()).unwrap();

        let done = refresh(&rootfs, &ours()).unwrap();
        assert_eq!(
            done,
            Refresh::Written {
                entries: 3,
                format: Format::OldWithNew,
                had_cache: true
            }
        );
        let cache = ldcache::load(&tmp.path().join("etc/ld.so.cache")).unwrap();
        let pairs: Vec<(&str, &str)> = cache
            .entries
            .iter()
            .map(|e| (e.key.as_str(), e.value.as_str()))
            .collect();
        assert_eq!(
            pairs,
            [
                (
                    "libnvidia-ml.so.1",
                    "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
                ),
                ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
            ]
        );
        // Second create of the same rootfs: nothing to do.
        assert_eq!(refresh(&rootfs, &ours()).unwrap(), Refresh::Unchanged);
    }

    #[test]
    fn starts_a_new_cache_when_the_image_has_none_or_a_broken_one() {
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = Rootfs::open(tmp.path()).unwrap();
        assert_eq!(
            refresh(&rootfs, &ours()).unwrap(),
            Refresh::Written {
                entries: 2,
                format: Format::New,
                had_cache: false
            }
        );
        fs::write(tmp.path().join("etc/ld.so.cache"), b"garbage").unwrap();
        assert!(matches!(
            refresh(&rootfs, &ours()).unwrap(),
            Refresh::Written {
                had_cache: false,
                ..
            }
        ));
        assert_eq!(
            ldcache::load(&tmp.path().join("etc/ld.so.cache"))
                .unwrap()
                .entries
                .len(),
            2
        );
    }

    #[test]
    fn preferred_entries_come_first_for_their_soname_and_replace_the_images() {
        let compat = entry("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1");
        let old = vec![
            entry("libcuda.so.1", "/usr/local/cuda/compat/libcuda.so.1"),
            entry("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
        ];
        let merged = merge(&old, &ours(), std::slice::from_ref(&compat));
        let libcuda: Vec<&str> = merged
            .iter()
            .filter(|e| e.key == "libcuda.so.1")
            .map(|e| e.value.as_str())
            .collect();
        assert_eq!(
            libcuda,
            [
                "/usr/local/cuda/compat/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            ]
        );
        assert_eq!(merged.len(), 4);
        // Merging the result again changes nothing; without `prefer` the host wins alone.
        assert_eq!(merge(&merged, &ours(), &[compat]), merged);
        let plain = merge(&merged, &ours(), &[]);
        assert_eq!(plain.iter().filter(|e| e.key == "libcuda.so.1").count(), 1);
    }

    #[test]
    fn nothing_to_add_touches_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let rootfs = Rootfs::open(tmp.path()).unwrap();
        assert_eq!(refresh(&rootfs, &[]).unwrap(), Refresh::Unchanged);
        assert!(!tmp.path().join("etc").exists());
    }
}

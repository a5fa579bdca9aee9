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
//! Argument forms (both validated before anything is written):
//! - `--link TARGET::PATH`: a symlink at container path `PATH` pointing to `TARGET`
//!   (NVIDIA's `create-symlinks` spelling);
//! - `--ldcache KEY=PATH@FLAGS[+HWCAP]`: one `ld.so.cache` entry, flags and hwcap in hex.

use std::path::{Component, Path, PathBuf};

use crate::bundle::{self, Bundle, BundleError};
use crate::discover::SymlinkEdit;
use crate::ldcache::Entry;
use crate::rootfs::linker::{self, Refresh};
use crate::rootfs::{Rootfs, RootfsError};

/// The subcommand name, as it appears in a spec's hook args (`nvshim hook link-driver`).
pub const SUBCOMMAND: &str = "link-driver";

pub use crate::cdi::HOOK_ENV;

#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error(
        "invalid --link {value:?}: expected TARGET::PATH with an absolute PATH, e.g. libcuda.so.1::/usr/lib64/libcuda.so"
    )]
    BadLink { value: String },
    #[error(
        "invalid --ldcache {value:?}: expected KEY=PATH@FLAGS[+HWCAP] with an absolute PATH \
         and hex numbers, e.g. libcuda.so.1=/usr/lib64/libcuda.so.1@0x303"
    )]
    BadEntry { value: String },
    #[error("cannot encode {what} {value:?} as a hook argument: it contains {separator:?}")]
    Unencodable {
        what: &'static str,
        value: String,
        separator: &'static str,
    },
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
}

/// The hook's arguments after the subcommand, for `links` and `entries`.
pub fn encode(links: &[SymlinkEdit], entries: &[Entry]) -> Result<Vec<String>, LinkError> {
    let mut args = Vec::with_capacity(2 * (links.len() + entries.len()));
    for link in links {
        let path = link.path.to_str().unwrap_or_default();
        for (what, value) in [("link target", link.target.as_str()), ("link path", path)] {
            if value.contains("::") || value.is_empty() {
                return Err(LinkError::Unencodable {
                    what,
                    value: value.to_owned(),
                    separator: "::",
                });
            }
        }
        args.push("--link".to_owned());
        args.push(format!("{}::{path}", link.target));
    }
    for entry in entries {
        for (what, value, sep) in [
            ("cache key", entry.key.as_str(), "="),
            ("cache path", entry.value.as_str(), "@"),
        ] {
            if value.contains(sep) {
                return Err(LinkError::Unencodable {
                    what,
                    value: value.to_owned(),
                    separator: sep,
                });
            }
        }
        args.push("--ldcache".to_owned());
        let mut arg = format!("{}={}@{:#x}", entry.key, entry.value, entry.flags);
        if entry.hwcap != 0 {
            arg.push_str(&format!("+{:#x}", entry.hwcap));
        }
        args.push(arg);
    }
    Ok(args)
}

/// Parses one `--link` value.
pub fn parse_link(value: &str) -> Result<SymlinkEdit, LinkError> {
    let bad = || LinkError::BadLink {
        value: value.to_owned(),
    };
    let (target, path) = value.split_once("::").ok_or_else(bad)?;
    // What `encode` refuses is refused here too: every value parsed can be written.
    if target.is_empty() || target.contains('\0') || path.contains("::") || !container_path(path) {
        return Err(bad());
    }
    Ok(SymlinkEdit {
        path: PathBuf::from(path),
        target: target.to_owned(),
    })
}

/// Parses one `--ldcache` value.
pub fn parse_entry(value: &str) -> Result<Entry, LinkError> {
    let bad = || LinkError::BadEntry {
        value: value.to_owned(),
    };
    let (key, rest) = value.split_once('=').ok_or_else(bad)?;
    let (path, numbers) = rest.rsplit_once('@').ok_or_else(bad)?;
    let (flags, hwcap) = numbers.split_once('+').unwrap_or((numbers, "0"));
    let hex = |s: &str| {
        let digits = s.strip_prefix("0x").unwrap_or(s);
        (!digits.is_empty())
            .then(|| u64::from_str_radix(digits, 16).ok())
            .flatten()
    };
    let flags = hex(flags)
        .and_then(|f| i32::try_from(f).ok())
        .ok_or_else(bad)?;
    let hwcap = hex(hwcap).ok_or_else(bad)?;
    if key.is_empty() || key.contains(['/', '\0']) || path.contains('@') || !container_path(path) {
        return Err(bad());
    }
    Ok(Entry {
        key: key.to_owned(),
        value: path.to_owned(),
        flags,
        hwcap,
    })
}

/// An absolute path with no `..` and no NUL. `Rootfs` would keep a `..` inside the
/// root anyway; refusing it here makes a bad spec fail loudly instead.
fn container_path(path: &str) -> bool {
    let p = Path::new(path);
    p.is_absolute()
        && !path.contains('\0')
        && p.components().all(|c| !matches!(c, Component::ParentDir))
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
    let rootfs = Rootfs::open(&state.bundle.join(root))?;
    Ok(linker::install(&rootfs, links, entries)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn link(path: &str, target: &str) -> SymlinkEdit {
        SymlinkEdit {
            path: PathBuf::from(path),
            target: target.to_owned(),
        }
    }

    #[test]
    fn arguments_round_trip() -> Result<(), LinkError> {
        let links = vec![
            link("/usr/lib64/libcuda.so.1", "libcuda.so.550.54.15"),
            link("/usr/lib64/libcuda.so", "libcuda.so.1"),
        ];
        let entries = vec![
            Entry {
                key: "libcuda.so.1".into(),
                value: "/usr/lib64/libcuda.so.1".into(),
                flags: 0x303,
                hwcap: 0,
            },
            Entry {
                key: "libnvidia-ml.so.1".into(),
                value: "/usr/lib/libnvidia-ml.so.1".into(),
                flags: 0x3,
                hwcap: 0x8000_0000_0000_0001,
            },
        ];
        let args = encode(&links, &entries)?;
        assert_eq!(args[1], "libcuda.so.550.54.15::/usr/lib64/libcuda.so.1");
        assert_eq!(args[5], "libcuda.so.1=/usr/lib64/libcuda.so.1@0x303");
        let mut back_links = Vec::new();
        let mut back_entries = Vec::new();
        for pair in args.chunks(2) {
            match pair[0].as_str() {
                "--link" => back_links.push(parse_link(&pair[1])?),
                _ => back_entries.push(parse_entry(&pair[1])?),
            }
        }
        assert_eq!(back_links, links);
        assert_eq!(back_entries, entries);
        Ok(())
    }

    #[test]
    fn bad_arguments_are_refused() {
        for (case, value) in [
            ("no separator", "libcuda.so.1"),
            ("relative path", "libcuda.so.1::usr/lib/libcuda.so"),
            ("dotdot", "x::/usr/../../etc/passwd"),
            ("separator in the path", "x::/usr/lib/a::b"),
            ("empty target", "::/usr/lib/libcuda.so"),
        ] {
            assert!(parse_link(value).is_err(), "{case}");
        }
        for (case, value) in [
            ("no flags", "libcuda.so.1=/usr/lib/libcuda.so.1"),
            ("bad hex", "libcuda.so.1=/usr/lib/libcuda.so.1@0xzz"),
            ("empty flags", "libcuda.so.1=/usr/lib/libcuda.so.1@"),
            ("relative", "libcuda.so.1=lib/libcuda.so.1@0x303"),
            ("key with slash", "a/b=/usr/lib/libcuda.so.1@0x303"),
            ("flags too big", "k=/usr/lib/k@0x1ffffffff"),
            ("no key", "=/usr/lib/k@0x303"),
            ("@ in the path", "k=/usr/l@b/k@0x303"),
        ] {
            assert!(parse_entry(value).is_err(), "{case}");
        }
        let err = parse_entry("k=/x@zz").map(|_| ()).unwrap_err().to_string();
        assert!(
            err.contains("\"k=/x@zz\"") && err.contains("KEY=PATH@FLAGS"),
            "{err}"
        );
    }

    #[test]
    fn unencodable_values_are_refused() {
        let bad = link("/usr/lib/a::b", "x");
        assert!(matches!(
            encode(&[bad], &[]),
            Err(LinkError::Unencodable { .. })
        ));
    }
}

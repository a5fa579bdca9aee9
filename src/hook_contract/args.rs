//! The stages' argument encodings, each encoder beside its decoder:
//! - `link-driver`: `--link TARGET::PATH` (NVIDIA's `create-symlinks` spelling) and
//!   `--ldcache KEY=PATH@FLAGS[+HWCAP]` (flags and hwcap in hex);
//! - `disable-device-node-modification`: nothing, or `--rootfs <absolute path>`.
//!
//! What an encoder refuses its decoder refuses too, so every value parsed can be
//! written back unchanged.

use std::path::{Component, Path, PathBuf};

use crate::discover::SymlinkEdit;
use crate::ldcache::Entry;

use super::{LDCACHE_FLAG, LINK_FLAG, ROOTFS_FLAG};

/// A hook argument that cannot be written, or one that does not parse.
#[derive(Debug, thiserror::Error)]
pub enum ArgError {
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
}

/// `link-driver`'s arguments after the stage, for `links` and `entries`.
pub fn encode_link_driver(
    links: &[SymlinkEdit],
    entries: &[Entry],
) -> Result<Vec<String>, ArgError> {
    let mut args = Vec::with_capacity(2 * (links.len() + entries.len()));
    for link in links {
        let path = link.path.to_str().unwrap_or_default();
        for (what, value) in [("link target", link.target.as_str()), ("link path", path)] {
            if value.contains("::") || value.is_empty() {
                return Err(ArgError::Unencodable {
                    what,
                    value: value.to_owned(),
                    separator: "::",
                });
            }
        }
        args.push(LINK_FLAG.to_owned());
        args.push(format!("{}::{path}", link.target));
    }
    for entry in entries {
        for (what, value, sep) in [
            ("cache key", entry.key.as_str(), "="),
            ("cache path", entry.value.as_str(), "@"),
        ] {
            if value.contains(sep) {
                return Err(ArgError::Unencodable {
                    what,
                    value: value.to_owned(),
                    separator: sep,
                });
            }
        }
        args.push(LDCACHE_FLAG.to_owned());
        let mut arg = format!("{}={}@{:#x}", entry.key, entry.value, entry.flags);
        if entry.hwcap != 0 {
            arg.push_str(&format!("+{:#x}", entry.hwcap));
        }
        args.push(arg);
    }
    Ok(args)
}

/// `link-driver`'s arguments: `--link V`, `--ldcache V` (or `--flag=V`), any order.
pub fn parse_link_driver(args: &[String]) -> Result<(Vec<SymlinkEdit>, Vec<Entry>), String> {
    let mut links = Vec::new();
    let mut entries = Vec::new();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let (name, value) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_owned())),
            None => (arg.as_str(), None),
        };
        let mut value = || {
            value
                .clone()
                .or_else(|| rest.next().cloned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match name {
            LINK_FLAG => links.push(parse_link(&value()?).map_err(|e| e.to_string())?),
            LDCACHE_FLAG => entries.push(parse_entry(&value()?).map_err(|e| e.to_string())?),
            other => {
                return Err(format!(
                    "unknown link-driver argument {other:?} (valid: {LINK_FLAG}, {LDCACHE_FLAG})"
                ));
            }
        }
    }
    Ok((links, entries))
}

/// Parses one `--link` value.
pub fn parse_link(value: &str) -> Result<SymlinkEdit, ArgError> {
    let bad = || ArgError::BadLink {
        value: value.to_owned(),
    };
    let (target, path) = value.split_once("::").ok_or_else(bad)?;
    // What `encode_link_driver` refuses is refused here too: every value parsed can be written.
    if target.is_empty() || target.contains('\0') || path.contains("::") || !container_path(path) {
        return Err(bad());
    }
    Ok(SymlinkEdit {
        path: PathBuf::from(path),
        target: target.to_owned(),
    })
}

/// Parses one `--ldcache` value.
pub fn parse_entry(value: &str) -> Result<Entry, ArgError> {
    let bad = || ArgError::BadEntry {
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

/// `disable-device-node-modification`'s arguments for the container's rootfs on the
/// host (absolute): `--rootfs <path>`, so that the hook reads neither its stdin nor
/// `config.json`. A path that is not UTF-8 cannot be a JSON string: then none, and the
/// hook finds the rootfs from the OCI state.
pub fn params_args(rootfs: &Path) -> Vec<String> {
    match rootfs.to_str() {
        Some(rootfs) => vec![ROOTFS_FLAG.to_owned(), rootfs.to_owned()],
        None => Vec::new(),
    }
}

/// The stage's arguments: none (the rootfs comes from the OCI state) or
/// `--rootfs <path>` / `--rootfs=<path>`.
pub fn parse_params_args(args: &[String]) -> Result<Option<PathBuf>, String> {
    match args {
        [] => Ok(None),
        [flag, path] if flag == ROOTFS_FLAG => Ok(Some(PathBuf::from(path))),
        [arg] => match arg
            .strip_prefix(ROOTFS_FLAG)
            .and_then(|rest| rest.strip_prefix('='))
        {
            Some(path) => Ok(Some(PathBuf::from(path))),
            None => Err(unexpected(args)),
        },
        _ => Err(unexpected(args)),
    }
}

fn unexpected(args: &[String]) -> String {
    format!("unexpected arguments {args:?} (valid: none, or {ROOTFS_FLAG} <absolute path>)")
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

    fn strings(l: &[&str]) -> Vec<String> {
        l.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn arguments_round_trip() -> Result<(), ArgError> {
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
        let args = encode_link_driver(&links, &entries)?;
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
        // The whole command line parses back as one.
        let (l, e) = parse_link_driver(&args).map_err(|value| ArgError::BadLink { value })?;
        assert_eq!((l, e), (links, entries));
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
            encode_link_driver(&[bad], &[]),
            Err(ArgError::Unencodable { .. })
        ));
    }

    #[test]
    fn link_driver_arguments() {
        let (links, entries) = parse_link_driver(&strings(&[
            "--link",
            "libcuda.so.1::/usr/lib/libcuda.so",
            "--ldcache=libcuda.so.1=/usr/lib/libcuda.so.1@0x303",
        ]))
        .unwrap();
        assert_eq!(links.len(), 1);
        assert_eq!(entries[0].key, "libcuda.so.1");
        for (case, bad) in [
            ("unknown", &["--bogus", "x"][..]),
            ("missing value", &["--link"][..]),
            ("bad link", &["--link", "relative::x"][..]),
        ] {
            let err = parse_link_driver(&strings(bad)).unwrap_err();
            assert!(!err.is_empty(), "{case}");
        }
    }

    #[test]
    fn arguments_name_the_rootfs_or_nothing() {
        let args = strings;
        assert_eq!(parse_params_args(&[]), Ok(None));
        assert_eq!(
            parse_params_args(&args(&["--rootfs", "/b/rootfs"])),
            Ok(Some(PathBuf::from("/b/rootfs")))
        );
        assert_eq!(
            parse_params_args(&args(&["--rootfs=/b/rootfs"])),
            Ok(Some(PathBuf::from("/b/rootfs")))
        );
        for bad in [
            &["--rootfs"][..],
            &["--root", "/b"],
            &["/b/rootfs"],
            &["--rootfs", "/a", "--rootfs", "/b"],
        ] {
            let err = parse_params_args(&args(bad)).unwrap_err();
            assert!(err.contains("--rootfs <absolute path>"), "{bad:?}: {err}");
        }
        // What the encoder writes is what the decoder reads.
        let encoded = params_args(Path::new("/run/c/rootfs"));
        assert_eq!(encoded, ["--rootfs", "/run/c/rootfs"]);
        assert_eq!(
            parse_params_args(&encoded),
            Ok(Some(PathBuf::from("/run/c/rootfs")))
        );
    }
}

//! One CSV mount-spec file, as text: `<type>, <path>` lines.
//!
//! NVIDIA's parser (`internal/platform-support/tegra/csv`) trims the line, splits it at
//! the first comma, trims both halves and accepts the types `dev`, `lib`, `sym` and
//! `dir` with a non-empty path; the path may itself hold commas. It skips every other
//! line with a debug message. We skip blank lines and `#` comments the same way, but a
//! line that is neither is an error naming the file and line: the files are the host's
//! configuration, and a typo there would otherwise drop a device or library without a
//! word. Paths must be absolute and free of `..`: they name files under the driver
//! root (or device nodes under the dev root), never above it.

use std::path::{Component, Path, PathBuf};

use serde::Serialize;

use super::glob::{Pattern, PatternError, has_meta};
use crate::request::Quoted;

/// What a line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SpecKind {
    /// A character device node, from the dev root.
    Dev,
    /// A library (or any regular file), mounted at its real path.
    Lib,
    /// A symlink: its chain is recreated in the container, its final target mounted.
    Sym,
    /// A directory, mounted whole.
    Dir,
}

impl SpecKind {
    pub const VALID: &'static str = "dev, lib, sym, dir";

    pub fn name(self) -> &'static str {
        match self {
            Self::Dev => "dev",
            Self::Lib => "lib",
            Self::Sym => "sym",
            Self::Dir => "dir",
        }
    }

    fn parse(word: &str) -> Option<Self> {
        Some(match word {
            "dev" => Self::Dev,
            "lib" => Self::Lib,
            "sym" => Self::Sym,
            "dir" => Self::Dir,
            _ => return None,
        })
    }
}

/// One line of a CSV file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MountSpec {
    pub kind: SpecKind,
    /// Absolute, with no `..` (checked).
    pub path: PathBuf,
}

/// Why a line is not a mount spec.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("expected \"<type>, <path>\" with a type of {valid}, got {line}", valid = SpecKind::VALID)]
    NoComma { line: Quoted },
    #[error("unknown mount type {kind} (valid: {valid})", valid = SpecKind::VALID)]
    UnknownKind { kind: Quoted },
    #[error("no path after the {kind} type")]
    NoPath { kind: &'static str },
    #[error("path {path} is not absolute (CSV paths are host paths such as /usr/lib/…)")]
    Relative { path: Quoted },
    #[error("path {path} climbs with .. (CSV paths must stay under the driver root)")]
    ParentDir { path: Quoted },
    #[error("path {path} holds a NUL byte")]
    Nul { path: Quoted },
    #[error("path {path} has a glob in a directory (only the last component may hold * ? [ ])")]
    GlobInDirectory { path: Quoted },
    #[error("path {path}: bad glob in its last component: {problem}")]
    BadGlob { path: Quoted, problem: PatternError },
}

/// Parses one file's text. `Err((line number, error))` for the first bad line
/// (numbered from 1).
pub fn parse(text: &str) -> Result<Vec<MountSpec>, (usize, LineError)> {
    let mut specs = Vec::new();
    for (index, raw) in text.lines().enumerate() {
        match parse_line(raw) {
            Ok(Some(spec)) => specs.push(spec),
            Ok(None) => {}
            Err(e) => return Err((index + 1, e)),
        }
    }
    Ok(specs)
}

/// One line: `None` for a blank line or a comment.
pub fn parse_line(raw: &str) -> Result<Option<MountSpec>, LineError> {
    let line = raw.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let Some((kind, path)) = line.split_once(',') else {
        return Err(LineError::NoComma {
            line: Quoted::new(line),
        });
    };
    let kind = kind.trim();
    let kind = SpecKind::parse(kind).ok_or_else(|| LineError::UnknownKind {
        kind: Quoted::new(kind),
    })?;
    let path = path.trim();
    if path.is_empty() {
        return Err(LineError::NoPath { kind: kind.name() });
    }
    if path.contains('\0') {
        return Err(LineError::Nul {
            path: Quoted::new(path),
        });
    }
    let path = Path::new(path);
    if !path.is_absolute() {
        return Err(LineError::Relative {
            path: Quoted::new(&path.to_string_lossy()),
        });
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(LineError::ParentDir {
            path: Quoted::new(&path.to_string_lossy()),
        });
    }
    // `components` drops `.` and repeated slashes: the path is normal from here on.
    let path: PathBuf = path.components().collect();
    let quoted = || Quoted::new(&path.to_string_lossy());
    if path
        .parent()
        .is_some_and(|dir| has_meta(&dir.to_string_lossy()))
    {
        return Err(LineError::GlobInDirectory { path: quoted() });
    }
    if let Some(name) = path.file_name().map(|n| n.to_string_lossy())
        && has_meta(&name)
    {
        Pattern::new(&name).map_err(|problem| LineError::BadGlob {
            path: quoted(),
            problem,
        })?;
    }
    Ok(Some(MountSpec { kind, path }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(kind: SpecKind, path: &str) -> Option<MountSpec> {
        Some(MountSpec {
            kind,
            path: PathBuf::from(path),
        })
    }

    #[test]
    fn lines_parse_like_nvidias() {
        use SpecKind::*;
        let cases: [(&str, Option<MountSpec>); 9] = [
            ("dev, /dev/nvhost-ctrl", spec(Dev, "/dev/nvhost-ctrl")),
            ("dev ,/a/path", spec(Dev, "/a/path")),
            (
                "  lib,\t/usr/lib/libcuda.so.1.1  ",
                spec(Lib, "/usr/lib/libcuda.so.1.1"),
            ),
            ("dev ,/a/path,with,commas", spec(Dev, "/a/path,with,commas")),
            (
                "sym, /usr/lib//tegra/./libcuda.so",
                spec(Sym, "/usr/lib/tegra/libcuda.so"),
            ),
            ("dir, /usr/share/nvidia", spec(Dir, "/usr/share/nvidia")),
            ("", None),
            ("\t", None),
            ("# lib, /commented/out", None),
        ];
        for (line, want) in cases {
            assert_eq!(parse_line(line), Ok(want), "case {line:?}");
        }
    }

    #[test]
    fn bad_lines_say_what_is_wrong() {
        let cases = [
            (",", "unknown mount type \"\""),
            ("dev,", "no path after the dev type"),
            ("dev, ", "no path after the dev type"),
            (
                "not-dev ,/a/path",
                "unknown mount type \"not-dev\" (valid: dev, lib, sym, dir)",
            ),
            ("LIB, /a", "unknown mount type \"LIB\""),
            ("lib /usr/lib/x", "expected \"<type>, <path>\""),
            ("lib, usr/lib/x", "is not absolute"),
            ("lib, /usr/../../etc/shadow", "climbs with .."),
            ("lib, /a\0b", "NUL byte"),
            ("dev, /dev/*/x", "glob in a directory"),
            ("dev, /dev/nvhost-[a", "bad glob"),
        ];
        for (line, want) in cases {
            let err = parse_line(line).expect_err(line).to_string();
            assert!(err.contains(want), "case {line:?}: {err}");
        }
    }

    #[test]
    fn a_file_reports_its_first_bad_line() {
        let text = "dev, /dev/nvmap\n\n# comment\nlib, /usr/lib/a.so\nbogus, /x\nlib, /y\n";
        let (line, err) = parse(text).unwrap_err();
        assert_eq!(line, 5);
        assert!(err.to_string().contains("\"bogus\""), "{err}");
        let ok = parse("dev, /dev/nvmap\r\nlib, /usr/lib/a.so\r\n").unwrap();
        assert_eq!(ok.len(), 2, "CRLF line ends are fine");
    }

    mod properties {
        use super::super::*;
        use proptest::prelude::*;

        proptest! {
            /// Any text: no panic; every accepted path is absolute, `..`-free and
            /// came from its line.
            #[test]
            fn any_text_parses_or_fails_cleanly(text in ".{0,400}") {
                if let Ok(specs) = parse(&text) {
                    for s in specs {
                        prop_assert!(s.path.is_absolute());
                        prop_assert!(!s.path.components().any(|c| c == Component::ParentDir));
                    }
                }
            }

            /// Well-formed lines round-trip whatever the spacing.
            #[test]
            fn spaced_lines_round_trip(
                kind in prop::sample::select(vec!["dev", "lib", "sym", "dir"]),
                parts in prop::collection::vec("[a-zA-Z0-9_.+-]{1,12}", 1..6),
                pre in "[ \t]{0,3}", mid in "[ \t]{0,3}", post in "[ \t]{0,3}",
            ) {
                let parts: Vec<String> = parts.into_iter().filter(|p| p != "." && p != "..").collect();
                prop_assume!(!parts.is_empty());
                let path = format!("/{}", parts.join("/"));
                let line = format!("{pre}{kind}{mid},{pre}{path}{post}");
                let got = parse_line(&line).unwrap().unwrap();
                prop_assert_eq!(got.kind.name(), kind);
                prop_assert_eq!(got.path, PathBuf::from(path));
            }
        }
    }
}

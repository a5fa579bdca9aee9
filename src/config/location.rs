//! Places in the config file: byte offsets from the TOML parser turned into
//! `path:line:column` and into the dotted key they fall under, for [`ConfigError`]
//! messages, and ignored serde paths written as dotted keys.
//!
//! [`ConfigError`]: super::ConfigError

use std::fmt;
use std::ops::Range;
use std::path::PathBuf;

use toml::de::{DeTable, DeValue};

/// A place in the config file: `path:line:column`, both 1-based, the column counted in
/// characters. Line 0 means the place is unknown (only the path is shown).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    pub path: PathBuf,
    pub line: usize,
    pub column: usize,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.path.display())
        } else {
            write!(f, "{}:{}:{}", self.path.display(), self.line, self.column)
        }
    }
}

/// 1-based line and column (in characters) of a byte offset.
pub(super) fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut end = offset.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    let before = text.get(..end).unwrap_or_default();
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let line = before.matches('\n').count() + 1;
    let column = before.get(line_start..).unwrap_or_default().chars().count() + 1;
    (line, column)
}

/// A key path as TOML would write it: bare keys as they are, others quoted.
pub(super) fn dotted(path: &serde_ignored::Path<'_>) -> String {
    fn segments(path: &serde_ignored::Path<'_>, out: &mut Vec<String>) {
        use serde_ignored::Path as P;
        match path {
            P::Root => {}
            P::Map { parent, key } => {
                segments(parent, out);
                out.push(toml_key(key));
            }
            P::Seq { parent, index } => {
                segments(parent, out);
                out.push(index.to_string());
            }
            P::Some { parent } | P::NewtypeStruct { parent } | P::NewtypeVariant { parent } => {
                segments(parent, out)
            }
        }
    }
    let mut out = Vec::new();
    segments(path, &mut out);
    out.join(".")
}

fn toml_key(key: &str) -> String {
    let bare = !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if bare {
        key.to_owned()
    } else {
        format!("{key:?}")
    }
}

/// The span of the value at `keys`, if the file sets it.
pub(super) fn value_span(doc: &DeTable<'_>, keys: &[&str]) -> Option<Range<usize>> {
    let (first, rest) = keys.split_first()?;
    let value = doc.iter().find(|(k, _)| k.get_ref() == first)?.1;
    if rest.is_empty() {
        return Some(value.span());
    }
    match value.get_ref() {
        DeValue::Table(table) => value_span(table, rest),
        _ => None,
    }
}

/// The dotted path of the innermost key whose key or value covers `offset`.
pub(super) fn key_at(doc: &DeTable<'_>, offset: usize) -> Option<String> {
    fn walk(
        table: &DeTable<'_>,
        offset: usize,
        prefix: &mut Vec<String>,
        best: &mut Option<(usize, String)>,
    ) {
        for (key, value) in table {
            prefix.push(toml_key(key.get_ref()));
            let (k, v) = (key.span(), value.span());
            if covers(&k, offset) || covers(&v, offset) {
                let size = v.len();
                // Deeper keys come later and win ties.
                if best.as_ref().is_none_or(|(s, _)| size <= *s) {
                    *best = Some((size, prefix.join(".")));
                }
            }
            if let DeValue::Table(inner) = value.get_ref() {
                walk(inner, offset, prefix, best);
            }
            prefix.pop();
        }
    }
    fn covers(span: &Range<usize>, offset: usize) -> bool {
        span.contains(&offset) || (span.is_empty() && span.start == offset)
    }
    let mut best = None;
    walk(doc, offset, &mut Vec::new(), &mut best);
    best.map(|(_, key)| key)
}

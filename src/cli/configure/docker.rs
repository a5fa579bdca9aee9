//! docker's `daemon.json`: `runtimes.<name>` and `default-runtime`.
//!
//! We write what `nvidia-ctk runtime configure --runtime=docker` writes for a new entry,
//! `{"args": [], "path": <path>}` (docker itself reads `path` and `runtimeArgs`; `args` is
//! NVIDIA's and docker ignores it), and `default-runtime` with `--set-as-default`. Unlike NVIDIA
//! we keep the file's key order (serde_json's `preserve_order`), update an existing entry's
//! `path` in place so its `runtimeArgs` survive, reuse the file's indentation, and on `--undo`
//! remove `default-runtime` instead of writing `runc` (docker's built-in default) into files
//! that never named one.
//!
//! `--cdi.enabled` sets `features.cdi` (`--undo` leaves it: it may predate us).
//!
//! An empty or whitespace-only file is read as `{}` (docker does the same); anything else that
//! is not a JSON object is refused.

use std::path::Path;

use serde::Serialize;
use serde_json::{Map, Value, json};

use super::{Action, ConfigureError, Edited, Outcome};
use crate::files::write::WriteError;

const RUNTIMES: &str = "runtimes";
const DEFAULT_RUNTIME: &str = "default-runtime";
const FEATURES: &str = "features";
/// The keys docker (and nvidia-ctk) put in a runtime entry: an entry holding only these is
/// updated in place, one holding more (a `runtimeType` shim entry) is replaced.
const ENTRY_KEYS: [&str; 3] = ["path", "args", "runtimeArgs"];
/// nvidia-ctk's indentation, used when the file shows none.
const DEFAULT_INDENT: &str = "    ";
/// Some editors on Windows start files with one; docker skips it, and so do we (and keep it).
const BOM: char = '\u{feff}';

pub(crate) fn edit(
    old: Option<&str>,
    path: &Path,
    action: Action<'_>,
) -> Result<Edited, ConfigureError> {
    let text = old.unwrap_or("");
    let (bom, body) = match text.strip_prefix(BOM) {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let mut config = parse(body, path)?;
    let before = config.clone();
    let mut notes = Vec::new();
    match action {
        Action::Add {
            name,
            path: runtime,
            set_as_default,
            cdi,
        } => {
            add(&mut config, path, name, runtime, set_as_default, &mut notes)?;
            if cdi {
                enable_cdi(&mut config, path)?;
            }
        }
        Action::Remove { name } => remove(&mut config, name),
    }
    // Equal maps mean no edit: ours never reorder keys, so comparing contents is enough. A
    // missing file still gets written when something is added.
    let unchanged = config == before && (old.is_some() || matches!(action, Action::Remove { .. }));
    if unchanged {
        return Ok(Edited {
            outcome: Outcome::Unchanged,
            notes,
        });
    }
    let mut out = String::new();
    if bom {
        out.push(BOM);
    }
    out.push_str(&render(&config, &indent_of(body), path)?);
    out.push('\n');
    Ok(Edited {
        outcome: Outcome::Write(out),
        notes,
    })
}

fn parse(body: &str, path: &Path) -> Result<Map<String, Value>, ConfigureError> {
    if body.trim().is_empty() {
        return Ok(Map::new());
    }
    match serde_json::from_str::<Value>(body) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(ConfigureError::JsonNotObject {
            path: path.to_path_buf(),
            found: kind(&other),
        }),
        Err(e) => {
            let (line, column) = (e.line(), e.column());
            let full = e.to_string();
            let reason = full
                .strip_suffix(&format!(" at line {line} column {column}"))
                .unwrap_or(&full)
                .to_owned();
            Err(ConfigureError::InvalidJson {
                path: path.to_path_buf(),
                reason,
                line,
                column,
            })
        }
    }
}

fn add(
    config: &mut Map<String, Value>,
    file: &Path,
    name: &str,
    runtime: &str,
    set_as_default: bool,
    notes: &mut Vec<String>,
) -> Result<(), ConfigureError> {
    let runtimes = config
        .entry(RUNTIMES)
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(runtimes) = runtimes else {
        return Err(ConfigureError::JsonType {
            path: file.to_path_buf(),
            key: RUNTIMES.to_owned(),
            found: kind(runtimes),
            expected: "an object",
        });
    };
    match runtimes.get_mut(name) {
        Some(Value::Object(entry)) if entry.keys().all(|k| ENTRY_KEYS.contains(&k.as_str())) => {
            entry.insert("path".to_owned(), runtime.into());
        }
        existing => {
            if let Some(old) = existing {
                notes.push(format!(
                    "replacing the whole \"{name}\" entry {old} with nvidia-ctk's path/args form"
                ));
            }
            // `insert` keeps an existing key's position.
            runtimes.insert(name.to_owned(), json!({"args": [], "path": runtime}));
        }
    }
    if set_as_default {
        config.insert(DEFAULT_RUNTIME.to_owned(), name.into());
    }
    Ok(())
}

/// `features.cdi = true`: docker 25+ then resolves `--device vendor.com/class=name` through CDI
/// specs (NVIDIA's `--cdi.enabled` for docker writes the same key). Other features are kept.
fn enable_cdi(config: &mut Map<String, Value>, file: &Path) -> Result<(), ConfigureError> {
    let features = config
        .entry(FEATURES)
        .or_insert_with(|| Value::Object(Map::new()));
    let Value::Object(features) = features else {
        return Err(ConfigureError::JsonType {
            path: file.to_path_buf(),
            key: FEATURES.to_owned(),
            found: kind(features),
            expected: "an object",
        });
    };
    features.insert("cdi".to_owned(), Value::Bool(true));
    Ok(())
}

fn remove(config: &mut Map<String, Value>, name: &str) {
    if let Some(Value::Object(runtimes)) = config.get_mut(RUNTIMES) {
        runtimes.shift_remove(name);
        if runtimes.is_empty() {
            config.shift_remove(RUNTIMES);
        }
    }
    if config.get(DEFAULT_RUNTIME).and_then(Value::as_str) == Some(name) {
        config.shift_remove(DEFAULT_RUNTIME);
    }
}

/// The file's indentation unit: that of its first indented line (a tab, or 1–8 spaces).
fn indent_of(body: &str) -> String {
    for line in body.lines().skip(1) {
        let rest = line.trim_start_matches([' ', '\t']);
        let ws = &line[..line.len() - rest.len()];
        if ws.is_empty() || rest.is_empty() {
            continue;
        }
        if ws.starts_with('\t') {
            return "\t".to_owned();
        }
        let spaces = ws.chars().take_while(|c| *c == ' ').count().clamp(1, 8);
        return " ".repeat(spaces);
    }
    DEFAULT_INDENT.to_owned()
}

fn render(
    config: &Map<String, Value>,
    indent: &str,
    file: &Path,
) -> Result<String, ConfigureError> {
    let mut buf = Vec::new();
    let formatter = serde_json::ser::PrettyFormatter::with_indent(indent.as_bytes());
    let mut ser = serde_json::Serializer::with_formatter(&mut buf, formatter);
    config.serialize(&mut ser).map_err(|e| {
        ConfigureError::File(WriteError::Write {
            path: file.to_path_buf(),
            source: std::io::Error::other(e),
        })
    })?;
    // serde_json writes UTF-8 only.
    Ok(String::from_utf8_lossy(&buf).into_owned())
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

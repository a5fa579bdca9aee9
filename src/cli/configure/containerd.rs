//! containerd's `config.toml`: a runtime for the CRI plugin, edited with `toml_edit` so that
//! comments, formatting and every unrelated table stay as they are.
//!
//! The schema comes from the file's `version`: 2 (containerd 1.x, still read by 2.x) keeps the
//! CRI runtimes under `plugins."io.containerd.grpc.v1.cri".containerd`, 3 (containerd 2.x) under
//! `plugins."io.containerd.cri.v1.runtime".containerd`. A file without `version` is version 1 —
//! containerd 1.x's default, gone in 2.x — and is refused with the way to convert it. An empty
//! or missing file becomes a minimal version 2 config, which both 1.x and 2.x read.
//!
//! Like `nvidia-ctk runtime configure --runtime=containerd`, the new `runtimes.<name>` starts as a
//! copy of the runtime it stands in for (the default runtime, else `runc`, else `crun`, if that
//! is a runc-type runtime), so settings such as `SystemdCgroup` carry over, then gets
//! `runtime_type = "io.containerd.runc.v2"` and `options.BinaryName = <path>`;
//! `--set-as-default` sets `default_runtime_name`. Where we differ from NVIDIA:
//! - an existing entry of that name is updated in place (its other settings are the user's);
//! - when the file lists no runtime yet, containerd's built-in `runc` is written out next to ours:
//!   containerd 1.6 replaces its built-in runtime map with the file's as soon as the file has a
//!   `runtimes` table, so adding only ours would drop `runc`, and the CRI plugin then refuses to
//!   load (`no corresponding runtime configured in containerd.runtimes for default_runtime_name
//!   = "runc"`); measured with containerd 1.6.20;
//! - `--undo` puts `default_runtime_name` back to `runc` when the file declares `runc` (the
//!   stock config does), rather than deleting it, so configure + undo gives the file back.

use std::path::Path;

use toml_edit::{DocumentMut, InlineTable, Item, Table, TableLike, TomlError, Value, value};

use super::{Action, ConfigureError, Edited, Outcome};

/// The runc shim, the only runtime type that reads `options.BinaryName`.
pub(crate) const RUNC_V2: &str = "io.containerd.runc.v2";
/// The version a new file gets: read by containerd 1.3+ and (converted on load) by 2.x.
const NEW_FILE_VERSION: i64 = 2;
const RUNC: &str = "runc";
/// Opens the comment on a `runc` entry we wrote out; `--undo` looks for it.
const BUILTIN_MARKER: &str = "# nvshim: containerd's built-in runc runtime";
const BUILTIN_COMMENT: &str = "\n# nvshim: containerd's built-in runc runtime, written out because containerd 1.x\n\
     # forgets it once the config lists a runtime (`nvshim configure containerd --undo` removes it)\n";

/// containerd config schema versions we edit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    V2,
    V3,
}

impl Schema {
    /// The plugin whose `containerd.runtimes` the CRI runtime service reads.
    pub(crate) fn cri_plugin(self) -> &'static str {
        match self {
            Schema::V2 => "io.containerd.grpc.v1.cri",
            Schema::V3 => "io.containerd.cri.v1.runtime",
        }
    }

    /// Plugin ids in `disabled_plugins` that take the CRI runtimes out of service.
    fn cri_ids(self) -> &'static [&'static str] {
        match self {
            Schema::V2 => &["io.containerd.grpc.v1.cri", "cri"],
            Schema::V3 => &["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"],
        }
    }
}

pub(crate) fn edit(
    old: Option<&str>,
    file: &Path,
    action: Action<'_>,
) -> Result<Edited, ConfigureError> {
    let text = old.unwrap_or("");
    let mut doc: DocumentMut = text.parse().map_err(|e| toml_error(&e, text, file))?;
    let before = doc.to_string();
    let mut notes = Vec::new();
    let schema = if doc.as_table().is_empty() {
        // Nothing but comments and blanks: a new config as far as containerd is concerned.
        if matches!(action, Action::Remove { .. }) {
            return Ok(Edited::new(Outcome::Unchanged));
        }
        start_document(&mut doc);
        Schema::V2
    } else {
        schema_of(&doc, file)?
    };
    match action {
        Action::Add {
            name,
            path,
            set_as_default,
        } => {
            add(
                &mut doc,
                schema,
                name,
                path,
                set_as_default,
                file,
                &mut notes,
            )?;
            notes.extend(warnings(&doc, schema, file));
        }
        Action::Remove { name } => remove(&mut doc, schema, name),
    }
    let after = doc.to_string();
    if old.is_some() && after == before {
        return Ok(Edited {
            outcome: Outcome::Unchanged,
            notes,
        });
    }
    Ok(Edited {
        outcome: Outcome::Write(after),
        notes,
    })
}

/// `version = 2` at the top of a file that has no keys yet, below its comments.
fn start_document(doc: &mut DocumentMut) {
    let trailing = doc.trailing().as_str().unwrap_or("").to_owned();
    doc.set_trailing("");
    doc.insert("version", value(NEW_FILE_VERSION));
    if trailing.contains('#')
        && let Some(mut key) = doc.key_mut("version")
    {
        let mut prefix = trailing.trim_end_matches([' ', '\t']).to_owned();
        if !prefix.ends_with('\n') {
            prefix.push('\n');
        }
        key.leaf_decor_mut().set_prefix(prefix);
    }
}

fn schema_of(doc: &DocumentMut, file: &Path) -> Result<Schema, ConfigureError> {
    let Some(version) = doc.get("version") else {
        return Err(ConfigureError::ContainerdV1 {
            path: file.to_path_buf(),
            why: "it has no `version` key",
        });
    };
    match version.as_integer() {
        Some(1) => Err(ConfigureError::ContainerdV1 {
            path: file.to_path_buf(),
            why: "`version = 1`",
        }),
        Some(2) => Ok(Schema::V2),
        Some(3) => Ok(Schema::V3),
        _ => Err(ConfigureError::ContainerdVersion {
            path: file.to_path_buf(),
            version: version.to_string().trim().to_owned(),
        }),
    }
}

fn add(
    doc: &mut DocumentMut,
    schema: Schema,
    name: &str,
    path: &str,
    set_as_default: bool,
    file: &Path,
    notes: &mut Vec<String>,
) -> Result<(), ConfigureError> {
    let plugin = schema.cri_plugin();
    let mut at = vec!["plugins", plugin, "containerd"];
    let containerd = descend(doc.as_item_mut(), &at, file)?;
    let default_name = containerd
        .get("default_runtime_name")
        .and_then(Item::as_str)
        .map(str::to_owned);
    at.push("runtimes");
    let runtimes_item = child(containerd, "runtimes", &at, file)?;
    let inline = is_inline(runtimes_item);
    let runtimes = table_like(runtimes_item, &at, file)?;

    if runtimes.is_empty() && name != RUNC {
        let mut runc = Table::new();
        runc.decor_mut().set_prefix(BUILTIN_COMMENT);
        runc.insert("runtime_type", value(RUNC_V2));
        runtimes.insert(RUNC, shaped(runc, inline));
    }

    at.push(name);
    match runtimes.get(name) {
        Some(item) if item.is_table_like() => {}
        existing => {
            if let Some(old) = existing {
                notes.push(format!(
                    "`{}` was {}; replaced by a runtime table",
                    at.join("."),
                    kind(old)
                ));
            }
            let entry = template(runtimes, default_name.as_deref(), name)
                .map(clean_copy)
                .unwrap_or_default();
            runtimes.insert(name, shaped(entry, inline));
        }
    }
    let entry_item = child_existing(runtimes, name, &at, file)?;
    let entry_inline = is_inline(entry_item);
    let entry = table_like(entry_item, &at, file)?;
    if let Some(old) = entry.get("runtime_type").and_then(Item::as_str)
        && old != RUNC_V2
    {
        notes.push(format!(
            "`{}.runtime_type` was \"{old}\"; BinaryName needs \"{RUNC_V2}\"",
            at.join(".")
        ));
    }
    set_str(entry, "runtime_type", RUNC_V2);
    if entry.get("options").is_none() {
        entry.insert("options", shaped(Table::new(), entry_inline));
    }
    at.push("options");
    let options_item = child_existing(entry, "options", &at, file)?;
    let options = table_like(options_item, &at, file)?;
    set_str(options, "BinaryName", path);

    if set_as_default {
        let containerd = descend(doc.as_item_mut(), &["plugins", plugin, "containerd"], file)?;
        let containerd = table_like(containerd, &["plugins", plugin, "containerd"], file)?;
        set_str(containerd, "default_runtime_name", name);
    }
    Ok(())
}

fn remove(doc: &mut DocumentMut, schema: Schema, name: &str) {
    let plugin = schema.cri_plugin();
    let Some(containerd) = lookup(doc.as_item_mut(), &["plugins", plugin, "containerd"]) else {
        return;
    };
    let mut removed = false;
    if let Some(runtimes) = containerd
        .get_mut("runtimes")
        .and_then(Item::as_table_like_mut)
        && runtimes.remove(name).is_some()
    {
        removed = true;
        let only_builtin = runtimes.len() == 1 && runtimes.get(RUNC).is_some_and(is_builtin_runc);
        if only_builtin {
            runtimes.remove(RUNC);
        }
    }
    let runc_declared = containerd
        .get("runtimes")
        .and_then(|r| r.get(RUNC))
        .is_some();
    if let Some(table) = containerd.as_table_like_mut()
        && table.get("default_runtime_name").and_then(Item::as_str) == Some(name)
    {
        removed = true;
        if runc_declared {
            set_str(table, "default_runtime_name", RUNC);
        } else {
            table.remove("default_runtime_name");
        }
    }
    if removed {
        prune(
            doc.as_item_mut(),
            &["plugins", plugin, "containerd", "runtimes"],
        );
    }
}

/// Removes the tables along `keys`, deepest first, that the removal left empty: the ones our
/// add created. An empty table means nothing to containerd — except an empty `runtimes`,
/// which containerd 1.x reads as "no runtimes at all" — so this is safe for one the user
/// wrote too; one with a comment above it is kept.
fn prune(root: &mut Item, keys: &[&str]) {
    for depth in (1..=keys.len()).rev() {
        let (parent_keys, last) = keys[..depth].split_at(depth - 1);
        let Some(parent) = lookup(root, parent_keys).and_then(Item::as_table_like_mut) else {
            return;
        };
        let empty = parent
            .get(last[0])
            .and_then(Item::as_table)
            .is_some_and(|t| t.is_empty() && !has_comment(t));
        if !empty {
            return;
        }
        parent.remove(last[0]);
    }
}

/// The runtime whose settings a new entry starts from: nvidia-ctk's order (the default runtime
/// unless it is an NVIDIA one, `runc`, `crun`), runc-type runtimes only — another shim's
/// options (kata's, gVisor's) mean nothing to runc.
fn template(runtimes: &dyn TableLike, default: Option<&str>, name: &str) -> Option<Table> {
    let candidates = default
        .filter(|d| *d != name && !d.starts_with("nvidia"))
        .into_iter()
        .chain([RUNC, "crun"]);
    for candidate in candidates {
        let Some(item) = runtimes.get(candidate) else {
            continue;
        };
        if is_builtin_runc(item) {
            continue;
        }
        let runc_type = item
            .get("runtime_type")
            .and_then(Item::as_str)
            .is_none_or(|t| t == RUNC_V2);
        if !runc_type {
            continue;
        }
        match item {
            Item::Table(t) => return Some(t.clone()),
            Item::Value(Value::InlineTable(t)) => return Some(t.clone().into_table()),
            _ => {}
        }
    }
    None
}

/// A copy of a runtime table fit to stand under another name: without its comments (they speak
/// of the original) and without document positions, so it is printed right after the tables
/// that precede it in the runtimes table.
fn clean_copy(mut table: Table) -> Table {
    clean_table(&mut table);
    // A blank line before the new header, whatever the original had.
    let decor = table.decor_mut();
    let prefix = decor.prefix().and_then(|p| p.as_str()).unwrap_or("");
    if !prefix.starts_with('\n') {
        let prefix = format!("\n{prefix}");
        decor.set_prefix(prefix);
    }
    table
}

fn clean_table(table: &mut Table) {
    table.set_position(None);
    let decor = table.decor_mut();
    let prefix = decor
        .prefix()
        .and_then(|p| p.as_str())
        .map(without_comments);
    if let Some(prefix) = prefix {
        decor.set_prefix(prefix);
    }
    decor.set_suffix("");
    for (mut key, item) in table.iter_mut() {
        let prefix = key
            .leaf_decor()
            .prefix()
            .and_then(|p| p.as_str())
            .map(without_comments);
        if let Some(prefix) = prefix {
            key.leaf_decor_mut().set_prefix(prefix);
        }
        match item {
            Item::Table(t) => clean_table(t),
            Item::Value(v) => {
                let has_comment = v
                    .decor()
                    .suffix()
                    .and_then(|s| s.as_str())
                    .is_some_and(|s| s.contains('#'));
                if has_comment {
                    v.decor_mut().set_suffix("");
                }
            }
            _ => {}
        }
    }
}

/// `text` without its comment lines (what stays is blank lines and indentation).
fn without_comments(text: &str) -> String {
    text.split('\n')
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

fn has_comment(table: &Table) -> bool {
    let decor = table.decor();
    [decor.prefix(), decor.suffix()]
        .into_iter()
        .flatten()
        .filter_map(|raw| raw.as_str())
        .any(|text| text.contains('#'))
}

fn is_builtin_runc(item: &Item) -> bool {
    item.as_table()
        .and_then(|t| t.decor().prefix())
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(BUILTIN_MARKER))
}

/// Things that make the new entry useless or surprising: the CRI plugin switched off, other
/// files imported on top of this one.
fn warnings(doc: &DocumentMut, schema: Schema, file: &Path) -> Vec<String> {
    let mut notes = Vec::new();
    let disabled = doc
        .get("disabled_plugins")
        .and_then(Item::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .find(|id| schema.cri_ids().contains(id));
    if let Some(id) = disabled {
        notes.push(format!(
            "{} disables the CRI plugin (disabled_plugins has \"{id}\"): the runtime is \
             registered, but only the CRI plugin (kubelet, crictl) reads it",
            file.display()
        ));
    }
    let imports: Vec<&str> = doc
        .get("imports")
        .and_then(Item::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    if !imports.is_empty() {
        notes.push(format!(
            "{} imports {}: settings there are applied over this file's",
            file.display(),
            imports.join(", ")
        ));
    }
    notes
}

/// The item at `keys`, tables created (implicit) where missing.
fn descend<'a>(
    root: &'a mut Item,
    keys: &[&str],
    file: &Path,
) -> Result<&'a mut Item, ConfigureError> {
    let mut item = root;
    for (depth, key) in keys.iter().enumerate() {
        item = child(item, key, &keys[..=depth], file)?;
    }
    Ok(item)
}

/// `parent[key]`, created as an (implicit) table if missing; an error if it is not a table.
fn child<'a>(
    parent: &'a mut Item,
    key: &str,
    at: &[&str],
    file: &Path,
) -> Result<&'a mut Item, ConfigureError> {
    let inline = is_inline(parent);
    let table = table_like(parent, &at[..at.len() - 1], file)?;
    if table.get(key).is_none() {
        let mut new = Table::new();
        new.set_implicit(true);
        table.insert(key, shaped(new, inline));
    }
    child_existing(table, key, at, file)
}

fn child_existing<'a>(
    table: &'a mut dyn TableLike,
    key: &str,
    at: &[&str],
    file: &Path,
) -> Result<&'a mut Item, ConfigureError> {
    match table.get_mut(key) {
        Some(item) if item.is_table_like() => Ok(item),
        Some(item) => Err(ConfigureError::TomlType {
            path: file.to_path_buf(),
            key: at.join("."),
            found: kind(item),
            expected: "a table",
        }),
        None => Err(ConfigureError::TomlType {
            path: file.to_path_buf(),
            key: at.join("."),
            found: "missing",
            expected: "a table",
        }),
    }
}

fn table_like<'a>(
    item: &'a mut Item,
    at: &[&str],
    file: &Path,
) -> Result<&'a mut dyn TableLike, ConfigureError> {
    let found = kind(item);
    item.as_table_like_mut()
        .ok_or_else(|| ConfigureError::TomlType {
            path: file.to_path_buf(),
            key: at.join("."),
            found,
            expected: "a table",
        })
}

/// The item at `keys` if every step is a table.
fn lookup<'a>(root: &'a mut Item, keys: &[&str]) -> Option<&'a mut Item> {
    let mut item = root;
    for key in keys {
        item = item.as_table_like_mut()?.get_mut(key)?;
        item.as_table_like()?;
    }
    Some(item)
}

fn is_inline(item: &Item) -> bool {
    matches!(item, Item::Value(Value::InlineTable(_)))
}

/// `table` as a header table, or as an inline one where its parent is inline.
fn shaped(table: Table, inline: bool) -> Item {
    if inline {
        let mut t: InlineTable = table.into_inline_table();
        t.fmt();
        Item::Value(Value::InlineTable(t))
    } else {
        Item::Table(table)
    }
}

/// Sets `key` to the string `text`, keeping the key's place and the value's decor (a comment
/// after it survives); a new key gets the indentation of the table's other keys.
fn set_str(table: &mut dyn TableLike, key: &str, text: &str) {
    if let Some(item) = table.get_mut(key) {
        if item.as_str() == Some(text) {
            return;
        }
        let new = match item.as_value() {
            Some(old) => like(old, text),
            None => Value::from(text),
        };
        *item = Item::Value(new);
        return;
    }
    let indent = table
        .iter()
        .find(|(_, item)| item.is_value())
        .and_then(|(k, _)| table.key(k))
        .and_then(|k| k.leaf_decor().prefix())
        .and_then(|p| p.as_str())
        .map(|p| p.rsplit('\n').next().unwrap_or("").to_owned())
        .filter(|p| p.chars().all(|c| c == ' ' || c == '\t'));
    table.insert(key, value(text));
    if let (Some(indent), Some(mut k)) = (indent, table.key_mut(key)) {
        k.leaf_decor_mut().set_prefix(indent);
    }
}

/// The string `text` written the way `old` was: its decor, and single quotes if it used them
/// (containerd 2.x's `config default` does) and `text` can be a literal string.
fn like(old: &Value, text: &str) -> Value {
    let literal = match old {
        Value::String(s) => s
            .as_repr()
            .and_then(|r| r.as_raw().as_str())
            .is_some_and(|raw| raw.starts_with('\'') && !raw.starts_with("'''")),
        _ => false,
    };
    let plain = !text.contains(|c: char| c == '\'' || c.is_control());
    let mut new = if literal && plain {
        format!("'{text}'")
            .parse::<Value>()
            .unwrap_or_else(|_| Value::from(text))
    } else {
        Value::from(text)
    };
    *new.decor_mut() = old.decor().clone();
    new
}

fn kind(item: &Item) -> &'static str {
    match item {
        Item::None => "missing",
        Item::Table(_) | Item::Value(Value::InlineTable(_)) => "a table",
        Item::ArrayOfTables(_) => "an array of tables",
        Item::Value(Value::String(_)) => "a string",
        Item::Value(Value::Integer(_)) => "an integer",
        Item::Value(Value::Float(_)) => "a float",
        Item::Value(Value::Boolean(_)) => "a boolean",
        Item::Value(Value::Datetime(_)) => "a datetime",
        Item::Value(Value::Array(_)) => "an array",
    }
}

fn toml_error(e: &TomlError, text: &str, file: &Path) -> ConfigureError {
    let offset = e.span().map_or(0, |s| s.start).min(text.len());
    let before = text.get(..offset).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    ConfigureError::InvalidToml {
        path: file.to_path_buf(),
        reason: e.message().trim().to_owned(),
        line,
        column,
    }
}

//! Editing `toml_edit` documents while keeping what the user wrote: walking to a table (made
//! where missing, an error naming the key where something else is in the way), setting a string
//! in the file's own style, copying a table to stand elsewhere. Used by the containerd and
//! CRI-O transforms; nothing here knows an engine's schema.

use std::path::Path;

use toml_edit::{DocumentMut, InlineTable, Item, Table, TableLike, TomlError, Value, value};

use super::ConfigureError;

/// `version = 2` at the top of a file that has no keys yet, below its comments.
pub(super) fn start_document(doc: &mut DocumentMut, version: i64) {
    let trailing = doc.trailing().as_str().unwrap_or("").to_owned();
    doc.set_trailing("");
    doc.insert("version", value(version));
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

/// A copy of a runtime table fit to stand under another name: without its comments (they speak
/// of the original) and without document positions, so it is printed right after the tables
/// that precede it in the runtimes table.
pub(super) fn clean_copy(mut table: Table) -> Table {
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

pub(super) fn clean_table(table: &mut Table) {
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
pub(super) fn without_comments(text: &str) -> String {
    text.split('\n')
        .filter(|line| !line.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join("\n")
}

pub(super) fn has_comment(table: &Table) -> bool {
    let decor = table.decor();
    [decor.prefix(), decor.suffix()]
        .into_iter()
        .flatten()
        .filter_map(|raw| raw.as_str())
        .any(|text| text.contains('#'))
}

/// The item at `keys`, tables created (implicit) where missing.
pub(super) fn descend<'a>(
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
pub(super) fn child<'a>(
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

pub(super) fn child_existing<'a>(
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

pub(super) fn table_like<'a>(
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
pub(super) fn lookup<'a>(root: &'a mut Item, keys: &[&str]) -> Option<&'a mut Item> {
    let mut item = root;
    for key in keys {
        item = item.as_table_like_mut()?.get_mut(key)?;
        item.as_table_like()?;
    }
    Some(item)
}

pub(super) fn is_inline(item: &Item) -> bool {
    matches!(item, Item::Value(Value::InlineTable(_)))
}

/// `table` as a header table, or as an inline one where its parent is inline.
pub(super) fn shaped(table: Table, inline: bool) -> Item {
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
pub(super) fn set_str(table: &mut dyn TableLike, key: &str, text: &str) {
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
    insert_indented(table, key, value(text));
}

/// Sets `key` to the boolean `on`, keeping the key's place and the value's decor.
pub(super) fn set_bool(table: &mut dyn TableLike, key: &str, on: bool) {
    if let Some(item) = table.get_mut(key) {
        if item.as_bool() == Some(on) {
            return;
        }
        let mut new = Value::from(on);
        if let Some(old) = item.as_value() {
            *new.decor_mut() = old.decor().clone();
        }
        *item = Item::Value(new);
        return;
    }
    insert_indented(table, key, value(on));
}

/// A new key, indented as the table's other keys are.
fn insert_indented(table: &mut dyn TableLike, key: &str, item: Item) {
    let indent = table
        .iter()
        .find(|(_, item)| item.is_value())
        .and_then(|(k, _)| table.key(k))
        .and_then(|k| k.leaf_decor().prefix())
        .and_then(|p| p.as_str())
        .map(|p| p.rsplit('\n').next().unwrap_or("").to_owned())
        .filter(|p| p.chars().all(|c| c == ' ' || c == '\t'));
    table.insert(key, item);
    if let (Some(indent), Some(mut k)) = (indent, table.key_mut(key)) {
        k.leaf_decor_mut().set_prefix(indent);
    }
}

/// The string `text` written the way `old` was: its decor, and single quotes if it used them
/// (containerd 2.x's `config default` does) and `text` can be a literal string.
pub(super) fn like(old: &Value, text: &str) -> Value {
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

pub(super) fn kind(item: &Item) -> &'static str {
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

pub(super) fn toml_error(e: &TomlError, text: &str, file: &Path) -> ConfigureError {
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

/// Removes the tables along `keys`, deepest first, that the removal left empty: the ones our
/// add created. An empty table means nothing to containerd — except an empty `runtimes`,
/// which containerd 1.x reads as "no runtimes at all" — so this is safe for one the user
/// wrote too; one with a comment above it is kept.
pub(super) fn prune(root: &mut Item, keys: &[&str]) {
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

/// `table` and the tables under it laid out afresh (no indentation, a blank line before each
/// header), keeping only the comment lines of what precedes each header and key: a table copied
/// from one file into another, whose old indentation means nothing there.
pub(super) fn relayout(table: &mut Table) {
    let comments = comment_lines(table.decor().prefix().and_then(|p| p.as_str()));
    let decor = table.decor_mut();
    decor.set_prefix(format!("\n{comments}"));
    decor.set_suffix("");
    for (mut key, item) in table.iter_mut() {
        let comments = comment_lines(key.leaf_decor().prefix().and_then(|p| p.as_str()));
        key.leaf_decor_mut().set_prefix(comments);
        if let Item::Table(t) = item {
            relayout(t);
        }
    }
}

/// The comment lines of `text`, unindented, each with its newline.
fn comment_lines(text: Option<&str>) -> String {
    text.unwrap_or("")
        .lines()
        .map(str::trim)
        .filter(|l| l.starts_with('#'))
        .map(|l| format!("{l}\n"))
        .collect()
}

//! CRI-O: by default a drop-in of our own, `crio.conf.d/99-nvidia.toml`, so CRI-O's main config
//! is never touched and `--undo` is deleting one file. CRI-O reads the drop-ins after
//! `crio.conf`, in name order, and merges them key by key, so `99-` wins over the
//! distribution's files and the drop-in needs only our keys. Without a drop-in the main config
//! is edited in place, as `nvidia-ctk runtime configure --drop-in-config=""` does.
//!
//! The content is what `nvidia-ctk runtime configure --runtime=crio` writes:
//! `[crio.runtime.runtimes.<name>]` starting as a copy of the runtime it stands in for in the
//! source config (the default runtime unless it is an NVIDIA one, `runc`, `crun`), so settings
//! such as `monitor_path` and `runtime_root` carry over, then `runtime_path` and
//! `runtime_type = "oci"`; plus `crio.runtime.default_runtime` with `--set-as-default`. CRI-O
//! enables CDI on its own, so there is nothing to write for `--cdi.enabled`.

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table, TableLike, value};

use super::toml_tables::{
    child_existing, clean_copy, descend, kind, lookup, prune, set_str, table_like, toml_error,
};
use super::{Action, ConfigureError, Edited, Outcome};

/// The drop-in's file name.
pub(crate) const DROP_IN: &str = "99-nvidia.toml";
const HEADER: &str = "# Written by `nvidia-ctk runtime configure` / `nvshim configure crio` (nvshim): registers\n\
     # the NVIDIA container runtime with CRI-O. `nvshim configure crio --undo` removes this file.\n\n";
const OCI: &str = "oci";
const RUNTIMES: [&str; 3] = ["crio", "runtime", "runtimes"];

/// The drop-in for `action`, with the template runtime read from `source` (the main config, or
/// `crio status config`); `old` is the drop-in as it is now.
pub(crate) fn drop_in(
    source: Option<&str>,
    source_file: &Path,
    old: Option<&str>,
    action: Action<'_>,
) -> Result<Edited, ConfigureError> {
    let outcome = match action {
        Action::Add {
            name,
            path,
            set_as_default,
            ..
        } => {
            let text = source.unwrap_or("");
            let src: DocumentMut = text
                .parse()
                .map_err(|e| toml_error(&e, text, source_file))?;
            let new = drop_in_text(name, path, set_as_default, template(&src, name));
            if old == Some(new.as_str()) {
                Outcome::Unchanged
            } else {
                Outcome::Write(new)
            }
        }
        Action::Remove { .. } if old.is_some() => Outcome::Remove,
        Action::Remove { .. } => Outcome::Unchanged,
    };
    Ok(Edited::new(outcome))
}

/// The drop-in's text (built with toml_edit, which quotes any name or path correctly).
pub(crate) fn drop_in_text(
    name: &str,
    path: &str,
    set_as_default: bool,
    template: Option<Table>,
) -> String {
    let mut entry = template.unwrap_or_default();
    entry.decor_mut().set_prefix("\n");
    set_str(&mut entry, "runtime_path", path);
    set_str(&mut entry, "runtime_type", OCI);
    let mut runtimes = Table::new();
    runtimes.set_implicit(true);
    runtimes.insert(name, Item::Table(entry));
    let mut runtime = Table::new();
    if set_as_default {
        runtime.insert("default_runtime", value(name));
    } else {
        runtime.set_implicit(true);
    }
    runtime.insert("runtimes", Item::Table(runtimes));
    let mut crio = Table::new();
    crio.set_implicit(true);
    crio.insert("runtime", Item::Table(runtime));
    let mut doc = DocumentMut::new();
    doc.insert("crio", Item::Table(crio));
    let body = doc.to_string();
    format!("{HEADER}{}", body.trim_start_matches('\n'))
}

/// Registers (or takes out) the runtime in CRI-O's main config itself.
pub(crate) fn edit(
    old: Option<&str>,
    file: &Path,
    action: Action<'_>,
) -> Result<Edited, ConfigureError> {
    let text = old.unwrap_or("");
    let mut doc: DocumentMut = text.parse().map_err(|e| toml_error(&e, text, file))?;
    let before = doc.to_string();
    match action {
        Action::Add {
            name,
            path,
            set_as_default,
            ..
        } => {
            let copy = template(&doc, name);
            let runtimes = descend(doc.as_item_mut(), &RUNTIMES, file)?;
            let at = [&RUNTIMES[..], &[name]].concat();
            if runtimes.get(name).is_none_or(|i| !i.is_table_like()) {
                let found = runtimes.get(name).map(kind);
                if let Some(found) = found {
                    return Err(ConfigureError::TomlType {
                        path: file.to_path_buf(),
                        key: at.join("."),
                        found,
                        expected: "a table",
                    });
                }
                let table = table_like(runtimes, &RUNTIMES, file)?;
                table.insert(name, Item::Table(copy.unwrap_or_default()));
            }
            let table = table_like(runtimes, &RUNTIMES, file)?;
            let entry = child_existing(table, name, &at, file)?;
            let entry = table_like(entry, &at, file)?;
            set_str(entry, "runtime_path", path);
            set_str(entry, "runtime_type", OCI);
            if set_as_default {
                let keys = ["crio", "runtime"];
                let runtime = descend(doc.as_item_mut(), &keys, file)?;
                set_str(table_like(runtime, &keys, file)?, "default_runtime", name);
            }
        }
        Action::Remove { name } => {
            if let Some(runtime) = lookup(doc.as_item_mut(), &["crio", "runtime"])
                && let Some(runtime) = runtime.as_table_like_mut()
            {
                if runtime.get("default_runtime").and_then(Item::as_str) == Some(name) {
                    runtime.remove("default_runtime");
                }
                if let Some(runtimes) = runtime
                    .get_mut("runtimes")
                    .and_then(Item::as_table_like_mut)
                {
                    runtimes.remove(name);
                }
            }
            prune(doc.as_item_mut(), &RUNTIMES);
        }
    }
    let after = doc.to_string();
    let outcome = if old.is_some() && after == before {
        Outcome::Unchanged
    } else {
        Outcome::Write(after)
    };
    Ok(Edited::new(outcome))
}

/// The runtime a new entry starts from, as nvidia-ctk picks it: the default runtime unless it
/// is an NVIDIA one (or the entry itself), then `runc`, then `crun`.
fn template(doc: &DocumentMut, name: &str) -> Option<Table> {
    let runtime = doc.get("crio")?.get("runtime")?;
    let runtimes = runtime.get("runtimes")?.as_table_like()?;
    let default = runtime
        .get("default_runtime")
        .and_then(Item::as_str)
        .filter(|d| *d != name && !d.starts_with("nvidia"));
    default
        .into_iter()
        .chain(["runc", "crun"])
        .find_map(|candidate| copy_of(runtimes, candidate))
}

fn copy_of(runtimes: &dyn TableLike, name: &str) -> Option<Table> {
    let table = match runtimes.get(name)? {
        Item::Table(t) => t.clone(),
        Item::Value(toml_edit::Value::InlineTable(t)) => t.clone().into_table(),
        _ => return None,
    };
    Some(clean_copy(table))
}

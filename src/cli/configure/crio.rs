//! CRI-O: a drop-in of our own, `<config-dir>/99-nvidia.toml`, so CRI-O's main config is never
//! touched and `--undo` is deleting one file. CRI-O reads the drop-ins after `crio.conf`, in
//! name order, so `99-` wins over the distribution's files.
//!
//! The content is what `nvidia-ctk runtime configure --runtime=crio` puts in its drop-in:
//! `[crio.runtime.runtimes.<name>]` with `runtime_path` and `runtime_type = "oci"`, plus
//! `crio.runtime.default_runtime` with `--set-as-default`. nvidia-ctk also copies the settings of
//! the main config's `runc`/`crun` entry into it; we leave those to CRI-O's defaults (it fills in
//! the monitor and runtime root for every handler).

use toml_edit::{DocumentMut, Item, Table, value};

use super::{Action, Edited, Outcome};

/// The drop-in's file name.
pub(crate) const DROP_IN: &str = "99-nvidia.toml";
const HEADER: &str = "# Written by `nvshim configure crio`: registers the NVIDIA container runtime with CRI-O.\n\
     # `nvshim configure crio --undo` removes this file.\n\n";

pub(crate) fn edit(old: Option<&str>, action: Action<'_>) -> Edited {
    let outcome = match action {
        Action::Add {
            name,
            path,
            set_as_default,
        } => {
            let new = drop_in(name, path, set_as_default);
            if old == Some(new.as_str()) {
                Outcome::Unchanged
            } else {
                Outcome::Write(new)
            }
        }
        Action::Remove { .. } if old.is_some() => Outcome::Remove,
        Action::Remove { .. } => Outcome::Unchanged,
    };
    Edited::new(outcome)
}

/// The drop-in's text (built with toml_edit, which quotes any name or path correctly).
pub(crate) fn drop_in(name: &str, path: &str, set_as_default: bool) -> String {
    let mut entry = Table::new();
    entry.insert("runtime_path", value(path));
    entry.insert("runtime_type", value("oci"));
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
    format!("{HEADER}{doc}")
}

//! containerd's `config.toml`: a runtime for the CRI plugin, edited with `toml_edit` so that
//! comments, formatting and every unrelated table stay as they are, either in the file itself
//! or in a drop-in the file imports.
//!
//! The schema comes from the file's `version`: 1 (no `version` key; containerd 1.x) keeps the
//! CRI runtimes under `plugins.cri.containerd`, 2 (containerd 1.x, still read by 2.x) under
//! `plugins."io.containerd.grpc.v1.cri".containerd`, 3 (containerd 2.x) under
//! `plugins."io.containerd.cri.v1.runtime".containerd`. An empty or missing file becomes a
//! minimal version 2 config, which both 1.x and 2.x read.
//!
//! Like `nvidia-ctk runtime configure --runtime=containerd`, the new `runtimes.<name>` starts as a
//! copy of the runtime it stands in for (the default runtime, else `runc`, else `crun`, if that
//! is a runc-type runtime), so settings such as `SystemdCgroup` carry over, then gets
//! `runtime_type = "io.containerd.runc.v2"` and `options.BinaryName = <path>`;
//! `--set-as-default` sets `default_runtime_name`, `--cdi.enabled` the CRI plugin's
//! `enable_cdi`. Where we differ from NVIDIA:
//! - an existing entry of that name is updated in place (its other settings are the user's);
//! - when the file lists no runtime yet, containerd's built-in `runc` is written out next to ours:
//!   containerd 1.6 replaces its built-in runtime map with the file's as soon as the file has a
//!   `runtimes` table, so adding only ours would drop `runc`, and the CRI plugin then refuses to
//!   load (`no corresponding runtime configured in containerd.runtimes for default_runtime_name
//!   = "runc"`); measured with containerd 1.6.20;
//! - `--undo` puts `default_runtime_name` back to `runc` when the file declares `runc` (the
//!   stock config does), rather than deleting it, so configure + undo gives the file back;
//! - a drop-in ([`drop_in`]) carries the source config's whole CRI plugin table, not only our
//!   runtime: containerd 1.x replaces a plugin's table with an imported file's instead of
//!   merging the two (measured with 1.6.20: a drop-in holding only `runtimes.nvidia` resets
//!   `sandbox_image` and loses `runc`), so a drop-in like NVIDIA's breaks 1.x nodes whose
//!   config.toml sets anything for the CRI plugin. containerd 2.x merges tables, where the copy
//!   changes nothing;
//! - version 1 `enable_cdi` goes where the CRI plugin reads it (`plugins.cri.enable_cdi`).

use std::path::Path;

use toml_edit::{DocumentMut, Item, Table, TableLike, Value, value};

use super::toml_tables::{
    child, child_existing, clean_copy, descend, is_inline, kind, lookup, prune, relayout, set_bool,
    set_str, shaped, start_document, table_like, toml_error,
};
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

/// containerd config schema versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Schema {
    V1,
    V2,
    V3,
}

impl Schema {
    /// The plugin whose `containerd.runtimes` the CRI runtime service reads.
    pub(crate) fn cri_plugin(self) -> &'static str {
        match self {
            Schema::V1 => "cri",
            Schema::V2 => "io.containerd.grpc.v1.cri",
            Schema::V3 => "io.containerd.cri.v1.runtime",
        }
    }

    pub(crate) fn version(self) -> i64 {
        match self {
            Schema::V1 => 1,
            Schema::V2 => 2,
            Schema::V3 => 3,
        }
    }

    /// Plugin ids in `disabled_plugins` that take the CRI runtimes out of service.
    fn cri_ids(self) -> &'static [&'static str] {
        match self {
            Schema::V1 | Schema::V2 => &["io.containerd.grpc.v1.cri", "cri"],
            Schema::V3 => &["io.containerd.cri.v1.runtime", "io.containerd.grpc.v1.cri"],
        }
    }
}

/// The schema of a config's text: its `version`, version 2 for an empty or missing file.
pub(crate) fn schema(text: Option<&str>, file: &Path) -> Result<Schema, ConfigureError> {
    let text = text.unwrap_or("");
    let doc: DocumentMut = text.parse().map_err(|e| toml_error(&e, text, file))?;
    if doc.as_table().is_empty() {
        return Ok(Schema::V2);
    }
    schema_of(&doc, file)
}

/// Registers (or with `Remove`, takes out) the runtime in the file itself.
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
        start_document(&mut doc, NEW_FILE_VERSION);
        Schema::V2
    } else {
        schema_of(&doc, file)?
    };
    match action {
        Action::Add { .. } => {
            add(&mut doc, schema, action, file, &mut notes)?;
            notes.extend(warnings(&doc, schema, file, None));
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

/// The drop-in for a version 2 or 3 `source` (the engine's config, or `containerd config dump`
/// when `dumped`): `version`, the source's CRI plugin table (see the module docs for why all of
/// it) and the runtime added to it. `old` is the drop-in as it is now, for "nothing to do".
pub(crate) fn drop_in(
    source: Option<&str>,
    source_file: &Path,
    dumped: bool,
    old: Option<&str>,
    drop_in_file: &Path,
    action: Action<'_>,
) -> Result<Edited, ConfigureError> {
    let text = source.unwrap_or("");
    let src: DocumentMut = text
        .parse()
        .map_err(|e| toml_error(&e, text, source_file))?;
    let schema = if src.as_table().is_empty() {
        Schema::V2
    } else {
        schema_of(&src, source_file)?
    };
    let plugin = schema.cri_plugin();
    let mut doc = DocumentMut::new();
    doc.insert("version", value(schema.version()));
    if let Some(mut key) = doc.key_mut("version") {
        key.leaf_decor_mut().set_prefix(format!(
            "# Written by nvshim (`nvidia-ctk runtime configure`, `nvshim configure containerd`):\n\
             # the NVIDIA runtime for containerd's CRI plugin, with the CRI plugin settings of\n\
             # {}, which containerd 1.x would otherwise drop (it replaces a plugin's\n\
             # table with an imported one's). Configure again after changing them there.\n",
            source_file.display()
        ));
    }
    if let Some(cri) = src.get("plugins").and_then(|p| p.get(plugin)) {
        let mut cri = cri.clone();
        if let Item::Table(t) = &mut cri {
            relayout(t);
        }
        let mut plugins = Table::new();
        plugins.set_implicit(true);
        plugins.insert(plugin, cri);
        doc.insert("plugins", Item::Table(plugins));
    }
    let mut notes = Vec::new();
    add(&mut doc, schema, action, drop_in_file, &mut notes)?;
    if !dumped {
        // A dump is the merged config: its `imports` are already in it.
        notes.extend(warnings(&src, schema, source_file, Some(drop_in_file)));
    }
    let new = doc.to_string();
    let outcome = if old == Some(new.as_str()) {
        Outcome::Unchanged
    } else {
        Outcome::Write(new)
    };
    Ok(Edited { outcome, notes })
}

/// The `imports` pattern that loads `drop_in_file`: every `.toml` in its directory, as NVIDIA
/// writes it.
pub(crate) fn import_pattern(drop_in_file: &Path) -> String {
    let dir = drop_in_file.parent().unwrap_or(Path::new("/"));
    format!("{}/*.toml", dir.display()).replace("//", "/")
}

/// `pattern` added to the top-level config's `imports` (a missing or empty config becomes
/// `version = <version>` plus the import).
pub(crate) fn add_import(
    old: Option<&str>,
    file: &Path,
    pattern: &str,
    version: i64,
) -> Result<Edited, ConfigureError> {
    let text = old.unwrap_or("");
    let mut doc: DocumentMut = text.parse().map_err(|e| toml_error(&e, text, file))?;
    if doc.as_table().is_empty() {
        start_document(&mut doc, version);
    }
    let imports = doc
        .entry("imports")
        .or_insert_with(|| value(toml_edit::Array::new()));
    let found = kind(imports);
    let Some(list) = imports.as_array_mut() else {
        return Err(ConfigureError::TomlType {
            path: file.to_path_buf(),
            key: "imports".to_owned(),
            found,
            expected: "an array of paths",
        });
    };
    if list.iter().any(|v| v.as_str() == Some(pattern)) {
        return Ok(Edited::new(Outcome::Unchanged));
    }
    list.push(pattern);
    Ok(Edited::new(Outcome::Write(doc.to_string())))
}

/// `pattern` taken out of the top-level config's `imports` (an `imports` it empties goes too).
pub(crate) fn remove_import(
    old: Option<&str>,
    file: &Path,
    pattern: &str,
) -> Result<Edited, ConfigureError> {
    let text = old.unwrap_or("");
    let mut doc: DocumentMut = text.parse().map_err(|e| toml_error(&e, text, file))?;
    let Some(list) = doc.get_mut("imports").and_then(Item::as_array_mut) else {
        return Ok(Edited::new(Outcome::Unchanged));
    };
    let before = list.len();
    list.retain(|v| v.as_str() != Some(pattern));
    if list.len() == before {
        return Ok(Edited::new(Outcome::Unchanged));
    }
    if list.is_empty() {
        doc.remove("imports");
    }
    Ok(Edited::new(Outcome::Write(doc.to_string())))
}

fn schema_of(doc: &DocumentMut, file: &Path) -> Result<Schema, ConfigureError> {
    let Some(version) = doc.get("version") else {
        return Ok(Schema::V1);
    };
    match version.as_integer() {
        Some(1) => Ok(Schema::V1),
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
    action: Action<'_>,
    file: &Path,
    notes: &mut Vec<String>,
) -> Result<(), ConfigureError> {
    let Action::Add {
        name,
        path,
        set_as_default,
        cdi,
    } = action
    else {
        return Ok(());
    };
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
    if cdi {
        // The CRI plugin's own table, for every schema (version 1 included: NVIDIA writes it
        // under `containerd` there, where the plugin does not read it).
        let keys = ["plugins", plugin];
        let cri = descend(doc.as_item_mut(), &keys, file)?;
        let cri = table_like(cri, &keys, file)?;
        set_bool(cri, "enable_cdi", true);
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

fn is_builtin_runc(item: &Item) -> bool {
    item.as_table()
        .and_then(|t| t.decor().prefix())
        .and_then(|p| p.as_str())
        .is_some_and(|p| p.contains(BUILTIN_MARKER))
}

/// Things that make the new entry useless or surprising: the CRI plugin switched off, other
/// files imported on top of this one.
fn warnings(doc: &DocumentMut, schema: Schema, file: &Path, drop_in: Option<&Path>) -> Vec<String> {
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
    let ours = drop_in.map(import_pattern);
    let imports: Vec<&str> = doc
        .get("imports")
        .and_then(Item::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .filter(|i| Some(*i) != ours.as_deref())
        .collect();
    if !imports.is_empty() {
        let what = match drop_in {
            None => "settings there are applied over this file's".to_owned(),
            Some(d) => format!(
                "{} is built from this file alone; to carry CRI settings from those files too \
                 (containerd 1.x replaces whole plugin tables on import), use --config-source=command",
                d.display()
            ),
        };
        notes.push(format!(
            "{} imports {}: {what}",
            file.display(),
            imports.join(", ")
        ));
    }
    notes
}

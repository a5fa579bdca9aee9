//! `nvidia-ctk config`: print or edit `config.toml` with `--set key=value`, and
//! `config default`.
//!
//! Edits go through `toml_edit`, so comments, layout, key order and tables we do not
//! know survive; the result is checked by the same parser the runtime and hook use
//! ([`crate::config::parse`]) before anything is written, and files are replaced
//! atomically. As NVIDIA's: a boolean key without `=value` means `true`, list values
//! are comma-separated, an empty value removes the key, a missing config file starts
//! from an empty one, and the result goes to stdout unless `--in-place` or `--output`
//! says where. `config default` prints the file the packages install
//! (`packaging/config.toml`: every key at our default, in NVIDIA's layout).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand};
use toml_edit::{Array, DocumentMut, Item, Table, Value};

use super::GlobalArgs;
use crate::config::{self as nvconfig, Config};
use crate::files::write::{self as files, WriteError};

/// What `nvidia-ctk config default` prints: the shipped config.toml.
pub const DEFAULT_CONFIG: &str = include_str!("../../packaging/config.toml");

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct ConfigArgs {
    #[command(subcommand)]
    pub command: Option<ConfigCommand>,
    /// The config file to read and modify (default: the one the toolkit reads).
    #[arg(
        long = "config-file",
        visible_alias = "config",
        short = 'c',
        value_name = "FILE"
    )]
    pub config_file: Option<PathBuf>,
    /// Set KEY (dotted, e.g. nvidia-container-cli.no-cgroups) to VALUE; repeatable. A
    /// boolean without =VALUE is true; lists are comma-separated; an empty VALUE
    /// removes the key.
    #[arg(long = "set", value_name = "KEY[=VALUE]")]
    pub set: Vec<String>,
    /// Write the result back to the config file.
    #[arg(long, short = 'i', conflicts_with = "output")]
    pub in_place: bool,
    /// Write the result to FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Print (or write) the default config file.
    #[command(visible_aliases = ["create-default", "generate-default"])]
    Default(DefaultArgs),
}

#[derive(Debug, Args)]
pub struct DefaultArgs {
    /// Write the default config to FILE instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: WriteError,
    },
    #[error(transparent)]
    Parse(#[from] nvconfig::ConfigError),
    #[error("invalid TOML in {}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("--set {set:?}: {reason}")]
    Set { set: String, reason: String },
    #[error("--set {set:?}: unknown key {key:?}; valid keys: {valid}")]
    UnknownKey {
        set: String,
        key: String,
        valid: String,
    },
    #[error("the result is not a valid config (nothing written): {0}")]
    Invalid(#[source] nvconfig::ConfigError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

pub fn run(global: &GlobalArgs, args: &ConfigArgs, out: &mut dyn Write) -> Result<(), ConfigError> {
    if let Some(ConfigCommand::Default(default)) = &args.command {
        return emit(DEFAULT_CONFIG, default.output.as_deref(), out);
    }
    let path = args
        .config_file
        .clone()
        .or_else(|| global.config.clone())
        .unwrap_or_else(|| nvconfig::locate(|name| std::env::var(name).ok()));
    let existing = files::read(&path).map_err(|source| ConfigError::Read {
        path: path.clone(),
        source,
    })?;
    let text = existing.as_ref().map_or("", |e| e.text.as_str());
    let edited = edit(text, &path, &args.set)?;
    if args.in_place {
        files::replace(&path, edited.as_bytes(), existing.as_ref(), false)?;
        return Ok(());
    }
    emit(&edited, args.output.as_deref(), out)
}

fn emit(text: &str, output: Option<&Path>, out: &mut dyn Write) -> Result<(), ConfigError> {
    match output {
        Some(path) => {
            let existing = files::read(path).map_err(|source| ConfigError::Read {
                path: path.to_path_buf(),
                source,
            })?;
            files::replace(path, text.as_bytes(), existing.as_ref(), false)?;
        }
        None => out.write_all(text.as_bytes())?,
    }
    Ok(())
}

/// The kind of value a key takes, from the serialised defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Bool,
    Integer,
    String,
    List,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Bool => "boolean",
            Kind::Integer => "integer",
            Kind::String => "string",
            Kind::List => "comma-separated list",
        }
    }
}

/// Every key of the config and its kind, dotted, from [`Config::default`] (so the set
/// is the parser's own). Keys whose default is unset are missing here; [`edit`] lets
/// the parser decide on those.
fn known_keys() -> Vec<(String, Kind)> {
    fn walk(prefix: &str, table: &toml::Table, out: &mut Vec<(String, Kind)>) {
        for (key, value) in table {
            let dotted = if prefix.is_empty() {
                key.clone()
            } else {
                format!("{prefix}.{key}")
            };
            let kind = match value {
                toml::Value::Table(inner) => {
                    walk(&dotted, inner, out);
                    continue;
                }
                toml::Value::Boolean(_) => Kind::Bool,
                toml::Value::Integer(_) => Kind::Integer,
                toml::Value::Array(_) => Kind::List,
                _ => Kind::String,
            };
            out.push((dotted, kind));
        }
    }
    let mut keys = Vec::new();
    if let Ok(table) = toml::Table::try_from(Config::default()) {
        walk("", &table, &mut keys);
    }
    keys.sort_by(|a, b| a.0.cmp(&b.0));
    keys
}

fn valid_keys(keys: &[(String, Kind)]) -> String {
    keys.iter()
        .map(|(k, kind)| format!("{k} ({})", kind.name()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// `text` with each `--set` applied, checked by the config parser.
pub fn edit(text: &str, path: &Path, sets: &[String]) -> Result<String, ConfigError> {
    let mut doc: DocumentMut =
        text.parse()
            .map_err(|e: toml_edit::TomlError| ConfigError::Syntax {
                path: path.to_path_buf(),
                message: e.message().trim().to_owned(),
            })?;
    let keys = known_keys();
    for set in sets {
        apply(&mut doc, set, &keys)?;
    }
    let edited = doc.to_string();
    let (_, unknown) = nvconfig::parse(&edited, path).map_err(ConfigError::Invalid)?;
    // A key the defaults do not list but the parser knows (an optional one) passes;
    // one the parser does not know either is refused.
    for set in sets {
        let key = set.split_once('=').map_or(set.as_str(), |(k, _)| k);
        if unknown
            .iter()
            .any(|u| u == key || key.starts_with(&format!("{u}.")))
        {
            return Err(ConfigError::UnknownKey {
                set: set.clone(),
                key: key.to_owned(),
                valid: valid_keys(&keys),
            });
        }
    }
    Ok(edited)
}

fn apply(doc: &mut DocumentMut, set: &str, keys: &[(String, Kind)]) -> Result<(), ConfigError> {
    let fail = |reason: String| ConfigError::Set {
        set: set.to_owned(),
        reason,
    };
    let (key, raw) = match set.split_once('=') {
        Some((key, raw)) => (key, Some(raw)),
        None => (set, None),
    };
    let parts: Vec<&str> = key.split('.').collect();
    if parts.iter().any(|p| p.is_empty()) {
        return Err(fail(
            "expected a dotted key such as nvidia-container-cli.no-cgroups".into(),
        ));
    }
    let kind = keys.iter().find(|(k, _)| k == key).map(|(_, kind)| *kind);
    if kind.is_none() && keys.iter().any(|(k, _)| k.starts_with(&format!("{key}."))) {
        return Err(fail(format!("{key} is a table, not a key")));
    }
    let value = match (kind, raw) {
        (_, Some("")) => None,
        (Some(Kind::Bool), None) => Some(Value::from(true)),
        (_, None) => return Err(fail("expected key=value".into())),
        (Some(Kind::Bool), Some(raw)) => {
            Some(Value::from(parse_bool(raw).ok_or_else(|| {
                fail(format!("{raw:?} is not a boolean (true or false)"))
            })?))
        }
        (Some(Kind::Integer), Some(raw)) => Some(Value::from(
            raw.parse::<i64>()
                .map_err(|_| fail(format!("{raw:?} is not an integer")))?,
        )),
        (Some(Kind::List), Some(raw)) => Some(Value::Array(raw.split(',').collect::<Array>())),
        (Some(Kind::String) | None, Some(raw)) => Some(Value::from(raw)),
    };
    let (last, tables) = match parts.split_last() {
        Some(split) => split,
        None => return Err(fail("empty key".into())),
    };
    let mut table: &mut Table = doc.as_table_mut();
    for name in tables {
        if !table.contains_key(name) {
            if value.is_none() {
                return Ok(());
            }
            let mut new = Table::new();
            new.set_implicit(true);
            table.insert(name, Item::Table(new));
        }
        table = match table.get_mut(name).and_then(Item::as_table_mut) {
            Some(inner) => inner,
            None => return Err(fail(format!("{name} is not a table in the config file"))),
        };
    }
    match value {
        Some(value) => match table.get_mut(last).and_then(Item::as_value_mut) {
            // Keep the key's decoration (comments around it).
            Some(old) => {
                let decor = old.decor().clone();
                *old = value;
                *old.decor_mut() = decor;
            }
            None => {
                table.insert(last, Item::Value(value));
            }
        },
        None => {
            table.remove(last);
        }
    }
    Ok(())
}

/// Go's `strconv.ParseBool`, which NVIDIA's `--set` uses.
fn parse_bool(raw: &str) -> Option<bool> {
    match raw {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;

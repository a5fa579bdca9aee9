//! Is our runtime registered with the container engines? Reads docker's
//! `daemon.json`, containerd's `config.toml` (schema 2 or 3) and CRI-O's drop-in,
//! the same places `nvshim configure` writes.

use std::fs;
use std::path::Path;

use super::{Check, DoctorArgs, Status};
use crate::cli::configure::containerd::{RUNC_V2, Schema};
use crate::cli::configure::crio::DROP_IN;

/// One check per engine whose config exists, and a failure when no engine has the
/// runtime at all.
pub fn registration(args: &DoctorArgs) -> Vec<Check> {
    let runtime = args.bin_dir.join("nvidia-container-runtime");
    let runtime = runtime.to_string_lossy();
    let mut out = Vec::new();
    let mut registered = 0;
    let mut seen = 0;
    for (engine, found) in [
        ("docker", docker(&args.docker_config, &args.runtime_name)),
        (
            "containerd",
            containerd(&args.containerd_config, &args.runtime_name),
        ),
        ("crio", crio(&args.crio_config_dir, &args.runtime_name)),
    ] {
        let name = format!("{engine} runtime");
        let fix = format!("nvshim configure {engine}");
        match found {
            Found::NoConfig(path) => out.push(Check::ok(
                &name,
                format!("{} does not exist: {engine} not in use, skipped", path),
            )),
            Found::Unreadable(why) => {
                seen += 1;
                out.push(Check::bad(Status::Fail, &name, why, fix));
            }
            Found::Missing(path) => {
                seen += 1;
                out.push(Check::bad(
                    Status::Warn,
                    &name,
                    format!("{path} has no \"{}\" runtime", args.runtime_name),
                    fix,
                ));
            }
            Found::Path(p) if p == runtime => {
                seen += 1;
                registered += 1;
                out.push(Check::ok(&name, format!("\"{}\" → {p}", args.runtime_name)));
            }
            Found::Path(p) => {
                seen += 1;
                out.push(Check::bad(
                    Status::Warn,
                    &name,
                    format!("\"{}\" points at {p}, not {runtime}", args.runtime_name),
                    format!("{fix} --runtime-path {runtime}"),
                ));
            }
        }
    }
    if registered == 0 {
        let detail = if seen == 0 {
            "no docker, containerd or CRI-O config found".to_string()
        } else {
            format!("no engine runs containers with {runtime}")
        };
        out.push(Check::bad(
            Status::Fail,
            "runtime registered",
            detail,
            "nvshim configure docker (or containerd, crio) --set-as-default, then restart the engine",
        ));
    }
    out
}

enum Found {
    NoConfig(String),
    Unreadable(String),
    Missing(String),
    Path(String),
}

fn read(path: &Path) -> Result<String, Found> {
    match fs::read_to_string(path) {
        Ok(text) => Ok(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            Err(Found::NoConfig(path.display().to_string()))
        }
        Err(e) => Err(Found::Unreadable(format!(
            "cannot read {}: {e}",
            path.display()
        ))),
    }
}

fn docker(path: &Path, name: &str) -> Found {
    let text = match read(path) {
        Ok(t) => t,
        Err(found) => return found,
    };
    if text.trim().is_empty() {
        return Found::Missing(path.display().to_string());
    }
    let json: serde_json::Value = match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(e) => return Found::Unreadable(format!("{} is not valid JSON: {e}", path.display())),
    };
    match json["runtimes"][name]["path"].as_str() {
        Some(p) => Found::Path(p.to_string()),
        None => Found::Missing(path.display().to_string()),
    }
}

fn containerd(path: &Path, name: &str) -> Found {
    let text = match read(path) {
        Ok(t) => t,
        Err(found) => return found,
    };
    let doc: toml::Table = match text.parse() {
        Ok(d) => d,
        Err(e) => return Found::Unreadable(format!("{} is not valid TOML: {e}", path.display())),
    };
    let schema = match doc.get("version").and_then(toml::Value::as_integer) {
        Some(3) => Schema::V3,
        _ => Schema::V2,
    };
    let entry = doc
        .get("plugins")
        .and_then(|p| p.get(schema.cri_plugin()))
        .and_then(|p| p.get("containerd"))
        .and_then(|c| c.get("runtimes"))
        .and_then(|r| r.get(name));
    let Some(entry) = entry else {
        return Found::Missing(path.display().to_string());
    };
    let runc_type = entry.get("runtime_type").and_then(toml::Value::as_str) == Some(RUNC_V2);
    match entry
        .get("options")
        .and_then(|o| o.get("BinaryName"))
        .and_then(toml::Value::as_str)
    {
        Some(p) if runc_type => Found::Path(p.to_string()),
        _ => Found::Missing(path.display().to_string()),
    }
}

fn crio(dir: &Path, name: &str) -> Found {
    let path = dir.join(DROP_IN);
    let text = match read(&path) {
        Ok(t) => t,
        Err(found) => return found,
    };
    let doc: toml::Table = match text.parse() {
        Ok(d) => d,
        Err(e) => return Found::Unreadable(format!("{} is not valid TOML: {e}", path.display())),
    };
    match doc
        .get("crio")
        .and_then(|c| c.get("runtime"))
        .and_then(|r| r.get("runtimes"))
        .and_then(|r| r.get(name))
        .and_then(|r| r.get("runtime_path"))
        .and_then(toml::Value::as_str)
    {
        Some(p) => Found::Path(p.to_string()),
        None => Found::Missing(path.display().to_string()),
    }
}

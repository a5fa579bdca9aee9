// SPDX-License-Identifier: Apache-2.0
//! `nvshim-simnode <dir> [--gpus N] [--model a100|h100] [--mig] [--driver-version V]
//! [--bundle B [--env K=V]... [--cmd SHELL-COMMAND]]`: builds a simulated GPU node at `<dir>` and prints the env to use as
//! shell `export` lines (used by `make demo`).
//!
//! `--bundle B` also writes an OCI bundle for runc at `B` (replacing an earlier one): a glibc
//! rootfs that can run the node's `nvidia-smi`, and a `config.json` (from `runc spec`) that runs
//! `sh -c SHELL-COMMAND` (default `nvidia-smi -L`) with the `--env` variables, plus what the mock
//! NVML needs inside: its config mounted at `/etc/mock-nvml.json` and `MOCK_NVML_DEV_ROOT=/dev`.
//!
//! An existing `<dir>` is replaced only if it holds a `mock-nvml.json` (an earlier node); any other
//! non-empty directory is left alone.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nvshim_testkit::{Artifacts, MOCK_CONFIG_FILE, NodeSpec, SimNode, runc_bundle};

const USAGE: &str = "usage: nvshim-simnode <dir> [--gpus N] [--model a100|h100] [--mig] \
                     [--driver-version V] \
                     [--bundle B [--env K=V]... [--cmd SHELL-COMMAND]]";

struct Args {
    dir: PathBuf,
    gpus: usize,
    h100: bool,
    mig: bool,
    driver_version: Option<String>,
    bundle: Option<PathBuf>,
    env: Vec<String>,
    cmd: String,
}

fn main() -> ExitCode {
    match parse(std::env::args().skip(1)).and_then(|args| run(&args)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("nvshim-simnode: {message}");
            ExitCode::FAILURE
        }
    }
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut dir = None;
    let mut args = Args {
        dir: PathBuf::new(),
        gpus: 2,
        h100: false,
        mig: false,
        driver_version: None,
        bundle: None,
        env: Vec::new(),
        cmd: "nvidia-smi -L".to_owned(),
    };
    while let Some(arg) = argv.next() {
        match arg.as_str() {
            "--gpus" => {
                let n = argv
                    .next()
                    .ok_or(format!("--gpus needs a value\n{USAGE}"))?;
                args.gpus = n
                    .parse()
                    .map_err(|_| format!("--gpus \"{n}\" is not a number\n{USAGE}"))?;
            }
            "--model" => match argv.next().as_deref() {
                Some("a100") => args.h100 = false,
                Some("h100") => args.h100 = true,
                other => {
                    return Err(format!(
                        "--model {:?} is not a model (valid: a100, h100)\n{USAGE}",
                        other.unwrap_or("")
                    ));
                }
            },
            "--mig" => args.mig = true,
            "--driver-version" => {
                let v = argv
                    .next()
                    .ok_or(format!("--driver-version needs a value\n{USAGE}"))?;
                args.driver_version = Some(v);
            }
            "--bundle" => {
                let b = argv
                    .next()
                    .ok_or(format!("--bundle needs a directory\n{USAGE}"))?;
                args.bundle = Some(PathBuf::from(b));
            }
            "--env" => {
                let kv = argv
                    .next()
                    .filter(|kv| kv.contains('='))
                    .ok_or(format!("--env needs KEY=VALUE\n{USAGE}"))?;
                args.env.push(kv);
            }
            "--cmd" => {
                args.cmd = argv
                    .next()
                    .ok_or(format!("--cmd needs a shell command\n{USAGE}"))?;
            }
            "-h" | "--help" => return Err(USAGE.to_owned()),
            flag if flag.starts_with('-') => {
                return Err(format!("unknown flag \"{flag}\"\n{USAGE}"));
            }
            path if dir.is_none() => dir = Some(PathBuf::from(path)),
            extra => return Err(format!("unexpected argument \"{extra}\"\n{USAGE}")),
        }
    }
    args.dir = dir.ok_or(USAGE.to_owned())?;
    Ok(args)
}

fn run(args: &Args) -> Result<(), String> {
    let mut spec = if args.mig && args.h100 {
        return Err(format!("--mig is for the a100 model only\n{USAGE}"));
    } else if args.mig {
        NodeSpec::with_mig(args.gpus)
    } else if args.h100 {
        NodeSpec::h100(args.gpus)
    } else {
        NodeSpec::standard(args.gpus)
    };
    if let Some(v) = &args.driver_version {
        spec.driver_version.clone_from(v);
    }
    clear(&args.dir)?;
    let artifacts = Artifacts::locate().map_err(|e| chain(&e))?;
    let node = SimNode::build(&spec, &args.dir, &artifacts).map_err(|e| chain(&e))?;
    for (key, value) in node.env() {
        println!("export {key}={}", quote(&value));
    }
    println!("# nvshim flags: {}", node.root_args().join(" "));
    if let Some(bundle) = &args.bundle {
        write_bundle(&node, bundle, args)?;
        println!("# bundle: {}", bundle.display());
    }
    Ok(())
}

fn write_bundle(node: &SimNode, bundle: &Path, args: &Args) -> Result<(), String> {
    if bundle.join("config.json").is_file() {
        std::fs::remove_dir_all(bundle)
            .map_err(|e| format!("removing {}: {e}", bundle.display()))?;
    }
    let rootfs = bundle.with_extension("rootfs-src");
    if rootfs.exists() {
        std::fs::remove_dir_all(&rootfs)
            .map_err(|e| format!("removing {}: {e}", rootfs.display()))?;
    }
    node.container_rootfs()
        .build(&rootfs)
        .map_err(|e| chain(&e))?;
    let mut env = vec![
        "MOCK_NVML_CONFIG=/etc/mock-nvml.json".to_owned(),
        "MOCK_NVML_DEV_ROOT=/dev".to_owned(),
    ];
    env.extend(args.env.iter().cloned());
    let env: Vec<&str> = env.iter().map(String::as_str).collect();
    runc_bundle(bundle, &rootfs, &["sh", "-c", &args.cmd], &env).map_err(|e| chain(&e))?;
    std::fs::remove_dir_all(&rootfs).map_err(|e| format!("removing {}: {e}", rootfs.display()))?;
    let path = bundle.join("config.json");
    let text = std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut spec: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    if let Some(mounts) = spec["mounts"].as_array_mut() {
        mounts.push(serde_json::json!({
            "destination": "/etc/mock-nvml.json",
            "type": "bind",
            "source": node.mock_config,
            "options": ["ro", "bind"],
        }));
    }
    let text = serde_json::to_string_pretty(&spec).map_err(|e| e.to_string())?;
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// Removes `dir` if it holds an earlier node; refuses any other non-empty directory.
fn clear(dir: &Path) -> Result<(), String> {
    let Ok(mut entries) = std::fs::read_dir(dir) else {
        return Ok(());
    };
    if entries.next().is_none() {
        return Ok(());
    }
    if !dir.join(MOCK_CONFIG_FILE).is_file() {
        return Err(format!(
            "{} is not empty and holds no {MOCK_CONFIG_FILE}; refusing to delete it",
            dir.display()
        ));
    }
    std::fs::remove_dir_all(dir).map_err(|e| format!("removing {}: {e}", dir.display()))
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut message = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        message.push_str(": ");
        message.push_str(&cause.to_string());
        source = cause.source();
    }
    message
}

fn quote(value: &str) -> String {
    format!("'{}'", value.replace('\'', r"'\''"))
}

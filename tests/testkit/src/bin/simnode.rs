// SPDX-License-Identifier: Apache-2.0
//! `nvshim-simnode <dir> [--gpus N] [--mig] [--driver-version V]`: builds a simulated GPU node at
//! `<dir>` and prints the env to use as shell `export` lines (used by `make demo`).
//!
//! An existing `<dir>` is replaced only if it holds a `mock-nvml.json` (an earlier node); any other
//! non-empty directory is left alone.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use nvshim_testkit::{Artifacts, MOCK_CONFIG_FILE, NodeSpec, SimNode};

const USAGE: &str = "usage: nvshim-simnode <dir> [--gpus N] [--mig] [--driver-version V]";

struct Args {
    dir: PathBuf,
    gpus: usize,
    mig: bool,
    driver_version: Option<String>,
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
        mig: false,
        driver_version: None,
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
            "--mig" => args.mig = true,
            "--driver-version" => {
                let v = argv
                    .next()
                    .ok_or(format!("--driver-version needs a value\n{USAGE}"))?;
                args.driver_version = Some(v);
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
    let mut spec = if args.mig {
        NodeSpec::with_mig(args.gpus)
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
    Ok(())
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

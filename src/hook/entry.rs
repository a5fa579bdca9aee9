//! The `nvidia-container-runtime-hook` binary's flow, in the library so that `nvshim`
//! can run it too:
//! - `[-config FILE] [-debug] prestart|poststart|poststop`, NVIDIA's interface (Go
//!   flags), for docker's `--gpus` and `hooks.d`;
//! - `link-driver --link TARGET::PATH … --ldcache KEY=PATH@FLAGS …`, the
//!   `createContainer` hook of our CDI specs (see [`super::link`]).
//!
//! The installed hook is a static binary, so no `LD_PRELOAD` can reach it (the dynamic
//! loader that would honour one is not there). Its `createContainer` stages refuse to
//! run when a loader variable is set at all: their env comes from a spec we wrote
//! (`PATH` only), so one carrying those was tampered with (CVE-2025-23266). `prestart`
//! gets the engine's own environment, where `LD_LIBRARY_PATH` can be legitimate, so it
//! runs, and removes the loader variables before handing anything to the dynamic
//! `nvshim`. A static glibc program must not load the host's NVML, so a prestart
//! request that needs NVML is handed to `nvshim runtime-hook -- <same argv>` by
//! `exec`, with the OCI state already read from stdin given to it again through a
//! pipe.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

use crate::config;
use crate::container::{HOOK_HELPER_COMMAND, NVML_HELPER};
use crate::hook_contract::{
    DISABLE_DEVICE_NODE_MODIFICATION, HOOK_BINARY as NAME, LINK_DRIVER, LOADER_VARS, POSTSTART,
    POSTSTOP, PRESTART, loader_var, parse_link_driver, parse_params_args,
};
use crate::logging::{self, LogSettings};
use crate::pipeline::NvmlAccess;

use super::privileges::{self, Stage};
use super::{HookOutcome, link, params};

/// What `-help` prints, and a missing stage.
const USAGE: &str = "usage: nvidia-container-runtime-hook [-config FILE] [-debug] \
                     prestart|poststart|poststop (reads the OCI state on stdin)";

/// The OCI state is small; anything larger is not one.
const MAX_STATE: u64 = 1 << 20;

/// The command line, as NVIDIA's hook takes it (Go flags: `-flag`, `--flag`,
/// `-flag=value` or `-flag value`, before the stage), and the stage's own arguments.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Args {
    pub config: Option<String>,
    pub debug: bool,
    pub version: bool,
    /// `-help`/`-h`: print the usage and exit 0, as Go's flag package does.
    pub help: bool,
    pub stage: Option<String>,
    /// What follows the stage (`link-driver`'s `--link`/`--ldcache`).
    pub rest: Vec<String>,
}

/// Parses the hook's command line.
pub fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            parsed.stage = Some(arg.clone());
            parsed.rest = rest.cloned().collect();
            break;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        match name {
            "config" => {
                let value = value.or_else(|| rest.next().cloned());
                parsed.config = Some(value.ok_or("-config needs a file")?);
            }
            "debug" => parsed.debug = value.is_none_or(|v| v != "false"),
            "version" => parsed.version = true,
            "help" | "h" => parsed.help = true,
            other => {
                return Err(format!(
                    "unknown flag -{other} (valid: -config, -debug, -version, -help, -h)"
                ));
            }
        }
    }
    Ok(parsed)
}

/// Runs the hook with `raw` (`argv[1..]`). `nvml` says whether this process may load
/// NVML (the static hook may not; `nvshim runtime-hook` may).
pub fn main(raw: Vec<String>, nvml: NvmlAccess) -> ExitCode {
    let failure = |message: &str| {
        eprintln!("{NAME}: {message}");
        ExitCode::FAILURE
    };
    let args = match parse(&raw) {
        Ok(args) => args,
        Err(e) => return failure(&e),
    };
    if args.version {
        eprintln!("{NAME} (nvshim) {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    if args.help {
        eprintln!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    // The createContainer stages run with the env our specs give them (PATH only): a
    // loader variable there means the spec was tampered with. `prestart` runs with the
    // engine's own env (dockerd passes its environment to the `--gpus` hook), where
    // LD_LIBRARY_PATH is legitimate: this static binary ignores it, and it is removed
    // before any hand-off to the dynamic `nvshim`.
    let refuse = |var: &str| {
        failure(&format!(
            "refusing to run with {var} set: loader variables must not reach a hook that \
             runs as root on the host (check the hook's env in the OCI spec)"
        ))
    };
    let restrict = |stage| match privileges::restrict(stage) {
        Ok(_) => None,
        Err(e) => Some(failure(&e.to_string())),
    };
    match args.stage.as_deref() {
        Some(PRESTART) => {
            if let Some(failed) = restrict(Stage::Prestart) {
                return failed;
            }
        }
        Some(LINK_DRIVER) => {
            return match loader_var() {
                Some(var) => refuse(var),
                None => restrict(Stage::LinkDriver).unwrap_or_else(|| link_driver(&args.rest)),
            };
        }
        Some(DISABLE_DEVICE_NODE_MODIFICATION) => {
            return match loader_var() {
                Some(var) => refuse(var),
                None => restrict(Stage::DisableDeviceNodeModification)
                    .unwrap_or_else(|| disable_device_node_modification(&args.rest)),
            };
        }
        Some(POSTSTART | POSTSTOP) => return ExitCode::SUCCESS,
        Some(other) => {
            return failure(&format!(
                "unknown stage {other:?} (valid: {PRESTART}, {POSTSTART}, {POSTSTOP}, \
                 {LINK_DRIVER}, {DISABLE_DEVICE_NODE_MODIFICATION})"
            ));
        }
        None => return failure(USAGE),
    }
    // `-config` names the file as NVIDIA_CTK_CONFIG_FILE_PATH would (a missing file is
    // then an error).
    let argv0 = std::env::args_os().next();
    let loaded = config::load_installed(
        |key| match (&args.config, key) {
            (Some(path), config::ENV_CONFIG_FILE_PATH) => Some(path.clone()),
            _ => std::env::var(key).ok(),
        },
        argv0.as_deref(),
    );
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(e) => return failure(&e.to_string()),
    };
    let log = &loaded.config.nvidia_container_cli.debug;
    let _ = logging::init(&LogSettings {
        debug: args.debug,
        file: (!log.as_os_str().is_empty() && log.as_path() != Path::new("/dev/null"))
            .then(|| log.clone()),
        // The runtime's `log-level` (default info) applies to the hook's file too.
        file_level: Some(loaded.config.nvidia_container_runtime.log_level.into()),
        // The one error line comes from below; -debug shows the rest on stderr.
        no_stderr: !args.debug,
        stderr_filter: None,
    });
    for key in &loaded.unknown_keys {
        tracing::warn!(path = %loaded.path.display(), "unknown config key {key}, ignored");
    }

    let mut state = Vec::new();
    if let Err(e) = std::io::stdin().take(MAX_STATE).read_to_end(&mut state) {
        return failure(&format!("cannot read the OCI state from stdin: {e}"));
    }
    match super::prestart(&state, &loaded.config, nvml) {
        Ok(HookOutcome::NeedsNvml { reason }) => {
            tracing::debug!(reason, "handing the request to nvshim, which loads NVML");
            let helper = nvml_helper();
            let err = exec_with_stdin(&helper, &raw, &state);
            failure(&format!(
                "this request needs NVML ({reason}), which runs in {}: {err}",
                helper.display()
            ))
        }
        Ok(outcome) => {
            tracing::debug!(?outcome, "prestart done");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e}");
            failure(&e.to_string())
        }
    }
}

fn link_driver(args: &[String]) -> ExitCode {
    let fail = |message: &str| {
        eprintln!("{NAME} {LINK_DRIVER}: {message}");
        ExitCode::FAILURE
    };
    let (links, entries) = match parse_link_driver(args) {
        Ok(parsed) => parsed,
        Err(e) => return fail(&e),
    };
    let mut state = Vec::new();
    if let Err(e) = std::io::stdin().take(MAX_STATE).read_to_end(&mut state) {
        return fail(&format!("cannot read the OCI state from stdin: {e}"));
    }
    match link::run(&state, &links, &entries) {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e.to_string()),
    }
}

fn disable_device_node_modification(args: &[String]) -> ExitCode {
    let fail = |message: &dyn std::fmt::Display| {
        eprintln!("{NAME} {DISABLE_DEVICE_NODE_MODIFICATION}: {message}");
        ExitCode::FAILURE
    };
    let outcome = match parse_params_args(args) {
        Err(e) => return fail(&e),
        // The runtime's form: the state on stdin is not needed, and not reading it
        // saves waiting for the engine to write it (runc writes it from a goroutine;
        // OCI runtimes ignore a hook that exits without reading it).
        Ok(Some(rootfs)) => params::run_at(&rootfs),
        Ok(None) => {
            let mut state = Vec::new();
            if let Err(e) = std::io::stdin().take(MAX_STATE).read_to_end(&mut state) {
                return fail(&format!("cannot read the OCI state from stdin: {e}"));
            }
            params::run(&state)
        }
    };
    match outcome {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => fail(&e),
    }
}

/// `nvshim` in the directory of the running binary.
fn nvml_helper() -> PathBuf {
    crate::roots::beside_self(NVML_HELPER)
}

/// Execs `nvshim runtime-hook -- <args>` with `state` on its stdin (a pipe holding it:
/// the state is far smaller than a pipe's buffer). Returns only on failure.
fn exec_with_stdin(helper: &Path, args: &[String], state: &[u8]) -> std::io::Error {
    let (read, write) = match nix::unistd::pipe() {
        Ok(fds) => fds,
        Err(e) => return e.into(),
    };
    let mut write = std::fs::File::from(write);
    if let Err(e) = write.write_all(state) {
        return e;
    }
    drop(write);
    if let Err(e) = nix::unistd::dup2_stdin(&read) {
        return e.into();
    }
    drop(read);
    let mut argv = vec![OsString::from(HOOK_HELPER_COMMAND), OsString::from("--")];
    argv.extend(args.iter().map(OsString::from));
    let mut command = Command::new(helper);
    // `nvshim` is dynamic: the engine's loader variables must not reach it.
    for var in LOADER_VARS {
        command.env_remove(var);
    }
    command.arg0(helper).args(&argv).exec()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn go_style_flags_before_the_stage() {
        let a = args(&["-config", "/etc/x.toml", "-debug", "prestart"]).unwrap();
        assert_eq!(
            (a.config.as_deref(), a.debug, a.stage.as_deref()),
            (Some("/etc/x.toml"), true, Some("prestart"))
        );
        let a = args(&["--config=/c.toml", "poststop"]).unwrap();
        assert_eq!(a.config.as_deref(), Some("/c.toml"));
        assert_eq!(a.stage.as_deref(), Some("poststop"));
        assert!(args(&["-version"]).unwrap().version);
        for help in ["-h", "--help", "-help"] {
            assert!(args(&[help]).unwrap().help, "{help}");
        }
        assert!(args(&["-bogus", "prestart"]).is_err());
        assert!(args(&["-config"]).is_err());
        let a = args(&["link-driver", "--link", "a::/b"]).unwrap();
        assert_eq!(a.rest, ["--link", "a::/b"]);
    }
}

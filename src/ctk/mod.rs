//! `nvidia-ctk` and `nvidia-cdi-hook`: NVIDIA's command names, subcommands, flags,
//! defaults and exit codes, as a second front end on the same library `nvshim` uses.
//! The `nvshim` binary runs this when it is started under one of those names (packages
//! install the names as links to it), so there is one implementation and no second
//! binary to build.
//!
//! Like NVIDIA's (urfave/cli) tool, every failure, usage errors included, exits 1;
//! `--help` and `--version` exit 0.

pub mod cdi;
pub mod config;
pub mod hook;
pub mod info;
pub mod runtime;
pub mod system;

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::logging::{self, LogSettings};

pub use crate::hook_contract::{CDI_HOOK_BINARY, CTK_BINARY};

/// Flags every `nvidia-ctk` command takes.
#[derive(Debug, Clone, Args)]
pub struct GlobalArgs {
    /// Enable debug-level logging.
    #[arg(long, short = 'd', global = true, env = "NVIDIA_CTK_DEBUG")]
    pub debug: bool,
    /// Suppress all output except for errors; overrides --debug.
    #[arg(long, global = true, env = "NVIDIA_CTK_QUIET")]
    pub quiet: bool,
    /// Path to the config file (default: /etc/nvidia-container-runtime/config.toml, or
    /// as `NVIDIA_CTK_CONFIG_FILE_PATH`/`XDG_CONFIG_HOME` say). Before the command, as
    /// NVIDIA's takes it: `runtime configure --config` is the engine's file.
    #[arg(long, env = "NVIDIA_CTK_CONFIG")]
    pub config: Option<PathBuf>,
}

#[derive(Debug, Parser)]
#[command(
    name = CTK_BINARY,
    version,
    about = "Tools to configure the NVIDIA Container Toolkit"
)]
pub struct Ctk {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(subcommand)]
    pub command: CtkCommand,
}

#[derive(Debug, Subcommand)]
pub enum CtkCommand {
    /// A collection of hooks that may be injected into an OCI spec.
    Hook(hook::HookArgs),
    /// A collection of runtime-related utilities for the NVIDIA Container Toolkit.
    Runtime(runtime::RuntimeArgs),
    /// Provide tools for interacting with Container Device Interface specifications.
    Cdi(cdi::CdiArgs),
    /// A collection of system-related utilities for the NVIDIA Container Toolkit.
    System(system::SystemArgs),
    /// Interact with the NVIDIA Container Toolkit configuration.
    Config(config::ConfigArgs),
    /// Provide information about the system.
    Info(info::InfoArgs),
}

/// `nvidia-cdi-hook <hook> …`: the same hooks as `nvidia-ctk hook`.
#[derive(Debug, Parser)]
#[command(
    name = CDI_HOOK_BINARY,
    version,
    about = "Hooks that CDI specs run in a container's createContainer stage"
)]
pub struct CdiHook {
    #[command(flatten)]
    pub global: GlobalArgs,
    #[command(flatten)]
    pub hook: hook::HookArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum CtkError {
    #[error(transparent)]
    Hook(#[from] hook::HookError),
    #[error(transparent)]
    Runtime(#[from] runtime::RuntimeError),
    #[error(transparent)]
    Cdi(#[from] cdi::CdiError),
    #[error(transparent)]
    System(#[from] system::SystemError),
    #[error(transparent)]
    Config(#[from] config::ConfigError),
    #[error(transparent)]
    Info(#[from] info::InfoError),
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// `nvidia-ctk …` (`args` includes argv[0]).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let ctk = match Ctk::try_parse_from(args) {
        Ok(ctk) => ctk,
        Err(e) => return usage(&e),
    };
    init_logging(&ctk.global);
    finish(CTK_BINARY, run(&ctk.global, &ctk.command))
}

/// `nvidia-cdi-hook …` (`args` includes argv[0]).
pub fn cdi_hook_main(args: Vec<OsString>) -> ExitCode {
    let parsed = match CdiHook::try_parse_from(args) {
        Ok(parsed) => parsed,
        Err(e) => return usage(&e),
    };
    init_logging(&parsed.global);
    finish(
        CDI_HOOK_BINARY,
        hook::run(&parsed.global, &parsed.hook).map_err(CtkError::from),
    )
}

/// Runs one `nvidia-ctk` command, writing its output to stdout.
pub fn run(global: &GlobalArgs, command: &CtkCommand) -> Result<(), CtkError> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = match command {
        CtkCommand::Hook(args) => hook::run(global, args).map_err(CtkError::from),
        CtkCommand::Runtime(args) => runtime::run(global, args, &mut out).map_err(CtkError::from),
        CtkCommand::Cdi(args) => cdi::run(global, args, &mut out).map_err(CtkError::from),
        CtkCommand::System(args) => system::run(global, args, &mut out).map_err(CtkError::from),
        CtkCommand::Config(args) => config::run(global, args, &mut out).map_err(CtkError::from),
        CtkCommand::Info(args) => info::run(global, args, &mut out).map_err(CtkError::from),
    };
    out.flush()?;
    result
}

fn init_logging(global: &GlobalArgs) {
    let settings = LogSettings {
        debug: global.debug && !global.quiet,
        stderr_filter: global.quiet.then(|| "error".to_owned()),
        ..LogSettings::default()
    };
    if let Err(e) = logging::init(&settings) {
        eprintln!("{CTK_BINARY}: {e}");
    }
}

/// clap's message; help and version go to stdout with 0, usage errors exit 1 as
/// NVIDIA's tools do.
fn usage(error: &clap::Error) -> ExitCode {
    let _ = error.print();
    if error.use_stderr() {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

fn finish(binary: &str, result: Result<(), CtkError>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{binary}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

//! `nvshim`: the admin CLI. Parsing, logging, one library call, an exit code.
//!
//! The same binary is NVIDIA's `nvidia-ctk`, `nvidia-cdi-hook`, `nvidia-container-cli`,
//! `nvidia-docker` and `gpu-feature-discovery` when started under those names (packages
//! install them as links to it): argv[0] picks the front end.

use std::ffi::OsStr;
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use nvshim::cli::{self, Cli, labels};
use nvshim::container::{HOOK_HELPER_COMMAND, RUNTIME_HELPER_COMMAND};
use nvshim::hook;
use nvshim::logging::{self, LogSettings};
use nvshim::pipeline::NvmlAccess;
use nvshim::runtime::entry;

fn main() -> ExitCode {
    let argv: Vec<_> = std::env::args_os().collect();
    let called_as = argv
        .first()
        .map(std::path::Path::new)
        .and_then(|p| p.file_name())
        .and_then(OsStr::to_str)
        .unwrap_or_default();
    match called_as {
        nvshim::ctk::CTK_BINARY => return nvshim::ctk::main(argv),
        nvshim::ctk::CDI_HOOK_BINARY => return nvshim::ctk::cdi_hook_main(argv),
        nvshim::container_cli::BINARY => return nvshim::container_cli::main(argv),
        nvshim::docker_wrapper::BINARY => return nvshim::docker_wrapper::main(argv),
        labels::feature_discovery::BINARY => return labels::feature_discovery::main(argv),
        _ => {}
    }
    // `nvidia-ctk-installer [flags]`: NVIDIA's toolkit image's entry point is `install`.
    let cli = if called_as == cli::install::INSTALLER_BINARY {
        let mut args = vec![std::ffi::OsString::from("nvshim"), "install".into()];
        args.extend(argv.iter().skip(1).cloned());
        Some(Cli::parse_from(args))
    } else {
        None
    };
    // `nvshim runtime -- <runc argv>`: the runtime hands requests that need NVML here
    // (see `runtime::entry`). Not a clap subcommand: runc's argv is passed through as is.
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() == Some(OsStr::new(RUNTIME_HELPER_COMMAND)) {
        let mut rest: Vec<_> = args.collect();
        if rest.first().map(|a| a.as_os_str()) == Some(OsStr::new("--")) {
            rest.remove(0);
        }
        return entry::main(rest, NvmlAccess::InProcess);
    }
    // `nvshim runtime-hook -- <hook argv>`: the static hook's counterpart (see
    // `hook::entry`).
    let mut args = std::env::args().skip(1);
    if args.next().as_deref() == Some(HOOK_HELPER_COMMAND) {
        let rest: Vec<String> = args.skip_while(|a| a == "--").collect();
        return hook::entry::main(rest, NvmlAccess::InProcess);
    }
    let cli = cli.unwrap_or_else(Cli::parse);
    if let Err(e) = logging::init(&LogSettings {
        debug: cli.debug,
        ..LogSettings::default()
    }) {
        eprintln!("nvshim: {e}");
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    match cli::run(&cli, &mut out) {
        Ok(()) => {
            let _ = out.flush();
            ExitCode::SUCCESS
        }
        Err(e) => {
            let _ = out.flush();
            // Our error messages already carry their causes.
            eprintln!("nvshim: error: {e}");
            ExitCode::FAILURE
        }
    }
}

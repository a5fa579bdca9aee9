//! `nvshim`: the admin CLI. Parsing, logging, one library call, an exit code.

use std::io::Write;
use std::process::ExitCode;

use clap::Parser;
use nvshim::cli::{self, Cli};
use nvshim::logging::{self, LogSettings};

fn main() -> ExitCode {
    let cli = Cli::parse();
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

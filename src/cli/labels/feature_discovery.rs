// SPDX-License-Identifier: Apache-2.0
//! `gpu-feature-discovery`: the `nvshim` binary started under GFD's name (the `nvshim`
//! package links `/usr/bin/gpu-feature-discovery` to it) runs `nvshim labels` with GFD's
//! command line and GFD's defaults, so GFD's container command, flags and `GFD_*`
//! variables work unchanged: it relabels every 60s until SIGTERM unless `--oneshot`, into
//! `features.d/gfd`. `--help` and `--version` exit 0, every failure (usage included) 1,
//! as GFD does.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

use clap::Parser;

use super::LabelsArgs;
use crate::cli::HostArgs;
use crate::logging::{self, LogSettings};

/// The name that picks this front end.
pub const BINARY: &str = "gpu-feature-discovery";
/// GFD's feature file: `nvshim labels` writes `…/nvshim`, GFD's name writes GFD's file.
pub const GFD_OUTPUT: &str = "/etc/kubernetes/node-feature-discovery/features.d/gfd";

/// GFD's command line: the labeller's flags, and the node's roots as `nvshim` takes them.
#[derive(Debug, Parser)]
#[command(
    name = BINARY,
    version,
    about = "Generate labels for NVIDIA devices (nvshim's gpu-feature-discovery)"
)]
pub struct GfdCli {
    #[command(flatten)]
    pub host: HostArgs,
    /// Log at debug level on stderr.
    #[arg(long, short = 'd', env = "NVSHIM_DEBUG")]
    pub debug: bool,
    #[command(flatten)]
    pub labels: LabelsArgs,
}

impl GfdCli {
    /// The labeller's arguments with GFD's defaults under them.
    pub fn labels_args(&self) -> LabelsArgs {
        LabelsArgs {
            gfd_defaults: true,
            ..self.labels.clone()
        }
    }
}

pub fn main(argv: Vec<OsString>) -> ExitCode {
    let cli = match GfdCli::try_parse_from(argv) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Err(e) = logging::init(&LogSettings {
        debug: cli.debug,
        ..LogSettings::default()
    }) {
        eprintln!("{BINARY}: {e}");
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = super::run(&cli.host, &cli.labels_args(), &mut out);
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{BINARY}: error: {e}");
            ExitCode::FAILURE
        }
    }
}

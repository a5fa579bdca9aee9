//! `nvidia-device-plugin`: the kubelet device plugin. Parsing, logging, one library
//! call, an exit code.

use std::process::ExitCode;

use clap::Parser;
use nvshim::logging::{self, LogSettings};
use nvshim_device_plugin::config::{PluginArgs, PluginCommand};
use nvshim_device_plugin::{mps_daemon, node};

fn main() -> ExitCode {
    let args = PluginArgs::parse();
    let level = args.log_level(&|key| std::env::var(key).ok());
    if let Err(e) = logging::init(&LogSettings {
        stderr_filter: Some(level.unwrap_or_else(|| "info".to_string())),
        ..LogSettings::default()
    }) {
        eprintln!("nvidia-device-plugin: {e}");
    }
    let result = match args.command {
        Some(PluginCommand::MpsControlDaemon) => mps_daemon::run(&args).map_err(|e| e.to_string()),
        None => node::run(&args).map_err(|e| e.to_string()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("nvidia-device-plugin: error: {e}");
            ExitCode::FAILURE
        }
    }
}

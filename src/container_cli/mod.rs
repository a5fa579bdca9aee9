//! `nvidia-container-cli`: libnvidia-container's node-inspection commands (being built).

use std::ffi::OsString;
use std::process::ExitCode;

/// The name packages install it under.
pub const BINARY: &str = "nvidia-container-cli";

pub fn main(_args: Vec<OsString>) -> ExitCode {
    eprintln!("not built yet");
    ExitCode::FAILURE
}

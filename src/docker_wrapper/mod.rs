//! `nvidia-docker`: the old docker wrapper (being built).

use std::ffi::OsString;
use std::process::ExitCode;

/// The name packages install it under.
pub const BINARY: &str = "nvidia-docker";

pub fn main(_args: Vec<OsString>) -> ExitCode {
    eprintln!("not built yet");
    ExitCode::FAILURE
}

//! `nvidia-ctk system` (being built).

use std::io::Write;

use clap::Args;

use super::GlobalArgs;

#[derive(Debug, Args)]
pub struct SystemArgs {}

#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error("nvidia-ctk system is not built yet")]
    NotBuilt,
}

pub fn run(
    _global: &GlobalArgs,
    _args: &SystemArgs,
    _out: &mut dyn Write,
) -> Result<(), SystemError> {
    Err(SystemError::NotBuilt)
}

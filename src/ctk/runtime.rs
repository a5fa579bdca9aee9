//! `nvidia-ctk runtime` (being built).

use std::io::Write;

use clap::Args;

use super::GlobalArgs;

#[derive(Debug, Args)]
pub struct RuntimeArgs {}

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("nvidia-ctk runtime is not built yet")]
    NotBuilt,
}

pub fn run(
    _global: &GlobalArgs,
    _args: &RuntimeArgs,
    _out: &mut dyn Write,
) -> Result<(), RuntimeError> {
    Err(RuntimeError::NotBuilt)
}

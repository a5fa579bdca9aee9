//! `nvidia-ctk hook <name>` = `nvidia-cdi-hook <name>` (being built).

use clap::{Args, Subcommand};

use super::GlobalArgs;

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub command: Option<HookCommand>,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("nvidia-cdi-hook is not built yet")]
    NotBuilt,
}

pub fn run(_global: &GlobalArgs, _args: &HookArgs) -> Result<(), HookError> {
    Err(HookError::NotBuilt)
}

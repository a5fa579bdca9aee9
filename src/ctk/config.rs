//! `nvidia-ctk config` (being built).

use std::io::Write;

use clap::Args;

use super::GlobalArgs;

#[derive(Debug, Args)]
pub struct ConfigArgs {}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("nvidia-ctk config is not built yet")]
    NotBuilt,
}

pub fn run(
    _global: &GlobalArgs,
    _args: &ConfigArgs,
    _out: &mut dyn Write,
) -> Result<(), ConfigError> {
    Err(ConfigError::NotBuilt)
}

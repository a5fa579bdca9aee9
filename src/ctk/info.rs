//! `nvidia-ctk info` (being built).

use std::io::Write;

use clap::Args;

use super::GlobalArgs;

#[derive(Debug, Args)]
pub struct InfoArgs {}

#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    #[error("nvidia-ctk info is not built yet")]
    NotBuilt,
}

pub fn run(_global: &GlobalArgs, _args: &InfoArgs, _out: &mut dyn Write) -> Result<(), InfoError> {
    Err(InfoError::NotBuilt)
}

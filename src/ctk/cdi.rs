//! `nvidia-ctk cdi` (being built).

use std::io::Write;

use clap::Args;

use super::GlobalArgs;

#[derive(Debug, Args)]
pub struct CdiArgs {}

#[derive(Debug, thiserror::Error)]
pub enum CdiError {
    #[error("nvidia-ctk cdi is not built yet")]
    NotBuilt,
}

pub fn run(_global: &GlobalArgs, _args: &CdiArgs, _out: &mut dyn Write) -> Result<(), CdiError> {
    Err(CdiError::NotBuilt)
}

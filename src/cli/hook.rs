//! `nvshim hook <name>`: the hooks our CDI specs put in a container's OCI spec.
//! runc runs them with the env the spec gives (never the container's) and the OCI
//! state on stdin.

use std::io::Read;

use clap::{Args, Subcommand};

use super::CliError;
use crate::hook::link;
use crate::hook::privileges::{self, Stage};

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub command: HookCommand,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// createContainer hook: create the driver's symlinks and merge linker cache
    /// entries in the container's rootfs (what the runtime does in-process).
    LinkDriver(LinkDriverArgs),
    /// createContainer hook: cover the container's /proc/driver/nvidia/params with a
    /// copy that says ModifyDeviceFiles: 0.
    DisableDeviceNodeModification(ParamsArgs),
}

#[derive(Debug, Args)]
pub struct ParamsArgs {
    /// The container's rootfs on the host (absolute); without it the rootfs is found
    /// from the OCI state on stdin and the bundle's config.json.
    #[arg(long = "rootfs")]
    pub rootfs: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct LinkDriverArgs {
    /// A symlink to create: TARGET::PATH (PATH absolute, in the container).
    #[arg(long = "link")]
    pub links: Vec<String>,
    /// A linker cache entry: KEY=PATH@FLAGS[+HWCAP] (hex).
    #[arg(long = "ldcache")]
    pub entries: Vec<String>,
}

pub fn run(args: &HookArgs) -> Result<(), CliError> {
    // An image's `ENV LD_PRELOAD` reached NVIDIA's hooks (CVE-2025-23266).
    if let Some(var) = crate::hook::entry::loader_var() {
        return Err(CliError::HookEnv { var });
    }
    match &args.command {
        HookCommand::DisableDeviceNodeModification(params) => {
            privileges::restrict(Stage::DisableDeviceNodeModification)?;
            let covered = match &params.rootfs {
                Some(rootfs) => crate::hook::params::run_at(rootfs)?,
                None => {
                    let mut state = Vec::new();
                    std::io::stdin().take(1 << 20).read_to_end(&mut state)?;
                    crate::hook::params::run(&state)?
                }
            };
            tracing::debug!(covered, "disable-device-node-modification");
            Ok(())
        }
        HookCommand::LinkDriver(args) => {
            privileges::restrict(Stage::LinkDriver)?;
            let links = args
                .links
                .iter()
                .map(|l| link::parse_link(l))
                .collect::<Result<Vec<_>, _>>()?;
            let entries = args
                .entries
                .iter()
                .map(|e| link::parse_entry(e))
                .collect::<Result<Vec<_>, _>>()?;
            let mut state = Vec::new();
            std::io::stdin().take(1 << 20).read_to_end(&mut state)?;
            let (changed, refresh) = link::run(&state, &links, &entries)?;
            tracing::debug!(changed, ?refresh, "link-driver");
            Ok(())
        }
    }
}

//! `nvshim hook <name>`: the hooks our CDI specs put in a container's OCI spec.
//! runc runs them with the env the spec gives (never the container's) and the OCI
//! state on stdin.

use std::io::Read;

use clap::{Args, Subcommand};

use super::CliError;
use crate::hook::link;
use crate::hook::privileges::{self, Stage};
use crate::hook_contract::{
    self, DISABLE_DEVICE_NODE_MODIFICATION, LDCACHE_FLAG, LINK_DRIVER, LINK_FLAG, ROOTFS_FLAG,
    long_name,
};

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub command: HookCommand,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// createContainer hook: create the driver's symlinks and merge linker cache
    /// entries in the container's rootfs (what the runtime does in-process).
    #[command(name = LINK_DRIVER)]
    LinkDriver(LinkDriverArgs),
    /// createContainer hook: cover the container's /proc/driver/nvidia/params with a
    /// copy that says ModifyDeviceFiles: 0.
    #[command(name = DISABLE_DEVICE_NODE_MODIFICATION)]
    DisableDeviceNodeModification(ParamsArgs),
}

#[derive(Debug, Args)]
pub struct ParamsArgs {
    /// The container's rootfs on the host (absolute); without it the rootfs is found
    /// from the OCI state on stdin and the bundle's config.json.
    #[arg(long = long_name(ROOTFS_FLAG))]
    pub rootfs: Option<std::path::PathBuf>,
}

#[derive(Debug, Args)]
pub struct LinkDriverArgs {
    /// A symlink to create: TARGET::PATH (PATH absolute, in the container).
    #[arg(long = long_name(LINK_FLAG))]
    pub links: Vec<String>,
    /// A linker cache entry: KEY=PATH@FLAGS[+HWCAP] (hex).
    #[arg(long = long_name(LDCACHE_FLAG))]
    pub entries: Vec<String>,
}

pub fn run(args: &HookArgs) -> Result<(), CliError> {
    // An image's `ENV LD_PRELOAD` reached NVIDIA's hooks (CVE-2025-23266).
    if let Some(var) = hook_contract::loader_var() {
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
            tracing::debug!(covered, "{DISABLE_DEVICE_NODE_MODIFICATION}");
            Ok(())
        }
        HookCommand::LinkDriver(args) => {
            privileges::restrict(Stage::LinkDriver)?;
            link_driver(args)
        }
    }
}

/// `link-driver`'s work, once the caller has refused loader variables and cut the
/// capabilities to `Stage::LinkDriver` (`nvidia-ctk hook link-driver` runs it too).
pub fn link_driver(args: &LinkDriverArgs) -> Result<(), CliError> {
    let links = args
        .links
        .iter()
        .map(|l| hook_contract::parse_link(l))
        .collect::<Result<Vec<_>, _>>()?;
    let entries = args
        .entries
        .iter()
        .map(|e| hook_contract::parse_entry(e))
        .collect::<Result<Vec<_>, _>>()?;
    let mut state = Vec::new();
    std::io::stdin().take(1 << 20).read_to_end(&mut state)?;
    let (changed, refresh) = link::run(&state, &links, &entries)?;
    tracing::debug!(changed, ?refresh, "{LINK_DRIVER}");
    Ok(())
}

//! `nvshim list`: the exact edits a container with these devices and capabilities
//! would get on this node. Runs the same `pipeline::plan` as the runtime.

use std::io::Write;

use clap::Args;

use super::{CliError, HostArgs};
use crate::pipeline::{self, Context, Plan};
use crate::request::{DeviceList, DriverCapabilities, Request};

#[derive(Debug, Args)]
pub struct ListArgs {
    /// Devices, as NVIDIA_VISIBLE_DEVICES takes them: all, none, 0,1, GPU or MIG UUIDs, 0:1 (GPU:MIG).
    #[arg(long, default_value = "all", env = "NVIDIA_VISIBLE_DEVICES")]
    pub devices: String,
    /// Driver capabilities, as NVIDIA_DRIVER_CAPABILITIES takes them: compute,utility,… or all.
    #[arg(
        long,
        default_value = "compute,utility",
        env = "NVIDIA_DRIVER_CAPABILITIES"
    )]
    pub caps: String,
    /// Print the whole plan (request, selection, CDI container edits) as JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn run(host: &HostArgs, args: &ListArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let request = Request::new(
        args.devices.parse::<DeviceList>()?,
        args.caps.parse::<DriverCapabilities>()?,
    );
    let ctx = Context {
        roots: host.roots(),
        source: host.source(),
        nvml: pipeline::NvmlAccess::InProcess,
        ..Default::default()
    };
    let plan = pipeline::plan(&ctx, &request)?;
    if args.json {
        serde_json::to_writer_pretty(&mut *out, &plan)?;
        writeln!(out)?;
    } else {
        write_text(&plan, out)?;
    }
    Ok(())
}

fn write_text(plan: &Plan, out: &mut dyn Write) -> std::io::Result<()> {
    let edits = &plan.edits;
    if plan.request.devices == DeviceList::Void {
        writeln!(
            out,
            "No GPUs requested (void): the container is left untouched."
        )?;
        return Ok(());
    }
    let gpus: Vec<String> = plan
        .selection
        .gpus
        .iter()
        .map(|g| g.index.to_string())
        .collect();
    let migs: Vec<String> = plan
        .selection
        .mig_devices
        .iter()
        .map(|m| format!("{}:{}", m.parent.index, m.index))
        .collect();
    writeln!(
        out,
        "Request: devices {} -> GPUs [{}] MIG [{}]; capabilities {}",
        plan.request.devices,
        gpus.join(", "),
        migs.join(", "),
        plan.request.capabilities
    )?;
    if let (Some(driver), Some(backend)) = (&plan.driver, plan.backend) {
        writeln!(out, "Driver {} (inventory from {backend})", driver.version)?;
    }
    writeln!(out, "\nDevice nodes:")?;
    for node in &edits.device_nodes {
        writeln!(
            out,
            "  {}  c {}:{}  {:o}  {}",
            node.path,
            node.major.unwrap_or(-1),
            node.minor.unwrap_or(-1),
            node.file_mode.unwrap_or(0),
            node.permissions.as_deref().unwrap_or("")
        )?;
    }
    writeln!(out, "\nMounts:")?;
    for mount in &edits.mounts {
        writeln!(
            out,
            "  {}  ({})",
            mount.container_path,
            mount.options.join(",")
        )?;
        if mount.host_path != mount.container_path {
            writeln!(out, "      from {}", mount.host_path)?;
        }
    }
    writeln!(out, "\nSymlinks (created in the rootfs):")?;
    for link in &plan.symlinks {
        writeln!(out, "  {} -> {}", link.path.display(), link.target)?;
    }
    if !edits.hooks.is_empty() {
        writeln!(out, "\nHooks:")?;
        for hook in &edits.hooks {
            let args = hook.args.get(1..).unwrap_or_default().join(" ");
            writeln!(out, "  {}: {} {}", hook.hook_name, hook.path, args)?;
        }
    }
    if !plan.missing.is_empty() {
        writeln!(out, "\nNot on this host (optional, skipped):")?;
        for m in &plan.missing {
            let detail = m
                .detail
                .as_deref()
                .map(|d| format!(": {d}"))
                .unwrap_or_default();
            writeln!(out, "  {} ({}){detail}", m.what, m.needed_for)?;
        }
    }
    Ok(())
}

//! `nvshim info`: the driver and its GPUs, as a table or JSON.

use std::io::Write;

use clap::Args;
use serde::Serialize;

use super::{CliError, HostArgs};
use crate::inventory::{Backend, Inventory};

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Print JSON instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Serialize)]
struct Report<'a> {
    backend: Backend,
    #[serde(flatten)]
    inventory: &'a Inventory,
}

pub fn run(host: &HostArgs, args: &InfoArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let (backend, inventory) = load(host)?;
    if args.json {
        serde_json::to_writer_pretty(
            &mut *out,
            &Report {
                backend,
                inventory: &inventory,
            },
        )?;
        writeln!(out)?;
        return Ok(());
    }
    write_table(backend, &inventory, out)?;
    Ok(())
}

fn load(host: &HostArgs) -> Result<(Backend, Inventory), CliError> {
    Ok(host.inventory()?)
}

fn write_table(
    backend: Backend,
    inventory: &Inventory,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let dash = || "-".to_string();
    writeln!(out, "Driver version: {}", inventory.driver.version)?;
    writeln!(
        out,
        "CUDA version:   {}",
        inventory.driver.cuda_version.clone().unwrap_or_else(dash)
    )?;
    writeln!(out, "Backend:        {backend}")?;
    writeln!(out, "GPUs:           {}", inventory.gpus.len())?;
    writeln!(out)?;
    let mut rows = vec![[
        "INDEX".to_string(),
        "MINOR".into(),
        "UUID".into(),
        "BUS ID".into(),
        "NAME".into(),
        "MEMORY".into(),
        "CC".into(),
        "MIG".into(),
    ]];
    for gpu in &inventory.gpus {
        rows.push([
            gpu.index.to_string(),
            gpu.minor.to_string(),
            gpu.uuid.clone(),
            gpu.bus_id.clone(),
            gpu.name.clone(),
            gpu.memory_bytes.map(mib).unwrap_or_else(dash),
            gpu.compute_capability.clone().unwrap_or_else(dash),
            match gpu.mig_enabled {
                Some(true) => "on".into(),
                Some(false) => "off".into(),
                None => dash(),
            },
        ]);
        for mig in &gpu.mig_devices {
            rows.push([
                format!("  {}:{}", gpu.index, mig.index),
                String::new(),
                mig.uuid.clone(),
                format!("GI {} CI {}", mig.gpu_instance_id, mig.compute_instance_id),
                format!("MIG {}", mig.profile),
                mig.memory_bytes.map(mib).unwrap_or_else(dash),
                String::new(),
                String::new(),
            ]);
        }
    }
    let widths: Vec<usize> = (0..8)
        .map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0))
        .collect();
    for row in rows {
        let line: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, w)| format!("{cell:<w$}"))
            .collect();
        writeln!(out, "{}", line.join("  ").trim_end())?;
    }
    Ok(())
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes / (1024 * 1024))
}

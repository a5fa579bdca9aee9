//! `nvidia-container-cli info [--csv]`: the driver and its GPUs in NVIDIA's layout
//! (`Label:` padded to 15 columns, a blank line before each device), from the
//! inventory `nvshim info` uses: NVML, else procfs.

use std::io::Write;

use clap::Args;

use super::ContainerCliError;
use crate::cli::HostArgs;
use crate::inventory::{Backend, Gpu, Inventory};
use crate::roots::Roots;

/// NVIDIA's word for a value the driver did not give.
const UNKNOWN: &str = "Unknown";

#[derive(Debug, Args)]
pub struct InfoArgs {
    /// Output in CSV format.
    #[arg(long)]
    pub csv: bool,
}

pub fn run(roots: &Roots, args: &InfoArgs, out: &mut dyn Write) -> Result<(), ContainerCliError> {
    let host = HostArgs {
        driver_root: Some(roots.driver.clone()),
        dev_root: Some(roots.dev.clone()),
        proc_root: Some(roots.proc.clone()),
        backend: Backend::Auto,
        nvml_lib: None,
    };
    let (_, inventory) = host.inventory()?;
    if args.csv {
        write_csv(&inventory, out)?;
    } else {
        write_text(&inventory, out)?;
    }
    Ok(())
}

/// One device's fields, in NVIDIA's order after the index and minor.
struct Fields {
    model: String,
    brand: &'static str,
    uuid: String,
    bus: String,
    arch: String,
}

/// libnvidia-container's word for an `nvmlBrandType_t`: six brands have one, every
/// other (14, NVIDIA, which current datacenter GPUs report, among them) and an unknown
/// brand (procfs, or a driver without `nvmlDeviceGetBrand`) print `Unknown`.
fn brand_word(brand: Option<u32>) -> &'static str {
    match brand {
        Some(1) => "Quadro",
        Some(2) => "Tesla",
        Some(3) => "NVS",
        Some(4) => "GRID",
        Some(5) => "GeForce",
        Some(6) => "TITAN",
        _ => UNKNOWN,
    }
}

fn fields(gpu: &Gpu) -> Fields {
    Fields {
        model: gpu.name.clone(),
        brand: brand_word(gpu.brand),
        uuid: gpu.uuid.clone(),
        bus: bus_location(&gpu.bus_id),
        arch: gpu
            .compute_capability
            .clone()
            .unwrap_or_else(|| UNKNOWN.to_owned()),
    }
}

fn cuda(inventory: &Inventory) -> &str {
    inventory.driver.cuda_version.as_deref().unwrap_or(UNKNOWN)
}

fn write_text(inventory: &Inventory, out: &mut dyn Write) -> std::io::Result<()> {
    let line = |out: &mut dyn Write, label: &str, value: &dyn std::fmt::Display| {
        writeln!(out, "{label:<15} {value}")
    };
    line(out, "NVRM version:", &inventory.driver.version)?;
    line(out, "CUDA version:", &cuda(inventory))?;
    for gpu in &inventory.gpus {
        let f = fields(gpu);
        writeln!(out)?;
        line(out, "Device Index:", &gpu.index)?;
        line(out, "Device Minor:", &gpu.minor)?;
        line(out, "Model:", &f.model)?;
        line(out, "Brand:", &f.brand)?;
        line(out, "GPU UUID:", &f.uuid)?;
        line(out, "Bus Location:", &f.bus)?;
        line(out, "Architecture:", &f.arch)?;
    }
    Ok(())
}

fn write_csv(inventory: &Inventory, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(out, "NVRM version,CUDA version")?;
    writeln!(out, "{},{}", inventory.driver.version, cuda(inventory))?;
    writeln!(out)?;
    writeln!(
        out,
        "Device Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture"
    )?;
    for gpu in &inventory.gpus {
        let f = fields(gpu);
        writeln!(
            out,
            "{},{},{},{},{},{},{}",
            gpu.index, gpu.minor, f.model, f.brand, f.uuid, f.bus, f.arch
        )?;
    }
    Ok(())
}

/// NVIDIA's bus location: an 8-digit domain (`00000000:07:00.0`), where our inventory
/// keeps sysfs's 4-digit form (`0000:07:00.0`). Anything else is printed as it is.
pub(super) fn bus_location(bus_id: &str) -> String {
    match bus_id.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(domain) => format!("{domain:08x}:{}", rest.to_ascii_lowercase()),
            Err(_) => bus_id.to_owned(),
        },
        None => bus_id.to_owned(),
    }
}

//! `nvidia-container-cli list`: the driver's components, one absolute path a line, in
//! NVIDIA's order: device nodes, binaries, libraries (64-bit, then 32-bit), IPC
//! endpoints, firmware. Found by the discovery the runtime uses, for every capability
//! (NVIDIA's list does not filter by capability either); only what exists is listed.
//!
//! With no option at all it lists everything for all GPUs; otherwise only what the
//! options ask for, and device nodes only with `--device`. Device nodes are printed as
//! the `/dev/…` paths a container sees them under (as NVIDIA's are); files with their
//! host paths, driver root included.

use std::io::Write;

use clap::Args;

use super::ContainerCliError;
use crate::discover::{self, FileKind, HostResources, Want};
use crate::inventory::{Backend, Source};
use crate::pipeline::{self, CdiFiles, Context, NvmlAccess};
use crate::request::{
    Capability, DeviceList, DriverCapabilities, MigAccess, Request, parse_mig_access_flag,
};
use crate::roots::Roots;
use crate::select;

/// Where the driver lists the MIG `config` and `monitor` capabilities.
const MIG_CAPS_PROC: &str = "/proc/driver/nvidia/capabilities/mig";

/// Where NVIDIA's tool says IMEX channel `N` is.
const IMEX_CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";

#[derive(Debug, Default, Args)]
pub struct ListArgs {
    /// Device UUID(s) or index(es) to list; repeat or separate with commas.
    #[arg(long, short = 'd', value_name = "ID")]
    pub device: Vec<String>,
    /// List driver libraries.
    #[arg(long, short = 'l')]
    pub libraries: bool,
    /// List driver binaries.
    #[arg(long, short = 'b')]
    pub binaries: bool,
    /// List driver ipcs.
    #[arg(long, short = 'i')]
    pub ipcs: bool,
    /// List driver firmwares.
    #[arg(long, short = 'f')]
    pub firmwares: bool,
    /// Enable 32bits compatibility.
    #[arg(long)]
    pub compat32: bool,
    /// `all`: list the MIG config capability files of the listed GPUs.
    #[arg(long, value_name = "ID")]
    pub mig_config: Vec<String>,
    /// `all`: list the MIG monitor capability files of the listed GPUs.
    #[arg(long, value_name = "ID")]
    pub mig_monitor: Vec<String>,
    /// IMEX channel ID(s) to inject.
    #[arg(long, value_name = "CHANNEL")]
    pub imex_channel: Vec<String>,
    /// Don't include the NVIDIA persistenced socket.
    #[arg(long)]
    pub no_persistenced: bool,
    /// Don't include the NVIDIA fabricmanager socket.
    #[arg(long)]
    pub no_fabricmanager: bool,
}

/// What to print, after NVIDIA's defaulting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Selected {
    /// `None`: no device nodes.
    pub devices: Option<String>,
    pub libraries: bool,
    pub binaries: bool,
    pub ipcs: bool,
    pub firmwares: bool,
    pub compat32: bool,
}

/// NVIDIA's rule: no option at all (an `--imex-channel` aside) means everything, for
/// all devices.
pub(super) fn selected(args: &ListArgs) -> Selected {
    let nothing = args.device.is_empty()
        && !args.libraries
        && !args.binaries
        && !args.ipcs
        && !args.firmwares
        && !args.compat32
        && args.mig_config.is_empty()
        && args.mig_monitor.is_empty()
        && !args.no_persistenced
        && !args.no_fabricmanager;
    if nothing {
        return Selected {
            devices: Some("all".to_owned()),
            libraries: true,
            binaries: true,
            ipcs: true,
            firmwares: true,
            compat32: true,
        };
    }
    Selected {
        devices: (!args.device.is_empty()).then(|| args.device.join(",")),
        libraries: args.libraries,
        binaries: args.binaries,
        ipcs: args.ipcs,
        firmwares: args.firmwares,
        compat32: args.compat32,
    }
}

pub fn run(roots: &Roots, args: &ListArgs, out: &mut dyn Write) -> Result<(), ContainerCliError> {
    let access = MigAccess {
        config: parse_mig_access_flag("--mig-config", &args.mig_config.join(","))?,
        monitor: parse_mig_access_flag("--mig-monitor", &args.mig_monitor.join(","))?,
    };
    let channels = imex_channels(&args.imex_channel)?;
    let what = selected(args);
    let devices = match &what.devices {
        Some(list) => list.parse::<DeviceList>()?,
        None => DeviceList::None,
    };
    let capabilities = Capability::ALL
        .into_iter()
        .filter(|c| what.compat32 || *c != Capability::Compat32)
        .fold(DriverCapabilities::EMPTY, DriverCapabilities::with);
    let request = Request::new(devices, capabilities);
    let ctx = Context {
        roots: roots.clone(),
        source: Source {
            backend: Backend::Auto,
            nvml_library: None,
        },
        nvml: NvmlAccess::InProcess,
        cdi: CdiFiles::Never,
    };
    let (_, inventory) = pipeline::load_inventory(&ctx, &request)?;
    let selection = select::resolve(&request.devices, &inventory)?;
    let resources = discover::discover(
        roots,
        Want {
            driver_version: &inventory.driver.version,
            capabilities,
            selection: &selection,
            classes: &request.classes,
        },
    )?;
    let mig = mig_access(roots, &request.devices, access, &selection)?;
    let mut resources = resources;
    libnvidia_container_scope(&mut resources, &inventory.driver.version);
    write(&what, &channels, args, &resources, out)?;
    write_mig_access(&mig, &resources, out)?;
    Ok(())
}

/// For each of `--mig-config` / `--mig-monitor` asked for: the capability's proc file
/// and the capability nodes a container would get for the listed GPUs (those that
/// exist). NVIDIA's list prints them among the device nodes.
fn mig_access(
    roots: &Roots,
    devices: &DeviceList,
    access: MigAccess,
    selection: &select::Selection,
) -> Result<Vec<(&'static str, HostResources)>, ContainerCliError> {
    let minors: Vec<u32> = select::mig_access_gpus(devices, access, selection)?
        .iter()
        .map(|g| g.minor)
        .collect();
    let mut out = Vec::new();
    for (on, name, only) in [
        (access.config, "config", MigAccess::CONFIG),
        (access.monitor, "monitor", MigAccess::MONITOR),
    ] {
        if on && !minors.is_empty() {
            let mut resources = HostResources::default();
            discover::mig_access::discover(roots, only, &minors, &mut resources)?;
            out.push((name, resources));
        }
    }
    Ok(out)
}

pub(super) fn write_mig_access(
    mig: &[(&'static str, HostResources)],
    printed: &HostResources,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let mut seen: Vec<&std::path::Path> = printed
        .device_nodes
        .iter()
        .map(|n| n.path.as_path())
        .collect();
    for (name, resources) in mig {
        writeln!(out, "{MIG_CAPS_PROC}/{name}")?;
        for node in &resources.device_nodes {
            if !seen.contains(&node.path.as_path()) {
                seen.push(&node.path);
                writeln!(out, "{}", node.path.display())?;
            }
        }
    }
    Ok(())
}

fn imex_channels(values: &[String]) -> Result<Vec<u32>, ContainerCliError> {
    values
        .iter()
        .flat_map(|v| v.split(','))
        .map(|id| {
            id.trim()
                .parse::<u32>()
                .map_err(|_| ContainerCliError::ImexChannel(id.to_owned()))
        })
        .collect()
}

/// What libnvidia-container itself lists: the files of its capability tables only, not
/// what NVIDIA's runtime adds for graphics on top (DRM nodes, EGL platform libraries,
/// Xorg modules, Vulkan's producer, `nvidia-xconfig`).
fn libnvidia_container_scope(resources: &mut HostResources, version: &str) {
    let tables = || discover::table::TABLE.iter();
    resources
        .device_nodes
        .retain(|n| !n.path.starts_with(discover::table::DRI_DIR));
    resources.files.retain(|f| {
        let name = f.path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        match f.kind {
            FileKind::Library => tables()
                .flat_map(|t| t.libraries)
                .any(|stem| name.strip_prefix(stem) == Some(&format!(".so.{version}"))),
            FileKind::Binary => tables().flat_map(|t| t.binaries).any(|b| *b == name),
            _ => true,
        }
    });
}

pub(super) fn write(
    what: &Selected,
    channels: &[u32],
    args: &ListArgs,
    resources: &HostResources,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    if what.devices.is_some() {
        for node in &resources.device_nodes {
            writeln!(out, "{}", node.path.display())?;
        }
    }
    for id in channels {
        writeln!(out, "{IMEX_CHANNEL_DIR}/channel{id}")?;
    }
    let files = |kinds: &'static [FileKind]| {
        resources
            .files
            .iter()
            .filter(move |f| kinds.contains(&f.kind))
    };
    if what.binaries {
        for file in files(&[FileKind::Binary]) {
            writeln!(out, "{}", file.host_path.display())?;
        }
    }
    if what.libraries {
        for file in files(&[FileKind::Library]) {
            writeln!(out, "{}", file.host_path.display())?;
        }
    }
    if what.ipcs {
        for file in files(&[FileKind::Socket, FileKind::IpcDir]) {
            let path = file.host_path.to_string_lossy();
            let left_out = (args.no_persistenced && path.contains("nvidia-persistenced"))
                || (args.no_fabricmanager && path.contains("nvidia-fabricmanager"));
            if !left_out {
                writeln!(out, "{path}")?;
            }
        }
    }
    if what.firmwares {
        for file in files(&[FileKind::Firmware]) {
            writeln!(out, "{}", file.host_path.display())?;
        }
    }
    Ok(())
}

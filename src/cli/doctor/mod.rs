//! `nvshim doctor`: checks the node end to end and says, for each problem, the one
//! command that fixes it. Read-only: it loads NVML and reads files, and changes nothing.
//!
//! Checks, in the order a container start depends on them: the kernel driver
//! (procfs), NVML and its agreement with procfs, the device nodes, the driver files
//! each default capability needs, our binaries, and our runtime's registration with
//! docker, containerd and CRI-O (an engine whose config file is absent is skipped),
//! and whether the CDI specs for `nvidia.com/gpu` still match the driver (no spec is
//! fine: CDI is optional).
//!
//! Two other modes serve the cluster deployments: `--wait-for` (an init container
//! waiting for the toolkit installer's ready file, [`wait`]) and `--in-container` (the
//! validation Job's checks from inside a GPU container, [`in_container`]).

mod cdi;
mod engines;
pub mod in_container;
pub mod wait;

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use clap::Args;
use nix::sys::stat;

use super::{CliError, HostArgs};
use crate::inventory::{self, Backend, Inventory, Source};
use crate::pipeline::{self, Context, NvmlAccess};
use crate::request::{DeviceList, DriverCapabilities, Request};

#[derive(Debug, Args)]
pub struct DoctorArgs {
    /// docker's config.
    #[arg(long, default_value = "/etc/docker/daemon.json")]
    pub docker_config: PathBuf,
    /// containerd's config.
    #[arg(long, default_value = "/etc/containerd/config.toml")]
    pub containerd_config: PathBuf,
    /// CRI-O's drop-in directory.
    #[arg(long, default_value = "/etc/crio/crio.conf.d")]
    pub crio_config_dir: PathBuf,
    /// The runtime name the engines should know.
    #[arg(long, default_value = "nvidia")]
    pub runtime_name: String,
    /// Where the binaries should be (the runtime, the hook, nvshim).
    #[arg(long, default_value = "/usr/bin")]
    pub bin_dir: PathBuf,
    /// A CDI spec directory to check; repeat for several.
    /// Default: /etc/cdi, then /var/run/cdi.
    #[arg(long)]
    pub cdi_spec_dir: Vec<PathBuf>,
    /// Wait until this file exists, then exit 0 (no checks): an init container waiting
    /// for the toolkit installer's ready file.
    #[arg(long, value_name = "PATH", conflicts_with = "in_container")]
    pub wait_for: Option<PathBuf>,
    /// With --wait-for: give up after this many seconds (exit 1); 0 waits forever.
    #[arg(
        long,
        value_name = "SECONDS",
        default_value_t = 0,
        requires = "wait_for"
    )]
    pub timeout: u64,
    /// Check a GPU container's view from inside it (the validation Job): NVML lists a
    /// GPU, its device nodes exist, nvidia-smi -L runs, libcuda.so.1 is in the linker
    /// cache when compute is asked for.
    #[arg(long)]
    pub in_container: bool,
}

/// Which of doctor's jobs a command line asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode<'a> {
    /// The node's checks (the default).
    Node,
    /// `--wait-for PATH`.
    WaitFor { path: &'a Path, timeout_s: u64 },
    /// `--in-container`.
    InContainer,
}

impl DoctorArgs {
    pub fn mode(&self) -> Mode<'_> {
        match (&self.wait_for, self.in_container) {
            (Some(path), _) => Mode::WaitFor {
                path,
                timeout_s: self.timeout,
            },
            (None, true) => Mode::InContainer,
            (None, false) => Mode::Node,
        }
    }
}

/// How a check came out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Ok,
    /// Works, but something is worth knowing (an engine not configured, say).
    Warn,
    Fail,
}

/// One line of the report.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub status: Status,
    pub name: String,
    pub detail: String,
    /// The one command (or step) that fixes it.
    pub fix: Option<String>,
}

impl Check {
    fn ok(name: &str, detail: impl Into<String>) -> Check {
        Check {
            status: Status::Ok,
            name: name.into(),
            detail: detail.into(),
            fix: None,
        }
    }

    fn bad(status: Status, name: &str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            status,
            name: name.into(),
            detail: detail.into(),
            fix: Some(fix.into()),
        }
    }
}

pub fn run(host: &HostArgs, args: &DoctorArgs, out: &mut dyn Write) -> Result<(), CliError> {
    report(&checks(host, args), out)
}

/// `--in-container`: the container's own view, no config file (a container has none;
/// its roots are `/`), `--nvml-lib` still honoured.
pub fn run_in_container(host: &HostArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let view = in_container::View::of_this_container(host.nvml_lib.clone());
    report(&in_container::checks(&view), out)
}

/// Prints one line per check (and its fix); an error when any failed.
fn report(checks: &[Check], out: &mut dyn Write) -> Result<(), CliError> {
    for c in checks {
        let mark = match c.status {
            Status::Ok => "ok  ",
            Status::Warn => "warn",
            Status::Fail => "FAIL",
        };
        writeln!(out, "[{mark}] {}: {}", c.name, c.detail)?;
        if let Some(fix) = &c.fix {
            writeln!(out, "       fix: {fix}")?;
        }
    }
    let failed = checks.iter().filter(|c| c.status == Status::Fail).count();
    if failed > 0 {
        return Err(CliError::Doctor { failed });
    }
    writeln!(out, "all checks passed")?;
    Ok(())
}

/// Runs every check.
pub fn checks(host: &HostArgs, args: &DoctorArgs) -> Vec<Check> {
    let mut out = Vec::new();
    let roots = host.roots();
    let procfs = inventory::load(
        &roots,
        &Source {
            backend: Backend::Procfs,
            nvml_library: None,
        },
    );
    let inventory = match procfs {
        Ok(inv) => {
            out.push(Check::ok(
                "driver",
                format!(
                    "kernel driver {}, {} GPU(s)",
                    inv.driver.version,
                    inv.gpus.len()
                ),
            ));
            inv
        }
        Err(e) => {
            out.push(Check::bad(
                Status::Fail,
                "driver",
                e.to_string(),
                "modprobe nvidia (or install the NVIDIA driver)",
            ));
            return out;
        }
    };
    out.push(nvml(host, &inventory));
    out.extend(device_nodes(&roots.dev, &inventory));
    out.push(driver_files(host));
    out.extend(binaries(&args.bin_dir));
    out.extend(engines::registration(args));
    let spec_dirs: Vec<PathBuf> = if args.cdi_spec_dir.is_empty() {
        super::cdi::SPEC_DIRS.iter().map(PathBuf::from).collect()
    } else {
        args.cdi_spec_dir.clone()
    };
    out.extend(cdi::specs(host, &spec_dirs, &inventory.gpus));
    out
}

fn nvml(host: &HostArgs, procfs: &Inventory) -> Check {
    let loaded = inventory::load(
        &host.roots(),
        &Source {
            backend: Backend::Nvml,
            nvml_library: host.nvml_lib.clone(),
        },
    );
    match loaded {
        Ok(inv) if inv.gpus.len() == procfs.gpus.len() => Check::ok(
            "nvml",
            format!(
                "driver {} (CUDA {}), {} GPU(s)",
                inv.driver.version,
                inv.driver.cuda_version.as_deref().unwrap_or("?"),
                inv.gpus.len()
            ),
        ),
        Ok(inv) => Check::bad(
            Status::Fail,
            "nvml",
            format!(
                "NVML sees {} GPU(s) but /proc/driver/nvidia lists {}",
                inv.gpus.len(),
                procfs.gpus.len()
            ),
            "nvidia-smi -q (a GPU has fallen off the bus or is held by another driver)",
        ),
        Err(e) => Check::bad(
            Status::Fail,
            "nvml",
            e.to_string(),
            "install the driver's user-space libraries (libnvidia-ml.so.1) or pass --nvml-lib",
        ),
    }
}

fn device_nodes(dev_root: &Path, inventory: &Inventory) -> Vec<Check> {
    let mut wanted: Vec<(String, Option<u32>)> = vec![("nvidiactl".into(), Some(255))];
    wanted.extend(
        inventory
            .gpus
            .iter()
            .map(|g| (format!("nvidia{}", g.minor), Some(g.minor))),
    );
    wanted.push(("nvidia-uvm".into(), None));
    let mut bad = Vec::new();
    for (name, minor) in &wanted {
        let path = dev_root.join("dev").join(name);
        match std::fs::metadata(&path) {
            Ok(m) if m.file_type().is_char_device() => {
                let found = stat::minor(m.rdev()) as u32;
                if let Some(want) = minor
                    && found != *want
                {
                    bad.push(format!("{} has minor {found}, not {want}", path.display()));
                }
            }
            Ok(_) => bad.push(format!("{} is not a character device", path.display())),
            Err(_) => bad.push(format!("{} is missing", path.display())),
        }
    }
    if bad.is_empty() {
        vec![Check::ok(
            "device nodes",
            format!("{} present with the driver's minors", wanted.len()),
        )]
    } else {
        vec![Check::bad(
            Status::Fail,
            "device nodes",
            bad.join("; "),
            "nvidia-modprobe -u -c=0 (creates /dev/nvidia* as the driver numbers them)",
        )]
    }
}

/// Plans `all` GPUs with the default capabilities, as a container start would.
fn driver_files(host: &HostArgs) -> Check {
    let ctx = Context {
        roots: host.roots(),
        source: Source {
            backend: Backend::Procfs,
            nvml_library: None,
        },
        nvml: NvmlAccess::InProcess,
        ..Default::default()
    };
    let request = Request::new(DeviceList::All, DriverCapabilities::default());
    match pipeline::plan(&ctx, &request) {
        Ok(plan) => Check::ok(
            "driver files",
            format!(
                "compute,utility: {} mounts, {} device nodes, {} linker cache entries",
                plan.edits.mounts.len(),
                plan.edits.device_nodes.len(),
                plan.ldcache.len()
            ),
        ),
        Err(e) => Check::bad(
            Status::Fail,
            "driver files",
            e.to_string(),
            "reinstall the driver's user-space package so its libraries match the kernel module",
        ),
    }
}

fn binaries(dir: &Path) -> Vec<Check> {
    let wanted = [
        ("nvidia-container-runtime", "the runtime"),
        (
            crate::hook_contract::HOOK_BINARY,
            "the prestart hook (docker --gpus, podman hooks.d)",
        ),
        (
            crate::hook_contract::NVSHIM_BINARY,
            "the runtime's NVML helper and this CLI",
        ),
    ];
    let missing: Vec<String> = wanted
        .iter()
        .filter(|(name, _)| {
            std::fs::metadata(dir.join(name))
                .map(|m| !m.is_file() || m.permissions().mode() & 0o111 == 0)
                .unwrap_or(true)
        })
        .map(|(name, why)| format!("{} ({why})", dir.join(name).display()))
        .collect();
    if missing.is_empty() {
        vec![Check::ok("binaries", format!("all in {}", dir.display()))]
    } else {
        vec![Check::bad(
            Status::Fail,
            "binaries",
            format!("missing: {}", missing.join(", ")),
            format!(
                "install the nvidia-container-toolkit package (or copy the binaries to {})",
                dir.display()
            ),
        )]
    }
}

//! `nvidia-ctk system`: `create-dev-char-symlinks` and `create-device-nodes`, NVIDIA's
//! flags (and the environment variables NVIDIA's take) on top of [`device_nodes`].
//!
//! NVIDIA applies `--load-kernel-modules` and `--create-device-nodes` of
//! `create-dev-char-symlinks` only together with `--create-all` and ignores them, with a
//! warning, otherwise; so do we. `--watch` (a long-running inotify loop) is accepted and
//! refused: the udev rule and the systemd unit in `deployments/` rerun the command when
//! the driver binds, which covers what the loop was for.

use std::io::Write;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::GlobalArgs;
use crate::device_nodes::{self, DeviceNodesError, Node, Outcome};
use crate::ldcache::Class;

#[derive(Debug, Args)]
pub struct SystemArgs {
    #[command(subcommand)]
    pub command: SystemCommand,
}

#[derive(Debug, Subcommand)]
pub enum SystemCommand {
    /// Create /dev/char/<major>:<minor> symlinks to the NVIDIA device nodes, so that
    /// systemd keeps GPU access in containers on daemon-reload.
    CreateDevCharSymlinks(DevCharArgs),
    /// Create the NVIDIA control device nodes.
    CreateDeviceNodes(DeviceNodesArgs),
    /// Print the libraries of the driver root's ld.so.cache.
    PrintLdcache(PrintLdcacheArgs),
}

#[derive(Debug, Args)]
pub struct PrintLdcacheArgs {
    /// The driver root whose etc/ld.so.cache is read.
    #[arg(
        long,
        value_name = "DRIVER_ROOT",
        default_value = "/",
        env = "DRIVER_ROOT"
    )]
    pub driver_root: PathBuf,
}

#[derive(Debug, Args)]
pub struct DevCharArgs {
    /// The directory the links go in, as <DEV_CHAR>/<major>:<minor>.
    #[arg(
        long,
        value_name = "DEV_CHAR",
        default_value = "/dev/char",
        env = "DEV_CHAR_PATH"
    )]
    pub dev_char_path: PathBuf,
    /// The driver root: <DRIVER_ROOT>/dev is searched for the NVIDIA device nodes.
    #[arg(
        long,
        value_name = "DRIVER_ROOT",
        default_value = "/",
        env = "DRIVER_ROOT"
    )]
    pub driver_root: PathBuf,
    /// nvshim: the directory holding the proc/ that --create-all reads
    /// (proc/devices, proc/driver/nvidia).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub proc_root: PathBuf,
    /// Not supported: rerun the command from udev or systemd instead (deployments/).
    #[arg(long, env = "WATCH")]
    pub watch: bool,
    /// Link every node the driver could create for this host's GPUs, not only the
    /// existing ones.
    #[arg(long, env = "CREATE_ALL")]
    pub create_all: bool,
    /// Load the NVIDIA kernel modules first (with --create-all only).
    #[arg(long, env = "LOAD_KERNEL_MODULES")]
    pub load_kernel_modules: bool,
    /// Create missing control device nodes in the driver root first (with --create-all
    /// only).
    #[arg(long, env = "CREATE_DEVICE_NODES")]
    pub create_device_nodes: bool,
    /// Print what would be done; change nothing.
    #[arg(long, env = "DRY_RUN")]
    pub dry_run: bool,
}

#[derive(Debug, Args)]
pub struct DeviceNodesArgs {
    /// The driver root: nodes are created in <DRIVER_ROOT>/dev.
    #[arg(
        long,
        value_name = "DRIVER_ROOT",
        default_value = "/",
        env = "DRIVER_ROOT"
    )]
    pub driver_root: PathBuf,
    /// nvshim: the directory holding the proc/ whose proc/devices gives the majors.
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub proc_root: PathBuf,
    /// Create the control device nodes: nvidiactl, nvidia-modeset, nvidia-uvm,
    /// nvidia-uvm-tools.
    #[arg(long)]
    pub control_devices: bool,
    /// Load the NVIDIA kernel modules first.
    #[arg(long, env = "LOAD_KERNEL_MODULES")]
    pub load_kernel_modules: bool,
    /// Print what would be done; change nothing.
    #[arg(long, env = "DRY_RUN")]
    pub dry_run: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum SystemError {
    #[error("--create-all and --watch are mutually exclusive")]
    CreateAllAndWatch,
    #[error(
        "--watch is not supported: run `nvidia-ctk system create-dev-char-symlinks --create-all` \
         when the driver loads instead (the udev rule 71-nvidia-dev-char.rules and the unit \
         nvidia-dev-char-symlinks.service do)"
    )]
    Watch,
    #[error(transparent)]
    DeviceNodes(#[from] DeviceNodesError),
    #[error("cannot read {}: {source}", path.display())]
    LdCache {
        path: PathBuf,
        #[source]
        source: crate::ldcache::LdCacheError,
    },
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

pub fn run(global: &GlobalArgs, args: &SystemArgs, out: &mut dyn Write) -> Result<(), SystemError> {
    let mut report = Report {
        out,
        quiet: global.quiet,
    };
    match &args.command {
        SystemCommand::CreateDevCharSymlinks(args) => dev_char(args, &mut report),
        SystemCommand::CreateDeviceNodes(args) => nodes(args, &mut report),
        SystemCommand::PrintLdcache(args) => print_ldcache(args, report.out),
    }
}

/// What was done, one line each, unless `--quiet`.
struct Report<'a> {
    out: &'a mut dyn Write,
    quiet: bool,
}

impl Report<'_> {
    fn line(&mut self, text: &str) -> Result<(), SystemError> {
        if !self.quiet {
            writeln!(self.out, "{text}")?;
        }
        Ok(())
    }
    fn modules(&mut self, dry_run: bool) -> Result<(), SystemError> {
        for command in device_nodes::load_kernel_modules(dry_run)? {
            let verb = if dry_run { "would run" } else { "ran" };
            self.line(&format!("{verb} {command}"))?;
        }
        Ok(())
    }
    fn nodes(&mut self, done: &[(Node, Outcome)]) -> Result<(), SystemError> {
        for (node, outcome) in done {
            let spec = format!("c {}:{}", node.major, node.minor);
            self.line(&format!(
                "{} device node {} ({spec})",
                verb(*outcome),
                node.path.display()
            ))?;
        }
        Ok(())
    }
}

fn verb(outcome: Outcome) -> &'static str {
    match outcome {
        Outcome::Created => "created",
        Outcome::Unchanged => "unchanged",
        Outcome::Replaced => "replaced",
        Outcome::WouldCreate => "would create",
    }
}

fn dev_char(args: &DevCharArgs, report: &mut Report<'_>) -> Result<(), SystemError> {
    if args.create_all && args.watch {
        return Err(SystemError::CreateAllAndWatch);
    }
    if args.watch {
        return Err(SystemError::Watch);
    }
    for (set, flag) in [
        (args.load_kernel_modules, "--load-kernel-modules"),
        (args.create_device_nodes, "--create-device-nodes"),
    ] {
        if set && !args.create_all {
            tracing::warn!("{flag} applies only with --create-all; ignoring it");
        }
    }
    let nodes = if args.create_all {
        if args.load_kernel_modules {
            report.modules(args.dry_run)?;
        }
        if args.create_device_nodes {
            let majors = device_nodes::majors(&args.proc_root)?;
            let (control, skipped) = device_nodes::control_nodes(&args.driver_root, &majors);
            warn_skipped(&skipped);
            let done = device_nodes::create_nodes(&control, args.dry_run)?;
            report.nodes(&done)?;
        }
        let possible = device_nodes::all_possible(&args.driver_root, &args.proc_root)?;
        warn_skipped(&possible.skipped);
        possible.nodes
    } else {
        device_nodes::existing(&args.driver_root)?
    };
    if nodes.is_empty() {
        tracing::warn!(
            driver_root = %args.driver_root.display(),
            "no NVIDIA device nodes found; no links created"
        );
    }
    for (link, target, outcome) in
        device_nodes::create_links(&args.dev_char_path, &nodes, args.dry_run)?
    {
        report.line(&format!(
            "{} link {} -> {}",
            verb(outcome),
            link.display(),
            target.display()
        ))?;
    }
    Ok(())
}

fn nodes(args: &DeviceNodesArgs, report: &mut Report<'_>) -> Result<(), SystemError> {
    if args.load_kernel_modules {
        report.modules(args.dry_run)?;
    }
    if !args.control_devices {
        tracing::warn!("no node kind selected (--control-devices); nothing to create");
        return Ok(());
    }
    let majors = device_nodes::majors(&args.proc_root)?;
    let (control, skipped) = device_nodes::control_nodes(&args.driver_root, &majors);
    warn_skipped(&skipped);
    let done = device_nodes::create_nodes(&control, args.dry_run)?;
    report.nodes(&done)
}

/// The cache's 32-bit and then 64-bit libraries, each list under a count, as
/// NVIDIA's prints them (to stdout here, not the log).
fn print_ldcache(args: &PrintLdcacheArgs, out: &mut dyn Write) -> Result<(), SystemError> {
    let path = args.driver_root.join("etc/ld.so.cache");
    let cache = crate::ldcache::load(&path).map_err(|source| SystemError::LdCache {
        path: path.clone(),
        source,
    })?;
    for (class, bits) in [(Class::Lib32, 32), (Class::Lib64, 64)] {
        let mut libs: Vec<&str> = cache
            .entries
            .iter()
            .filter(|e| e.class() == class)
            .map(|e| e.value.as_str())
            .collect();
        libs.sort_unstable();
        libs.dedup();
        if libs.is_empty() {
            writeln!(out, "No {bits}-bit libraries found")?;
        } else {
            writeln!(out, "{} {bits}-bit libraries found", libs.len())?;
        }
        for lib in libs {
            writeln!(out, "{lib}")?;
        }
    }
    Ok(())
}

fn warn_skipped(skipped: &[String]) {
    for what in skipped {
        tracing::warn!("skipped {what}");
    }
}

#[cfg(test)]
#[path = "system_tests.rs"]
mod tests;

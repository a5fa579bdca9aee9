//! The `nvshim` admin CLI: argument structs (clap) kept apart from the work, one file
//! per subcommand. Output goes to the writer the binary passes in; errors go back
//! as values for the binary to print.

pub mod cdi;
pub mod configure;
pub mod doctor;
pub mod exporter;
pub mod hook;
pub mod info;
pub mod install;
pub mod labels;
pub mod list;

use std::io::{self, Write};
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

use crate::inventory::{Backend, Source};
use crate::roots::Roots;

#[derive(Debug, Parser)]
#[command(
    name = "nvshim",
    version,
    about = "NVIDIA GPUs in containers: node inspection and setup"
)]
pub struct Cli {
    #[command(flatten)]
    pub host: HostArgs,
    /// Log at debug level on stderr.
    #[arg(long, short = 'd', global = true, env = "NVSHIM_DEBUG")]
    pub debug: bool,
    #[command(subcommand)]
    pub command: Command,
}

/// Where the driver lives and how to ask it.
#[derive(Debug, Clone, Args)]
pub struct HostArgs {
    /// Root of the driver's files (a driver container mounts it at /run/nvidia/driver).
    /// Default: config.toml's [nvidia-container-cli] root, else /.
    #[arg(long, global = true, env = "NVIDIA_DRIVER_ROOT")]
    pub driver_root: Option<PathBuf>,
    /// Root under which dev/nvidia* live.
    /// Default: config.toml's [nvidia-container-cli] dev-root, else the driver root.
    #[arg(long, global = true, env = "NVIDIA_DEV_ROOT")]
    pub dev_root: Option<PathBuf>,
    /// Root under which proc/driver/nvidia lives.
    /// Default: config.toml's [nvshim] proc-root, else /.
    #[arg(long, global = true)]
    pub proc_root: Option<PathBuf>,
    /// Where GPU information comes from: procfs (fast, no library loaded), nvml, or
    /// auto (list: procfs unless MIG devices are involved; info: nvml, else procfs).
    #[arg(long, global = true, default_value = "auto")]
    pub backend: Backend,
    /// The NVML library to load, instead of the driver root's ld.so.cache entry.
    #[arg(long, global = true)]
    pub nvml_lib: Option<PathBuf>,
}

impl HostArgs {
    /// The roots given; `/` for one not given (see [`HostArgs::with_config_roots`] for
    /// the file's).
    pub fn roots(&self) -> Roots {
        let or_slash = |root: &Option<PathBuf>| root.clone().unwrap_or_else(|| "/".into());
        Roots {
            driver: or_slash(&self.driver_root),
            dev: or_slash(&self.dev_root),
            proc: or_slash(&self.proc_root),
        }
    }

    /// Fills the roots no flag or env gave from config.toml, found as the runtime finds
    /// it (`env` looks up `NVIDIA_CTK_CONFIG_FILE_PATH` and `XDG_CONFIG_HOME`): the
    /// driver root from `[nvidia-container-cli] root`, the dev root from `dev-root`
    /// (else the file's driver root), the proc root from `[nvshim] proc-root`. The
    /// file is read only when a root is missing; a file that cannot be read or parsed
    /// is an error, never a silent `/`.
    pub fn with_config_roots(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<HostArgs, crate::config::ConfigError> {
        if self.driver_root.is_some() && self.dev_root.is_some() && self.proc_root.is_some() {
            return Ok(self.clone());
        }
        let loaded = crate::config::load(env)?;
        for key in &loaded.unknown_keys {
            tracing::warn!(path = %loaded.path.display(), "unknown config key {key}, ignored");
        }
        let file = &loaded.config;
        tracing::debug!(path = %loaded.path.display(), from_file = loaded.from_file, "roots not given filled from the config");
        Ok(HostArgs {
            driver_root: self
                .driver_root
                .clone()
                .or_else(|| Some(file.driver_root())),
            dev_root: self.dev_root.clone().or_else(|| Some(file.dev_root())),
            proc_root: self
                .proc_root
                .clone()
                .or_else(|| Some(file.nvshim.proc_root.clone())),
            ..self.clone()
        })
    }

    pub fn source(&self) -> Source {
        Source {
            backend: self.backend,
            nvml_library: self.nvml_lib.clone(),
        }
    }

    /// The inventory for `info` and `labels`: `auto` prefers NVML (it knows memory,
    /// compute capability and MIG) and falls back to procfs, with a warning, when NVML
    /// cannot be loaded.
    pub fn inventory(
        &self,
    ) -> Result<(Backend, crate::inventory::Inventory), crate::inventory::InventoryError> {
        let roots = self.roots();
        let source = self.source();
        let with = |backend| Source {
            backend,
            ..source.clone()
        };
        match source.backend {
            Backend::Auto => match crate::inventory::load(&roots, &with(Backend::Nvml)) {
                Ok(inv) => Ok((Backend::Nvml, inv)),
                Err(e) => {
                    tracing::warn!("NVML unavailable, using what /proc/driver/nvidia knows: {e}");
                    Ok((
                        Backend::Procfs,
                        crate::inventory::load(&roots, &with(Backend::Procfs))?,
                    ))
                }
            },
            backend => Ok((backend, crate::inventory::load(&roots, &source)?)),
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show the driver and every GPU (index, minor, UUID, bus id, name, memory, compute capability, MIG).
    Info(info::InfoArgs),
    /// Show the exact device nodes, mounts and hooks a container would get.
    List(list::ListArgs),
    /// Register the NVIDIA runtime with docker, containerd or CRI-O (or take it out: --undo).
    Configure(configure::ConfigureArgs),
    /// Check the node end to end (driver, NVML, device nodes, driver files, binaries,
    /// engine registration, CDI specs) and print the fix for each problem; or check a
    /// GPU container's view from inside it (--in-container), or wait for a file
    /// (--wait-for).
    Doctor(doctor::DoctorArgs),
    /// Write a CDI spec for this node (generate), or list the CDI devices defined (list).
    Cdi(cdi::CdiArgs),
    /// Hooks that CDI specs run (createContainer: link-driver).
    #[command(name = crate::hook_contract::NVSHIM_HOOK_COMMAND)]
    Hook(hook::HookArgs),
    /// Write the node's GPU labels (gpu-feature-discovery's nvidia.com/* set) as a Node
    /// Feature Discovery feature file, once or every --interval.
    Labels(labels::LabelsArgs),
    /// Serve the GPUs' metrics for Prometheus under dcgm-exporter's names and flags
    /// (DCGM_FI_* on /metrics, :9400), read through NVML.
    Exporter(exporter::ExporterArgs),
    /// Put the runtime, hook and nvshim on the host from a container (--host-root),
    /// register them with the engine, write the ready marker; as a daemon, undo all of
    /// it on SIGTERM (what NVIDIA's toolkit container, nvidia-ctk-installer, does).
    Install(install::InstallArgs),
    /// Undo `nvshim install`: the engine's config back byte for byte, the binaries gone
    /// once no container runs through them (waiting up to 90 s).
    Uninstall(install::UninstallArgs),
}

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error(transparent)]
    Pipeline(#[from] crate::pipeline::PipelineError),
    #[error(transparent)]
    Request(#[from] crate::request::RequestError),
    #[error(transparent)]
    Configure(#[from] configure::ConfigureError),
    #[error(transparent)]
    Generate(#[from] crate::generate::GenerateError),
    #[error(transparent)]
    Link(#[from] crate::hook::link::LinkError),
    #[error(transparent)]
    HookArgs(#[from] crate::hook_contract::ArgError),
    #[error(transparent)]
    Params(#[from] crate::hook::params::ParamsError),
    #[error(transparent)]
    Privileges(#[from] crate::hook::privileges::PrivilegeError),
    #[error(transparent)]
    Labels(#[from] labels::LabelsError),
    #[error(transparent)]
    Exporter(#[from] exporter::ExporterCommandError),
    #[error(transparent)]
    Wait(#[from] doctor::wait::WaitError),
    #[error(transparent)]
    Install(#[from] install::InstallError),
    #[error(
        "unknown hook {name:?} for --disable-hook (valid: disable-device-node-modification, all)"
    )]
    UnknownHook { name: String },
    #[error(
        "refusing to run a hook with {var} set: loader variables must not reach a hook running on the host"
    )]
    HookEnv { var: &'static str },
    #[error("{failed} check(s) failed (see above)")]
    Doctor { failed: usize },
    #[error("cannot write output: {0}")]
    Output(#[from] io::Error),
    #[error("cannot encode JSON: {0}")]
    Json(#[from] serde_json::Error),
}

impl From<crate::files::write::WriteError> for CliError {
    fn from(error: crate::files::write::WriteError) -> Self {
        Self::Configure(error.into())
    }
}

/// Runs one command, writing its output to `out`.
pub fn run(cli: &Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match &cli.command {
        Command::Info(args) => info::run(&host_from_config(&cli.host)?, args, out),
        Command::List(args) => list::run(&host_from_config(&cli.host)?, args, out),
        Command::Configure(args) => configure::run(args, out),
        Command::Doctor(args) => match args.mode() {
            doctor::Mode::Node => doctor::run(&host_from_config(&cli.host)?, args, out),
            doctor::Mode::WaitFor { path, timeout_s } => {
                Ok(doctor::wait::run(path, timeout_s, out)?)
            }
            doctor::Mode::InContainer => doctor::run_in_container(&cli.host, out),
        },
        Command::Cdi(args) => cdi::run(&cli.host, args, out),
        Command::Hook(args) => hook::run(args),
        Command::Labels(args) => labels::run(&cli.host, args, out),
        Command::Exporter(args) => exporter::run(&cli.host, args),
        Command::Install(args) => install::run_install(&cli.host, args, out),
        Command::Uninstall(args) => install::run_uninstall(args, out),
    }
}

/// `info`, `list` and `doctor` look at the node the runtime serves: roots no flag gives
/// come from the runtime's config file.
fn host_from_config(host: &HostArgs) -> Result<HostArgs, CliError> {
    Ok(host.with_config_roots(|key| std::env::var(key).ok())?)
}

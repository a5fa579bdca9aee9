//! `nvidia-container-cli`: the node-inspection commands of libnvidia-container's tool
//! (`info`, `list`, `--version`), with NVIDIA's global options and output layout, on
//! the inventory and discovery the runtime uses. Scripts and validators that parse
//! NVIDIA's output (`nvidia-container-cli info | grep 'CUDA version'`) read ours the
//! same way.
//!
//! `configure` (what NVIDIA's legacy hook runs to set up a container) is not here: our
//! runtime and prestart hook do that work themselves, and CDI specs do it for other
//! engines. It exits 1 saying so.
//!
//! The driver root is `--root`, else `config.toml`'s `[nvidia-container-cli] root`
//! (the file the runtime reads), else `/`; the dev and proc roots come from the same
//! file (`dev-root`, `[nvshim] proc-root`). NVIDIA's tool reads no config file; the
//! hook passes it `--root` from the same key, so the result is the same.
//!
//! Like NVIDIA's (argp) tool, usage errors and failures exit 1, `--help` and
//! `--version` exit 0, and errors are one line prefixed with the program name.

mod info;
mod list;

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{self, ConfigError};
use crate::logging::{self, LogSettings};
use crate::roots::Roots;

pub use info::InfoArgs;
pub use list::ListArgs;

/// The name packages install it under.
pub const BINARY: &str = "nvidia-container-cli";

/// The linker cache NVIDIA's tool reads by default, under the driver root; the only
/// one discovery reads.
const DEFAULT_LDCACHE: &str = "/etc/ld.so.cache";

/// NVIDIA's global options, given before the command.
#[derive(Debug, Parser)]
#[command(
    name = BINARY,
    about = "Command line utility for manipulating NVIDIA GPU containers (nvshim)",
    disable_version_flag = true
)]
pub struct ContainerCli {
    /// Log debug information to FILE.
    #[arg(long, short = 'd', value_name = "FILE")]
    pub debug: Option<PathBuf>,
    /// Load kernel modules. Accepted; nvshim loads none (load the nvidia modules first).
    #[arg(long, short = 'k')]
    pub load_kmods: bool,
    /// Do not use pivot_root. Accepted; only `configure` would use it.
    #[arg(long, short = 'n')]
    pub no_pivot: bool,
    /// User and group to use for privilege separation. Checked, then unused: nvshim
    /// runs no privileged helper to separate from.
    #[arg(
        long,
        short = 'u',
        value_name = "UID[:GID]",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = ""
    )]
    pub user: Option<String>,
    /// Path to the driver root directory.
    #[arg(long, short = 'r', value_name = "PATH")]
    pub root: Option<PathBuf>,
    /// Path to the system's DSO cache, under the driver root (only /etc/ld.so.cache).
    #[arg(long, short = 'l', value_name = "FILE")]
    pub ldcache: Option<PathBuf>,
    /// Don't automatically create IMEX channel device nodes. Accepted; info and list
    /// create none.
    #[arg(long)]
    pub no_create_imex_channels: bool,
    /// Print the version and exit.
    #[arg(long, short = 'V')]
    pub version: bool,
    #[command(subcommand)]
    pub command: Option<Command>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Report information about the driver and devices.
    Info(InfoArgs),
    /// List driver components.
    List(ListArgs),
    /// Configure a container with GPU support (not in nvshim: see the message).
    Configure(ConfigureArgs),
}

/// `configure`'s arguments, taken as they come: the command only says what replaces it.
#[derive(Debug, Args)]
pub struct ConfigureArgs {
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, hide = true)]
    pub args: Vec<OsString>,
}

#[derive(Debug, thiserror::Error)]
pub enum ContainerCliError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Inventory(#[from] crate::inventory::InventoryError),
    #[error("detection error: {0}")]
    Pipeline(#[from] crate::pipeline::PipelineError),
    #[error("detection error: {0}")]
    Discover(#[from] crate::discover::DiscoverError),
    #[error("device error: {0}")]
    Select(#[from] crate::select::SelectError),
    #[error("input error: {0}")]
    Request(#[from] crate::request::RequestError),
    #[error("input error: invalid --user {0:?} (valid: UID or UID:GID, numbers)")]
    User(String),
    #[error(
        "input error: --ldcache {} is not supported: nvshim reads the driver root's \
         {DEFAULT_LDCACHE} only",
        .0.display()
    )]
    Ldcache(PathBuf),
    #[error("input error: invalid --imex-channel {0:?} (valid: channel numbers, e.g. 0,1)")]
    ImexChannel(String),
    #[error(
        "configure is not part of nvshim: nvidia-container-runtime (or the \
         nvidia-container-runtime-hook prestart hook) gives containers their GPUs, and \
         CDI specs from `nvidia-ctk cdi generate` do it for podman and CRI-O"
    )]
    Configure,
    #[error("missing command (valid: info, list, configure; or --version, --help)")]
    NoCommand,
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// `nvidia-container-cli …` (`args` includes argv[0]).
pub fn main(args: Vec<OsString>) -> ExitCode {
    let cli = match ContainerCli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    if let Some(file) = &cli.debug {
        let settings = LogSettings {
            file: Some(file.clone()),
            file_level: Some(tracing::Level::DEBUG),
            ..LogSettings::default()
        };
        if let Err(e) = logging::init(&settings) {
            eprintln!("{BINARY}: {e}");
        }
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let result = run(&cli, &mut out);
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{BINARY}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Runs the parsed command line, writing its output to `out`.
pub fn run(cli: &ContainerCli, out: &mut dyn Write) -> Result<(), ContainerCliError> {
    if cli.version {
        return write_version(out).map_err(Into::into);
    }
    check_globals(cli)?;
    match &cli.command {
        Some(Command::Info(args)) => info::run(&roots(cli)?, args, out),
        Some(Command::List(args)) => list::run(&roots(cli)?, args, out),
        Some(Command::Configure(_)) => Err(ContainerCliError::Configure),
        None => Err(ContainerCliError::NoCommand),
    }
}

/// NVIDIA's version lines (`cli-version:`, `lib-version:`, …), with what we know.
fn write_version(out: &mut dyn Write) -> std::io::Result<()> {
    let version = env!("CARGO_PKG_VERSION");
    writeln!(out, "cli-version: {version}")?;
    writeln!(out, "lib-version: {version}")?;
    if let Some(commit) = option_env!("NVSHIM_GIT_COMMIT") {
        writeln!(out, "build revision: {commit}")?;
    }
    writeln!(out, "build platform: {}", std::env::consts::ARCH)
}

/// The options NVIDIA checks before any command runs.
fn check_globals(cli: &ContainerCli) -> Result<(), ContainerCliError> {
    if let Some(user) = cli.user.as_deref().filter(|u| !u.is_empty()) {
        let numeric = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let valid = match user.split_once(':') {
            Some((uid, gid)) => numeric(uid) && numeric(gid),
            None => numeric(user),
        };
        if !valid {
            return Err(ContainerCliError::User(user.to_owned()));
        }
    }
    if let Some(ldcache) = &cli.ldcache
        && ldcache.as_path() != Path::new(DEFAULT_LDCACHE)
    {
        return Err(ContainerCliError::Ldcache(ldcache.clone()));
    }
    Ok(())
}

/// The roots: `--root` over the config file's `root`; the dev and proc roots from the
/// file (see the module doc).
fn roots(cli: &ContainerCli) -> Result<Roots, ContainerCliError> {
    let loaded = config::load(|key| std::env::var(key).ok())?;
    for key in &loaded.unknown_keys {
        tracing::warn!(path = %loaded.path.display(), "unknown config key {key}, ignored");
    }
    let mut config = loaded.config;
    if let Some(root) = &cli.root {
        config.nvidia_container_cli.root = root.clone();
    }
    Ok(Roots {
        driver: config.driver_root(),
        dev: config.dev_root(),
        proc: config.nvshim.proc_root.clone(),
    })
}

#[cfg(test)]
mod tests;

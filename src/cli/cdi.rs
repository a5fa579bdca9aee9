//! `nvshim cdi generate|list`: a CDI spec for this node (see `generate`), and the
//! device names the spec directories define.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::{Args, Subcommand, ValueEnum};

use super::{CliError, HostArgs};
use crate::cdi::Spec;
use crate::cdi::{Registry, spec};
use crate::files::write;
use crate::generate::{self, NameStrategy, NvidiaHooks, Options};
use crate::hook_contract::{
    ALL_HOOKS, CDI_HOOK_BINARY, CTK_BINARY, DISABLE_DEVICE_NODE_MODIFICATION, HOOK_BINARY,
    NVSHIM_BINARY,
};
use crate::pipeline::{Context, NvmlAccess};
use crate::request::DriverCapabilities;

/// The spec directories CDI consumers read, lowest priority first.
pub const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];

#[derive(Debug, Args)]
pub struct CdiArgs {
    #[command(subcommand)]
    pub command: CdiCommand,
}

#[derive(Debug, Subcommand)]
pub enum CdiCommand {
    /// Write a CDI spec for this node's GPUs (one device per GPU and MIG device, plus all).
    Generate(GenerateArgs),
    /// List the CDI device names the spec directories define.
    List(ListArgs),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Json,
    Yaml,
}

#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// Write the spec here (atomically) instead of to stdout; `-` is stdout.
    #[arg(long, short = 'o')]
    pub output: Option<PathBuf>,
    /// json or yaml; default: from the output file's extension, else yaml.
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// How devices are named: index (0, 0:1), uuid (GPU-…, MIG-…), type-index (gpu0,
    /// mig0:1). Repeat or comma-separate for several names per device.
    #[arg(long, value_delimiter = ',', default_values = ["index", "uuid"])]
    pub device_name_strategy: Vec<String>,
    /// The vendor of the device kind.
    #[arg(long, default_value = "nvidia.com")]
    pub vendor: String,
    /// The class of the device kind.
    #[arg(long, default_value = "gpu")]
    pub class: String,
    /// The binary the spec's createContainer hook runs (absolute): nvidia-container-runtime-hook
    /// or nvshim. Default: the nvidia-container-runtime-hook beside this nvshim, else this nvshim.
    #[arg(long, alias = "hook-path")]
    pub nvidia_cdi_hook_path: Option<PathBuf>,
    /// Leave out the `all` device.
    #[arg(long)]
    pub no_all_device: bool,
    /// The driver files to include, as NVIDIA_DRIVER_CAPABILITIES takes them. NVIDIA's
    /// specs carry the whole driver.
    #[arg(long, default_value = "all")]
    pub driver_capabilities: String,
    /// Leave a hook out of the spec: disable-device-node-modification (the one
    /// optional hook), or all; for a spec with NVIDIA's hooks (the hook path is
    /// nvidia-cdi-hook or nvidia-ctk) also NVIDIA's hook names. Repeat or
    /// comma-separate.
    #[arg(long, value_delimiter = ',')]
    pub disable_hook: Vec<String>,
}

#[derive(Debug, Args)]
pub struct ListArgs {
    /// A directory of spec files; repeat for several, later ones take priority.
    /// Default: /etc/cdi, then /var/run/cdi.
    #[arg(long)]
    pub spec_dir: Vec<PathBuf>,
}

pub fn run(host: &HostArgs, args: &CdiArgs, out: &mut dyn Write) -> Result<(), CliError> {
    match &args.command {
        CdiCommand::Generate(args) => run_generate(host, args, out),
        CdiCommand::List(args) => run_list(args, out),
    }
}

fn run_generate(host: &HostArgs, args: &GenerateArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let strategies = args
        .device_name_strategy
        .iter()
        .map(|s| s.parse::<NameStrategy>())
        .collect::<Result<Vec<_>, _>>()?;
    let (hook_path, hook_argv0) = match &args.nvidia_cdi_hook_path {
        Some(path) => (path.clone(), None),
        None => default_hook()?,
    };
    let options = Options {
        kind: format!("{}/{}", args.vendor, args.class),
        strategies,
        all_device: !args.no_all_device,
        hook_path: hook_path.display().to_string(),
        capabilities: args.driver_capabilities.parse::<DriverCapabilities>()?,
        cover_params: true,
        only: None,
        hook_argv0,
    };
    let mut options = options;
    let mut nvidia = NvidiaHooks::default();
    let nvidia_shape = generate::nvidia_shape(&options.hook_path);
    for hook in &args.disable_hook {
        match hook.as_str() {
            DISABLE_DEVICE_NODE_MODIFICATION => options.cover_params = false,
            ALL_HOOKS => {
                options.cover_params = false;
                for name in NvidiaHooks::NAMES {
                    nvidia.set(name, false);
                }
            }
            other if nvidia_shape && nvidia.set(other, false) => {}
            other => {
                return Err(CliError::UnknownHook {
                    name: other.to_owned(),
                });
            }
        }
    }
    let ctx = Context {
        roots: host.roots(),
        source: host.source(),
        nvml: NvmlAccess::InProcess,
        ..Default::default()
    };
    let spec = generate::generate_with(&ctx, &options, &nvidia)?;
    let output = args.output.as_deref().filter(|p| *p != Path::new("-"));
    emit(&spec, output, args.format, out)
}

/// Writes `spec` to `output` (atomically) or to `out`, in `format`; without one, JSON
/// for a `.json` file and YAML otherwise.
pub fn emit(
    spec: &Spec,
    output: Option<&Path>,
    format: Option<Format>,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let format = format.unwrap_or_else(|| match output {
        Some(p) if p.extension().is_some_and(|e| e == "json") => Format::Json,
        _ => Format::Yaml,
    });
    let bytes = match format {
        Format::Json => spec::to_json(spec),
        Format::Yaml => spec::to_yaml(spec)
            .map_err(generate::GenerateError::from)?
            .into_bytes(),
    };
    match output {
        None => out.write_all(&bytes)?,
        Some(path) => {
            let path = write::resolve(path);
            let existing = write::read(&path)?;
            write::replace(&path, &bytes, existing.as_ref(), false)?;
            tracing::info!(path = %path.display(), devices = spec.devices.len(), "wrote CDI spec");
        }
    }
    Ok(())
}

/// Writes `bytes` to `path` atomically (the spec files `nvidia-ctk cdi transform`
/// writes).
pub fn write_file(path: &Path, bytes: &[u8]) -> Result<(), CliError> {
    let path = write::resolve(path);
    let existing = write::read(&path)?;
    write::replace(&path, bytes, existing.as_ref(), false)?;
    Ok(())
}

/// `nvidia-container-runtime-hook` beside this `nvshim` (as packages install them),
/// else this `nvshim` itself, with the name its hooks start it as ([`hook_for`]).
fn default_hook() -> Result<(PathBuf, Option<String>), CliError> {
    let exe = std::env::current_exe().map_err(CliError::Output)?;
    let hook = exe.with_file_name(HOOK_BINARY);
    Ok(if hook.is_file() {
        (hook, None)
    } else {
        hook_for(exe)
    })
}

/// This binary, at `exe`, as a hook: under one of its own names it is started by that name;
/// under any other (a renamed or versioned copy) its argv[0] would pick the default front
/// end, which has no `link-driver`: it is started as `nvshim`, which takes `hook <stage>`.
pub fn hook_for(exe: PathBuf) -> (PathBuf, Option<String>) {
    let known = exe
        .file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| [NVSHIM_BINARY, CTK_BINARY, CDI_HOOK_BINARY].contains(&n));
    (exe, (!known).then(|| NVSHIM_BINARY.to_owned()))
}

fn run_list(args: &ListArgs, out: &mut dyn Write) -> Result<(), CliError> {
    list(&args.spec_dir, out)
}

/// Prints the device names the spec directories `dirs` define (default: [`SPEC_DIRS`]).
pub fn list(dirs: &[PathBuf], out: &mut dyn Write) -> Result<(), CliError> {
    let dirs: Vec<PathBuf> = if dirs.is_empty() {
        SPEC_DIRS.iter().map(PathBuf::from).collect()
    } else {
        dirs.to_vec()
    };
    let registry = Registry::load(&dirs);
    for (path, error) in registry.errors() {
        tracing::warn!("skipped CDI spec {}: {error}", path.display());
    }
    for name in registry.devices() {
        writeln!(out, "{name}")?;
    }
    Ok(())
}

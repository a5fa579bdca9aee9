//! `nvidia-ctk hook <name>` = `nvidia-cdi-hook <name>`: NVIDIA's `createContainer`
//! hooks, with NVIDIA's names and flags, running `hook::stages` (and `hook::params`
//! for `disable-device-node-modification`).
//!
//! Every hook reads the OCI state from stdin (or the file `--container-spec` names),
//! refuses to run with a loader variable set (CVE-2025-23266: the hook's env comes from
//! the spec, never the image), and cuts its capabilities to its stage's set before it
//! reads anything.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, Subcommand};

use super::GlobalArgs;
use crate::hook::params::{self, ParamsError};
use crate::hook::privileges::{self, PrivilegeError, Stage};
use crate::hook::stages::{self, StageError, chmod, compat, ldcache, profile, symlinks};
use crate::hook_contract::{
    self, ArgError, CHMOD, CREATE_SYMLINKS, DISABLE_DEVICE_NODE_MODIFICATION, ENABLE_CUDA_COMPAT,
    LINK_DRIVER, NVIDIA_HOOKS, UPDATE_APPLICATION_PROFILE, UPDATE_LDCACHE,
};

#[derive(Debug, Args)]
pub struct HookArgs {
    #[command(subcommand)]
    pub command: Option<HookCommand>,
}

/// `--container-spec`, which every hook takes.
#[derive(Debug, Clone, Args)]
pub struct StateArgs {
    /// The OCI state file; empty or `-`: stdin (where runtimes write it).
    #[arg(long)]
    pub container_spec: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum HookCommand {
    /// Create symlinks in the container: --link TARGET::LINK (repeatable).
    #[command(name = CREATE_SYMLINKS)]
    CreateSymlinks(CreateSymlinksArgs),
    /// Put the libraries in the given folders into the container's linker cache
    /// (written directly; no ldconfig runs).
    #[command(name = UPDATE_LDCACHE)]
    UpdateLdcache(UpdateLdcacheArgs),
    /// Set the mode of paths in the container.
    #[command(name = CHMOD)]
    Chmod(ChmodArgs),
    /// Put the image's CUDA forward-compat libraries first when they are newer than
    /// the host driver (for update-ldcache, which runs after it).
    #[command(name = ENABLE_CUDA_COMPAT)]
    EnableCudaCompat(CudaCompatArgs),
    /// Cover the container's /proc/driver/nvidia/params with ModifyDeviceFiles: 0.
    #[command(name = DISABLE_DEVICE_NODE_MODIFICATION)]
    DisableDeviceNodeModification(StateArgs),
    /// Limit EGL/Vulkan to the container's GPUs with a driver application profile.
    #[command(name = UPDATE_APPLICATION_PROFILE)]
    UpdateApplicationProfile(StateArgs),
    /// nvshim's one hook for the driver's symlinks and linker cache entries (what
    /// create-symlinks and update-ldcache do), as the device plugin's CDI specs run it.
    #[command(name = LINK_DRIVER)]
    LinkDriver(crate::cli::hook::LinkDriverArgs),
    #[command(external_subcommand)]
    Unknown(Vec<OsString>),
}

#[derive(Debug, Args)]
pub struct CreateSymlinksArgs {
    /// A link to create, TARGET::LINK (LINK absolute in the container); repeat or
    /// comma-separate.
    #[arg(long, value_delimiter = ',')]
    pub link: Vec<String>,
    /// NVIDIA's older CSV mode (Tegra); not supported.
    #[arg(long, value_delimiter = ',')]
    pub csv_filename: Vec<String>,
    /// NVIDIA's host root for CSV links; only meaningful with --csv-filename.
    #[arg(long)]
    pub host_root: Option<String>,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct UpdateLdcacheArgs {
    /// A folder (in the container) whose libraries go into the cache; repeat or
    /// comma-separate.
    #[arg(long, value_delimiter = ',')]
    pub folder: Vec<String>,
    /// NVIDIA's ldconfig to run; accepted and unused (the cache is written directly).
    #[arg(long, default_value = "/sbin/ldconfig")]
    pub ldconfig_path: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct ChmodArgs {
    /// The mode, in octal (e.g. 755).
    #[arg(long)]
    pub mode: Option<String>,
    /// A path in the container; repeat or comma-separate.
    #[arg(long, value_delimiter = ',')]
    pub path: Vec<String>,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, Args)]
pub struct CudaCompatArgs {
    /// The host driver's version; without it the hook does nothing.
    #[arg(long)]
    pub host_driver_version: Option<String>,
    /// The host's CUDA version, compared with the compat library's ELF note when the
    /// note lists no driver branches.
    #[arg(long)]
    pub host_cuda_version: Option<String>,
    /// Where the image keeps its compat libraries.
    #[arg(long, default_value = compat::DEFAULT_COMPAT_ROOT)]
    pub cuda_compat_container_root: String,
    #[command(flatten)]
    pub state: StateArgs,
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error("no hook given (valid: {})", NVIDIA_HOOKS.join(", "))]
    NoHook,
    #[error("unknown hook {name:?} (valid: {})", NVIDIA_HOOKS.join(", "))]
    Unknown { name: String },
    #[error(
        "{hook}: refusing to run with {var} set: loader variables must not reach a hook that \
         runs as root on the host (check the hook's env in the OCI spec)"
    )]
    LoaderVar {
        hook: &'static str,
        var: &'static str,
    },
    #[error("{hook}: {source}")]
    Privileges {
        hook: &'static str,
        #[source]
        source: PrivilegeError,
    },
    #[error("{hook}: {source}")]
    Stage {
        hook: &'static str,
        #[source]
        source: StageError,
    },
    #[error("{CREATE_SYMLINKS}: {0}")]
    Link(#[from] ArgError),
    #[error("{LINK_DRIVER}: {0}")]
    LinkDriver(Box<crate::cli::CliError>),
    #[error("{DISABLE_DEVICE_NODE_MODIFICATION}: {0}")]
    Params(#[from] ParamsError),
    #[error("{CHMOD}: --mode is required (an octal mode such as 755)")]
    NoMode,
    #[error(
        "{CREATE_SYMLINKS}: --csv-filename (NVIDIA's CSV mode for Tegra) is not supported yet; \
         give the links with --link"
    )]
    Csv,
}

/// Runs the hook `args` names.
pub fn run(_global: &GlobalArgs, args: &HookArgs) -> Result<(), HookError> {
    let command = args.command.as_ref().ok_or(HookError::NoHook)?;
    let (hook, stage) = match command {
        HookCommand::Unknown(argv) => {
            let name = argv
                .first()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(HookError::Unknown { name });
        }
        HookCommand::CreateSymlinks(_) => (CREATE_SYMLINKS, Stage::RootfsFiles),
        HookCommand::UpdateLdcache(_) => (UPDATE_LDCACHE, Stage::RootfsFiles),
        HookCommand::Chmod(_) => (CHMOD, Stage::Chmod),
        HookCommand::EnableCudaCompat(_) => (ENABLE_CUDA_COMPAT, Stage::RootfsFiles),
        HookCommand::DisableDeviceNodeModification(_) => (
            DISABLE_DEVICE_NODE_MODIFICATION,
            Stage::DisableDeviceNodeModification,
        ),
        HookCommand::UpdateApplicationProfile(_) => {
            (UPDATE_APPLICATION_PROFILE, Stage::RootfsFiles)
        }
        HookCommand::LinkDriver(_) => (LINK_DRIVER, Stage::LinkDriver),
    };
    if let Some(var) = hook_contract::loader_var() {
        return Err(HookError::LoaderVar { hook, var });
    }
    privileges::restrict(stage).map_err(|source| HookError::Privileges { hook, source })?;
    let stage_err = |source| HookError::Stage { hook, source };
    match command {
        HookCommand::Unknown(_) => Ok(()),
        HookCommand::CreateSymlinks(a) => {
            if !a.csv_filename.is_empty() {
                return Err(HookError::Csv);
            }
            let links = symlinks::parse_links(&a.link)?;
            let rootfs = open(&a.state).map_err(stage_err)?;
            let changed = symlinks::run(&rootfs, &links).map_err(stage_err)?;
            tracing::debug!(changed, "{CREATE_SYMLINKS}");
            Ok(())
        }
        HookCommand::UpdateLdcache(a) => {
            let folders = ldcache::parse_folders(&a.folder).map_err(stage_err)?;
            let rootfs = open(&a.state).map_err(stage_err)?;
            let done = ldcache::run(&rootfs, &folders).map_err(stage_err)?;
            tracing::debug!(links = done.links, refresh = ?done.refresh, "{UPDATE_LDCACHE}");
            Ok(())
        }
        HookCommand::Chmod(a) => {
            let mode = a.mode.as_deref().ok_or(HookError::NoMode)?;
            let (mode, paths) = chmod::parse(mode, &a.path).map_err(stage_err)?;
            let rootfs = open(&a.state).map_err(stage_err)?;
            let changed = chmod::run(&rootfs, mode, &paths).map_err(stage_err)?;
            tracing::debug!(changed, "{CHMOD}");
            Ok(())
        }
        HookCommand::EnableCudaCompat(a) => {
            if a.host_driver_version.as_deref().is_none_or(str::is_empty) {
                // NVIDIA's hook does nothing then, without reading the state.
                return Ok(());
            }
            let rootfs = open(&a.state).map_err(stage_err)?;
            let decision = compat::decide(
                &rootfs,
                a.host_driver_version.as_deref(),
                a.host_cuda_version.as_deref(),
                Some(&a.cuda_compat_container_root),
            )
            .map_err(stage_err)?;
            match decision {
                compat::Decision::Skip(why) => {
                    tracing::debug!("{ENABLE_CUDA_COMPAT}: {why}");
                    Ok(())
                }
                compat::Decision::UseCompat { dir, library } => {
                    compat::apply(&rootfs, &dir).map_err(stage_err)?;
                    tracing::debug!(dir = %dir.display(), library, "{ENABLE_CUDA_COMPAT}: compat libraries first");
                    Ok(())
                }
            }
        }
        HookCommand::DisableDeviceNodeModification(a) => {
            let state = stages::read_state(a.container_spec.as_deref()).map_err(stage_err)?;
            let covered = params::run(&state)?;
            tracing::debug!(covered, "{DISABLE_DEVICE_NODE_MODIFICATION}");
            Ok(())
        }
        HookCommand::UpdateApplicationProfile(a) => {
            let rootfs = open(a).map_err(stage_err)?;
            let mask = profile::run(&rootfs).map_err(stage_err)?;
            tracing::debug!(?mask, "{UPDATE_APPLICATION_PROFILE}");
            Ok(())
        }
        HookCommand::LinkDriver(a) => {
            crate::cli::hook::link_driver(a).map_err(|e| HookError::LinkDriver(Box::new(e)))
        }
    }
}

fn open(state: &StateArgs) -> Result<crate::rootfs::Rootfs, StageError> {
    let state = stages::read_state(state.container_spec.as_deref())?;
    stages::open_rootfs(&state)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use clap::Parser;

    use super::*;
    use crate::ctk::{CdiHook, Ctk, CtkCommand};

    fn hook(args: &[&str]) -> CdiHook {
        CdiHook::try_parse_from(["nvidia-cdi-hook"].iter().chain(args)).unwrap()
    }

    /// The device plugin's CDI specs run `nvidia-ctk hook link-driver …` (its default
    /// hook binary is NVIDIA's `/usr/bin/nvidia-ctk`): the spec it writes must parse.
    #[test]
    fn the_device_plugins_link_driver_hook_parses() {
        let spec = hook_contract::stage_hook(
            std::path::Path::new("/usr/bin/nvidia-ctk"),
            LINK_DRIVER,
            vec!["--link".into(), "libcuda.so.1::/usr/lib/libcuda.so".into()],
        );
        let parsed = Ctk::try_parse_from(&spec.args).unwrap();
        let CtkCommand::Hook(HookArgs {
            command: Some(HookCommand::LinkDriver(a)),
        }) = parsed.command
        else {
            panic!("{parsed:?}");
        };
        assert_eq!(a.links, ["libcuda.so.1::/usr/lib/libcuda.so"]);
    }

    #[test]
    fn nvidias_flags_parse() {
        let parsed = hook(&[
            "update-ldcache",
            "--folder",
            "/usr/lib64",
            "--folder=/usr/lib/x86_64-linux-gnu,/lib64",
            "--ldconfig-path",
            "/sbin/ldconfig.real",
            "--container-spec",
            "/run/state.json",
        ]);
        let Some(HookCommand::UpdateLdcache(a)) = parsed.hook.command else {
            panic!("{parsed:?}");
        };
        assert_eq!(
            a.folder,
            ["/usr/lib64", "/usr/lib/x86_64-linux-gnu", "/lib64"]
        );
        assert_eq!(
            a.state.container_spec,
            Some(PathBuf::from("/run/state.json"))
        );
        let parsed = hook(&["update-ldcache"]);
        let Some(HookCommand::UpdateLdcache(a)) = parsed.hook.command else {
            panic!("{parsed:?}");
        };
        assert_eq!(a.ldconfig_path, "/sbin/ldconfig");

        let parsed = hook(&["chmod", "--mode", "755", "--path", "/dev/dri"]);
        assert!(matches!(parsed.hook.command, Some(HookCommand::Chmod(_))));
        let parsed = hook(&["enable-cuda-compat", "--host-driver-version=550.54.15"]);
        let Some(HookCommand::EnableCudaCompat(a)) = parsed.hook.command else {
            panic!("{parsed:?}");
        };
        assert_eq!(a.cuda_compat_container_root, "/usr/local/cuda/compat");
        // `nvidia-ctk hook <name>` is the same command.
        let ctk = Ctk::try_parse_from(["nvidia-ctk", "hook", "create-symlinks", "--link", "a::/b"])
            .unwrap();
        let CtkCommand::Hook(HookArgs {
            command: Some(HookCommand::CreateSymlinks(a)),
        }) = ctk.command
        else {
            panic!("{:?}", ctk.command);
        };
        assert_eq!(a.link, ["a::/b"]);
    }

    #[test]
    fn unknown_or_missing_hooks_name_the_valid_ones() {
        let global = hook(&[]).global;
        for args in [&["bogus-hook", "--x"][..], &[]] {
            let parsed = hook(args);
            let err = run(&global, &parsed.hook).unwrap_err().to_string();
            for name in NVIDIA_HOOKS {
                assert!(err.contains(name), "{args:?}: {err}");
            }
            if !args.is_empty() {
                assert!(err.contains("\"bogus-hook\""), "{err}");
            }
        }
    }
}

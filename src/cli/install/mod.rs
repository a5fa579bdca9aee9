// SPDX-License-Identifier: Apache-2.0
//! `nvshim install` (also started as `nvidia-ctk-installer`, the name of NVIDIA's
//! toolkit container's entry point) and `nvshim uninstall`: puts the runtime, the hook
//! and `nvshim` on a host from a container that has the host's `/` mounted
//! (`--host-root`), writes their config.toml, registers the runtime with the engine,
//! makes the engine read it, and writes the ready marker the device plugin waits for.
//! Then, as a DaemonSet's process, it waits for SIGTERM and undoes all of it, unless a
//! newer install took over in the meantime (a rolling update starts the new pod first).
//!
//! ```text
//! args     flags and NVIDIA's environment variables → Settings
//! layout   versioned binaries, switched by one rename; the undo takes them out
//! drain    the containers whose shim still runs the toolkit's binaries; the undo waits
//!          for them before it takes the binaries out
//! changes  recorded text-file writes (engine config via `configure::plan`, config.toml,
//!          the ready file) and their byte-identical undo
//! restart  signal / systemd / none
//! state    the record on the host, `<toolkit-dir>/.nvshim-install.json`
//! ```

pub mod args;
mod changes;
pub mod drain;
pub mod layout;
pub mod restart;
pub mod state;
mod undo;

pub use undo::{RestartOverride, uninstall};

#[cfg(test)]
mod accept_tests;
#[cfg(test)]
mod crio_drain_tests;
#[cfg(test)]
mod drain_tests;
#[cfg(test)]
mod hook_mode_tests;
#[cfg(test)]
mod signal_tests;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::signal::Signal;

pub use args::{InstallArgs, Place, PlaceArgs, RestartMode, Settings, UninstallArgs};
pub use drain::DRAIN_BOUND;
use state::{STATE_FILE, State};

use super::{CliError, HostArgs};
use crate::cli::configure::{ConfigureError, EngineKind, oci_hook};
use crate::cli::labels::stop::{StopSignals, Wake};
use crate::config::{BESIDE_DIR, Config, RELATIVE_PATH};
use crate::files::write::WriteError;
use crate::hook_contract::{CTK_BINARY, HOOK_BINARY};

/// The name NVIDIA's toolkit image starts its installer by; `nvshim` under this name
/// runs `install`.
pub const INSTALLER_BINARY: &str = "nvidia-ctk-installer";

#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    #[error("{what} {value:?} is not valid (valid: {valid})")]
    BadValue {
        what: String,
        value: String,
        valid: &'static str,
    },
    #[error("{what} {path:?} is not an absolute path")]
    NotAbsolute { what: String, path: PathBuf },
    #[error("--host-root {path:?} is not a directory (mount the host's / there)")]
    HostRoot { path: PathBuf },
    #[error("no engine given: set --runtime (or RUNTIME) to docker, containerd or crio")]
    NoRuntime,
    #[error(
        "cannot read {missing:?} from the source directory {dir:?} ({reason}); it must hold nvidia-container-runtime, nvidia-container-runtime-hook and nvshim (--source-dir)"
    )]
    Source {
        dir: PathBuf,
        missing: PathBuf,
        reason: String,
    },
    #[error("cannot {what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("install state {path}: {reason}")]
    State { path: PathBuf, reason: String },
    #[error("cannot reach the engine on {socket}: {reason}")]
    Socket { socket: PathBuf, reason: String },
    #[error("cannot send SIGHUP to pid {pid} (the engine behind {socket}): {reason}")]
    Signal {
        pid: i32,
        socket: PathBuf,
        reason: String,
    },
    #[error("`{command}` failed: {reason}")]
    Restart { command: String, reason: String },
    #[error("cannot listen for SIGTERM: {0}")]
    Signals(#[source] io::Error),
    #[error(transparent)]
    Configure(#[from] ConfigureError),
    #[error(transparent)]
    Write(#[from] WriteError),
}

/// The state file of an install at `place`, as a path here.
pub fn state_file(place: &Place) -> PathBuf {
    place.host(&place.toolkit_dir).join(STATE_FILE)
}

pub(crate) fn save_state(file: &Path, state: &State) -> Result<(), InstallError> {
    state::save(file, state)
}

/// config.toml for the toolkit directory: NVIDIA's defaults, the driver root, the two
/// `accept-nvidia-visible-devices-*` keys, and the hook and `nvidia-ctk` in the toolkit
/// directory.
pub fn config_toml(settings: &Settings) -> Result<String, InstallError> {
    let mut config = Config::default();
    let toolkit = &settings.place.toolkit_dir;
    config.accept_nvidia_visible_devices_envvar_when_unprivileged =
        settings.accept_envvar_unprivileged;
    config.accept_nvidia_visible_devices_as_volume_mounts = settings.accept_volume_mounts;
    config.nvidia_container_cli.root = settings.driver_root.clone();
    config.nvidia_container_cli.dev_root = settings.dev_root.clone();
    config.nvidia_container_runtime_hook.path = toolkit.join(HOOK_BINARY);
    config.nvidia_ctk.path = toolkit.join(CTK_BINARY);
    let body = toml::to_string(&config).map_err(|e| InstallError::State {
        path: config_toml_path(toolkit),
        reason: format!("cannot write the config: {e}"),
    })?;
    Ok(format!(
        "# Written by `nvshim install`; taken out again by its undo. The runtime, the hook and\n\
         # nvshim in {} read this file (it is beside them, see docs/configuration.md).\n\n{body}",
        toolkit.display()
    ))
}

/// Where config.toml goes, as a host path.
pub fn config_toml_path(toolkit: &Path) -> PathBuf {
    toolkit.join(BESIDE_DIR).join(RELATIVE_PATH)
}

/// What an install did, for the daemon's later undo.
#[derive(Debug, Clone)]
pub struct Done {
    pub owner: String,
    pub lines: Vec<String>,
}

/// Installs as `settings` say; returns the owner id this install recorded.
pub fn install(settings: &Settings) -> Result<Done, InstallError> {
    let place = &settings.place;
    let sources = layout::read_sources(&settings.source_dir)?;
    let toolkit = place.host(&place.toolkit_dir);
    let file = state_file(place);
    let mut lines = Vec::new();
    let mut fresh = State {
        version: state::STATE_VERSION,
        owner: String::new(),
        engine: String::new(),
        runtime_name: String::new(),
        runtime_path: PathBuf::new(),
        config: PathBuf::new(),
        drop_in: None,
        set_as_default: false,
        cdi: false,
        socket: PathBuf::new(),
        restart: settings.restart,
        ready_file: PathBuf::new(),
        files: Vec::new(),
        engine_files: Vec::new(),
        saved: Vec::new(),
        dirs: Vec::new(),
    };
    layout::create_dirs(&place.host_root, &toolkit, &mut fresh)?;
    // A previous install's record is taken over: its originals stay the originals.
    let mut state = state::load(&file)?.unwrap_or(fresh);
    if !state.owner.is_empty() {
        lines.push(format!("taking over the install of {}", state.owner));
    }
    let engine_changed_settings = state.engine != engine_name(settings.engine)
        || state.config != settings.config
        || state.drop_in != settings.drop_in
        || state.runtime_name != settings.runtime_name;
    if !state.owner.is_empty() && engine_changed_settings {
        return Err(InstallError::State {
            path: file,
            reason: format!(
                "the install there configured {} ({}, runtime \"{}\"); run `nvshim uninstall` first to configure another engine or file",
                state.engine,
                state.config.display(),
                state.runtime_name
            ),
        });
    }
    state.owner = state::new_owner();
    state.engine = engine_name(settings.engine).to_owned();
    state.runtime_name = settings.runtime_name.clone();
    state.runtime_path = place.toolkit_dir.join(layout::RUNTIME_BINARY);
    state.config = settings.config.clone();
    state.drop_in = settings.drop_in.clone();
    state.set_as_default = settings.set_as_default;
    state.cdi = settings.cdi;
    state.socket = settings.socket.clone();
    state.restart = settings.restart;
    state.ready_file = settings.ready_file.clone();
    save_state(&file, &state)?;

    let installed = layout::install(&place.host_root, &toolkit, &sources, &mut state)?;
    save_state(&file, &state)?;
    lines.push(match (&installed.previous, installed.changed) {
        (_, false) => format!("binaries {} already in place", installed.version),
        (Some(p), true) => format!("switched the binaries from {p} to {}", installed.version),
        (None, true) => format!("installed binaries {}", installed.version),
    });
    let config_path = config_toml_path(&place.toolkit_dir);
    if changes::write_recorded(
        place,
        &mut state,
        &file,
        &config_path,
        &config_toml(settings)?,
    )? {
        lines.push(format!("wrote {}", config_path.display()));
    }
    if let Some(hook_file) = &settings.oci_hook {
        // CRI-O reads its hooks directories when it starts (1.34 does not watch them), so
        // the hook takes a restart, as the runtime's registration does; recorded as an
        // engine file, its removal by the undo restarts CRI-O too (else CRI-O would go on
        // running a hook whose binary the undo removed).
        if !state.engine_files.contains(hook_file) {
            state.engine_files.push(hook_file.clone());
        }
        let hook = place.toolkit_dir.join(HOOK_BINARY).display().to_string();
        let text = oci_hook::hook_json(&hook);
        if changes::write_recorded(place, &mut state, &file, hook_file, &text)? {
            lines.push(format!("wrote the OCI hook {}", hook_file.display()));
            let socket = restart::socket_here(&place.host_root, &settings.socket);
            lines.push(restart::restart(
                settings.engine,
                settings.restart,
                &socket,
                &place.host_root,
                None,
            )?);
        } else {
            lines.push(format!("the OCI hook {} is in place", hook_file.display()));
        }
        changes::write_recorded(place, &mut state, &file, &settings.ready_file, "")?;
        lines.push(format!("ready: {}", settings.ready_file.display()));
        return Ok(Done {
            owner: state.owner,
            lines,
        });
    }
    let (notes, engine_changed) = changes::configure_engine(place, &mut state, &file)?;
    lines.extend(notes.into_iter().map(|n| format!("note: {n}")));
    if engine_changed {
        lines.push(format!(
            "registered runtime \"{}\" with {} in {}",
            settings.runtime_name,
            settings.engine.display(),
            settings
                .drop_in
                .as_ref()
                .unwrap_or(&settings.config)
                .display()
        ));
        let socket = restart::socket_here(&place.host_root, &settings.socket);
        let runtime = place.toolkit_dir.join(layout::RUNTIME_BINARY);
        let runtime = runtime.display().to_string();
        lines.push(restart::restart(
            settings.engine,
            settings.restart,
            &socket,
            &place.host_root,
            Some((&settings.runtime_name, &runtime)),
        )?);
    } else {
        lines.push(format!(
            "{} already runs runtime \"{}\" from {}",
            settings.engine.display(),
            settings.runtime_name,
            place.toolkit_dir.display()
        ));
    }
    changes::write_recorded(place, &mut state, &file, &settings.ready_file, "")?;
    lines.push(format!("ready: {}", settings.ready_file.display()));
    Ok(Done {
        owner: state.owner,
        lines,
    })
}

fn engine_name(engine: EngineKind) -> &'static str {
    match engine {
        EngineKind::Docker => "docker",
        EngineKind::Containerd => "containerd",
        EngineKind::Crio => "crio",
    }
}

/// `nvshim install`.
pub fn run_install(
    host: &HostArgs,
    args: &InstallArgs,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let env = |name: &str| std::env::var(name).ok();
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_path_buf))
        .unwrap_or_else(|| PathBuf::from("/usr/bin"));
    let settings = args.resolve(
        &env,
        host.driver_root.as_ref(),
        host.dev_root.as_ref(),
        &exe_dir,
    )?;
    // Blocked before anything changes: a SIGTERM during the install is handled once
    // it is complete (by undoing it), never by dying half-way.
    let signals = if settings.daemon {
        Some(
            StopSignals::listen_to(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT])
                .map_err(InstallError::Signals)?,
        )
    } else {
        None
    };
    let done = install(&settings)?;
    for line in &done.lines {
        writeln!(out, "{line}")?;
    }
    let Some(signals) = signals else {
        return Ok(());
    };
    let pod_ready = Path::new(args::POD_READY_FILE);
    std::fs::write(pod_ready, "").map_err(|source| InstallError::Io {
        what: "write",
        path: pod_ready.to_path_buf(),
        source,
    })?;
    writeln!(out, "waiting for SIGTERM to undo the install")?;
    out.flush()?;
    loop {
        match signals
            .wait(Duration::from_secs(3600))
            .map_err(InstallError::Signals)?
        {
            Wake::Stop => break,
            Wake::Elapsed | Wake::Reload => {}
        }
    }
    match uninstall(
        &settings.place,
        Some(&done.owner),
        &RestartOverride::default(),
        DRAIN_BOUND,
    )? {
        Some(lines) => {
            for line in lines {
                writeln!(out, "{line}")?;
            }
        }
        None => writeln!(
            out,
            "a newer install owns {} now: leaving everything to it",
            settings.place.toolkit_dir.display()
        )?,
    }
    // Gone with the install (a daemon on a host, not in a pod, leaves nothing behind).
    let _ = std::fs::remove_file(pod_ready);
    Ok(())
}

/// `nvshim uninstall`.
pub fn run_uninstall(args: &UninstallArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let env = |name: &str| std::env::var(name).ok();
    let place = args.place.resolve(&env)?;
    let overrides = RestartOverride {
        mode: args.restart_mode,
        socket: args.socket.clone(),
        proc: None,
    };
    for line in uninstall(&place, None, &overrides, DRAIN_BOUND)?.unwrap_or_default() {
        writeln!(out, "{line}")?;
    }
    Ok(())
}

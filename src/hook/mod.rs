//! `nvidia-container-runtime-hook prestart`: GPUs for containers our runtime did not
//! create — docker's `--gpus` with the stock runc, podman and CRI-O through
//! `hooks.d/oci-nvidia-hook.json`.
//!
//! runc has already read `config.json` when a prestart hook runs, so the hook applies
//! the edits itself, inside the container's namespaces. It prepares exactly as the
//! runtime does (`container`: the same `Request`, the same plan), then:
//! 1. host side (`host`): opens every source (driver files, device nodes) in the
//!    host's mount namespace and clones each into a detached mount;
//! 2. host side ([`cgroup`]): grants the device nodes in the container's device cgroup
//!    (v1 `devices.allow`, v2 device programs), unless `no-cgroups` is set, and when
//!    that cgroup is a systemd scope, writes them as its `DeviceAllow=` drop-in so a
//!    `daemon-reload` keeps them ([`systemd_scope`]);
//! 3. `setns` into `/proc/<pid>/ns/mnt` ([`ns`]; the process is single-threaded);
//! 4. container side ([`apply`]): mountpoints, bind mounts, device nodes, the
//!    driver's soname symlinks and the linker cache, all through one rootfs fd opened
//!    in that namespace.
//!
//! runc runs prestart hooks after it mounted the rootfs (at the bundle's `root.path`)
//! and `/dev` in the container's new mount namespace, and before `pivot_root`; the
//! state's `pid` is `runc init`, waiting. The hook never runs a binary from the image
//! (it writes `ld.so.cache` itself) and never resolves an image path outside the
//! rootfs fd.
//!
//! A spec our runtime edited carries its mark (`inject::is_marked`): then, or when no
//! GPU is asked for, the hook does nothing. `poststart` and `poststop` do nothing.
//!
//! NVIDIA's `createContainer` hooks (`nvidia-cdi-hook create-symlinks`,
//! `update-ldcache`, `chmod`, …) are [`stages`].
//!
//! `hooks.d/oci-nvidia-hook.json` (podman, CRI-O) says `"when": {"always": true}`:
//! the OCI hooks format 1.0.0 can match annotations, commands and bind mounts, not
//! env vars, and its conditions are and-ed, so a narrower `when` would miss
//! `-e NVIDIA_VISIBLE_DEVICES=…`. A container without a GPU request costs one hook
//! process that reads `config.json` and exits.
//!
//! Config keys, as NVIDIA's hook reads them:
//! - `[nvidia-container-cli] root` (and our `dev-root`): the driver root, as for the
//!   runtime; `no-cgroups = true` skips step 2 (rootless engines); `debug`: the
//!   hook's log file, at `[nvidia-container-runtime] log-level`.
//! - `[nvidia-container-cli] ldconfig`, `load-kmods`, `user`, `path`, `environment`,
//!   `no-pivot`: accepted and ignored. No ldconfig runs (the cache is written
//!   natively, see `rootfs::linker`), no kernel module is loaded (the driver must be
//!   up), and there is no separate CLI process to configure.
//! - `[nvidia-container-runtime-hook] path` is for the runtime's legacy mode;
//!   `skip-mode-detection` is accepted and has no effect: the hook works in every mode.

pub mod apply;
pub mod cgroup;
pub mod entry;
mod host;
pub mod link;
pub mod mounts;
mod nodes;
pub mod ns;
pub mod params;
pub mod privileges;
pub mod stages;
mod syscalls;
pub mod systemd_scope;

use std::path::PathBuf;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::stat::Mode;

use crate::bundle::{self, Bundle, BundleError};
use crate::config::Config;
use crate::container::{self, ContainerError, Front, Planned};
use crate::inject;
use crate::pipeline::NvmlAccess;
use crate::rootfs::RootfsError;
use apply::Applied;
use cgroup::{CgroupError, CharDevice, Granted};

/// What the hook decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookOutcome {
    /// Our runtime already injected the GPUs.
    AlreadyInjected,
    /// The container asks for no GPU.
    NoGpuRequested,
    /// The request needs NVML, which this process does not load: nothing was done, and
    /// the caller hands the state to `nvshim runtime-hook` ([`container::NVML_HELPER`]).
    NeedsNvml { reason: &'static str },
    /// The hook injected the GPUs.
    Injected(Box<Injected>),
}

/// What an injection did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Injected {
    /// The request, as `NVIDIA_VISIBLE_DEVICES` would spell it.
    pub devices: String,
    pub applied: Applied,
    /// `None` with `no-cgroups`.
    pub cgroup: Option<Granted>,
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Container(#[from] ContainerError),
    #[error("the OCI state has no pid: run this as a prestart hook of a container being created")]
    NoPid,
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error(
        "setns needs a single-threaded process, and this one has {} threads",
        count.map_or("an unknown number of".to_string(), |n| n.to_string())
    )]
    Threads { count: Option<usize> },
    #[error(
        "process {pid} of the OCI state shares this hook's mount namespace, so it is not a \
         container being created; refusing to mount into the host"
    )]
    SameNamespace { pid: i32 },
    #[error("cannot enter the container's mount namespace {path}: {source}")]
    Namespace {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot open the container's rootfs {path}: {source}")]
    OpenRoot {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("cannot open {path} on the host: {source}")]
    Source {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("{path} on the host is {found}, which cannot be injected")]
    SourceKind { path: PathBuf, found: &'static str },
    #[error("device node {path} is {found} now, but was {planned} when planned")]
    NodeChanged {
        path: PathBuf,
        planned: String,
        found: String,
    },
    #[error("cannot clone the mount of {path} (open_tree, Linux 5.2+): {source}")]
    Clone {
        path: PathBuf,
        #[source]
        source: Errno,
    },
    #[error("mount of {target}: unsupported option {option:?}")]
    MountOption { target: PathBuf, option: String },
    #[error("cannot bind-mount {source_path} onto {target} in the container ({step}): {source}")]
    Mount {
        source_path: PathBuf,
        target: PathBuf,
        step: &'static str,
        #[source]
        source: Errno,
    },
    #[error(transparent)]
    Rootfs(#[from] RootfsError),
    #[error(transparent)]
    Params(#[from] params::ParamsError),
    #[error("device cgroup: {0}")]
    Cgroup(#[from] CgroupError),
    #[error(transparent)]
    Stage(#[from] stages::StageError),
}

/// The prestart stage: `state` is the OCI state JSON the runtime writes to the hook's
/// stdin. Must run in a single-threaded process (it `setns`es); leaves the process in
/// the container's mount namespace when it injected.
pub fn prestart(state: &[u8], config: &Config, nvml: NvmlAccess) -> Result<HookOutcome, HookError> {
    let started = Instant::now();
    let state = bundle::parse_state(state)?;
    let loaded = Bundle::new(&state.bundle).load()?;
    let doc = &loaded.doc;
    if inject::is_marked(doc.value()) {
        tracing::debug!(id = %state.id, "already injected by the runtime");
        return Ok(HookOutcome::AlreadyInjected);
    }
    let Some(request) = container::request(doc, config)? else {
        tracing::debug!(id = %state.id, "no GPU requested");
        return Ok(HookOutcome::NoGpuRequested);
    };
    let pid = state.pid.ok_or(HookError::NoPid)?;
    // Opened (and checked to be another namespace) before anything is done for the pid.
    let namespace = ns::MountNamespace::open(pid)?;
    let root = doc.root_path().ok_or(HookError::NoRoot)?;
    // runc gives the bundle as an absolute path; the rootfs is relative to it.
    let rootfs = std::path::absolute(state.bundle.join(root)).map_err(|e| HookError::Source {
        path: state.bundle.join(root),
        source: e.raw_os_error().map_or(Errno::EINVAL, Errno::from_raw),
    })?;

    // CDI names are planned in memory: a spec file's hooks could not run from here.
    let plan = match container::plan(&request, config, Front::Hook, nvml)? {
        Planned::Ready(plan) => *plan,
        Planned::NeedsNvml { reason } => return Ok(HookOutcome::NeedsNvml { reason }),
    };
    phase("planned", started);
    for missing in &plan.missing {
        tracing::debug!(what = %missing.what, needed_for = %missing.needed_for, "not on this host, skipped");
    }
    let sources = host::open(&plan.edits)?;
    phase("host sources opened", started);
    let devices: Vec<CharDevice> = sources
        .nodes
        .iter()
        .map(|n| CharDevice {
            major: n.major,
            minor: n.minor,
        })
        .collect();

    let cgroup = if config.nvidia_container_cli.no_cgroups {
        tracing::debug!("no-cgroups: device cgroup left alone");
        None
    } else {
        let granted = cgroup::grant(pid, &devices)?;
        persist_for_systemd(&granted, &devices, config);
        Some(granted)
    };
    let user = ns::user_namespace(pid);
    phase("device cgroup", started);
    namespace.enter()?;
    // Device nodes get the host's permission bits exactly.
    nix::sys::stat::umask(Mode::empty());
    let files = apply::Files {
        symlinks: &plan.symlinks,
        ldcache: &plan.ldcache,
        compat_host: plan
            .driver
            .as_ref()
            .filter(|_| crate::rootfs::compat::enabled(config)),
    };
    let applied = apply::apply(&rootfs, &sources, files, user)?;
    if container::covers_params(config) {
        let root = nix::fcntl::open(
            &rootfs,
            nix::fcntl::OFlag::O_PATH
                | nix::fcntl::OFlag::O_DIRECTORY
                | nix::fcntl::OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(|source| HookError::OpenRoot {
            path: rootfs.clone(),
            source,
        })?;
        let covered = params::cover(std::os::fd::AsFd::as_fd(&root))?;
        tracing::debug!(
            covered,
            "driver params: ModifyDeviceFiles 0 in the container"
        );
    }
    phase("applied in the container", started);
    tracing::info!(
        id = %state.id,
        devices = %request.devices,
        mounts = applied.mounts,
        nodes = applied.nodes_created + applied.nodes_mounted + applied.nodes_existing,
        elapsed_us = started.elapsed().as_micros() as u64,
        "prestart: injected"
    );
    Ok(HookOutcome::Injected(Box::new(Injected {
        devices: request.devices.to_string(),
        applied,
        cgroup,
    })))
}

/// Tells systemd the nodes just granted when the container's cgroup is a systemd scope
/// ([`systemd_scope`]). A failure is logged, not fatal: the container has its devices
/// now, and only a later systemd reload would take them away, as without the drop-in.
fn persist_for_systemd(granted: &Granted, devices: &[CharDevice], config: &Config) {
    let dir = granted
        .v1
        .as_deref()
        .or(granted.v2.as_ref().map(|(d, _)| d.as_path()));
    let Some(scope) = dir.and_then(systemd_scope::scope_name) else {
        return;
    };
    if devices.is_empty() {
        return;
    }
    if let Err(e) = systemd_scope::persist(&config.nvshim.systemd_root, scope, devices) {
        tracing::warn!("{e}: a systemd reload will drop the GPUs");
    }
}

/// A debug event with the time since `started`, for profiling the hook from its log.
fn phase(what: &'static str, started: Instant) {
    tracing::debug!(elapsed_us = started.elapsed().as_micros() as u64, "{what}");
}

//! Builds what the plugin serves from its settings, and runs it: the one call the
//! `nvidia-device-plugin` binary makes.
//!
//! Start-up is: settings → NVML → inventory → resources, health board, topology (with
//! NVLink counts) → the health thread → the gRPC server (and, with `--metrics-addr`, the
//! metrics, which sample the node's GPUs). SIGHUP does it all again from the settings
//! on, as NVIDIA's plugin does; the metrics' counters carry over. With `failOnInitError: false` a node
//! without NVML or GPUs serves nothing and stays up instead of crash-looping.
//!
//! With a `cdi-*` strategy, [`run`] keeps the CDI spec file in step with each node it
//! builds (written before the node is served, so a name `Allocate` hands out is always
//! defined) and removes it on a clean exit; see `cdi_spec`.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use super::cdi_spec::{self, CdiSpecError, DriverView, SpecFile, Synced};
use super::config::{self, PluginArgs, PluginConfigError, Settings};
use super::health::{self, HealthBoard, WatchOptions};
use super::imex::{self, ImexError};
use super::metrics::Metrics;
use super::resources::{self, Resource, ResourceError};
use super::server::{self, Node, ServerError};
use super::topology::Topology;
use nvshim::cdi::Spec;
use nvshim::inventory::{self, InventoryError, nvlink};
use nvshim::nvml::{Nvml, NvmlError};

/// Where the kernel publishes PCI devices (NUMA node, PCIe switches).
const SYSFS: &str = "/sys";
/// Which MIG capability node belongs to which GPU/compute instance.
const MIG_MINORS: &str = "/proc/driver/nvidia-caps/mig-minors";

#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error(transparent)]
    Config(#[from] PluginConfigError),
    #[error("cannot load NVML: {0} (set --fail-on-init-error=false to run without GPUs)")]
    Nvml(#[source] NvmlError),
    #[error("cannot list the GPUs: {0} (set --fail-on-init-error=false to run without GPUs)")]
    Inventory(#[source] InventoryError),
    #[error("no GPUs found (set --fail-on-init-error=false to run without GPUs)")]
    NoGpus,
    #[error(transparent)]
    Resources(#[from] ResourceError),
    #[error("cannot start the health checks thread: {0}")]
    Thread(#[source] std::io::Error),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error(transparent)]
    CdiSpec(#[from] CdiSpecError),
    #[error(transparent)]
    Imex(#[from] ImexError),
}

/// The running health thread of one [`Node`]; stopped on drop (and on rebuild).
#[derive(Debug)]
pub struct Monitor {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for Monitor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Resolves the settings, serves until SIGTERM/SIGINT/SIGQUIT, rebuilds on SIGHUP.
pub fn run(args: &PluginArgs) -> Result<(), PluginError> {
    let settings = config::resolve_from_process(args)?;
    tracing::info!(settings = %serde_json::to_string(&settings).unwrap_or_default(), "starting");
    let metrics = Metrics::for_settings(&settings).map_err(ServerError::from)?;
    let mut spec_file = SpecFile::default();
    let built = build(settings, &metrics)?;
    keep_spec(&mut spec_file, &built)?;
    let Built { node, monitor, .. } = built;
    let mut monitor = Some(monitor);
    let rebuild = || -> Result<Node, PluginError> {
        let settings = config::resolve_from_process(args)?;
        tracing::info!(settings = %serde_json::to_string(&settings).unwrap_or_default(), "restarting");
        // The old health thread keeps watching the old node until the new one is up:
        // when the rebuild fails, the server goes on serving the old node, and its
        // health must stay live. (Two NVML handles at once are fine: init is counted.)
        let built = build(settings, &metrics)?;
        // Before the new node is served: its names must resolve from the first Allocate.
        keep_spec(&mut spec_file, &built)?;
        monitor = Some(built.monitor);
        Ok(built.node)
    };
    server::run_with_metrics(node, rebuild, metrics.clone())?;
    if let Some(path) = spec_file.remove()? {
        tracing::info!(path = %path.display(), "removed the CDI spec");
    }
    Ok(())
}

/// Brings the spec file in line with `built` (see [`SpecFile::sync`]).
fn keep_spec(file: &mut SpecFile, built: &Built) -> Result<(), PluginError> {
    let dir = &built.node.settings.cdi_spec_dir;
    let synced = match file.sync(dir, built.cdi_spec.as_ref()) {
        Ok(synced) => synced,
        // Without a cdi-* strategy nothing depends on the directory: a stale spec
        // that cannot be checked or removed (an unreadable /var/run/cdi) must not
        // stop a plugin that never used it.
        Err(error) if built.cdi_spec.is_none() => {
            tracing::warn!(%error, "cannot check for a stale CDI spec");
            return Ok(());
        }
        Err(error) => return Err(error.into()),
    };
    match synced {
        Synced::Written(path) => tracing::info!(
            path = %path.display(),
            devices = built.cdi_spec.as_ref().map_or(0, |s| s.devices.len()),
            read_driver_at = %built.view.seen.driver.display(),
            host_driver_root = %built.view.host_driver.display(),
            "wrote the CDI spec"
        ),
        Synced::Unchanged(path) => {
            tracing::debug!(path = %path.display(), "the CDI spec is current")
        }
        Synced::Removed(path) => tracing::info!(
            path = %path.display(),
            "removed a stale CDI spec (no cdi-* device list strategy)"
        ),
        Synced::Absent => {}
    }
    Ok(())
}

/// Builds the [`Node`] for `settings` and starts its health thread. Without NVML or
/// GPUs this fails, unless `fail_on_init_error` is off: then the node has no
/// resources, and the reason is logged.
pub fn start(settings: Settings) -> Result<(Node, Monitor), PluginError> {
    start_with_metrics(settings, &Metrics::disabled())
}

/// [`start`], handing the node's GPUs to `metrics` to sample.
pub fn start_with_metrics(
    settings: Settings,
    metrics: &Metrics,
) -> Result<(Node, Monitor), PluginError> {
    let built = build(settings, metrics)?;
    Ok((built.node, built.monitor))
}

/// A started node, with the CDI spec for what it advertises (a `cdi-*` strategy only).
struct Built {
    node: Node,
    monitor: Monitor,
    cdi_spec: Option<Spec>,
    /// Where the driver was read, and where the host has it.
    view: DriverView,
}

fn build(settings: Settings, metrics: &Metrics) -> Result<Built, PluginError> {
    let view = DriverView::of(&settings);
    let settings = Arc::new(imex::existing(settings, &view.seen.dev)?);
    match discover(&settings, &view) {
        Ok((nvml, inventory, resources)) => {
            let cdi_spec = cdi_spec::build(&settings, &view, &inventory, &resources)?;
            let units = resources.iter().flat_map(Resource::units);
            let board = Arc::new(HealthBoard::new(units));
            let topology = Topology::load(&inventory, Path::new(SYSFS))
                .with_nvlinks(nvlink::nvlink_matrix(&nvml, &inventory));
            for resource in &resources {
                tracing::info!(resource = %resource.name, devices = resource.devices.len(), "advertising");
            }
            metrics.observe(&nvml, &inventory, &resources, &board);
            let monitor = spawn_monitor(nvml, inventory, &settings, Arc::clone(&board))?;
            let node = Node {
                settings,
                resources,
                health: board,
                topology: Arc::new(topology),
            };
            Ok(Built {
                node,
                monitor,
                cdi_spec,
                view,
            })
        }
        Err(error) if !settings.fail_on_init_error => {
            tracing::error!("{error}; serving no devices (fail-on-init-error is false)");
            metrics.forget_node();
            let node = Node {
                settings,
                resources: Vec::new(),
                health: Arc::new(HealthBoard::new([])),
                topology: Arc::new(Topology::default()),
            };
            let monitor = Monitor {
                stop: Arc::new(AtomicBool::new(true)),
                thread: None,
            };
            Ok(Built {
                node,
                monitor,
                cdi_spec: None,
                view,
            })
        }
        Err(error) => Err(error),
    }
}

type Discovered = (Arc<Nvml>, inventory::Inventory, Vec<Resource>);

/// The resources `settings` advertise on this node, from NVML: what the MPS control
/// daemon starts a daemon for, built exactly as the plugin builds them.
pub fn discover_resources(settings: &Settings) -> Result<Vec<Resource>, PluginError> {
    discover(settings, &DriverView::of(settings)).map(|(_, _, resources)| resources)
}

/// Loads NVML (found under the driver root as this process sees it) and builds the
/// resources.
fn discover(settings: &Settings, view: &DriverView) -> Result<Discovered, PluginError> {
    let roots = &view.seen;
    let library = settings
        .nvml_library
        .clone()
        .unwrap_or_else(|| inventory::nvml::library_path(roots));
    let nvml = Nvml::load(&library).map_err(PluginError::Nvml)?;
    let inventory = inventory::nvml::from_nvml(&nvml).map_err(PluginError::Inventory)?;
    if inventory.gpus.is_empty() {
        return Err(PluginError::NoGpus);
    }
    let mig_minors = std::fs::read_to_string(MIG_MINORS).ok();
    let resources = resources::build_with_mig_minors(
        &inventory,
        settings,
        Path::new(SYSFS),
        mig_minors.as_deref(),
    )?;
    Ok((Arc::new(nvml), inventory, resources))
}

fn spawn_monitor(
    nvml: Arc<Nvml>,
    inventory: inventory::Inventory,
    settings: &Settings,
    board: Arc<HealthBoard>,
) -> Result<Monitor, PluginError> {
    let stop = Arc::new(AtomicBool::new(false));
    let checks = settings.health_checks.clone();
    let flag = Arc::clone(&stop);
    let thread = std::thread::Builder::new()
        .name("health".into())
        .spawn(move || {
            let options = WatchOptions::default();
            if let Err(error) = health::run(&nvml, &inventory, &checks, &board, &flag, &options) {
                tracing::warn!("{error}");
            }
        })
        .map_err(PluginError::Thread)?;
    Ok(Monitor {
        stop,
        thread: Some(thread),
    })
}

//! `plan()`: the one path from a request to container edits, shared by the runtime,
//! the prestart hook and `nvshim list`.
//!
//! inventory → select → discover → edits. The only policy decisions live here:
//! which backend `auto` means for this request, and which missing host files are
//! fatal. A `void` request touches nothing on the host at all.

use std::fs;

use serde::Serialize;

use crate::cdi::ContainerEdits;
use crate::discover::{self, HostResources, Missing, Want};
use crate::edits::{self, Settings};
use crate::inventory::{self, Backend, DriverInfo, Inventory, Source};
use crate::request::{DeviceId, DeviceList, Request};
use crate::roots::Roots;
use crate::select::{self, Selection};

/// Everything about the host a plan needs; built once per process.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub roots: Roots,
    pub source: Source,
    pub edits: Settings,
}

/// The outcome of planning one request; `nvshim list --json` prints this.
#[derive(Debug, Clone, Serialize)]
pub struct Plan {
    pub request: Request,
    /// The backend that filled the inventory (`None` for a void request).
    pub backend: Option<Backend>,
    pub driver: Option<DriverInfo>,
    pub selection: Selection,
    pub edits: ContainerEdits,
    /// Optional things the host lacks (shown by `nvshim list`, logged by the runtime).
    pub missing: Vec<Missing>,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    #[error(transparent)]
    Select(#[from] select::SelectError),
    #[error(transparent)]
    Discover(#[from] discover::DiscoverError),
    #[error("{what} is needed for {needed_for} but {}", detail.as_deref().unwrap_or("does not exist on the host"))]
    MissingRequired {
        what: String,
        needed_for: String,
        detail: Option<String>,
    },
}

/// Plans `request` on the host described by `ctx`.
pub fn plan(ctx: &Context, request: &Request) -> Result<Plan, PipelineError> {
    if request.devices == DeviceList::Void {
        return Ok(Plan {
            request: request.clone(),
            backend: None,
            driver: None,
            selection: Selection::default(),
            edits: ContainerEdits::default(),
            missing: Vec::new(),
        });
    }
    let (backend, inventory) = load_inventory(ctx, &request.devices)?;
    let selection = select::resolve(&request.devices, &inventory)?;
    let resources = discover::discover(
        &ctx.roots,
        Want {
            driver_version: &inventory.driver.version,
            capabilities: request.capabilities,
            selection: &selection,
        },
    )?;
    let HostResources { missing, .. } = &resources;
    if let Some(m) = missing.iter().find(|m| m.required) {
        return Err(PipelineError::MissingRequired {
            what: m.what.clone(),
            needed_for: m.needed_for.clone(),
            detail: m.detail.clone(),
        });
    }
    let edits = edits::build(&resources, &ctx.edits);
    tracing::debug!(
        devices = %request.devices,
        capabilities = %request.capabilities,
        %backend,
        nodes = edits.device_nodes.len(),
        mounts = edits.mounts.len(),
        hooks = edits.hooks.len(),
        "planned container edits"
    );
    Ok(Plan {
        request: request.clone(),
        backend: Some(backend),
        driver: Some(inventory.driver),
        selection,
        missing: resources.missing,
        edits,
    })
}

/// Loads the inventory, resolving `auto`: procfs (no NVML initialisation) unless the
/// request names MIG devices, or asks for `all` on a node where MIG instances exist.
pub fn load_inventory(
    ctx: &Context,
    devices: &DeviceList,
) -> Result<(Backend, Inventory), PipelineError> {
    let load = |backend| {
        let source = Source {
            backend,
            ..ctx.source.clone()
        };
        inventory::load(&ctx.roots, &source).map(|inv| (backend, inv))
    };
    match ctx.source.backend {
        Backend::Procfs => Ok(load(Backend::Procfs)?),
        Backend::Nvml => Ok(load(Backend::Nvml)?),
        Backend::Auto if names_mig(devices) => Ok(load(Backend::Nvml)?),
        Backend::Auto => {
            let (backend, inventory) = load(Backend::Procfs)?;
            if *devices == DeviceList::All && has_mig_instances(&ctx.roots, &inventory) {
                return Ok(load(Backend::Nvml)?);
            }
            Ok((backend, inventory))
        }
    }
}

fn names_mig(devices: &DeviceList) -> bool {
    let DeviceList::Ids(ids) = devices else {
        return false;
    };
    ids.iter().any(|id| match id {
        DeviceId::MigIndex { .. } | DeviceId::MigUuid(_) | DeviceId::MigLegacy { .. } => true,
        DeviceId::Cdi { name, .. } => {
            name.contains(':') || name.to_ascii_uppercase().starts_with("MIG-")
        }
        DeviceId::Index(_) | DeviceId::GpuUuid(_) | DeviceId::BusId(_) => false,
    })
}

/// The driver lists each created GPU instance as
/// `/proc/driver/nvidia/capabilities/gpu<minor>/mig/gi<N>`.
fn has_mig_instances(roots: &Roots, inventory: &Inventory) -> bool {
    inventory.gpus.iter().any(|gpu| {
        let dir = roots.proc.join(format!(
            "proc/driver/nvidia/capabilities/gpu{}/mig",
            gpu.minor
        ));
        fs::read_dir(dir).is_ok_and(|mut entries| {
            entries.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("gi")))
        })
    })
}

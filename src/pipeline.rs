//! `plan()`: the one path from a request to container edits, shared by the runtime,
//! the prestart hook (both through `container`), `nvshim list` and `cdi generate`.
//!
//! inventory → select → discover → edits, in two halves: [`stage`] splits the request
//! between CDI spec files and the host and loads what it can without NVML, so that
//! whether NVML is needed is known ([`Staged::needs_nvml`]) before anything is planned;
//! [`finish`] does the rest. The only policy decisions live here: which backend `auto`
//! means for this request, and which missing host files are fatal. A `void` request
//! touches nothing on the host at all.

pub mod csv;
mod mig_access;

use std::fs;
use std::path::PathBuf;

use serde::Serialize;

use crate::cdi::{self, ContainerEdits};
use crate::discover::{self, Missing, SymlinkEdit, Want};
use crate::edits;
use crate::inventory::{self, Backend, DriverInfo, Inventory, Source};
use crate::ldcache;
use crate::request::{DeviceId, DeviceList, Request};
use crate::roots::Roots;
use crate::select::{self, Facts, GpuFacts, Selection};

mod classes;

/// Everything about the host a plan needs; built once per process.
#[derive(Debug, Clone, Default)]
pub struct Context {
    pub roots: Roots,
    pub source: Source,
    /// Whether this process may load NVML.
    pub nvml: NvmlAccess,
    /// Whether CDI names are looked up in spec files, and where.
    pub cdi: CdiFiles,
}

/// How CDI device names (`nvidia.com/gpu=0`) are resolved: from the spec files in
/// `modes.cdi.spec-dirs`, or in memory from this host (JIT), as the config's `mode`
/// says. Only requests that name CDI devices read the spec directories.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum CdiFiles {
    /// JIT only (`mode = "jit-cdi"`, the prestart hook, `nvshim list`): our kinds
    /// (`nvidia.com/gpu`, …) are planned from this host, other kinds are an error.
    #[default]
    Never,
    /// `mode = "auto"`: a name a spec file defines comes from that file; otherwise
    /// our kinds are planned in memory.
    Prefer(Vec<PathBuf>),
    /// `mode = "cdi"`: every device must be defined by a spec file; ids that are not
    /// CDI names (`0`, `GPU-…`, `all`) are read as names of `default_kind`
    /// (`modes.cdi.default-kind`), as NVIDIA's runtime does.
    Only {
        dirs: Vec<PathBuf>,
        default_kind: String,
    },
}

/// Whether the planning process may load `libnvidia-ml.so.1` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NvmlAccess {
    /// dlopen NVML here when the request needs it.
    #[default]
    InProcess,
    /// Never load NVML here. The front ends ask [`Staged::needs_nvml`] first and hand
    /// such a request to a process that may (see `container`); [`finish`] refuses one
    /// with [`PipelineError::NeedsNvml`] all the same. The runtime and the hook are
    /// static binaries for start-up speed, and a static glibc program must not dlopen a
    /// library linked against the host's shared glibc.
    Elsewhere,
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
    /// The entries the container's `ld.so.cache` needs for the injected libraries
    /// (written into the rootfs on the host side; see `rootfs::linker`).
    pub ldcache: Vec<ldcache::Entry>,
    /// The driver's symlinks to create in the rootfs (on the host side, like the cache).
    pub symlinks: Vec<SymlinkEdit>,
    /// Optional things the host lacks (shown by `nvshim list`, logged by the runtime).
    pub missing: Vec<Missing>,
    /// The host driver lets NVML create device nodes (`ModifyDeviceFiles: 1` in its
    /// params): the front ends cover the container's copy of that file (see
    /// `hook::params`).
    pub modify_device_files: bool,
    /// The CDI names whose edits came from spec files (their edits are in `edits`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cdi_devices: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error(transparent)]
    Inventory(#[from] inventory::InventoryError),
    #[error(transparent)]
    Select(#[from] select::SelectError),
    #[error(transparent)]
    Discover(#[from] discover::DiscoverError),
    #[error(transparent)]
    CdiSpec(#[from] Box<cdi::RegistryError>),
    #[error("invalid CDI device name: {0}")]
    CdiName(#[from] cdi::CdiNameError),
    #[error("this request needs NVML ({reason}) and this process does not load it")]
    NeedsNvml { reason: &'static str },
    #[error("{what} is needed for {needed_for} but {}", detail.as_deref().unwrap_or("does not exist on the host"))]
    MissingRequired {
        what: String,
        needed_for: String,
        detail: Option<String>,
    },
    #[error(transparent)]
    ClassName(crate::request::RequestError),
    #[error("cannot create the IMEX channel nodes: {0}")]
    ImexChannels(#[source] crate::device_nodes::DeviceNodesError),
    #[error(
        "on WSL2 one device node (/dev/dxg) serves every GPU, so a container gets all {total} \
         GPUs or none: {devices} selects {selected} (use all, as NVIDIA's toolkit requires there)"
    )]
    WslPartial {
        devices: String,
        selected: usize,
        total: usize,
    },
    #[error(transparent)]
    Csv(#[from] discover::csv::CsvError),
}

/// Fails on the first missing host resource the container cannot work without.
fn require_all(missing: &[Missing]) -> Result<(), PipelineError> {
    match missing.iter().find(|m| m.required) {
        Some(m) => Err(PipelineError::MissingRequired {
            what: m.what.clone(),
            needed_for: m.needed_for.clone(),
            detail: m.detail.clone(),
        }),
        None => Ok(()),
    }
}

/// Plans `request` on the host described by `ctx`: [`stage`], then [`finish`].
pub fn plan(ctx: &Context, request: &Request) -> Result<Plan, PipelineError> {
    let staged = stage(ctx, request)?;
    finish(ctx, staged)
}

/// The first half of planning: the request split between CDI spec files and the host,
/// the spec files' edits resolved, and the inventory loaded where procfs can give it.
/// [`Staged::needs_nvml`] then says, before NVML is touched, whether the rest does.
#[derive(Debug)]
pub struct Staged {
    request: Request,
    /// The edits and names of the devices spec files define.
    files: Option<(ContainerEdits, Vec<String>)>,
    /// The part of the request planned from this host (`None`: all of it), and its
    /// inventory.
    host: Option<(Option<Request>, Inventorying)>,
}

impl Staged {
    /// Why the rest of the plan needs NVML, if it does: a process that may not load it
    /// hands the request on instead of calling [`finish`].
    pub fn needs_nvml(&self) -> Option<&'static str> {
        match &self.host {
            Some((_, Inventorying::Nvml { reason })) => Some(reason),
            _ => None,
        }
    }
}

/// Where a request's inventory comes from, decided before NVML is loaded.
#[derive(Debug)]
pub enum Inventorying {
    /// Loaded already (from procfs, or given).
    Loaded(Backend, Inventory),
    /// Only NVML can give it, for `reason`.
    Nvml { reason: &'static str },
}

/// Splits `request` and loads what it needs short of NVML (see [`Staged`]). A `void`
/// request touches nothing on the host.
pub fn stage(ctx: &Context, request: &Request) -> Result<Staged, PipelineError> {
    let mut staged = Staged {
        request: request.clone(),
        files: None,
        host: None,
    };
    if request.devices == DeviceList::Void {
        return Ok(staged);
    }
    let mut rest = match from_spec_files(ctx, request)? {
        None => None,
        Some(FromFiles { edits, names, rest }) => {
            staged.files = Some((edits, names));
            if rest.is_empty() {
                return Ok(staged);
            }
            Some(Request {
                devices: DeviceList::Ids(rest),
                ..request.clone()
            })
        }
    };
    if let DeviceList::Ids(ids) = &rest.as_ref().unwrap_or(request).devices
        && let Some(jit) = classes::plan_names(ctx, request, ids)?
    {
        match &mut staged.files {
            Some((edits, names)) => {
                edits.merge(&jit.edits);
                names.extend(jit.names);
            }
            None => staged.files = Some((jit.edits, jit.names)),
        }
        if jit.rest.is_empty() {
            return Ok(staged);
        }
        rest = Some(Request {
            devices: DeviceList::Ids(jit.rest),
            ..request.clone()
        });
    }
    let inventory = inventory_for(ctx, rest.as_ref().unwrap_or(request))?;
    staged.host = Some((rest, inventory));
    Ok(staged)
}

/// The second half of planning: loads NVML where [`Staged::needs_nvml`] says so (an
/// error in a process with [`NvmlAccess::Elsewhere`]), plans the host's part and merges
/// in the spec files' edits.
pub fn finish(ctx: &Context, staged: Staged) -> Result<Plan, PipelineError> {
    let Staged {
        request,
        files,
        host,
    } = staged;
    let mut plan = match host {
        Some((rest, inventorying)) => {
            let (backend, inventory) = complete(ctx, inventorying)?;
            let mut plan = plan_on(ctx, rest.as_ref().unwrap_or(&request), backend, inventory)?;
            if rest.is_some() {
                plan.request = request;
            }
            plan
        }
        None => empty(&request),
    };
    if let Some((edits, cdi_devices)) = files {
        tracing::debug!(devices = ?cdi_devices, "CDI devices from spec files");
        plan.edits.merge(&edits);
        plan.cdi_devices = cdi_devices;
    }
    mig_access::add(&ctx.roots, &mut plan)?;
    Ok(plan)
}

/// The plan that changes nothing (a `void` request, or one spec files fully define).
fn empty(request: &Request) -> Plan {
    Plan {
        request: request.clone(),
        backend: None,
        driver: None,
        selection: Selection::default(),
        edits: ContainerEdits::default(),
        ldcache: Vec::new(),
        symlinks: Vec::new(),
        missing: Vec::new(),
        modify_device_files: false,
        cdi_devices: Vec::new(),
    }
}

/// The part of a request that CDI spec files define.
struct FromFiles {
    edits: ContainerEdits,
    /// The qualified names the files resolved.
    names: Vec<String>,
    /// The ids left for the host.
    rest: Vec<DeviceId>,
}

/// Resolves the request's CDI names that spec files define (all of them in `cdi`
/// mode). `None` when no name comes from a file (then nothing was read but the
/// directories).
fn from_spec_files(ctx: &Context, request: &Request) -> Result<Option<FromFiles>, PipelineError> {
    let all = [DeviceId::Cdi {
        kind: String::new(),
        name: "all".to_owned(),
    }];
    let (dirs, default_kind, ids) = match (&ctx.cdi, &request.devices) {
        (CdiFiles::Never, _) => return Ok(None),
        (CdiFiles::Prefer(dirs), DeviceList::Ids(ids))
            if ids.iter().any(|id| matches!(id, DeviceId::Cdi { .. })) =>
        {
            (dirs, None, ids.as_slice())
        }
        (CdiFiles::Only { dirs, default_kind }, DeviceList::Ids(ids)) => {
            (dirs, Some(default_kind), ids.as_slice())
        }
        (CdiFiles::Only { dirs, default_kind }, DeviceList::All) => {
            (dirs, Some(default_kind), all.as_slice())
        }
        _ => return Ok(None),
    };
    let registry = cdi::Registry::load(dirs);
    let mut from_files = Vec::new();
    let mut rest = Vec::new();
    for id in ids {
        let qualified = match (id, default_kind) {
            (DeviceId::Cdi { kind, name }, _) if !kind.is_empty() => format!("{kind}={name}"),
            (DeviceId::Cdi { name, .. }, Some(default_kind)) => format!("{default_kind}={name}"),
            (id, Some(default_kind)) => format!("{default_kind}={id}"),
            (id, None) => {
                rest.push(id.clone());
                continue;
            }
        };
        let qualified: cdi::QualifiedName = qualified.parse()?;
        if default_kind.is_some() || registry.contains(&qualified) {
            from_files.push(qualified);
        } else {
            rest.push(id.clone());
        }
    }
    if from_files.is_empty() {
        return Ok(None);
    }
    let edits = registry.resolve(&from_files).map_err(Box::new)?;
    let names = from_files.iter().map(ToString::to_string).collect();
    Ok(Some(FromFiles { edits, names, rest }))
}

/// Plans `request` on an inventory already loaded (by [`load_inventory`]): what a
/// caller planning many requests on one host does (`nvshim cdi generate`).
pub fn plan_on(
    ctx: &Context,
    request: &Request,
    backend: Backend,
    inventory: Inventory,
) -> Result<Plan, PipelineError> {
    let selection = select::resolve(&request.devices, &inventory)?;
    if !request.requirements.is_empty() {
        select::check(&request.requirements, &facts(&inventory, &selection))?;
    }
    if request.classes.create_imex_channels && !request.classes.imex_channels.is_empty() {
        crate::device_nodes::create_imex_channels(&ctx.roots, &request.classes.imex_channels)
            .map_err(PipelineError::ImexChannels)?;
    }
    let want = Want {
        driver_version: &inventory.driver.version,
        capabilities: request.capabilities,
        selection: &selection,
        classes: &request.classes,
    };
    // Only an NVML inventory can be WSL's: the procfs path never looks.
    let resources = if backend == Backend::Nvml && inventory::wsl::detect(&ctx.roots) {
        let selected = selection.gpus.len() + selection.mig_devices.len();
        if selected > 0 && selection.gpus.len() < inventory.gpus.len() {
            return Err(PipelineError::WslPartial {
                devices: request.devices.to_string(),
                selected,
                total: inventory.gpus.len(),
            });
        }
        discover::wsl::discover(&ctx.roots, want)?
    } else {
        discover::discover(&ctx.roots, want)?
    };
    require_all(&resources.missing)?;
    let edits = edits::build(&resources);
    let symlinks = edits::symlinks(&resources);
    let ldcache = resources
        .files
        .iter()
        .filter_map(|f| f.ldcache.clone())
        .collect();
    tracing::debug!(
        devices = %request.devices,
        capabilities = %request.capabilities,
        %backend,
        nodes = edits.device_nodes.len(),
        mounts = edits.mounts.len(),
        "planned container edits"
    );
    Ok(Plan {
        request: request.clone(),
        backend: Some(backend),
        driver: Some(inventory.driver),
        selection,
        missing: resources.missing,
        edits,
        ldcache,
        symlinks,
        modify_device_files: modifies_device_files(&ctx.roots),
        cdi_devices: Vec::new(),
    })
}

/// Whether the host's `proc/driver/nvidia/params` says `ModifyDeviceFiles: 1`.
fn modifies_device_files(roots: &Roots) -> bool {
    let path = roots.proc.join(discover::params::PARAMS);
    crate::files::read_to_string(&path)
        .is_ok_and(|text| discover::params::modifies_device_files(&text))
}

/// What `NVIDIA_REQUIRE_*` is checked against: the driver, and each selected GPU (a
/// MIG device counts as its parent).
fn facts(inventory: &Inventory, selection: &Selection) -> Facts {
    let arch = |uuid: &str| {
        inventory
            .gpus
            .iter()
            .find(|g| g.uuid == uuid)
            .and_then(|g| g.compute_capability.clone())
    };
    let gpus = selection
        .gpus
        .iter()
        .map(|g| GpuFacts {
            id: format!("GPU {}", g.index),
            arch: arch(&g.uuid),
            brand: None,
        })
        .chain(selection.mig_devices.iter().map(|m| GpuFacts {
            id: format!("MIG device {}:{}", m.parent.index, m.index),
            arch: arch(&m.parent.uuid),
            brand: None,
        }))
        .collect();
    Facts {
        cuda_version: inventory.driver.cuda_version.clone(),
        driver_version: inventory.driver.version.clone(),
        gpus,
    }
}

/// Loads the inventory, resolving `auto` ([`inventory_for`], then NVML if needed).
pub fn load_inventory(
    ctx: &Context,
    request: &Request,
) -> Result<(Backend, Inventory), PipelineError> {
    let inventorying = inventory_for(ctx, request)?;
    complete(ctx, inventorying)
}

/// Where `request`'s inventory comes from, resolving `auto`: procfs (no NVML
/// initialisation, loaded here) unless the request needs what only NVML knows: MIG
/// devices (named, or `all` on a node where MIG instances exist), or `NVIDIA_REQUIRE_*`
/// checks (the CUDA version, the GPU arch).
pub fn inventory_for(ctx: &Context, request: &Request) -> Result<Inventorying, PipelineError> {
    let devices = &request.devices;
    let nvml = |reason| Ok(Inventorying::Nvml { reason });
    match ctx.source.backend {
        Backend::Procfs => {
            let (backend, inventory) = load(ctx, Backend::Procfs)?;
            Ok(Inventorying::Loaded(backend, inventory))
        }
        Backend::Nvml => nvml(nvml_reason(ctx, request)),
        Backend::Auto if names_mig(devices) || !request.requirements.is_empty() => {
            nvml(nvml_reason(ctx, request))
        }
        Backend::Auto => {
            let (backend, inventory) = match load(ctx, Backend::Procfs) {
                // No NVIDIA module: on WSL2 (`/dev/dxg`) only NVML lists the GPUs.
                Err(PipelineError::Inventory(inventory::InventoryError::NoDriver { .. }))
                    if inventory::wsl::dxg_present(&ctx.roots) =>
                {
                    return nvml(WSL_REASON);
                }
                loaded => loaded?,
            };
            if *devices == DeviceList::All && has_mig_instances(&ctx.roots, &inventory) {
                return nvml("MIG instances exist and all GPUs were requested");
            }
            Ok(Inventorying::Loaded(backend, inventory))
        }
    }
}

/// Why a request on WSL2 needs NVML.
const WSL_REASON: &str = "WSL2 (/dev/dxg, no /proc/driver/nvidia): only NVML lists the GPUs";

/// Why `request` needs NVML on this `ctx`, in the words a hand-over logs.
fn nvml_reason(ctx: &Context, request: &Request) -> &'static str {
    if names_mig(&request.devices) {
        "MIG devices are named"
    } else if !request.requirements.is_empty() {
        "NVIDIA_REQUIRE_* checks the CUDA version or GPU architecture"
    } else if ctx.source.backend == Backend::Nvml {
        "the inventory backend is nvml"
    } else {
        "MIG instances exist and all GPUs were requested"
    }
}

fn load(ctx: &Context, backend: Backend) -> Result<(Backend, Inventory), PipelineError> {
    let source = Source {
        backend,
        ..ctx.source.clone()
    };
    Ok((backend, inventory::load(&ctx.roots, &source)?))
}

/// The inventory `inventorying` stands for, loading NVML if it must (and may).
fn complete(
    ctx: &Context,
    inventorying: Inventorying,
) -> Result<(Backend, Inventory), PipelineError> {
    match inventorying {
        Inventorying::Loaded(backend, inventory) => Ok((backend, inventory)),
        Inventorying::Nvml { reason } if ctx.nvml == NvmlAccess::Elsewhere => {
            Err(PipelineError::NeedsNvml { reason })
        }
        Inventorying::Nvml { .. } => load(ctx, Backend::Nvml),
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

#[cfg(test)]
#[path = "pipeline_wsl_tests.rs"]
mod wsl_tests;

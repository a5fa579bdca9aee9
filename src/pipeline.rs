//! `plan()`: the one path from a request to container edits, shared by the runtime,
//! the prestart hook and `nvshim list`.
//!
//! inventory → select → discover → edits. The only policy decisions live here:
//! which backend `auto` means for this request, and which missing host files are
//! fatal. A `void` request touches nothing on the host at all.

use std::fs;
use std::path::PathBuf;

use serde::Serialize;

use crate::bundle::SpecDoc;
use crate::cdi::{self, ContainerEdits};
use crate::config::{Config, ConfigError, Mode};
use crate::discover::{self, HostResources, Missing, SymlinkEdit, Want};
use crate::edits;
use crate::inventory::{self, Backend, DriverInfo, Inventory, Source};
use crate::ldcache;
use crate::request::{ContainerInputs, DeviceId, DeviceList, InputMount, Request, RequestPolicy};
use crate::roots::Roots;
use crate::select::{self, Facts, GpuFacts, Selection};

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
    /// Never load NVML here: a request that needs it fails with
    /// [`PipelineError::NeedsNvml`] before anything is written, and the caller hands
    /// it to a process that may. The runtime is a static binary for start-up speed,
    /// and a static glibc program must not dlopen a library linked against the
    /// host's shared glibc.
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
            ldcache: Vec::new(),
            symlinks: Vec::new(),
            missing: Vec::new(),
            modify_device_files: false,
            cdi_devices: Vec::new(),
        });
    }
    if let Some(planned) = plan_from_spec_files(ctx, request)? {
        return Ok(planned);
    }
    let (backend, inventory) = load_inventory(ctx, request)?;
    plan_on(ctx, request, backend, inventory)
}

/// Resolves the request's CDI names that spec files define (all of them in `cdi`
/// mode); the rest of the request is planned from the host and the two merged.
/// `None` when no name comes from a file (then nothing was read but the directories).
fn plan_from_spec_files(ctx: &Context, request: &Request) -> Result<Option<Plan>, PipelineError> {
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
    let cdi_devices = from_files.iter().map(ToString::to_string).collect();
    let mut plan = if rest.is_empty() {
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
    } else {
        let rest = Request {
            devices: DeviceList::Ids(rest),
            ..request.clone()
        };
        let (backend, inventory) = load_inventory(ctx, &rest)?;
        Plan {
            request: request.clone(),
            ..plan_on(ctx, &rest, backend, inventory)?
        }
    };
    tracing::debug!(devices = ?cdi_devices, "CDI devices from spec files");
    plan.edits.merge(&edits);
    plan.cdi_devices = cdi_devices;
    Ok(Some(plan))
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

/// Loads the inventory, resolving `auto`: procfs (no NVML initialisation) unless the
/// request needs what only NVML knows: MIG devices (named, or `all` on a node where MIG
/// instances exist), or `NVIDIA_REQUIRE_*` checks (the CUDA version, the GPU arch).
pub fn load_inventory(
    ctx: &Context,
    request: &Request,
) -> Result<(Backend, Inventory), PipelineError> {
    let devices = &request.devices;
    let load = |backend| {
        if backend == Backend::Nvml && ctx.nvml == NvmlAccess::Elsewhere {
            let reason = if names_mig(devices) {
                "MIG devices are named"
            } else if !request.requirements.is_empty() {
                "NVIDIA_REQUIRE_* checks the CUDA version or GPU architecture"
            } else if ctx.source.backend == Backend::Nvml {
                "the inventory backend is nvml"
            } else {
                "MIG instances exist and all GPUs were requested"
            };
            return Err(PipelineError::NeedsNvml { reason });
        }
        let source = Source {
            backend,
            ..ctx.source.clone()
        };
        inventory::load(&ctx.roots, &source)
            .map(|inv| (backend, inv))
            .map_err(PipelineError::from)
    };
    match ctx.source.backend {
        Backend::Procfs => load(Backend::Procfs),
        Backend::Nvml => load(Backend::Nvml),
        Backend::Auto if names_mig(devices) || !request.requirements.is_empty() => {
            load(Backend::Nvml)
        }
        Backend::Auto => {
            let (backend, inventory) = load(Backend::Procfs)?;
            if *devices == DeviceList::All && has_mig_instances(&ctx.roots, &inventory) {
                return load(Backend::Nvml);
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

// ---- what the runtime and the hook read from config.toml and config.json ----

/// The request policy a config gives.
pub fn policy(config: &Config) -> Result<RequestPolicy, ConfigError> {
    Ok(RequestPolicy {
        accept_envvar_when_unprivileged: config
            .accept_nvidia_visible_devices_envvar_when_unprivileged,
        accept_volume_mounts: config.accept_nvidia_visible_devices_as_volume_mounts,
        swarm_resource: config
            .swarm_resource
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        supported_capabilities: config.supported_capabilities()?,
        disable_require: config.disable_require,
        annotation_prefixes: config
            .nvidia_container_runtime
            .modes
            .cdi
            .annotation_prefixes
            .clone(),
    })
}

/// The pipeline context a config gives: NVIDIA's `nvidia-container-cli.root` is the
/// driver root, and the dev root unless set apart.
pub fn context(config: &Config) -> Context {
    Context {
        roots: Roots {
            driver: config.driver_root(),
            dev: config.dev_root(),
            proc: config.nvshim.proc_root.clone(),
        },
        source: Source {
            backend: Backend::Auto,
            nvml_library: None,
        },
        nvml: NvmlAccess::InProcess,
        cdi: {
            let dirs = config.nvidia_container_runtime.modes.cdi.spec_dirs.clone();
            match config.nvidia_container_runtime.mode {
                Mode::JitCdi => CdiFiles::Never,
                Mode::Cdi => CdiFiles::Only {
                    dirs,
                    default_kind: config
                        .nvidia_container_runtime
                        .modes
                        .cdi
                        .default_kind
                        .clone(),
                },
                Mode::Auto | Mode::Legacy | Mode::Csv => CdiFiles::Prefer(dirs),
            }
        },
    }
}

/// NVIDIA's name for the hook that covers the container's driver params.
pub const PARAMS_HOOK: &str = "disable-device-node-modification";

/// Whether the config leaves the params cover on: NVIDIA's
/// `modes.jit-cdi.nvcdi-disable-hooks` turns hooks off by name, or all with `all`.
pub fn covers_params(config: &Config) -> bool {
    !config
        .nvidia_container_runtime
        .modes
        .jit_cdi
        .nvcdi_disable_hooks
        .iter()
        .any(|h| h == PARAMS_HOOK || h == "all")
}

/// What the request reads from a spec.
pub fn inputs(doc: &SpecDoc) -> ContainerInputs {
    ContainerInputs {
        env: doc.env().into_iter().map(String::from).collect(),
        mounts: doc
            .mounts()
            .into_iter()
            .map(|m| InputMount {
                destination: m.destination.to_string(),
                source: m.source.map(String::from),
            })
            .collect(),
        annotations: doc
            .annotations()
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        privileged: doc.is_privileged(),
    }
}

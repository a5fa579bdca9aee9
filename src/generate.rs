//! Builds a CDI spec for this host: what `nvshim cdi generate` writes.
//!
//! A front end like the runtime: it plans requests with `pipeline`, so a device of the
//! spec carries exactly the edits the runtime would apply for the same request. The
//! plan for `none` (driver files and control nodes, no GPU) becomes the spec-level
//! `containerEdits`; each GPU's and MIG device's plan, minus those, becomes its
//! device. The driver's symlinks and linker cache entries, which the runtime writes
//! into the rootfs itself, become one `createContainer` hook running
//! `nvidia-container-runtime-hook link-driver` (or `nvshim hook link-driver`; the names
//! and arguments are `hook_contract`'s), since CDI consumers only apply nodes, mounts,
//! env and hooks.
//!
//! A spec whose hook binary is NVIDIA's `nvidia-cdi-hook` (or `nvidia-ctk`), as
//! `nvidia-ctk cdi generate` writes it, has NVIDIA's hooks instead, so tools that read
//! specs see NVIDIA's form: `create-symlinks --link TARGET::LINK …`, `update-ldcache
//! --folder DIR …` (the directories of the cache entries) with `enable-cuda-compat`
//! between them, then
//! `disable-device-node-modification` and `update-application-profile`
//! ([`NvidiaHooks`] says which).
//!
//! Every device also sets `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's specs do: a
//! container given GPUs by CDI must not be injected a second time by a runtime or
//! hook that reads the variable.
//!
//! Lives outside `cdi` (a leaf of plain types) because it needs the pipeline.

pub mod csv;

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::str::FromStr;

use crate::cdi::{self, ContainerEdits, Device, Hook, NVIDIA_GPU_KIND, Spec};
use crate::discover::SymlinkEdit;
use crate::hook_contract::{
    self, ArgError, CDI_HOOK_BINARY, CHMOD, CREATE_SYMLINKS, CTK_BINARY,
    DISABLE_DEVICE_NODE_MODIFICATION, ENABLE_CUDA_COMPAT, HOOK_BINARY, LINK_DRIVER,
    UPDATE_APPLICATION_PROFILE, UPDATE_LDCACHE,
};
use crate::inventory::{Backend, Inventory};
use crate::ldcache::Entry;
use crate::pipeline::{self, Context, PipelineError, Plan};
use crate::request::{DeviceId, DeviceList, DriverCapabilities, Request};

/// How devices are named (`--device-name-strategy`, NVIDIA's values).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameStrategy {
    /// `0`, `1`; MIG `0:1` (GPU index : MIG index within it).
    Index,
    /// `GPU-…` and `MIG-…`.
    Uuid,
    /// `gpu0`; MIG `mig0:1`.
    TypeIndex,
}

impl NameStrategy {
    pub const VALID: &'static str = "index, uuid, type-index";
}

impl FromStr for NameStrategy {
    type Err = GenerateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "index" => Ok(Self::Index),
            "uuid" => Ok(Self::Uuid),
            "type-index" => Ok(Self::TypeIndex),
            _ => Err(GenerateError::Strategy {
                value: s.to_owned(),
            }),
        }
    }
}

impl fmt::Display for NameStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Index => "index",
            Self::Uuid => "uuid",
            Self::TypeIndex => "type-index",
        })
    }
}

/// What to generate.
#[derive(Debug, Clone)]
pub struct Options {
    /// `vendor/class` of the devices.
    pub kind: String,
    /// One device per strategy per GPU (NVIDIA's default: index and uuid).
    pub strategies: Vec<NameStrategy>,
    /// Also a device named `all` with every GPU and MIG device.
    pub all_device: bool,
    /// The binary the hook runs, an absolute host path: `nvidia-container-runtime-hook`
    /// (static; `link-driver` is one of its stages) or `nvshim` (`hook link-driver`).
    pub hook_path: String,
    /// The driver files to include; NVIDIA's specs carry the whole driver (`all`).
    pub capabilities: DriverCapabilities,
    /// Add the hook that gives containers `ModifyDeviceFiles: 0` when the host's
    /// driver says 1 (`--disable-hook disable-device-node-modification` clears it).
    pub cover_params: bool,
    /// Only the devices with these names (the device plugin: what it advertises);
    /// `None`: every GPU and MIG device. Devices left out are not planned at all.
    pub only: Option<BTreeSet<String>>,
    /// The name the hook binary is started as (the hooks' `args[0]`, which picks a
    /// multi-call binary's front end); `None`: `hook_path`'s file name. `nvshim cdi generate`
    /// run as a binary of another name sets `nvshim`, the name that takes `hook <stage>`.
    pub hook_argv0: Option<String>,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            kind: NVIDIA_GPU_KIND.to_owned(),
            strategies: vec![NameStrategy::Index, NameStrategy::Uuid],
            all_device: true,
            hook_path: format!("/usr/bin/{HOOK_BINARY}"),
            capabilities: DriverCapabilities::all(),
            cover_params: true,
            only: None,
            hook_argv0: None,
        }
    }
}

/// Which of NVIDIA's hooks a spec in NVIDIA's shape carries, beyond
/// `disable-device-node-modification` ([`Options::cover_params`]): `nvidia-ctk cdi
/// generate`'s `--disable-hook` and `--enable-hook`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvidiaHooks {
    pub create_symlinks: bool,
    pub update_ldcache: bool,
    /// `enable-cuda-compat --host-driver-version=<driver>`, between the two above.
    pub cuda_compat: bool,
    pub application_profile: bool,
    /// `chmod --mode 755 --path /dev/dri` for devices with DRM nodes (off by default,
    /// as in NVIDIA's).
    pub chmod: bool,
    /// `update-ldcache --ldconfig-path P`, as NVIDIA writes it when given (our hook
    /// runs no ldconfig).
    pub ldconfig_path: Option<String>,
}

impl Default for NvidiaHooks {
    fn default() -> Self {
        Self {
            create_symlinks: true,
            update_ldcache: true,
            cuda_compat: true,
            application_profile: true,
            chmod: false,
            ldconfig_path: None,
        }
    }
}

impl NvidiaHooks {
    /// The names `--disable-hook`/`--enable-hook` take (besides `all` for disabling).
    pub const NAMES: [&'static str; 6] = [
        CREATE_SYMLINKS,
        UPDATE_LDCACHE,
        ENABLE_CUDA_COMPAT,
        DISABLE_DEVICE_NODE_MODIFICATION,
        UPDATE_APPLICATION_PROFILE,
        CHMOD,
    ];

    /// Turns `name` on or off; `false` for a name that is not one of [`Self::NAMES`]
    /// (`disable-device-node-modification` is the caller's, in [`Options`]).
    pub fn set(&mut self, name: &str, on: bool) -> bool {
        let slot = match name {
            CREATE_SYMLINKS => &mut self.create_symlinks,
            UPDATE_LDCACHE => &mut self.update_ldcache,
            ENABLE_CUDA_COMPAT => &mut self.cuda_compat,
            UPDATE_APPLICATION_PROFILE => &mut self.application_profile,
            CHMOD => &mut self.chmod,
            _ => return false,
        };
        *slot = on;
        true
    }
}

/// Whether specs for the hook binary at `path` get NVIDIA's hooks: `nvidia-cdi-hook`
/// and `nvidia-ctk` run those, not `link-driver`.
pub fn nvidia_shape(path: &str) -> bool {
    let name = std::path::Path::new(path)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    name == CDI_HOOK_BINARY || name == CTK_BINARY
}

#[derive(Debug, thiserror::Error)]
pub enum GenerateError {
    #[error(
        "unknown device name strategy {value:?} (valid: {})",
        NameStrategy::VALID
    )]
    Strategy { value: String },
    #[error("invalid CDI kind {kind:?}: {source}")]
    Kind {
        kind: String,
        #[source]
        source: cdi::CdiNameError,
    },
    #[error("the hook path {path:?} must be absolute: runc resolves it on the host")]
    HookPath { path: String },
    #[error("no GPU found on this host: a spec needs at least one device")]
    NoGpu,
    #[error("none of the devices {wanted:?} is on this host: a spec needs at least one device")]
    NoneWanted { wanted: Vec<String> },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(transparent)]
    Hook(#[from] ArgError),
    #[error("the generated spec is not valid CDI: {0}")]
    Invalid(#[from] cdi::SpecError),
    #[error(
        "on WSL2 a spec has the device \"all\" alone (/dev/dxg serves every GPU): \
         drop --no-all-device"
    )]
    WslAllOnly,
    #[error(
        "the CSV mount specs list nothing this host has (csv mode reads devices.csv, \
         drivers.csv and l4t.csv, or the --csv.file files): a spec needs at least one device"
    )]
    NoCsvEntries,
}

/// Generates the spec for the host `ctx` describes.
pub fn generate(ctx: &Context, options: &Options) -> Result<Spec, GenerateError> {
    generate_with(ctx, options, &NvidiaHooks::default())
}

/// [`generate`] with `nvidia` saying which of NVIDIA's hooks a spec in NVIDIA's shape
/// carries.
pub fn generate_with(
    ctx: &Context,
    options: &Options,
    nvidia: &NvidiaHooks,
) -> Result<Spec, GenerateError> {
    check(options)?;
    let request = Request::new(DeviceList::All, options.capabilities);
    let (backend, inventory) = pipeline::load_inventory(ctx, &request)?;
    generate_on_with(ctx, options, nvidia, backend, &inventory)
}

/// [`generate`] for an inventory the caller already holds (the device plugin's, from
/// NVML), so the spec names exactly the GPUs and MIG devices the caller knows.
pub fn generate_on(
    ctx: &Context,
    options: &Options,
    backend: Backend,
    inventory: &Inventory,
) -> Result<Spec, GenerateError> {
    generate_on_with(ctx, options, &NvidiaHooks::default(), backend, inventory)
}

fn generate_on_with(
    ctx: &Context,
    options: &Options,
    nvidia: &NvidiaHooks,
    backend: Backend,
    inventory: &Inventory,
) -> Result<Spec, GenerateError> {
    check(options)?;
    let shape = Shape {
        options,
        nvidia: nvidia_shape(&options.hook_path).then_some(nvidia),
        driver_version: &inventory.driver.version,
    };
    if inventory.gpus.is_empty() {
        return Err(GenerateError::NoGpu);
    }
    // WSL2: one node serves every GPU, so NVIDIA's spec has the `all` device alone,
    // and neither the CUDA compat hook nor the application profile (`pkg/nvcdi/lib-wsl.go`).
    let wsl = backend == Backend::Nvml && crate::inventory::wsl::detect(&ctx.roots);
    if wsl && !options.all_device {
        return Err(GenerateError::WslAllOnly);
    }
    let caps = options.capabilities;
    let wanted = |name: &str| options.only.as_ref().is_none_or(|only| only.contains(name));
    let planner = Planner {
        ctx,
        backend,
        inventory,
        caps,
    };
    let common = planner.plan(DeviceList::None)?;
    let mut shared = common.edits.clone();
    shared
        .env
        .push(format!("{}=void", crate::request::ENV_VISIBLE_DEVICES));
    shared
        .hooks
        .extend(shape.hooks(&common.symlinks, &common.ldcache, !wsl)?);
    if common.modify_device_files && options.cover_params {
        shared.hooks.push(stage_hook(
            options,
            DISABLE_DEVICE_NODE_MODIFICATION,
            Vec::new(),
        ));
    }
    if shape.nvidia.is_some_and(|n| n.application_profile) && !wsl {
        shared
            .hooks
            .push(stage_hook(options, UPDATE_APPLICATION_PROFILE, Vec::new()));
    }

    let mut devices = Vec::new();
    for gpu in inventory.gpus.iter().filter(|_| !wsl) {
        let names: Vec<String> = options
            .strategies
            .iter()
            .map(|strategy| match strategy {
                NameStrategy::Index => gpu.index.to_string(),
                NameStrategy::Uuid => gpu.uuid.clone(),
                NameStrategy::TypeIndex => format!("gpu{}", gpu.index),
            })
            .filter(|name| wanted(name))
            .collect();
        if !names.is_empty() {
            let plan = planner.plan(DeviceList::Ids(vec![DeviceId::Index(gpu.index)]))?;
            let edits = own_edits(&shape, &common, &plan)?;
            devices.extend(names.into_iter().map(|name| device(name, &edits)));
        }
        for mig in &gpu.mig_devices {
            let names: Vec<String> = options
                .strategies
                .iter()
                .map(|strategy| match strategy {
                    NameStrategy::Index => format!("{}:{}", gpu.index, mig.index),
                    NameStrategy::Uuid => mig.uuid.clone(),
                    NameStrategy::TypeIndex => format!("mig{}:{}", gpu.index, mig.index),
                })
                .filter(|name| wanted(name))
                .collect();
            if names.is_empty() {
                continue;
            }
            let id = DeviceId::MigIndex {
                gpu: gpu.index,
                mig: mig.index,
            };
            let plan = planner.plan(DeviceList::Ids(vec![id]))?;
            let edits = own_edits(&shape, &common, &plan)?;
            devices.extend(names.into_iter().map(|name| device(name, &edits)));
        }
    }
    // No naming strategy at all asks for the `all` device alone (NVIDIA's management
    // mode).
    let only_all = (options.strategies.is_empty() || wsl) && options.all_device;
    if devices.is_empty() && !only_all {
        return Err(GenerateError::NoneWanted {
            wanted: options.only.iter().flatten().cloned().collect(),
        });
    }
    if options.all_device {
        let plan = planner.plan(DeviceList::All)?;
        devices.push(device(
            "all".to_owned(),
            &own_edits(&shape, &common, &plan)?,
        ));
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: options.kind.clone(),
        annotations: Default::default(),
        devices,
        container_edits: shared,
    };
    spec.cdi_version = cdi::minimum_version(&spec).to_owned();
    cdi::spec::validate(&spec)?;
    Ok(spec)
}

/// What is wrong with `options` before any host is looked at.
fn check(options: &Options) -> Result<(), GenerateError> {
    cdi::name::parse_kind(&options.kind).map_err(|source| GenerateError::Kind {
        kind: options.kind.clone(),
        source,
    })?;
    if !options.hook_path.starts_with('/') {
        return Err(GenerateError::HookPath {
            path: options.hook_path.clone(),
        });
    }
    Ok(())
}

struct Planner<'a> {
    ctx: &'a Context,
    backend: Backend,
    inventory: &'a Inventory,
    caps: DriverCapabilities,
}

impl Planner<'_> {
    fn plan(&self, devices: DeviceList) -> Result<Plan, PipelineError> {
        let request = Request::new(devices, self.caps);
        pipeline::plan_on(self.ctx, &request, self.backend, self.inventory.clone())
    }
}

/// What `plan` adds to the common plan: its own device nodes and mounts, and a hook
/// for any link or cache entry the common plan lacks.
fn own_edits(
    shape: &Shape<'_>,
    common: &Plan,
    plan: &Plan,
) -> Result<ContainerEdits, GenerateError> {
    let nodes: HashSet<&str> = common
        .edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    let mounts: HashSet<&str> = common
        .edits
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    let links: Vec<SymlinkEdit> = plan
        .symlinks
        .iter()
        .filter(|l| !common.symlinks.contains(l))
        .cloned()
        .collect();
    let entries: Vec<Entry> = plan
        .ldcache
        .iter()
        .filter(|e| !common.ldcache.contains(e))
        .cloned()
        .collect();
    let mut edits = ContainerEdits {
        device_nodes: plan
            .edits
            .device_nodes
            .iter()
            .filter(|n| !nodes.contains(n.path.as_str()))
            .cloned()
            .collect(),
        mounts: plan
            .edits
            .mounts
            .iter()
            .filter(|m| !mounts.contains(m.container_path.as_str()))
            .cloned()
            .collect(),
        hooks: shape.hooks(&links, &entries, false)?,
        ..ContainerEdits::default()
    };
    if shape.nvidia.is_some_and(|n| n.chmod)
        && edits
            .device_nodes
            .iter()
            .any(|n| n.path.starts_with("/dev/dri/"))
    {
        edits.hooks.push(stage_hook(
            shape.options,
            CHMOD,
            ["--mode", "755", "--path", "/dev/dri"]
                .map(str::to_owned)
                .to_vec(),
        ));
    }
    edits.normalise();
    Ok(edits)
}

fn device(name: String, edits: &ContainerEdits) -> Device {
    Device {
        name,
        annotations: Default::default(),
        container_edits: edits.clone(),
    }
}

/// How the hooks of a spec are written: ours (`link-driver`) or NVIDIA's.
struct Shape<'a> {
    options: &'a Options,
    /// `Some` for NVIDIA's hooks.
    nvidia: Option<&'a NvidiaHooks>,
    driver_version: &'a str,
}

impl Shape<'_> {
    /// The `createContainer` hooks for `links` and `entries` (none if there are none):
    /// one `link-driver`, or NVIDIA's `create-symlinks` and `update-ldcache` (with
    /// `enable-cuda-compat` between them in the spec-level edits, when enabled).
    fn hooks(
        &self,
        links: &[SymlinkEdit],
        entries: &[Entry],
        common: bool,
    ) -> Result<Vec<Hook>, GenerateError> {
        let options = self.options;
        let Some(nvidia) = self.nvidia else {
            if links.is_empty() && entries.is_empty() {
                return Ok(Vec::new());
            }
            // `nvshim hook link-driver …`, or `nvidia-container-runtime-hook link-driver …`
            // (the static binary packages install: no loader, so no preload can reach it).
            let args = hook_contract::encode_link_driver(links, entries)?;
            return Ok(vec![stage_hook(options, LINK_DRIVER, args)]);
        };
        let mut hooks = Vec::new();
        if nvidia.create_symlinks && !links.is_empty() {
            let args = hook_contract::create_symlinks_args(links)?;
            hooks.push(stage_hook(options, CREATE_SYMLINKS, args));
        }
        if common && nvidia.cuda_compat && !self.driver_version.is_empty() {
            let arg = format!("--host-driver-version={}", self.driver_version);
            hooks.push(stage_hook(options, ENABLE_CUDA_COMPAT, vec![arg]));
        }
        let folders: BTreeSet<&str> = entries
            .iter()
            .filter_map(|e| std::path::Path::new(&e.value).parent()?.to_str())
            .collect();
        if nvidia.update_ldcache && !folders.is_empty() {
            let mut args = hook_contract::update_ldcache_args(folders);
            if let Some(path) = &nvidia.ldconfig_path {
                args.extend(["--ldconfig-path".to_owned(), path.clone()]);
            }
            hooks.push(stage_hook(options, UPDATE_LDCACHE, args));
        }
        Ok(hooks)
    }
}

/// A `createContainer` hook running `stage` of the hook binary: `nvshim hook <stage>`
/// or `nvidia-container-runtime-hook <stage>`.
fn stage_hook(options: &Options, stage: &str, args: Vec<String>) -> Hook {
    hook_contract::stage_hook_named(
        std::path::Path::new(&options.hook_path),
        options.hook_argv0.as_deref(),
        stage,
        args,
    )
}

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
//! Every device also sets `NVIDIA_VISIBLE_DEVICES=void`, as NVIDIA's specs do: a
//! container given GPUs by CDI must not be injected a second time by a runtime or
//! hook that reads the variable.
//!
//! Lives outside `cdi` (a leaf of plain types) because it needs the pipeline.

use std::collections::{BTreeSet, HashSet};
use std::fmt;
use std::str::FromStr;

use crate::cdi::{self, ContainerEdits, Device, Hook, NVIDIA_GPU_KIND, Spec};
use crate::discover::SymlinkEdit;
use crate::hook_contract::{
    self, ArgError, DISABLE_DEVICE_NODE_MODIFICATION, HOOK_BINARY, LINK_DRIVER,
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
        }
    }
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
}

/// Generates the spec for the host `ctx` describes.
pub fn generate(ctx: &Context, options: &Options) -> Result<Spec, GenerateError> {
    check(options)?;
    let request = Request::new(DeviceList::All, options.capabilities);
    let (backend, inventory) = pipeline::load_inventory(ctx, &request)?;
    generate_on(ctx, options, backend, &inventory)
}

/// [`generate`] for an inventory the caller already holds (the device plugin's, from
/// NVML), so the spec names exactly the GPUs and MIG devices the caller knows.
pub fn generate_on(
    ctx: &Context,
    options: &Options,
    backend: Backend,
    inventory: &Inventory,
) -> Result<Spec, GenerateError> {
    check(options)?;
    if inventory.gpus.is_empty() {
        return Err(GenerateError::NoGpu);
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
        .extend(hook(options, &common.symlinks, &common.ldcache)?);
    if common.modify_device_files && options.cover_params {
        shared.hooks.push(stage_hook(
            options,
            DISABLE_DEVICE_NODE_MODIFICATION,
            Vec::new(),
        ));
    }

    let mut devices = Vec::new();
    for gpu in &inventory.gpus {
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
            let edits = own_edits(options, &common, &plan)?;
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
            let edits = own_edits(options, &common, &plan)?;
            devices.extend(names.into_iter().map(|name| device(name, &edits)));
        }
    }
    if devices.is_empty() {
        return Err(GenerateError::NoneWanted {
            wanted: options.only.iter().flatten().cloned().collect(),
        });
    }
    if options.all_device {
        let plan = planner.plan(DeviceList::All)?;
        devices.push(device(
            "all".to_owned(),
            &own_edits(options, &common, &plan)?,
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
    options: &Options,
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
        hooks: hook(options, &links, &entries)?.into_iter().collect(),
        ..ContainerEdits::default()
    };
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

/// The `createContainer` hook for `links` and `entries`, if there are any.
fn hook(
    options: &Options,
    links: &[SymlinkEdit],
    entries: &[Entry],
) -> Result<Option<Hook>, GenerateError> {
    if links.is_empty() && entries.is_empty() {
        return Ok(None);
    }
    // `nvshim hook link-driver …`, or `nvidia-container-runtime-hook link-driver …`
    // (the static binary packages install: no loader, so no preload can reach it).
    let args = hook_contract::encode_link_driver(links, entries)?;
    Ok(Some(stage_hook(options, LINK_DRIVER, args)))
}

/// A `createContainer` hook running `stage` of the hook binary: `nvshim hook <stage>`
/// or `nvidia-container-runtime-hook <stage>`.
fn stage_hook(options: &Options, stage: &str, args: Vec<String>) -> Hook {
    hook_contract::stage_hook(std::path::Path::new(&options.hook_path), stage, args)
}

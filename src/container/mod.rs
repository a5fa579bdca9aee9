//! The front half the runtime and the prestart hook share: a container's spec document
//! plus `config.toml` → the [`Request`] it makes and the [`Plan`] that meets it
//! ([`Prepared`]), or a clear "no GPU asked for", or "this needs NVML, which this
//! process does not load".
//!
//! Sits between `pipeline` (which it drives) and the front ends (`runtime`, `hook`,
//! and `nvshim runtime` / `nvshim runtime-hook`, which run the same front ends with
//! NVML allowed). Whether a request needs NVML is decided here, before anything is
//! planned or written ([`Preparation::NeedsNvml`]): the static runtime and hook then
//! hand the container to `nvshim` ([`NVML_HELPER`]) by `exec`. It reads the spec and
//! never writes it (`inject` does), and touches nothing in the container.

mod csv;
mod nvml;

use crate::bundle::SpecDoc;
use crate::config::{Config, ConfigError, Mode};
use crate::hook_contract::{self, DISABLE_DEVICE_NODE_MODIFICATION};
use crate::inventory::{Backend, Source};
use crate::pipeline::{self, CdiFiles, Context, NvmlAccess, PipelineError, Plan};
use crate::request::{
    self, ContainerInputs, DeviceList, InputMount, Request, RequestError, RequestPolicy,
};
use crate::roots::Roots;

pub use nvml::{HOOK_HELPER_COMMAND, NVML_HELPER, RUNTIME_HELPER_COMMAND};

/// Which front end prepares: they plan alike, with two differences.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Front {
    /// The runtime (`nvidia-container-runtime`, `nvshim runtime`): CDI names as the
    /// config's `mode` says; NVML bounded by `[nvshim] nvml-timeout`.
    Runtime,
    /// The prestart hook: CDI names planned in memory (a spec file's hooks could not
    /// run from a prestart hook), and no planning thread (it `setns`es next, which a
    /// multi-threaded process cannot).
    Hook,
}

/// A container's GPU request and the plan that meets it.
#[derive(Debug, Clone)]
pub struct Prepared {
    pub request: Request,
    pub plan: Plan,
}

/// What preparing a container came to.
#[derive(Debug, Clone)]
pub enum Preparation {
    /// The container asks for no GPU: nothing to do.
    NoGpu,
    /// Planning needs NVML (for `reason`) and this process does not load it: hand the
    /// container to one that does. Nothing was written.
    NeedsNvml { reason: &'static str },
    /// Ready to apply.
    Ready(Box<Prepared>),
}

/// What came of planning a request.
#[derive(Debug, Clone)]
pub enum Planned {
    NeedsNvml { reason: &'static str },
    Ready(Box<Plan>),
}

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error(
        "NVML did not list the GPUs within {seconds} s (is the driver hung? nvidia-smi would \
         hang too; the limit is [nvshim] nvml-timeout in config.toml)"
    )]
    NvmlTimeout { seconds: u64 },
    #[error("cannot start a thread to plan the request: {0}")]
    Thread(#[source] std::io::Error),
}

/// Prepares the container whose spec is `doc`, for `front`, in a process that may or
/// may not load NVML: [`request`], then [`plan`].
pub fn prepare(
    doc: &SpecDoc,
    config: &Config,
    front: Front,
    nvml: NvmlAccess,
) -> Result<Preparation, ContainerError> {
    let Some(request) = request(doc, config)? else {
        return Ok(Preparation::NoGpu);
    };
    Ok(match plan(&request, config, front, nvml)? {
        Planned::NeedsNvml { reason } => Preparation::NeedsNvml { reason },
        Planned::Ready(plan) => Preparation::Ready(Box::new(Prepared {
            request,
            plan: *plan,
        })),
    })
}

/// The GPU request `doc` makes under `config`'s policy; `None` when it asks for none
/// (`void`, or nothing at all). A part of the request the policy ignores is logged.
pub fn request(doc: &SpecDoc, config: &Config) -> Result<Option<Request>, ContainerError> {
    let request = request::build(&inputs(doc), &policy(config)?)?;
    if let Some(ignored) = &request.ignored {
        tracing::warn!("{ignored}");
    }
    if let Some(ignored) = &request.classes.ignored_imex {
        tracing::warn!("{ignored}");
    }
    for gate in &request.classes.ignored_gates {
        tracing::debug!("ignoring {gate}: only \"enabled\" turns a device class on");
    }
    Ok((request.devices != DeviceList::Void).then_some(request))
}

/// Plans `request` for `front` on the host `config` describes. With
/// [`NvmlAccess::Elsewhere`], whether NVML is needed is decided first (from procfs
/// alone) and such a request comes back as [`Planned::NeedsNvml`], unplanned.
pub fn plan(
    request: &Request,
    config: &Config,
    front: Front,
    nvml: NvmlAccess,
) -> Result<Planned, ContainerError> {
    let ctx = Context {
        nvml,
        ..context(config, front)
    };
    if let Some(source) = csv::source(config, request, &ctx.roots) {
        let plan = pipeline::csv::plan(&ctx, request, &source)?;
        return Ok(Planned::Ready(Box::new(plan)));
    }
    match (nvml, front) {
        (NvmlAccess::Elsewhere, _) => {
            let staged = pipeline::stage(&ctx, request)?;
            if let Some(reason) = staged.needs_nvml() {
                return Ok(Planned::NeedsNvml { reason });
            }
            Ok(Planned::Ready(Box::new(pipeline::finish(&ctx, staged)?)))
        }
        (NvmlAccess::InProcess, Front::Runtime) => Ok(Planned::Ready(Box::new(nvml::plan_within(
            &ctx,
            request,
            config.nvshim.nvml_timeout,
        )?))),
        (NvmlAccess::InProcess, Front::Hook) => {
            Ok(Planned::Ready(Box::new(pipeline::plan(&ctx, request)?)))
        }
    }
}

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
        ignore_imex_channel_requests: config.features.ignore_imex_channel_requests,
        create_imex_channels: !config.features.disable_imex_channel_creation,
    })
}

/// The pipeline context a config gives `front`: NVIDIA's `nvidia-container-cli.root`
/// is the driver root, and the dev root unless set apart.
pub fn context(config: &Config, front: Front) -> Context {
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
        cdi: match front {
            Front::Hook => CdiFiles::Never,
            Front::Runtime => cdi_files(config),
        },
    }
}

/// Where CDI names are looked up, as the config's `mode` says.
fn cdi_files(config: &Config) -> CdiFiles {
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
}

/// Whether the config leaves the params cover on: NVIDIA's
/// `modes.jit-cdi.nvcdi-disable-hooks` turns hooks off by name, or all with `all`.
pub fn covers_params(config: &Config) -> bool {
    !hook_contract::disables(
        &config
            .nvidia_container_runtime
            .modes
            .jit_cdi
            .nvcdi_disable_hooks,
        DISABLE_DEVICE_NODE_MODIFICATION,
    )
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

#[cfg(test)]
mod tests;

//! `nvidia-container-runtime-hook`: the OCI prestart hook docker's `--gpus` adds.
//!
//! dockerd only offers `--gpus` when a binary of this name is on PATH, and adds it
//! as a prestart hook. When our runtime created the container, the GPUs are already
//! in the spec (and the runtime removed the hook, or marked the spec), so the hook
//! has nothing to do. Injecting from the hook alone (plain runc, podman, CRI-O
//! hooks.d) is not built yet: then the hook fails and says how to use the runtime.

use crate::bundle::{self, Bundle, BundleError};
use crate::config::{Config, ConfigError};
use crate::inject::INJECTED_ANNOTATION;
use crate::pipeline;
use crate::request::{self, DeviceList, RequestError};

/// What the hook decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HookOutcome {
    /// Our runtime already injected the GPUs.
    AlreadyInjected,
    /// The container asks for no GPU.
    NoGpuRequested,
}

#[derive(Debug, thiserror::Error)]
pub enum HookError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(
        "the container asks for GPUs ({devices}) but was not created by nvidia-container-runtime, \
         and this hook cannot add GPUs on its own yet; run the container with the nvidia runtime: \
         `docker run --runtime=nvidia …`, or set \"default-runtime\": \"nvidia\" in /etc/docker/daemon.json \
         with the runtime registered as {{\"nvidia\": {{\"path\": \"/usr/bin/nvidia-container-runtime\"}}}}"
    )]
    NotInjected { devices: String },
}

/// The prestart stage: `state` is the OCI state JSON runc writes to the hook's stdin.
pub fn prestart(state: &[u8], config: &Config) -> Result<HookOutcome, HookError> {
    let state = bundle::parse_state(state)?;
    let loaded = Bundle::new(&state.bundle).load()?;
    let doc = &loaded.doc;
    if doc
        .annotations()
        .iter()
        .any(|(k, _)| *k == INJECTED_ANNOTATION)
    {
        return Ok(HookOutcome::AlreadyInjected);
    }
    let policy = pipeline::policy(config)?;
    let request = request::build(&pipeline::inputs(doc), &policy)?;
    if request.devices == DeviceList::Void {
        return Ok(HookOutcome::NoGpuRequested);
    }
    Err(HookError::NotInjected {
        devices: request.devices.to_string(),
    })
}

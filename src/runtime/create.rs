//! The shim's work on `create`/`run`: read the bundle's `config.json`, build the
//! request, plan it, apply the edits and replace the file atomically.
//!
//! A container that asks for no GPU is left alone: the file is not even rewritten.
//! Any error leaves `config.json` as it was, and the caller fails the `create`
//! instead of starting a container without the GPUs it asked for.

use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use crate::bundle::{Bundle, BundleError, SpecDoc};
use crate::cdi::Hook;
use crate::config::{Config, ConfigError};
use crate::inject::{self, Applied, INJECTED_ANNOTATION, InjectError};
use crate::pipeline::{self, NvmlAccess, PipelineError, context, inputs, policy};
use crate::request::{self, DeviceList, RequestError};
use crate::rootfs::{Rootfs, RootfsError, linker};

/// What happened to the bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No GPU requested: `config.json` was not touched.
    Untouched,
    /// The edits were applied and `config.json` replaced.
    Injected {
        devices: String,
        applied: Applied,
        removed_hooks: usize,
    },
}

#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error(transparent)]
    Bundle(#[from] BundleError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Request(#[from] RequestError),
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("cannot edit config.json: {0}")]
    Inject(#[from] InjectError),
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error("cannot make the bundle path absolute: {0}")]
    Cwd(#[source] std::io::Error),
    #[error("cannot write the driver's symlinks and linker cache into the container's rootfs: {0}")]
    Rootfs(#[from] RootfsError),
    #[error(
        "NVML did not list the GPUs within {seconds} s (is the driver hung? nvidia-smi would \
         hang too; the limit is [nvshim] nvml-timeout in config.toml)"
    )]
    NvmlTimeout { seconds: u64 },
    #[error("cannot start a thread to plan the request: {0}")]
    Thread(#[source] std::io::Error),
}

/// Edits the bundle at `dir` for `config`. With [`NvmlAccess::Elsewhere`] a request
/// that needs NVML fails with [`PipelineError::NeedsNvml`] before anything is written.
/// Meant for a process that `exec`s next: on success the spec and the plan are not
/// freed (see the end of the function).
pub fn prepare(dir: &Path, config: &Config, nvml: NvmlAccess) -> Result<Outcome, CreateError> {
    let bundle = Bundle::new(dir);
    let mut loaded = bundle.load()?;
    let request = request::build(&inputs(&loaded.doc), &policy(config)?)?;
    if let Some(ignored) = &request.ignored {
        tracing::warn!("{ignored}");
    }
    if request.devices == DeviceList::Void {
        tracing::debug!(bundle = %dir.display(), "no GPU requested; config.json left untouched");
        return Ok(Outcome::Untouched);
    }
    let ctx = pipeline::Context {
        nvml,
        ..context(config)
    };
    let plan = match nvml {
        NvmlAccess::InProcess => plan_within(&ctx, &request, config.nvshim.nvml_timeout)?,
        NvmlAccess::Elsewhere => pipeline::plan(&ctx, &request)?,
    };
    for node in &plan.edits.device_nodes {
        tracing::debug!(path = %node.path, major = ?node.major, minor = ?node.minor, "inject device node");
    }
    for mount in &plan.edits.mounts {
        tracing::debug!(destination = %mount.container_path, source = %mount.host_path, "inject mount");
    }
    for missing in &plan.missing {
        tracing::debug!(what = %missing.what, needed_for = %missing.needed_for, "not on this host, skipped");
    }

    let mut plan = plan;
    // The container's rootfs on the host, for the params hook and the linker files.
    let rootfs_dir = loaded.doc.root_path().map(|root| dir.join(root));
    if plan.modify_device_files && pipeline::covers_params(config) {
        // runc refuses mounts under /proc: a hook covers the driver's params once the
        // container's /proc is mounted (see `hook::params`).
        let rootfs = rootfs_dir.as_deref().ok_or(CreateError::NoRoot)?;
        let rootfs = std::path::absolute(rootfs).map_err(CreateError::Cwd)?;
        plan.edits.hooks.push(params_hook(&hook_binary(), &rootfs));
    }
    // Edited in place: nothing is written unless every edit applied.
    let applied = inject::apply(loaded.doc.value_mut(), &plan.edits)?;
    if !plan.ldcache.is_empty() || !plan.symlinks.is_empty() {
        let rootfs = Rootfs::open(rootfs_dir.as_deref().ok_or(CreateError::NoRoot)?)?;
        linker::install(&rootfs, &plan.symlinks, &plan.ldcache)?;
    }
    let removed_hooks = inject::remove_legacy_hooks(loaded.doc.value_mut());
    mark(&mut loaded.doc, &request.devices.to_string())?;
    bundle.save(&loaded.doc, &loaded)?;
    let outcome = Outcome::Injected {
        devices: request.devices.to_string(),
        applied,
        removed_hooks,
    };
    // The runtime execs runc next, so nothing would ever use the freed memory: freeing
    // the spec's ~2,000 JSON nodes and the plan's paths one by one costs about 15% of
    // the runtime's own instructions on an 8-GPU create (callgrind). The process image
    // is replaced instead.
    std::mem::forget(loaded);
    std::mem::forget(plan);
    Ok(outcome)
}

/// [`pipeline::plan`] on a helper thread, given at most `seconds` (0: no limit).
///
/// Only the process that loads NVML (`nvshim runtime`) plans this way: a driver that
/// hangs hangs every NVML call in it, and a runtime that never returns leaves the
/// engine's container start hanging with no error. On a timeout the thread is left
/// stuck in the driver and the process fails the `create` and exits, which ends it.
fn plan_within(
    ctx: &pipeline::Context,
    request: &request::Request,
    seconds: u64,
) -> Result<pipeline::Plan, CreateError> {
    if seconds == 0 {
        return Ok(pipeline::plan(ctx, request)?);
    }
    let (tx, rx) = mpsc::channel();
    let (ctx, request) = (ctx.clone(), request.clone());
    let worker = std::thread::Builder::new()
        .name("nvml".into())
        .spawn(move || {
            // The receiver is gone only after a timeout, when nobody wants the result.
            let _ = tx.send(pipeline::plan(&ctx, &request));
        })
        .map_err(CreateError::Thread)?;
    match rx.recv_timeout(Duration::from_secs(seconds)) {
        Ok(planned) => {
            // Joined, so the process is single-threaded again before it execs runc.
            let _ = worker.join();
            Ok(planned?)
        }
        Err(RecvTimeoutError::Timeout) => Err(CreateError::NvmlTimeout { seconds }),
        Err(RecvTimeoutError::Disconnected) => {
            // The worker ended without sending: it panicked. Carry the panic on.
            let panic = worker
                .join()
                .err()
                .unwrap_or_else(|| Box::new("the planning thread ended without a result"));
            std::panic::resume_unwind(panic)
        }
    }
}

/// The `createContainer` hook that gives the container `ModifyDeviceFiles: 0`, told
/// the rootfs (absolute) so that it reads neither its stdin nor `config.json`.
pub fn params_hook(binary: &Path, rootfs: &Path) -> Hook {
    let name = binary
        .file_name()
        .map_or_else(|| HOOK_BINARY.into(), |n| n.to_string_lossy().into_owned());
    Hook {
        hook_name: "createContainer".into(),
        path: binary.display().to_string(),
        // A rootfs path that is not UTF-8 cannot be a JSON string: the hook then finds
        // it from the OCI state.
        args: match rootfs.to_str() {
            Some(rootfs) => vec![
                name,
                pipeline::PARAMS_HOOK.into(),
                crate::hook::params::ROOTFS_FLAG.into(),
                rootfs.into(),
            ],
            None => vec![name, pipeline::PARAMS_HOOK.into()],
        },
        env: vec![crate::cdi::HOOK_ENV.into()],
        timeout: None,
    }
}

/// `nvidia-container-runtime-hook` beside the running binary (the runtime, or the
/// `nvshim` it hands NVML requests to: packages install all three in one directory).
fn hook_binary() -> PathBuf {
    crate::roots::beside_self(HOOK_BINARY)
}

const HOOK_BINARY: &str = "nvidia-container-runtime-hook";

fn mark(doc: &mut SpecDoc, devices: &str) -> Result<(), InjectError> {
    let root = doc
        .value_mut()
        .as_object_mut()
        .ok_or(InjectError::NotAnObject)?;
    let annotations = root
        .entry("annotations")
        .or_insert_with(|| serde_json::Value::Object(serde_json::Map::new()));
    if annotations.is_null() {
        *annotations = serde_json::Value::Object(serde_json::Map::new());
    }
    let map = annotations.as_object_mut().ok_or(InjectError::Shape {
        pointer: "/annotations".into(),
        expected: "an object",
        found: "not an object",
    })?;
    map.insert(
        INJECTED_ANNOTATION.into(),
        serde_json::Value::String(devices.into()),
    );
    Ok(())
}

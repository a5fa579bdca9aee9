//! The shim's work on `create`/`run`: read the bundle's `config.json`, build the
//! request, plan it, apply the edits and replace the file atomically.
//!
//! A container that asks for no GPU is left alone: the file is not even rewritten.
//! Any error leaves `config.json` as it was, and the caller fails the `create`
//! instead of starting a container without the GPUs it asked for.

use std::path::{Path, PathBuf};

use crate::bundle::{Bundle, BundleError};
use crate::cdi::{Hook, Mount};
use crate::config::{Config, DriverMounts};
use crate::container::{self, ContainerError, Front, Preparation, Prepared};
use crate::discover::SymlinkEdit;
use crate::driver_stage::{self, StageError};
use crate::hook_contract::{self, DISABLE_DEVICE_NODE_MODIFICATION, HOOK_BINARY, LINK_DRIVER};
use crate::inject::{self, Applied, InjectError};
use crate::pipeline::NvmlAccess;
use crate::rootfs::{Rootfs, RootfsError, compat, linker};

/// What happened to the bundle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// No GPU requested: `config.json` was not touched.
    Untouched,
    /// The request needs NVML, which this process does not load: nothing was written,
    /// and the caller hands the create to `nvshim runtime` ([`container::NVML_HELPER`]).
    NeedsNvml { reason: &'static str },
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
    Container(#[from] ContainerError),
    #[error("cannot edit config.json: {0}")]
    Inject(#[from] InjectError),
    #[error("config.json has no root.path: cannot find the container's rootfs")]
    NoRoot,
    #[error("cannot make the bundle path absolute: {0}")]
    Cwd(#[source] std::io::Error),
    #[error("cannot write the driver's symlinks and linker cache into the container's rootfs: {0}")]
    Rootfs(#[from] RootfsError),
    #[error("cannot pass the /dev links to the hook: {0}")]
    HookArgs(#[from] hook_contract::ArgError),
}

/// Edits the bundle at `dir` for `config`. With [`NvmlAccess::Elsewhere`] a request
/// that needs NVML comes back as [`Outcome::NeedsNvml`] before anything is written.
/// Meant for a process that `exec`s next: on success the spec and the plan are not
/// freed (see the end of the function).
pub fn prepare(dir: &Path, config: &Config, nvml: NvmlAccess) -> Result<Outcome, CreateError> {
    let bundle = Bundle::new(dir);
    let mut loaded = bundle.load()?;
    let Prepared { request, mut plan } = match container::prepare(
        &loaded.doc,
        config,
        Front::Runtime,
        nvml,
    )? {
        Preparation::Ready(prepared) => *prepared,
        Preparation::NoGpu => {
            tracing::debug!(bundle = %dir.display(), "no GPU requested; config.json left untouched");
            return Ok(Outcome::Untouched);
        }
        Preparation::NeedsNvml { reason } => return Ok(Outcome::NeedsNvml { reason }),
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

    // The container's rootfs on the host, for the params hook and the linker files.
    let rootfs_dir = loaded.doc.root_path().map(|root| dir.join(root));
    let spec_file_hooks = !plan.edits.hooks.is_empty();
    if plan.modify_device_files && container::covers_params(config) {
        // runc refuses mounts under /proc: a hook covers the driver's params once the
        // container's /proc is mounted (see `hook::params`).
        let rootfs = rootfs_dir.as_deref().ok_or(CreateError::NoRoot)?;
        let rootfs = std::path::absolute(rootfs).map_err(CreateError::Cwd)?;
        plan.edits.hooks.push(params_hook(&hook_binary(), &rootfs));
    }
    if let Some(hook) = dev_links_hook(&hook_binary(), &mut plan.symlinks)? {
        plan.edits.hooks.push(hook);
    }
    let mut rootfs = None;
    if config.nvshim.driver_mounts == DriverMounts::Staged {
        // A spec file's hooks write links of their own into the rootfs, where a
        // directory link to the stage's tree could be in their way: none then.
        let others = (!spec_file_hooks).then_some(plan.symlinks.as_slice());
        rootfs = stage_driver(
            config,
            &mut plan.edits.mounts,
            others,
            rootfs_dir.as_deref(),
        )?;
    }
    // Edited in place: nothing is written unless every edit applied.
    let applied = inject::apply(loaded.doc.value_mut(), &plan.edits)?;
    if !plan.ldcache.is_empty() || !plan.symlinks.is_empty() {
        let rootfs = match rootfs {
            Some(rootfs) => rootfs,
            None => Rootfs::open(rootfs_dir.as_deref().ok_or(CreateError::NoRoot)?)?,
        };
        let prefer = match plan.driver.as_ref().filter(|_| compat::enabled(config)) {
            Some(host) => compat::preferred(
                &rootfs,
                &host.version,
                host.cuda_version.as_deref(),
                &plan.ldcache,
            ),
            None => Vec::new(),
        };
        linker::install(&rootfs, &plan.symlinks, &plan.ldcache, &prefer)?;
    }
    let removed_hooks = inject::remove_legacy_hooks(loaded.doc.value_mut());
    let devices = request.devices.to_string();
    inject::mark(loaded.doc.value_mut(), &devices)?;
    bundle.save(&loaded.doc, &loaded)?;
    let outcome = Outcome::Injected {
        devices,
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

/// Puts the driver's read-only files into their stage (see [`driver_stage`]): the
/// symlinks go into the rootfs and `mounts` gets one bind of the stage in place of
/// theirs. A stage that cannot be had (no right to mount, a full `/run`, …) leaves the
/// per-file mounts as they are, which give the container the same files. A directory
/// the image lacks becomes one link to the stage's tree unless `soname_links` is `None`
/// (hooks of a spec file write there) or one of them is below it. Returns the rootfs
/// when it was opened.
fn stage_driver(
    config: &Config,
    mounts: &mut Vec<Mount>,
    soname_links: Option<&[SymlinkEdit]>,
    rootfs_dir: Option<&Path>,
) -> Result<Option<Rootfs>, CreateError> {
    if !mounts.iter().any(driver_stage::eligible) {
        return Ok(None);
    }
    let rootfs = Rootfs::open(rootfs_dir.ok_or(CreateError::NoRoot)?)?;
    if rootfs.is_host_root()? {
        // No links into the host's own directories: per-file mounts.
        return Ok(Some(rootfs));
    }
    let stage = match driver_stage::ensure(&config.nvshim.driver_stage_dir, mounts) {
        Ok(Some(stage)) => stage,
        Ok(None) => return Ok(Some(rootfs)),
        Err(e @ StageError::NotPermitted { .. }) => {
            tracing::debug!("{e}; per-file mounts");
            return Ok(Some(rootfs));
        }
        Err(e) => {
            tracing::warn!("{e}; the driver's files get per-file mounts instead");
            return Ok(Some(rootfs));
        }
    };
    let links = stage.symlinks();
    let links: Vec<(&Path, &str)> = links
        .iter()
        .map(|(p, t)| (p.as_path(), t.as_str()))
        .collect();
    // What else goes into the rootfs: no directory of the stage's tree may hide it.
    let others: Vec<&Path> = mounts
        .iter()
        .map(|m| Path::new(&m.container_path))
        .filter(|p| !stage.links.contains_key(*p))
        .chain(
            soname_links
                .unwrap_or_default()
                .iter()
                .map(|l| l.path.as_path()),
        )
        .chain([Path::new(linker::CACHE_PATH)])
        .collect();
    let placed = rootfs.place_links(&links, &|dir| {
        soname_links.and_then(|_| stage.dir_link(dir, &others))
    })?;
    let occupied = placed.occupied;
    for path in &occupied {
        tracing::debug!(path = %path.display(), "the image has a file here: it keeps its own bind mount");
    }
    stage.rewrite(mounts, &occupied);
    tracing::debug!(
        stage = %stage.host_dir.display(),
        built = stage.built,
        files = links.len() - occupied.len(),
        directory_links = placed.dir_links.len(),
        "driver files staged: one mount at {}",
        driver_stage::CONTAINER_DIR
    );
    Ok(Some(rootfs))
}

/// The `createContainer` hook that gives the container `ModifyDeviceFiles: 0`, told
/// the rootfs (absolute) so that it reads neither its stdin nor `config.json`.
pub fn params_hook(binary: &Path, rootfs: &Path) -> Hook {
    hook_contract::stage_hook(
        binary,
        DISABLE_DEVICE_NODE_MODIFICATION,
        hook_contract::params_args(rootfs),
    )
}

/// Takes the links under `/dev` (the DRM `by-path` links) out of `links`: written into
/// the rootfs now they would end up under the `/dev` tmpfs runc mounts, so a
/// `createContainer` hook (`link-driver`, run once that tmpfs is there) makes them, as
/// NVIDIA's `create-symlinks` hook does.
pub fn dev_links_hook(
    binary: &Path,
    links: &mut Vec<SymlinkEdit>,
) -> Result<Option<Hook>, hook_contract::ArgError> {
    let (dev, rest): (Vec<SymlinkEdit>, Vec<SymlinkEdit>) = std::mem::take(links)
        .into_iter()
        .partition(|l| l.path.starts_with("/dev"));
    *links = rest;
    if dev.is_empty() {
        return Ok(None);
    }
    let args = hook_contract::encode_link_driver(&dev, &[])?;
    Ok(Some(hook_contract::stage_hook(binary, LINK_DRIVER, args)))
}

/// `nvidia-container-runtime-hook` beside the running binary (the runtime, or the
/// `nvshim` it hands NVML requests to: packages install all three in one directory).
fn hook_binary() -> PathBuf {
    crate::roots::beside_self(HOOK_BINARY)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn links_under_dev_go_to_one_hook_and_the_rest_stay() {
        let link = |path: &str, target: &str| SymlinkEdit {
            path: path.into(),
            target: target.into(),
        };
        let mut links = vec![
            link(
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "libcuda.so.550.54.15",
            ),
            link("/dev/dri/by-path/pci-0000:07:00.0-card", "../card1"),
            link("/device/x", "y"),
        ];
        let binary = Path::new("/usr/bin/nvidia-container-runtime-hook");
        let hook = dev_links_hook(binary, &mut links).unwrap().unwrap();
        assert_eq!(
            links
                .iter()
                .map(|l| l.path.to_str().unwrap())
                .collect::<Vec<_>>(),
            ["/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/device/x"]
        );
        assert_eq!(hook.path, binary.display().to_string());
        let args = hook.args;
        assert_eq!(args[1], LINK_DRIVER);
        assert!(
            args.iter()
                .any(|a| a == "../card1::/dev/dri/by-path/pci-0000:07:00.0-card"),
            "{args:?}"
        );
        assert!(dev_links_hook(binary, &mut links).unwrap().is_none());
    }
}

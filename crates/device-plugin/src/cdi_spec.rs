// SPDX-License-Identifier: Apache-2.0
//! The CDI spec behind the `cdi-annotations` and `cdi-cri` strategies: with either on,
//! `Allocate` answers `k8s.device-plugin.nvidia.com/gpu=<id>`, and container engines
//! that resolve CDI themselves (containerd with `enable_cdi`, CRI-O, podman) need a
//! spec file that defines those names. NVIDIA's plugin writes one; so does this module,
//! at NVIDIA's path (`/var/run/cdi/k8s.device-plugin.nvidia.com-gpu.json`, the
//! directory configurable with `--cdi-spec-dir`).
//!
//! The spec is built by [`nvshim::generate`], the generator behind `nvshim cdi
//! generate`, on the inventory the plugin already holds: one device per advertised
//! GPU or MIG device, named by the runtime id `Allocate` puts in the CDI name (its
//! UUID or index; time-sliced replicas share their unit's device). Its edits are what
//! our runtime injects for the same device.
//!
//! The plugin usually runs in a container, and the spec is read on the host. So the
//! driver is read where this process sees it ([`DriverView::seen`]: NVIDIA's
//! `containerDriverRoot`, `/driver-root` by default) and the spec names host paths
//! (under `--nvidia-driver-root` and `--dev-root`, as NVIDIA's plugin does with
//! `nvidiaDriverRoot`).
//!
//! [`SpecFile`] keeps the file: written atomically (the crate's one atomic writer),
//! only when its content changes, and removed on a clean exit. This module never
//! decides what a container gets; it describes what the names `Allocate` hands out
//! resolve to.

use std::collections::BTreeSet;
use std::io;
use std::path::{Path, PathBuf};

use crate::allocate::CDI_KIND;
use crate::config::{CDI_SPEC_FILE, CONTAINER_DRIVER_ROOT, DeviceIdStrategy, Settings};
use crate::resources::Resource;
use nvshim::cdi::{Spec, spec};
use nvshim::files::write::{self, WriteError};
use nvshim::generate::{self, GenerateError, NameStrategy, Options};
use nvshim::inventory::{Backend, Inventory, Source};
use nvshim::pipeline::{CdiFiles, Context, NvmlAccess};
use nvshim::request::DriverCapabilities;
use nvshim::roots::Roots;

#[derive(Debug, thiserror::Error)]
pub enum CdiSpecError {
    #[error("cannot build the CDI spec for {CDI_KIND}: {0}")]
    Generate(#[source] GenerateError),
    /// A guard: the generator names devices from the same inventory as the resources,
    /// so this means the two disagree on how a device is named.
    #[error(
        "the CDI spec for {CDI_KIND} lacks devices the plugin advertises: {names:?} \
         (it defines {defined:?})"
    )]
    Missing {
        names: Vec<String>,
        defined: Vec<String>,
    },
    #[error(transparent)]
    File(#[from] WriteError),
}

/// Where the driver is: as this process sees it, and as the host has it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverView {
    /// What this process reads (NVML, libraries, device nodes).
    pub seen: Roots,
    /// The host's driver root (`--nvidia-driver-root`): the spec's paths are under it.
    pub host_driver: PathBuf,
    /// The host's dev root (`--dev-root`).
    pub host_dev: PathBuf,
}

impl DriverView {
    /// The view for `settings`: the driver is read at `--container-driver-root` when
    /// that is a directory, else at NVIDIA's default `/driver-root` when that is one (its
    /// Helm chart mounts the host's driver root there), else at the driver root itself
    /// (the plugin runs on the host, or sees the driver at the host's path). A dev root
    /// equal to the driver root moves with it; a different one is read at its own path.
    pub fn of(settings: &Settings) -> DriverView {
        let seen_driver = match &settings.container_driver_root {
            Some(root) if root.is_dir() => root.clone(),
            Some(root) => {
                // NVIDIA's plugin falls back silently; a drop-in must not refuse to
                // start where it started, but the operator should know.
                tracing::warn!(
                    container_driver_root = %root.display(),
                    driver_root = %settings.driver_root.display(),
                    "the container driver root is not a directory; reading the driver at the driver root"
                );
                settings.driver_root.clone()
            }
            None if Path::new(CONTAINER_DRIVER_ROOT).is_dir() => {
                PathBuf::from(CONTAINER_DRIVER_ROOT)
            }
            None => settings.driver_root.clone(),
        };
        Self::with_seen_driver(settings, seen_driver)
    }

    /// The view with the driver read at `seen_driver` (no file system check).
    pub fn with_seen_driver(settings: &Settings, seen_driver: PathBuf) -> DriverView {
        let seen_dev = if settings.dev_root == settings.driver_root {
            seen_driver.clone()
        } else {
            settings.dev_root.clone()
        };
        DriverView {
            seen: Roots {
                driver: seen_driver,
                dev: seen_dev,
                proc: PathBuf::from("/"),
            },
            host_driver: settings.driver_root.clone(),
            host_dev: settings.dev_root.clone(),
        }
    }

    /// `path`, a driver file as this process sees it, as the host has it; unchanged
    /// when it is under neither seen root.
    pub fn to_host(&self, path: &str) -> String {
        self.moved(
            path,
            [
                (&self.seen.driver, &self.host_driver),
                (&self.seen.dev, &self.host_dev),
            ],
        )
    }

    /// [`DriverView::to_host`] for a device node: the dev roots first (with a dev root of
    /// `/` on the host and a driver root elsewhere, `/dev/nvidia0` stays where it is).
    pub fn node_to_host(&self, path: &str) -> String {
        self.moved(
            path,
            [
                (&self.seen.dev, &self.host_dev),
                (&self.seen.driver, &self.host_driver),
            ],
        )
    }

    fn moved(&self, path: &str, pairs: [(&PathBuf, &PathBuf); 2]) -> String {
        for (seen, host) in pairs {
            if let Ok(rest) = Path::new(path).strip_prefix(seen) {
                if rest.as_os_str().is_empty() {
                    return host.display().to_string();
                }
                return host.join(rest).display().to_string();
            }
        }
        path.to_owned()
    }

    fn is_identity(&self) -> bool {
        self.seen.driver == self.host_driver && self.seen.dev == self.host_dev
    }

    /// Rewrites every host path of `spec` (mount sources, device nodes) from this
    /// process's view to the host's, as NVIDIA's plugin transforms its spec's root.
    pub fn relocate(&self, spec: &mut Spec) {
        if self.is_identity() {
            return;
        }
        let edits = std::iter::once(&mut spec.container_edits)
            .chain(spec.devices.iter_mut().map(|d| &mut d.container_edits));
        for edits in edits {
            for mount in &mut edits.mounts {
                mount.host_path = self.to_host(&mount.host_path);
            }
            for node in &mut edits.device_nodes {
                let seen = node.host_path.as_deref().unwrap_or(&node.path);
                let host = self.node_to_host(seen);
                // `hostPath` is left out when it equals `path`, as the generator does.
                node.host_path = (host != node.path).then_some(host);
            }
        }
    }
}

/// The spec for what `resources` advertise, or `None` when no `cdi-*` strategy is on
/// or nothing is advertised. `inventory` is the one the resources were built from.
pub fn build(
    settings: &Settings,
    view: &DriverView,
    inventory: &Inventory,
    resources: &[Resource],
) -> Result<Option<Spec>, CdiSpecError> {
    if !settings.uses_cdi() {
        return Ok(None);
    }
    // Replicas (`GPU-…::3`) carry their unit's runtime id: one device per unit.
    let names: BTreeSet<String> = resources
        .iter()
        .flat_map(|r| &r.devices)
        .map(|d| d.runtime_id.clone())
        .collect();
    if names.is_empty() {
        return Ok(None);
    }
    let options = Options {
        kind: CDI_KIND.to_owned(),
        strategies: vec![match settings.device_id_strategy {
            DeviceIdStrategy::Uuid => NameStrategy::Uuid,
            DeviceIdStrategy::Index => NameStrategy::Index,
        }],
        // NVIDIA's plugin leaves `all` out (a pod is given devices, never all of them).
        all_device: false,
        hook_path: settings.cdi_hook_path.display().to_string(),
        // The whole driver, as in NVIDIA's specs: a CDI name carries no capabilities.
        capabilities: DriverCapabilities::all(),
        cover_params: !nvshim::hook_contract::disables(
            &settings.cdi_disable_hooks,
            nvshim::hook_contract::DISABLE_DEVICE_NODE_MODIFICATION,
        ),
        only: Some(names.clone()),
        hook_argv0: None,
    };
    let ctx = Context {
        roots: view.seen.clone(),
        source: Source {
            backend: Backend::Nvml,
            nvml_library: settings.nvml_library.clone(),
        },
        // The inventory is given; nothing here needs NVML again.
        nvml: NvmlAccess::Elsewhere,
        cdi: CdiFiles::Never,
    };
    let mut spec = generate::generate_on(&ctx, &options, Backend::Nvml, inventory)
        .map_err(CdiSpecError::Generate)?;
    let missing: Vec<String> = names
        .into_iter()
        .filter(|name| !spec.devices.iter().any(|d| &d.name == name))
        .collect();
    if !missing.is_empty() {
        return Err(CdiSpecError::Missing {
            names: missing,
            defined: spec.devices.iter().map(|d| d.name.clone()).collect(),
        });
    }
    view.relocate(&mut spec);
    Ok(Some(spec))
}

/// What [`SpecFile::sync`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// The file now holds the spec (it did not before).
    Written(PathBuf),
    /// The file already held exactly this spec.
    Unchanged(PathBuf),
    /// No spec is wanted, and a stale one was removed.
    Removed(PathBuf),
    /// No spec is wanted, and there was none.
    Absent,
}

/// The spec file this process keeps. Dropping it leaves the file: only a clean exit
/// ([`SpecFile::remove`]) takes it away, so a crash does not break the CDI names of
/// containers kubelet restarts meanwhile.
#[derive(Debug, Default)]
pub struct SpecFile {
    /// Where this process last wrote the spec.
    written: Option<PathBuf>,
}

impl SpecFile {
    /// Makes `<dir>/k8s.device-plugin.nvidia.com-gpu.json` hold `spec`, writing only when
    /// its content differs; with `None`, removes a spec of the plugin's kind found
    /// there (left by an earlier run with a `cdi-*` strategy: one device plugin serves
    /// a node, so a spec of its kind nobody keeps is stale). A file this process wrote
    /// in another directory (the settings moved) is removed.
    pub fn sync(&mut self, dir: &Path, spec: Option<&Spec>) -> Result<Synced, CdiSpecError> {
        let path = dir.join(CDI_SPEC_FILE);
        if let Some(old) = self.written.take().filter(|old| *old != path) {
            remove_if_present(&old)?;
        }
        let Some(spec) = spec else {
            return if is_plugin_spec(&path)? {
                write::remove(&path)?;
                Ok(Synced::Removed(path))
            } else {
                Ok(Synced::Absent)
            };
        };
        let bytes = spec::to_json(spec);
        let existing = write::read(&path)?;
        self.written = Some(path.clone());
        if existing
            .as_ref()
            .is_some_and(|e| e.text.as_bytes() == bytes)
        {
            return Ok(Synced::Unchanged(path));
        }
        write::replace(&path, &bytes, existing.as_ref(), false)?;
        Ok(Synced::Written(path))
    }

    /// Removes the file this process wrote, if any: what a clean exit does.
    pub fn remove(&mut self) -> Result<Option<PathBuf>, CdiSpecError> {
        match self.written.take() {
            Some(path) => {
                remove_if_present(&path)?;
                Ok(Some(path))
            }
            None => Ok(None),
        }
    }
}

fn remove_if_present(path: &Path) -> Result<(), CdiSpecError> {
    match write::remove(path) {
        Err(WriteError::Remove { source, .. }) if source.kind() == io::ErrorKind::NotFound => {
            Ok(())
        }
        other => Ok(other?),
    }
}

/// Whether `path` holds a spec of the plugin's kind. A file that is not JSON, or has
/// another kind, is someone else's and is left alone.
fn is_plugin_spec(path: &Path) -> Result<bool, CdiSpecError> {
    let Some(existing) = write::read(path)? else {
        return Ok(false);
    };
    let value: serde_json::Value = match serde_json::from_str(&existing.text) {
        Ok(value) => value,
        Err(_) => return Ok(false),
    };
    Ok(value.get("kind").and_then(|k| k.as_str()) == Some(CDI_KIND))
}

#[cfg(test)]
#[path = "cdi_spec_tests.rs"]
mod tests;

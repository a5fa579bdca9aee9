// SPDX-License-Identifier: Apache-2.0
//! The NVML inventory backend: GPUs, MIG devices, memory and compute capability as the
//! driver reports them through `libnvidia-ml.so.1`.
//!
//! Slower than procfs (it loads the driver's library and attaches to every GPU) but the
//! only source of MIG devices. [`load`] picks the library the way the driver root's own
//! loader would; [`from_nvml`] is the enumeration alone, so the device plugin can reuse an
//! [`Nvml`] it keeps open for health events. GPUs keep NVML's order, which is PCI bus order.

use std::path::{Path, PathBuf};

use super::{DriverInfo, Gpu, Inventory, InventoryError, MigDevice, normalize_bus_id};
use crate::ldcache::{self, Class};
use crate::nvml::{Device, Nvml, NvmlError, Return};
use crate::roots::{self, ContainerPath, Roots};

/// NVML's soname, as the driver installs it and as the loader looks it up.
pub const NVML_SONAME: &str = "libnvidia-ml.so.1";

/// The loader cache, relative to the driver root.
const LD_CACHE: &str = "etc/ld.so.cache";

/// Loads NVML (from `library` if given, else [`library_path`]) and enumerates the node.
pub fn load(roots: &Roots, library: Option<&Path>) -> Result<Inventory, InventoryError> {
    let library = library.map_or_else(|| library_path(roots), Path::to_path_buf);
    let nvml = Nvml::load(&library)?;
    from_nvml(&nvml)
}

/// The NVML library to load for this driver root: the 64-bit `libnvidia-ml.so.1` that the
/// driver root's `ld.so.cache` records, joined onto the root (the cache holds root-relative
/// paths when written with `ldconfig -r`). Without a cache or an entry, the bare soname, so
/// the default loader path decides, as `nvidia-container-cli` does for a host driver.
pub fn library_path(roots: &Roots) -> PathBuf {
    let cache_path = roots.driver.join(LD_CACHE);
    let cache = match ldcache::load(&cache_path) {
        Ok(cache) => cache,
        Err(error) => {
            tracing::debug!(path = %cache_path.display(), %error, "no usable ld.so.cache; using the default loader path for NVML");
            return PathBuf::from(NVML_SONAME);
        }
    };
    let found = cache
        .lookup(NVML_SONAME)
        .filter(|entry| entry.class() == Class::Lib64)
        // The driver installs into plain library directories; prefer those to any
        // glibc-hwcaps variant. `min_by_key` keeps the first of equals: the cache's order.
        .min_by_key(|entry| entry.is_hwcaps_subdirectory())
        // A value with `..` or without a leading `/` could point outside the driver root.
        .and_then(|entry| ContainerPath::new(&entry.value).ok());
    match found {
        Some(path) => roots::join(&roots.driver, &path).as_path().to_path_buf(),
        None => {
            tracing::debug!(path = %cache_path.display(), "no 64-bit {NVML_SONAME} in ld.so.cache; using the default loader path");
            PathBuf::from(NVML_SONAME)
        }
    }
}

/// Enumerates GPUs and MIG devices through an initialised NVML.
pub fn from_nvml(nvml: &Nvml) -> Result<Inventory, InventoryError> {
    let driver = DriverInfo {
        version: nvml.driver_version()?,
        cuda_version: unsupported_as_none(nvml.cuda_driver_version())?.map(cuda_version),
    };
    let count = nvml.device_count()?;
    let mut gpus = Vec::with_capacity(count as usize);
    for index in 0..count {
        let device = nvml.device_by_index(index)?;
        gpus.push(gpu(nvml, index, &device)?);
    }
    Ok(Inventory { driver, gpus })
}

fn gpu(nvml: &Nvml, index: u32, device: &Device) -> Result<Gpu, InventoryError> {
    let pci = device.pci_info()?;
    let bus_id = normalize_bus_id(&pci.bus_id).ok_or_else(|| InventoryError::Parse {
        path: nvml.library().to_path_buf(),
        reason: format!(
            "GPU {index} has PCI bus id {:?}, not a domain:bus:device.function address",
            pci.bus_id
        ),
    })?;
    let mig_enabled = unsupported_as_none(device.mig_mode())?.map(|(current, _pending)| current);
    let mig_devices = if mig_enabled == Some(true) {
        mig_devices(device)?
    } else {
        Vec::new()
    };
    Ok(Gpu {
        index,
        // WSL's NVML has no minor numbers (there are no `/dev/nvidia<minor>` nodes, only
        // `/dev/dxg`) and answers "not supported": the index stands in, and nothing looks
        // up a node by it there (`discover::wsl`).
        minor: unsupported_as_none(device.minor_number())?.unwrap_or(index),
        uuid: device.uuid()?,
        bus_id,
        name: device.name()?,
        memory_bytes: unsupported_as_none(device.memory_info())?.map(|memory| memory.total),
        compute_capability: unsupported_as_none(device.cuda_compute_capability())?
            .map(|(major, minor)| format!("{major}.{minor}")),
        // Only `nvidia-container-cli info` shows it: a driver without the call, or
        // one that fails it, leaves it unknown rather than failing the inventory.
        brand: device.brand().ok(),
        mig_enabled,
        mig_devices,
    })
}

/// The MIG devices of a GPU in MIG mode: NVML's slots `0..max`, skipping empty ones, each
/// numbered by its position among the devices found (the `M` of `N:M`, as NVIDIA's
/// toolkit numbers them).
fn mig_devices(gpu: &Device) -> Result<Vec<MigDevice>, InventoryError> {
    let mut found = Vec::new();
    for slot in 0..gpu.max_mig_device_count()? {
        let mig = match gpu.mig_device_by_index(slot) {
            Ok(mig) => mig,
            Err(error)
                if matches!(
                    error.code(),
                    Some(Return::NotFound | Return::InvalidArgument)
                ) =>
            {
                continue;
            }
            Err(error) => return Err(error.into()),
        };
        let name = mig.name()?;
        found.push(MigDevice {
            index: found.len() as u32,
            gpu_instance_id: mig.gpu_instance_id()?,
            compute_instance_id: mig.compute_instance_id()?,
            uuid: mig.uuid()?,
            memory_bytes: unsupported_as_none(mig.memory_info())?.map(|memory| memory.total),
            profile: mig_profile(&name),
        });
    }
    Ok(found)
}

/// `NVIDIA A100-SXM4-40GB MIG 1g.5gb` → `1g.5gb`; a name without `MIG ` is kept whole.
fn mig_profile(name: &str) -> String {
    match name.rsplit_once("MIG ") {
        Some((_, profile)) if !profile.trim().is_empty() => profile.trim().to_string(),
        _ => name.trim().to_string(),
    }
}

/// NVML's `1000 * major + 10 * minor` → `major.minor` (12040 → `12.4`).
fn cuda_version(version: i32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// A query this driver or device cannot answer becomes `None`; other failures stay errors.
fn unsupported_as_none<T>(result: Result<T, NvmlError>) -> Result<Option<T>, NvmlError> {
    match result {
        Ok(value) => Ok(Some(value)),
        Err(error) if error.is_not_supported() => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuda_versions_format_like_nvidia_smi() {
        let cases = [
            (12040, "12.4"),
            (11080, "11.8"),
            (12000, "12.0"),
            (10010, "10.1"),
        ];
        for (raw, want) in cases {
            assert_eq!(cuda_version(raw), want, "case {raw}");
        }
    }

    #[test]
    fn mig_profiles_come_from_the_name() {
        let cases = [
            ("NVIDIA A100-SXM4-40GB MIG 1g.5gb", "1g.5gb"),
            ("NVIDIA H100 80GB HBM3 MIG 1g.10gb+me", "1g.10gb+me"),
            ("MIG 7g.80gb", "7g.80gb"),
            ("NVIDIA A100-SXM4-40GB", "NVIDIA A100-SXM4-40GB"),
        ];
        for (name, want) in cases {
            assert_eq!(mig_profile(name), want, "case {name}");
        }
    }

    #[test]
    fn without_a_cache_the_loader_path_decides() {
        let roots = Roots {
            driver: PathBuf::from("/nonexistent/nvshim-test-driver-root"),
            ..Roots::default()
        };
        assert_eq!(library_path(&roots), PathBuf::from(NVML_SONAME));
    }
}

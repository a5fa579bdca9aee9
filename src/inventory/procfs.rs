//! The procfs backend: GPUs from `/proc/driver/nvidia/gpus/*/information`, the driver
//! version from `/proc/driver/nvidia/version`.
//!
//! This is the runtime's fast path: a handful of small reads, no library loaded, no
//! NVML initialisation. It knows identity (index, minor, UUID, bus id, name) and the
//! driver version; memory, compute capability and MIG need NVML.

use std::fs;
use std::path::Path;

use super::{DriverInfo, Gpu, Inventory, InventoryError, bus_order, normalize_bus_id};
use crate::roots::Roots;

/// Loads the inventory from `<proc root>/proc/driver/nvidia`.
pub fn load(roots: &Roots) -> Result<Inventory, InventoryError> {
    let base = roots.proc.join("proc/driver/nvidia");
    let version_path = base.join("version");
    if !base.exists() {
        return Err(InventoryError::NoDriver { path: base });
    }
    let version = parse_version(&read(&version_path)?).ok_or_else(|| InventoryError::Parse {
        path: version_path.clone(),
        reason: "no \"NVRM version:\" line with a driver version".into(),
    })?;

    let gpus_dir = base.join("gpus");
    let mut gpus = Vec::new();
    // No `gpus` directory means the module is loaded but sees no GPU.
    if gpus_dir.exists() {
        let entries = fs::read_dir(&gpus_dir).map_err(|source| InventoryError::Read {
            path: gpus_dir.clone(),
            source,
        })?;
        for entry in entries {
            let entry = entry.map_err(|source| InventoryError::Read {
                path: gpus_dir.clone(),
                source,
            })?;
            let path = entry.path().join("information");
            gpus.push(parse_information(&read(&path)?, &path)?);
        }
    }
    gpus.sort_by_key(|g| bus_order(&g.bus_id));
    for (index, gpu) in gpus.iter_mut().enumerate() {
        gpu.index = u32::try_from(index).unwrap_or(u32::MAX);
    }
    Ok(Inventory {
        driver: DriverInfo {
            version,
            cuda_version: None,
        },
        gpus,
    })
}

fn read(path: &Path) -> Result<String, InventoryError> {
    crate::files::read_to_string(path).map_err(|source| InventoryError::Read {
        path: path.to_path_buf(),
        source,
    })
}

/// The version from `NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Thu …`
/// (or the `Open Kernel Module for x86_64` wording): the first word after "Module"
/// that looks like a dotted number.
pub fn parse_version(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.starts_with("NVRM version:"))?;
    let after = line.split_once("Module").map_or(line, |(_, rest)| rest);
    after
        .split_whitespace()
        .find(|w| {
            w.contains('.')
                && w.split('.')
                    .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
        })
        .map(str::to_string)
}

/// One GPU from its `information` file. The index is set later, from PCI order.
pub fn parse_information(text: &str, path: &Path) -> Result<Gpu, InventoryError> {
    let field = |key: &str| {
        text.lines().find_map(|line| {
            let (k, v) = line.split_once(':')?;
            (k.trim() == key).then(|| v.trim().to_string())
        })
    };
    let missing = |key: &str| InventoryError::Parse {
        path: path.to_path_buf(),
        reason: format!("no {key:?} field"),
    };
    let name = field("Model").ok_or_else(|| missing("Model"))?;
    let uuid = field("GPU UUID").ok_or_else(|| missing("GPU UUID"))?;
    let bus_raw = field("Bus Location").ok_or_else(|| missing("Bus Location"))?;
    let minor_raw = field("Device Minor").ok_or_else(|| missing("Device Minor"))?;
    let bus_id = normalize_bus_id(&bus_raw).ok_or_else(|| InventoryError::Parse {
        path: path.to_path_buf(),
        reason: format!("bad \"Bus Location\" {bus_raw:?}"),
    })?;
    let minor = minor_raw.parse().map_err(|_| InventoryError::Parse {
        path: path.to_path_buf(),
        reason: format!("bad \"Device Minor\" {minor_raw:?}"),
    })?;
    Ok(Gpu {
        index: 0,
        minor,
        uuid,
        bus_id,
        name,
        memory_bytes: None,
        compute_capability: None,
        brand: None,
        mig_enabled: None,
        mig_devices: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const INFO: &str = "Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 40\nGPU UUID: \t GPU-4e1f0000-0000-4000-8000-000000000003\nVideo BIOS: \t 92.00.25.00.08\nBus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\nBus Location: \t 0000:B1:00.0\nDevice Minor: \t 3\nGPU Excluded:\t No\n";

    #[test]
    fn information_files_parse() -> Result<(), InventoryError> {
        let gpu = parse_information(INFO, Path::new("info"))?;
        assert_eq!(gpu.name, "NVIDIA A100-SXM4-80GB");
        assert_eq!(gpu.uuid, "GPU-4e1f0000-0000-4000-8000-000000000003");
        assert_eq!(gpu.bus_id, "0000:b1:00.0");
        assert_eq!(gpu.minor, 3);
        Ok(())
    }

    #[test]
    fn broken_information_files_name_the_field() {
        let cases = [
            (
                "no minor",
                INFO.replace("Device Minor", "Minor"),
                "\"Device Minor\"",
            ),
            (
                "bad minor",
                INFO.replace("Minor: \t 3", "Minor: \t x"),
                "\"x\"",
            ),
            ("bad bus", INFO.replace("0000:B1:00.0", "zz"), "\"zz\""),
            ("empty", String::new(), "\"Model\""),
        ];
        for (name, text, needle) in cases {
            match parse_information(&text, Path::new("info")) {
                Ok(g) => panic!("case {name}: parsed {g:?}"),
                Err(e) => assert!(e.to_string().contains(needle), "case {name}: {e}"),
            }
        }
    }

    #[test]
    fn driver_versions_parse() {
        let cases = [
            (
                "proprietary",
                "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Thu Feb 22 01:44:30 UTC 2024\nGCC version: 12\n",
                Some("550.54.15"),
            ),
            (
                "open",
                "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.65.06  Release Build  (dvs-builder@U16-I3-B03-4-3)  Sun Jul 27 07:09:21 UTC 2025\n",
                Some("580.65.06"),
            ),
            (
                "aarch64",
                "NVRM version: NVIDIA UNIX aarch64 Kernel Module  535.104.05  Sat\n",
                Some("535.104.05"),
            ),
            ("garbage", "hello\n", None),
        ];
        for (name, text, want) in cases {
            assert_eq!(parse_version(text).as_deref(), want, "case {name}");
        }
    }
}

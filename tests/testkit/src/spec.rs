// SPDX-License-Identifier: Apache-2.0
//! What a simulated node holds: GPUs, MIG devices, driver version, XID events.
//!
//! Plain data plus the two presets nvshim's tests use. The numbering rules that several parts of the
//! node must agree on (bus id forms, MIG capability minors) live here so the driver root, `/dev`,
//! `/proc` and the mock NVML config cannot drift apart.

use crate::error::TestkitError;

/// The driver version a preset node gets (a real R550 release).
pub const DEFAULT_DRIVER_VERSION: &str = "550.54.15";
/// The CUDA driver API version that driver reports (`cuDriverGetVersion` form: 12.4 → 12040).
pub const DEFAULT_CUDA_DRIVER_VERSION: u32 = 12040;

/// Major number of `/dev/nvidiactl`, `/dev/nvidia<minor>` and `/dev/nvidia-modeset`.
pub const NVIDIA_MAJOR: u32 = 195;
/// Minor number of `/dev/nvidiactl`.
pub const NVIDIACTL_MINOR: u32 = 255;
/// Minor number of `/dev/nvidia-modeset`.
pub const NVIDIA_MODESET_MINOR: u32 = 254;
/// Major number the node gives `/dev/nvidia-uvm` (minor 0) and `/dev/nvidia-uvm-tools` (minor 1).
/// The real one is dynamic; 510 is a value seen on real hosts.
pub const NVIDIA_UVM_MAJOR: u32 = 510;
/// Major number the node gives `/dev/nvidia-caps/*` (dynamic on real hosts too).
pub const NVIDIA_CAPS_MAJOR: u32 = 511;
/// Capability minor of the MIG `config` capability (`/dev/nvidia-caps/nvidia-cap1`).
pub const MIG_CONFIG_MINOR: u32 = 1;
/// Capability minor of the MIG `monitor` capability (`/dev/nvidia-caps/nvidia-cap2`).
pub const MIG_MONITOR_MINOR: u32 = 2;
/// GPU instance ids the driver reserves capability minors for, per GPU (`gi0`..`gi14`).
pub const MIG_MAX_GPU_INSTANCES: u32 = 15;
/// Compute instance ids per GPU instance (`ci0`..`ci7`).
pub const MIG_MAX_COMPUTE_INSTANCES: u32 = 8;

const A100_NAME: &str = "NVIDIA A100-SXM4-80GB";
const A100_MEMORY: u64 = 80 * GIB;
const H100_NAME: &str = "NVIDIA H100 80GB HBM3";
/// What NVML reports for an H100 80GB HBM3 (81559 MiB), less than an A100-80GB's 80 GiB: the
/// two models differ in memory as real ones do (scheduling by `nvidia.com/gpu.memory`).
const H100_MEMORY: u64 = 81559 * MIB;
const MIB: u64 = 1024 * 1024;
const GIB: u64 = 1024 * MIB;
/// PCI buses of the eight GPUs of a DGX A100, in PCI order.
const DGX_A100_BUSES: [u8; 8] = [0x07, 0x0f, 0x47, 0x4e, 0x87, 0x90, 0xb7, 0xbd];

/// One physical GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuSpec {
    /// Marketing name, as NVML and `/proc/.../information` report it.
    pub name: String,
    /// `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    /// PCI address in the procfs/sysfs form `0000:07:00.0` (4-digit domain, lowercase hex).
    pub bus_id: String,
    /// Device minor: the `N` of `/dev/nvidiaN`.
    pub minor: u32,
    pub memory_bytes: u64,
    pub compute_capability: (u32, u32),
    /// MIG devices; non-empty means MIG mode is on.
    pub mig_devices: Vec<MigSpec>,
}

/// One MIG device (a GPU instance / compute instance pair).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigSpec {
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    /// `MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`.
    pub uuid: String,
    pub memory_bytes: u64,
    /// Profile name such as `1g.10gb`.
    pub profile: String,
}

/// The whole node. `gpus` is in PCI order, which is also NVML's index order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    pub driver_version: String,
    /// `cuDriverGetVersion` form: 12.4 → 12040.
    pub cuda_driver_version: u32,
    pub gpus: Vec<GpuSpec>,
    /// XID events the mock NVML delivers: (GPU UUID, XID, delay in ms).
    pub xid_events: Vec<(String, u64, u64)>,
}

impl NodeSpec {
    /// `n` A100-80GB GPUs with deterministic UUIDs and the default driver version.
    ///
    /// Bus ids rise with the index (index = PCI order = NVML order). Device minors equal the
    /// index except for the last two GPUs, whose minors are swapped (on an 8-GPU node index 6
    /// has minor 7), as on real nodes where the driver hands out minors in probe order. Code
    /// that confuses index and minor fails on it, while the first GPUs keep the familiar
    /// `/dev/nvidia<index>` names.
    pub fn standard(n: usize) -> NodeSpec {
        let gpus = (0..n)
            .map(|index| {
                let minor = match n.checked_sub(index) {
                    Some(2) => index + 1,
                    Some(1) if n >= 2 => index - 1,
                    _ => index,
                };
                GpuSpec {
                    name: A100_NAME.to_owned(),
                    uuid: gpu_uuid(index),
                    bus_id: standard_bus_id(index, n),
                    minor: u32::try_from(minor).unwrap_or(u32::MAX),
                    memory_bytes: A100_MEMORY,
                    compute_capability: (8, 0),
                    mig_devices: Vec::new(),
                }
            })
            .collect();
        NodeSpec {
            driver_version: DEFAULT_DRIVER_VERSION.to_owned(),
            cuda_driver_version: DEFAULT_CUDA_DRIVER_VERSION,
            gpus,
            xid_events: Vec::new(),
        }
    }

    /// Like [`NodeSpec::standard`], with `n` H100-80GB (Hopper, compute capability 9.0) and
    /// UUIDs of their own (`GPU-4100…`), so a cluster of both presets has no UUID twice.
    pub fn h100(n: usize) -> NodeSpec {
        let mut spec = NodeSpec::standard(n);
        for (index, gpu) in spec.gpus.iter_mut().enumerate() {
            gpu.name = H100_NAME.to_owned();
            gpu.memory_bytes = H100_MEMORY;
            gpu.compute_capability = (9, 0);
            gpu.uuid = format!("GPU-4100{index:04x}-0000-4000-8000-{index:012x}");
        }
        spec
    }

    /// Like [`NodeSpec::standard`], but GPU 0 (PCI order; its minor is 1 when `n == 2`) has MIG
    /// on with two MIG devices: `1g.10gb` (GI 1, CI 0) and `2g.20gb` (GI 2, CI 0).
    pub fn with_mig(n: usize) -> NodeSpec {
        let mut spec = NodeSpec::standard(n);
        if let Some(gpu) = spec.gpus.first_mut() {
            gpu.mig_devices = vec![
                MigSpec {
                    gpu_instance_id: 1,
                    compute_instance_id: 0,
                    uuid: mig_uuid(0, 1, 0),
                    memory_bytes: 10 * GIB,
                    profile: "1g.10gb".to_owned(),
                },
                MigSpec {
                    gpu_instance_id: 2,
                    compute_instance_id: 0,
                    uuid: mig_uuid(0, 2, 0),
                    memory_bytes: 20 * GIB,
                    profile: "2g.20gb".to_owned(),
                },
            ];
        }
        spec
    }

    /// Checks what the builder relies on: a plain dotted driver version, well-formed and unique
    /// bus ids, UUIDs and minors, MIG ids in the driver's range, XID events naming known GPUs.
    pub fn validate(&self) -> Result<(), TestkitError> {
        let invalid = |what: String| Err(TestkitError::InvalidSpec { what });
        let v = &self.driver_version;
        if v.is_empty()
            || v.starts_with('.')
            || v.ends_with('.')
            || v.contains("..")
            || !v.chars().all(|c| c.is_ascii_digit() || c == '.')
        {
            return invalid(format!(
                "driver version \"{v}\" is not of the form 550.54.15"
            ));
        }
        let mut seen_minors = Vec::new();
        let mut seen_buses = Vec::new();
        let mut seen_uuids = Vec::new();
        for gpu in &self.gpus {
            if !is_uuid(&gpu.uuid, "GPU-") {
                return invalid(format!(
                    "GPU UUID \"{}\" is not GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                    gpu.uuid
                ));
            }
            if !is_sysfs_bus_id(&gpu.bus_id) {
                return invalid(format!(
                    "bus id \"{}\" of {} is not in the sysfs form 0000:07:00.0",
                    gpu.bus_id, gpu.uuid
                ));
            }
            if gpu.minor >= NVIDIA_MODESET_MINOR {
                return invalid(format!(
                    "minor {} of {} collides with nvidia-modeset/nvidiactl (valid: 0-253)",
                    gpu.minor, gpu.uuid
                ));
            }
            for (seen, value, kind) in [
                (&mut seen_minors, gpu.minor.to_string(), "minor"),
                (&mut seen_buses, gpu.bus_id.to_ascii_lowercase(), "bus id"),
                (&mut seen_uuids, gpu.uuid.to_ascii_lowercase(), "UUID"),
            ] {
                if seen.contains(&value) {
                    return invalid(format!("{kind} \"{value}\" is used by two GPUs"));
                }
                seen.push(value);
            }
            for mig in &gpu.mig_devices {
                if !is_uuid(&mig.uuid, "MIG-") {
                    return invalid(format!(
                        "MIG UUID \"{}\" is not MIG-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx",
                        mig.uuid
                    ));
                }
                if mig.gpu_instance_id >= MIG_MAX_GPU_INSTANCES
                    || mig.compute_instance_id >= MIG_MAX_COMPUTE_INSTANCES
                {
                    return invalid(format!(
                        "MIG device {} has GI {} CI {} (valid: GI 0-{}, CI 0-{})",
                        mig.uuid,
                        mig.gpu_instance_id,
                        mig.compute_instance_id,
                        MIG_MAX_GPU_INSTANCES - 1,
                        MIG_MAX_COMPUTE_INSTANCES - 1
                    ));
                }
                let value = mig.uuid.to_ascii_lowercase();
                if seen_uuids.contains(&value) {
                    return invalid(format!("UUID \"{value}\" is used twice"));
                }
                seen_uuids.push(value);
            }
        }
        for (uuid, xid, _) in &self.xid_events {
            if !seen_uuids.contains(&uuid.to_ascii_lowercase()) {
                return invalid(format!("XID {xid} event names unknown GPU \"{uuid}\""));
            }
        }
        Ok(())
    }
}

impl GpuSpec {
    /// The bus id in NVML's form: 8-digit domain, uppercase hex (`00000000:B7:00.0`).
    pub fn nvml_bus_id(&self) -> String {
        nvml_bus_id(&self.bus_id)
    }
}

/// Converts a sysfs bus id (`0000:b7:00.0`) to NVML's form (`00000000:B7:00.0`).
pub fn nvml_bus_id(sysfs: &str) -> String {
    format!("0000{}", sysfs.to_ascii_uppercase())
}

/// The capability minor of `gpu<gpu_minor>/gi<gi>/access` in `/proc/driver/nvidia-caps/mig-minors`.
///
/// Matches the real driver's numbering: after `config` (1) and `monitor` (2), each GPU owns
/// 15 GIs × (1 GI access + 8 CI access) = 135 consecutive minors (so gpu0/gi1 is 12, gpu0/gi2 is 21).
pub fn mig_gi_minor(gpu_minor: u32, gi: u32) -> u32 {
    let per_gi = 1 + MIG_MAX_COMPUTE_INSTANCES;
    3 + gpu_minor * MIG_MAX_GPU_INSTANCES * per_gi + gi * per_gi
}

/// The capability minor of `gpu<gpu_minor>/gi<gi>/ci<ci>/access`.
pub fn mig_ci_minor(gpu_minor: u32, gi: u32, ci: u32) -> u32 {
    mig_gi_minor(gpu_minor, gi) + 1 + ci
}

fn gpu_uuid(index: usize) -> String {
    format!("GPU-4e1f{index:04x}-0000-4000-8000-{index:012x}")
}

fn mig_uuid(gpu_index: usize, gi: u32, ci: u32) -> String {
    format!("MIG-4e1f{gpu_index:04x}-{gi:04x}-4{ci:03x}-8000-{gpu_index:06x}{gi:03x}{ci:03x}")
}

/// Bus ids rising with the index: a DGX A100's buses for up to 8 GPUs, then consecutive buses,
/// moving to the next PCI domain every 200 GPUs.
fn standard_bus_id(index: usize, n: usize) -> String {
    if n <= DGX_A100_BUSES.len()
        && let Some(bus) = DGX_A100_BUSES.get(index)
    {
        return format!("0000:{bus:02x}:00.0");
    }
    format!("{:04x}:{:02x}:00.0", index / 200, 1 + index % 200)
}

fn is_hex(s: &str, len: usize) -> bool {
    s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit())
}

fn is_uuid(s: &str, prefix: &str) -> bool {
    let Some(rest) = s.strip_prefix(prefix) else {
        return false;
    };
    let parts: Vec<&str> = rest.split('-').collect();
    parts.len() == 5
        && parts
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(part, len)| is_hex(part, len))
}

fn is_sysfs_bus_id(s: &str) -> bool {
    let Some((domain, rest)) = s.split_once(':') else {
        return false;
    };
    let Some((bus, rest)) = rest.split_once(':') else {
        return false;
    };
    let Some((device, function)) = rest.split_once('.') else {
        return false;
    };
    is_hex(domain, 4)
        && is_hex(bus, 2)
        && is_hex(device, 2)
        && matches!(function, "0" | "1" | "2" | "3" | "4" | "5" | "6" | "7")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn presets_are_valid() {
        for n in [0, 1, 2, 3, 8, 9, 254] {
            for (name, spec) in [
                ("standard", NodeSpec::standard(n)),
                ("with_mig", NodeSpec::with_mig(n)),
            ] {
                assert!(
                    spec.validate().is_ok(),
                    "{name}({n}): {:?}",
                    spec.validate()
                );
                assert_eq!(spec.gpus.len(), n, "{name}({n})");
            }
        }
    }

    #[test]
    fn standard_bus_ids_rise_and_minors_differ_from_index() {
        for n in [2, 3, 8, 16] {
            let spec = NodeSpec::standard(n);
            let buses: Vec<&str> = spec.gpus.iter().map(|g| g.bus_id.as_str()).collect();
            let mut sorted = buses.clone();
            sorted.sort_unstable();
            assert_eq!(buses, sorted, "standard({n}) bus order");
            assert_eq!(
                spec.gpus[n - 2].minor as usize,
                n - 1,
                "standard({n}) index {}",
                n - 2
            );
            assert_eq!(
                spec.gpus[n - 1].minor as usize,
                n - 2,
                "standard({n}) index {}",
                n - 1
            );
            if n > 2 {
                assert_eq!(spec.gpus[0].minor, 0, "standard({n}) index 0");
            }
        }
    }

    #[test]
    fn mig_minors_match_the_real_driver() {
        for (case, got, want) in [
            ("gpu0/gi1", mig_gi_minor(0, 1), 12),
            ("gpu0/gi2", mig_gi_minor(0, 2), 21),
            ("gpu0/gi1/ci0", mig_ci_minor(0, 1, 0), 13),
            ("gpu1/gi0", mig_gi_minor(1, 0), 138),
        ] {
            assert_eq!(got, want, "{case}");
        }
    }

    #[test]
    fn validate_rejects_bad_values() {
        type Mutation = fn(&mut NodeSpec);
        let base = NodeSpec::standard(2);
        let cases: [(&str, Mutation); 6] = [
            ("bad version", |s| s.driver_version = "550.x".into()),
            ("nvml bus id", |s| {
                s.gpus[0].bus_id = "00000000:07:00.0".into()
            }),
            ("dup minor", |s| s.gpus[0].minor = s.gpus[1].minor),
            ("minor 255", |s| s.gpus[0].minor = 255),
            ("bad uuid", |s| s.gpus[0].uuid = "GPU-1".into()),
            ("unknown xid gpu", |s| {
                s.xid_events.push(("GPU-x".into(), 79, 0))
            }),
        ];
        for (case, mutate) in cases {
            let mut spec = base.clone();
            mutate(&mut spec);
            assert!(spec.validate().is_err(), "{case}");
        }
    }

    #[test]
    fn nvml_form_has_eight_digit_domain() {
        assert_eq!(nvml_bus_id("0000:b7:00.0"), "00000000:B7:00.0");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The proc root: `driver/nvidia/{version,params,registry}`, one `gpus/<bus>/information` per
//! GPU, and the MIG capability files (`driver/nvidia-caps/mig-minors`,
//! `driver/nvidia/capabilities/...`), with the real driver's spacing and numbering.

use std::fmt::Write as _;
use std::path::Path;

use crate::error::TestkitError;
use crate::files;
use crate::spec::{
    MIG_CONFIG_MINOR, MIG_MAX_COMPUTE_INSTANCES, MIG_MAX_GPU_INSTANCES, MIG_MONITOR_MINOR,
    NodeSpec, mig_ci_minor, mig_gi_minor,
};

const PARAMS: &str = "ResmanDebugLevel: 4294967295\n\
RmLogonRC: 1\n\
ModifyDeviceFiles: 1\n\
DeviceFileUID: 0\n\
DeviceFileGID: 0\n\
DeviceFileMode: 438\n\
InitializeSystemMemoryAllocations: 1\n\
UsePageAttributeTable: 4294967295\n\
EnableMSI: 1\n\
EnableGpuFirmware: 18\n\
RegistryDwords: \"\"\n\
RegistryDwordsPerDevice: \"\"\n\
RmMsg: \"\"\n\
GpuBlacklist: \"\"\n\
TemporaryFilePath: \"\"\n\
ExcludedGpus: \"\"\n";

/// The text of `driver/nvidia/version` for driver `version`.
pub fn version_file(version: &str) -> String {
    format!(
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  {version}  Thu Feb 22 01:44:30 UTC 2024\n\
         GCC version:  gcc version 12.2.0 (Debian 12.2.0-14) \n"
    )
}

/// The body of a capability file (`DeviceFileMode` in decimal, as the driver prints it).
pub fn capability_file(minor: u32, mode: u32) -> String {
    format!("DeviceFileMinor: {minor}\nDeviceFileMode: {mode}\nDeviceFileModify: 1\n")
}

/// Creates the proc root at `root`.
pub(crate) fn build(root: &Path, spec: &NodeSpec) -> Result<(), TestkitError> {
    let nvidia = root.join("driver/nvidia");
    let version = &spec.driver_version;
    files::write(&nvidia.join("version"), version_file(version), 0o444)?;
    files::write(&nvidia.join("params"), PARAMS, 0o444)?;
    files::write(&nvidia.join("registry"), "Binary: \"\"\n", 0o444)?;
    files::mkdir_all(&nvidia.join("gpus"))?;
    for (index, gpu) in spec.gpus.iter().enumerate() {
        let bus = gpu.bus_id.to_ascii_lowercase();
        // Tab-and-space layout of the driver's nv-procfs.c.
        let information = format!(
            "Model: \t\t {}\nIRQ:   \t\t {}\nGPU UUID: \t {}\nVideo BIOS: \t 92.00.25.00.08\n\
             Bus Type: \t PCIe\nDMA Size: \t 47 bits\nDMA Mask: \t 0x7fffffffffff\n\
             Bus Location: \t {bus}\nDevice Minor: \t {}\nGPU Firmware: \t {version}\n\
             GPU Excluded:\t No\n",
            gpu.name,
            40 + index,
            gpu.uuid,
            gpu.minor,
        );
        files::write(
            &nvidia.join(format!("gpus/{bus}/information")),
            information,
            0o444,
        )?;
    }
    build_mig(root, spec)
}

fn build_mig(root: &Path, spec: &NodeSpec) -> Result<(), TestkitError> {
    // mig-minors lists every GI/CI slot of every GPU, in use or not, like the real file.
    let mut minors = format!("config {MIG_CONFIG_MINOR}\nmonitor {MIG_MONITOR_MINOR}\n");
    let mut gpu_minors: Vec<u32> = spec.gpus.iter().map(|g| g.minor).collect();
    gpu_minors.sort_unstable();
    for n in gpu_minors {
        for gi in 0..MIG_MAX_GPU_INSTANCES {
            let _ = writeln!(minors, "gpu{n}/gi{gi}/access {}", mig_gi_minor(n, gi));
            for ci in 0..MIG_MAX_COMPUTE_INSTANCES {
                let _ = writeln!(
                    minors,
                    "gpu{n}/gi{gi}/ci{ci}/access {}",
                    mig_ci_minor(n, gi, ci)
                );
            }
        }
    }
    files::write(&root.join("driver/nvidia-caps/mig-minors"), minors, 0o444)?;

    let caps = root.join("driver/nvidia/capabilities");
    files::write(
        &caps.join("mig/config"),
        capability_file(MIG_CONFIG_MINOR, 0o400),
        0o444,
    )?;
    files::write(
        &caps.join("mig/monitor"),
        capability_file(MIG_MONITOR_MINOR, 0o444),
        0o444,
    )?;
    // Per-instance capability files exist only for instances that have been created.
    for gpu in &spec.gpus {
        for mig in &gpu.mig_devices {
            let (n, gi, ci) = (gpu.minor, mig.gpu_instance_id, mig.compute_instance_id);
            let gi_dir = caps.join(format!("gpu{n}/mig/gi{gi}"));
            files::write(
                &gi_dir.join("access"),
                capability_file(mig_gi_minor(n, gi), 0o444),
                0o444,
            )?;
            files::write(
                &gi_dir.join(format!("ci{ci}/access")),
                capability_file(mig_ci_minor(n, gi, ci), 0o444),
                0o444,
            )?;
        }
    }
    Ok(())
}

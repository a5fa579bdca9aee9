// SPDX-License-Identifier: Apache-2.0
//! The two NVML queries gpu-feature-discovery labels from beyond the inventory: a GPU's
//! place in an NVLink fabric (`nvmlDeviceGetGpuFabricInfo`, for the IMEX clique) and a
//! MIG device's share of its GPU (`nvmlDeviceGetAttributes_v2`: multiprocessors, slices,
//! engines, memory). Both are optional: drivers before R550 lack the fabric call, and a
//! missing one is reported as [`NvmlError::SymbolMissing`] only when called.
#![allow(unsafe_code)]

use std::ffi::{c_uint, c_ulonglong};

use super::ffi::{RawDevice, RawReturn};
use super::{Device, NvmlError, Return};

/// `NVML_GPU_FABRIC_STATE_COMPLETED`: the GPU has finished registering with the fabric.
pub const FABRIC_STATE_COMPLETED: u8 = 3;

/// `nvmlGpuFabricInfo_t`, as `nvmlDeviceGetGpuFabricInfo` fills it.
#[repr(C)]
#[derive(Default)]
pub(super) struct RawFabricInfo {
    cluster_uuid: [u8; 16],
    status: RawReturn,
    clique_id: c_uint,
    state: u8,
}

/// `nvmlGpuFabricInfo_v2_t`, as `nvmlDeviceGetGpuFabricInfoV` fills it for version 2.
#[repr(C)]
#[derive(Default)]
pub(super) struct RawFabricInfoV2 {
    version: c_uint,
    cluster_uuid: [u8; 16],
    status: RawReturn,
    clique_id: c_uint,
    state: u8,
    health_mask: c_uint,
}

/// `nvmlGpuFabricInfo_v2`: the struct's size with the version (2) in the top byte.
const FABRIC_INFO_V2: c_uint = size_of::<RawFabricInfoV2>() as c_uint | (2 << 24);

/// `nvmlDeviceAttributes_t`.
#[repr(C)]
#[derive(Default)]
pub(super) struct RawAttributes {
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
    gpu_instance_slice_count: c_uint,
    compute_instance_slice_count: c_uint,
    memory_size_mb: c_ulonglong,
}

const _: () = {
    assert!(size_of::<RawFabricInfo>() == 28);
    assert!(size_of::<RawFabricInfoV2>() == 36);
    assert!(size_of::<RawAttributes>() == 40);
};

pub(super) type FabricInfoFn = unsafe extern "C" fn(RawDevice, *mut RawFabricInfo) -> RawReturn;
pub(super) type FabricInfoVFn = unsafe extern "C" fn(RawDevice, *mut RawFabricInfoV2) -> RawReturn;
pub(super) type AttributesFn = unsafe extern "C" fn(RawDevice, *mut RawAttributes) -> RawReturn;

/// A GPU's fabric registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FabricInfo {
    /// The NVLink domain's cluster UUID; all zero when the GPU is in none.
    pub cluster_uuid: [u8; 16],
    /// The result of the registration, an NVML return code.
    pub status: Return,
    /// The clique (the GPUs that can reach each other's memory) within the cluster.
    pub clique_id: u32,
    /// `NVML_GPU_FABRIC_STATE_*`; [`FABRIC_STATE_COMPLETED`] once registered.
    pub state: u8,
}

impl FabricInfo {
    /// Whether the GPU is attached to a fabric: registration completed successfully and
    /// a cluster was assigned (NVIDIA's go-nvlib applies the same three checks).
    pub fn is_attached(&self) -> bool {
        self.state == FABRIC_STATE_COMPLETED
            && self.status == Return::Success
            && self.cluster_uuid != [0; 16]
    }

    /// The cluster UUID in the usual 8-4-4-4-12 lowercase form.
    pub fn cluster_uuid_string(&self) -> String {
        let hex: String = self
            .cluster_uuid
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        format!(
            "{}-{}-{}-{}-{}",
            &hex[0..8],
            &hex[8..12],
            &hex[12..16],
            &hex[16..20],
            &hex[20..32]
        )
    }
}

/// A MIG device's resources, as `nvmlDeviceGetAttributes_v2` reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MigAttributes {
    pub multiprocessors: u32,
    pub copy_engines: u32,
    pub decoders: u32,
    pub encoders: u32,
    pub jpeg_engines: u32,
    pub ofa_engines: u32,
    pub gpu_instance_slices: u32,
    pub compute_instance_slices: u32,
    pub memory_mib: u64,
}

impl Device<'_> {
    /// `nvmlDeviceGetGpuFabricInfo`, or `nvmlDeviceGetGpuFabricInfoV` (version 2) on a
    /// driver that has only that. `NOT_SUPPORTED` on GPUs without a fabric.
    pub fn fabric_info(&self) -> Result<FabricInfo, NvmlError> {
        let api = &self.nvml.api;
        if api.fabric_info.f.is_none() && api.fabric_info_v.f.is_some() {
            let (f, name) = self.nvml.function(&api.fabric_info_v)?;
            let mut raw = RawFabricInfoV2 {
                version: FABRIC_INFO_V2,
                ..RawFabricInfoV2::default()
            };
            // SAFETY: `raw` is a valid nvmlGpuFabricInfo_v2_t (layout-checked above) whose
            // version field tells the function which layout it may write.
            self.nvml.check(name, unsafe { f(self.handle, &mut raw) })?;
            return Ok(FabricInfo {
                cluster_uuid: raw.cluster_uuid,
                status: Return::from_raw(raw.status),
                clique_id: raw.clique_id,
                state: raw.state,
            });
        }
        let raw = self.out(&api.fabric_info, RawFabricInfo::default())?;
        Ok(FabricInfo {
            cluster_uuid: raw.cluster_uuid,
            status: Return::from_raw(raw.status),
            clique_id: raw.clique_id,
            state: raw.state,
        })
    }

    /// `nvmlDeviceGetAttributes_v2` on a MIG device handle.
    pub fn mig_attributes(&self) -> Result<MigAttributes, NvmlError> {
        let raw = self.out(&self.nvml.api.attributes, RawAttributes::default())?;
        Ok(MigAttributes {
            multiprocessors: raw.multiprocessor_count,
            copy_engines: raw.shared_copy_engine_count,
            decoders: raw.shared_decoder_count,
            encoders: raw.shared_encoder_count,
            jpeg_engines: raw.shared_jpeg_count,
            ofa_engines: raw.shared_ofa_count,
            gpu_instance_slices: raw.gpu_instance_slice_count,
            compute_instance_slices: raw.compute_instance_slice_count,
            memory_mib: raw.memory_size_mb,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fabric_attachment_needs_completed_success_and_a_cluster() {
        let attached = FabricInfo {
            cluster_uuid: [0x11; 16],
            status: Return::Success,
            clique_id: 7,
            state: FABRIC_STATE_COMPLETED,
        };
        let cases = [
            ("attached", attached.clone(), true),
            (
                "in progress",
                FabricInfo {
                    state: 2,
                    ..attached.clone()
                },
                false,
            ),
            (
                "failed",
                FabricInfo {
                    status: Return::NotSupported,
                    ..attached.clone()
                },
                false,
            ),
            (
                "no cluster",
                FabricInfo {
                    cluster_uuid: [0; 16],
                    ..attached.clone()
                },
                false,
            ),
        ];
        for (case, info, want) in cases {
            assert_eq!(info.is_attached(), want, "case {case}");
        }
        assert_eq!(
            FabricInfo {
                cluster_uuid: [
                    0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0, 0x01, 0x23, 0x45, 0x67, 0x89,
                    0xab, 0xcd, 0xef
                ],
                ..attached
            }
            .cluster_uuid_string(),
            "12345678-9abc-def0-0123-456789abcdef"
        );
    }
}

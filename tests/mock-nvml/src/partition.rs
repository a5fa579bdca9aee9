// SPDX-License-Identifier: Apache-2.0
//! The exports gpu-feature-discovery's labels need beyond the inventory: a GPU's fabric
//! registration (`nvmlDeviceGetGpuFabricInfo`, `…InfoV`) and a MIG device's attributes
//! (`nvmlDeviceGetAttributes_v2`), answered from a GPU's `gfd` config
//! ([`crate::config::GfdConfig`]). A GPU without one answers `NOT_SUPPORTED` to both, as
//! a GPU outside an NVLink fabric does.

use std::ffi::{c_uint, c_ulonglong};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::config::GfdConfig;
use crate::state::{Dev, Node, Ret, code};
use crate::{RawDevice, log_call, put, with_device};

/// `nvmlGpuFabricInfo_t`.
#[repr(C)]
struct FabricInfo {
    cluster_uuid: [u8; 16],
    status: c_uint,
    clique_id: c_uint,
    state: u8,
}

/// `nvmlGpuFabricInfo_v2_t`.
#[repr(C)]
struct FabricInfoV2 {
    version: c_uint,
    cluster_uuid: [u8; 16],
    status: c_uint,
    clique_id: c_uint,
    state: u8,
    health_mask: c_uint,
}

/// `nvmlDeviceAttributes_t`.
#[repr(C)]
struct Attributes {
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

/// The `gfd` config of the GPU behind `dev` (a MIG device's parent for MIG devices).
fn gfd(node: &Node, dev: Dev) -> Option<&GfdConfig> {
    node.gpu(dev).config.gfd.as_ref()
}

/// (cluster UUID bytes, status, clique id, state) of a GPU.
fn fabric(handle: RawDevice) -> Result<([u8; 16], c_uint, c_uint, u8), Ret> {
    with_device(handle, |node, dev| {
        let Dev::Gpu(_) = dev else {
            return Err(code::NOT_SUPPORTED);
        };
        let fabric = gfd(node, dev)
            .and_then(|g| g.fabric.as_ref())
            .ok_or(code::NOT_SUPPORTED)?;
        let uuid = fabric.cluster_uuid_bytes().ok_or(code::UNKNOWN)?;
        Ok((uuid, fabric.status, fabric.clique_id, fabric.state))
    })
}

/// `nvmlGpuFabricInfo_v2`: the struct's size, version 2 in the top byte.
const FABRIC_INFO_V2: c_uint = size_of::<FabricInfoV2>() as c_uint | (2 << 24);

nvml_exports! {
    fn nvmlDeviceGetGpuFabricInfo(device: RawDevice, info: *mut FabricInfo) {
        let (cluster_uuid, status, clique_id, state) = fabric(device)?;
        let value = FabricInfo { cluster_uuid, status, clique_id, state };
        // SAFETY: NVML's contract: `info` is NULL or points to an nvmlGpuFabricInfo_t.
        unsafe { put(info, value) }
    }
    fn nvmlDeviceGetGpuFabricInfoV(device: RawDevice, info: *mut FabricInfoV2) {
        if info.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: non-NULL; NVML's contract makes it a versioned struct, whose first
        // field is the version.
        let version = unsafe { info.cast::<c_uint>().read_unaligned() };
        if version != FABRIC_INFO_V2 {
            return Err(code::ARGUMENT_VERSION_MISMATCH);
        }
        let (cluster_uuid, status, clique_id, state) = fabric(device)?;
        let value = FabricInfoV2 { version, cluster_uuid, status, clique_id, state, health_mask: 0 };
        // SAFETY: as above; the version says the caller's struct is a v2 one.
        unsafe { put(info, value) }
    }
    fn nvmlDeviceGetAttributes_v2(device: RawDevice, attributes: *mut Attributes) {
        let value = with_device(device, |node, dev| {
            let Dev::Mig(gpu, mig) = dev else {
                return Err(code::NOT_SUPPORTED);
            };
            let profile = &node.mig(gpu, mig).ok_or(code::NOT_FOUND)?.profile;
            let a = gfd(node, dev)
                .and_then(|g| g.mig_attributes.get(profile))
                .ok_or(code::NOT_SUPPORTED)?;
            Ok(Attributes {
                multiprocessor_count: a.multiprocessors,
                shared_copy_engine_count: a.copy_engines,
                shared_decoder_count: a.decoders,
                shared_encoder_count: a.encoders,
                shared_jpeg_count: a.jpeg_engines,
                shared_ofa_count: a.ofa_engines,
                gpu_instance_slice_count: a.gpu_instance_slices,
                compute_instance_slice_count: a.compute_instance_slices,
                memory_size_mb: a.memory_mib,
            })
        })?;
        // SAFETY: NVML's contract: `attributes` is NULL or points to an
        // nvmlDeviceAttributes_t.
        unsafe { put(attributes, value) }
    }
}

// SPDX-License-Identifier: Apache-2.0
//! [`Device`]: the safe wrapper around an `nvmlDevice_t` (a GPU or a MIG device) and the
//! queries the inventory makes of it, with their result types [`PciInfo`] and [`MemoryInfo`].
//! It borrows the [`Nvml`] it came from, so no handle outlives the library.
#![allow(unsafe_code)]

use std::ffi::c_uint;
use std::fmt;

use super::ffi::{self, RawDevice, RawReturn};
use super::{Nvml, NvmlError, Sym, c_string};

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLE: c_uint = 1;

/// A GPU or MIG device handle, valid while the [`Nvml`] it came from is alive.
#[derive(Clone, Copy)]
pub struct Device<'a> {
    pub(super) nvml: &'a Nvml,
    pub(super) handle: RawDevice,
}

// SAFETY: an nvmlDevice_t is an opaque token that NVML validates on every call, and NVML is
// thread-safe, so a handle may be used from, and shared with, any thread while the library
// is loaded; the `'a` borrow of `Nvml` keeps it loaded.
unsafe impl Send for Device<'_> {}
// SAFETY: as for Send: `Device` has no interior mutability; every use is an NVML call.
unsafe impl Sync for Device<'_> {}

impl fmt::Debug for Device<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Device").field(&self.handle).finish()
    }
}

/// Two handles are equal when NVML gave the same handle (NVML hands out one per device).
impl PartialEq for Device<'_> {
    fn eq(&self, other: &Self) -> bool {
        self.handle == other.handle && std::ptr::eq(self.nvml, other.nvml)
    }
}
impl Eq for Device<'_> {}

/// `nvmlDeviceGetPciInfo_v3`, with the bus id as NVML writes it (`00000000:07:00.0`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PciInfo {
    pub bus_id: String,
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    /// Combined device id (high 16 bits) and vendor id (low 16 bits, `0x10de`).
    pub pci_device_id: u32,
    pub pci_subsystem_id: u32,
}

impl PciInfo {
    /// Reads NVML's struct (as `_v2`/`_v3` fill it) into owned fields.
    pub(super) fn from_raw(raw: &ffi::PciInfo) -> PciInfo {
        PciInfo {
            bus_id: c_string(&raw.bus_id),
            domain: raw.domain,
            bus: raw.bus,
            device: raw.device,
            pci_device_id: raw.pci_device_id,
            pci_subsystem_id: raw.pci_subsystem_id,
        }
    }
}

/// `nvmlDeviceGetMemoryInfo`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfo {
    pub total: u64,
    pub free: u64,
    pub used: u64,
}

impl<'a> Device<'a> {
    /// `nvmlDeviceGetUUID`: `GPU-…` or `MIG-…`.
    pub fn uuid(&self) -> Result<String, NvmlError> {
        self.string(&self.nvml.api.uuid, ffi::UUID_BUFFER_SIZE)
    }

    /// `nvmlDeviceGetName`, e.g. `NVIDIA A100-SXM4-80GB`; MIG devices append ` MIG <profile>`.
    pub fn name(&self) -> Result<String, NvmlError> {
        self.string(&self.nvml.api.name, ffi::NAME_BUFFER_SIZE)
    }

    /// `nvmlDeviceGetMinorNumber`: the `N` of `/dev/nvidiaN`.
    pub fn minor_number(&self) -> Result<u32, NvmlError> {
        self.out(&self.nvml.api.minor_number, 0)
    }

    /// `nvmlDeviceGetBrand`: the `nvmlBrandType_t` value (1 Quadro, 2 Tesla, 3 NVS,
    /// 4 GRID, 5 GeForce, 6 Titan, … 14 NVIDIA).
    pub fn brand(&self) -> Result<u32, NvmlError> {
        self.out(&self.nvml.api.brand, 0)
    }

    /// `nvmlDeviceGetPciInfo_v3`.
    pub fn pci_info(&self) -> Result<PciInfo, NvmlError> {
        let raw = self.out(&self.nvml.api.pci_info, ffi::PciInfo::default())?;
        Ok(PciInfo::from_raw(&raw))
    }

    /// `nvmlDeviceGetMemoryInfo`.
    pub fn memory_info(&self) -> Result<MemoryInfo, NvmlError> {
        let raw = self.out(&self.nvml.api.memory_info, ffi::Memory::default())?;
        Ok(MemoryInfo {
            total: raw.total,
            free: raw.free,
            used: raw.used,
        })
    }

    /// `nvmlDeviceGetCudaComputeCapability`: `(major, minor)`, e.g. `(8, 0)`.
    pub fn cuda_compute_capability(&self) -> Result<(i32, i32), NvmlError> {
        self.out_pair(&self.nvml.api.compute_capability, 0)
    }

    /// `nvmlDeviceGetMigMode`: `(current, pending)`. `NOT_SUPPORTED` on GPUs without MIG.
    pub fn mig_mode(&self) -> Result<(bool, bool), NvmlError> {
        let (current, pending) = self.out_pair(&self.nvml.api.mig_mode, 0)?;
        Ok((current == MIG_ENABLE, pending == MIG_ENABLE))
    }

    /// `nvmlDeviceGetMaxMigDeviceCount`: how many MIG device slots to probe with
    /// [`Device::mig_device_by_index`] (zero when MIG is off).
    pub fn max_mig_device_count(&self) -> Result<u32, NvmlError> {
        self.out(&self.nvml.api.max_mig_device_count, 0)
    }

    /// `nvmlDeviceGetMigDeviceHandleByIndex`: `NOT_FOUND` for an empty slot.
    pub fn mig_device_by_index(&self, index: u32) -> Result<Device<'a>, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.mig_by_index)?;
        let mut handle: RawDevice = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer for an nvmlDevice_t.
        let ret = unsafe { f(self.handle, index, &mut handle) };
        self.nvml.check(name, ret)?;
        Ok(self.sibling(handle))
    }

    /// `nvmlDeviceIsMigDeviceHandle`.
    pub fn is_mig_device(&self) -> Result<bool, NvmlError> {
        Ok(self.out(&self.nvml.api.is_mig_device, 0)? != 0)
    }

    /// `nvmlDeviceGetGpuInstanceId` (MIG devices only).
    pub fn gpu_instance_id(&self) -> Result<u32, NvmlError> {
        self.out(&self.nvml.api.gpu_instance_id, 0)
    }

    /// `nvmlDeviceGetComputeInstanceId` (MIG devices only).
    pub fn compute_instance_id(&self) -> Result<u32, NvmlError> {
        self.out(&self.nvml.api.compute_instance_id, 0)
    }

    /// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the GPU a MIG device lives on.
    pub fn parent(&self) -> Result<Device<'a>, NvmlError> {
        let handle = self.out(&self.nvml.api.parent, std::ptr::null_mut())?;
        Ok(self.sibling(handle))
    }

    /// `nvmlDeviceGetSupportedEventTypes`: a mask of `nvmlEventType*` bits.
    pub fn supported_event_types(&self) -> Result<u64, NvmlError> {
        self.out(&self.nvml.api.supported_event_types, 0)
    }

    /// Another device of the same [`Nvml`].
    fn sibling(&self, handle: RawDevice) -> Device<'a> {
        Device {
            nvml: self.nvml,
            handle,
        }
    }

    /// Calls a getter shaped `(nvmlDevice_t, T *)` and returns what it wrote over `init`.
    pub(super) fn out<T>(
        &self,
        sym: &Sym<unsafe extern "C" fn(RawDevice, *mut T) -> RawReturn>,
        init: T,
    ) -> Result<T, NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        let mut value = init;
        // SAFETY: `value` is a valid, initialised `T`, and `sym`'s type (nvml.h's signature,
        // transcribed and layout-checked in `ffi`) says the function writes one `T` there.
        let ret = unsafe { f(self.handle, &mut value) };
        self.nvml.check(name, ret)?;
        Ok(value)
    }

    /// Calls a getter shaped `(nvmlDevice_t, T *, T *)` and returns the two values it wrote.
    fn out_pair<T: Copy>(
        &self,
        sym: &Sym<unsafe extern "C" fn(RawDevice, *mut T, *mut T) -> RawReturn>,
        init: T,
    ) -> Result<(T, T), NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        let (mut first, mut second) = (init, init);
        // SAFETY: both are valid out-pointers to the `T`s that `sym`'s type says it writes.
        let ret = unsafe { f(self.handle, &mut first, &mut second) };
        self.nvml.check(name, ret)?;
        Ok((first, second))
    }

    fn string(&self, sym: &Sym<ffi::DeviceStringFn>, size: usize) -> Result<String, NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        self.nvml.string_out(name, size, |buffer, length| {
            // SAFETY: `string_out` passes a buffer writable for the `length` it passes.
            unsafe { f(self.handle, buffer, length) }
        })
    }
}

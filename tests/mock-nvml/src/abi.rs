//! NVML's C structs that cross the ABI in both directions: the mock library fills
//! them, the fake `nvidia-smi` reads them. Layouts as in nvml.h.

use std::ffi::{c_uint, c_ulonglong};

/// `nvmlPciInfo_t` (v2/v3 layout).
#[repr(C)]
#[derive(Default)]
pub(crate) struct PciInfo {
    pub(crate) bus_id_legacy: [u8; 16],
    pub(crate) domain: c_uint,
    pub(crate) bus: c_uint,
    pub(crate) device: c_uint,
    pub(crate) pci_device_id: c_uint,
    pub(crate) pci_subsystem_id: c_uint,
    pub(crate) bus_id: [u8; 32],
}

/// `nvmlMemory_t`.
#[repr(C)]
#[derive(Default)]
pub(crate) struct Memory {
    pub(crate) total: c_ulonglong,
    pub(crate) free: c_ulonglong,
    pub(crate) used: c_ulonglong,
}

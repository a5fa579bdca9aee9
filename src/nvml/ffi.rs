// SPDX-License-Identifier: Apache-2.0
//! NVML's C types and function signatures, transcribed from `nvml.h`.
//!
//! Only what [`super`] calls is here. Layouts are checked against the header at compile
//! time below, so a typo in a field shows up as a build error rather than as a garbled
//! bus id at run time.

use std::ffi::{c_int, c_uint, c_ulonglong, c_void};

/// `nvmlReturn_t`: a C enum, so an `int`-sized value; every defined code is non-negative.
pub(super) type RawReturn = c_uint;
/// `nvmlDevice_t`: `struct nvmlDevice_st *`, opaque.
pub(super) type RawDevice = *mut c_void;
/// `nvmlEventSet_t`: `struct nvmlEventSet_st *`, opaque.
pub(super) type RawEventSet = *mut c_void;

/// `NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE`.
pub(super) const DRIVER_VERSION_BUFFER_SIZE: usize = 80;
/// `NVML_DEVICE_UUID_V2_BUFFER_SIZE` (the v1 size, 80, is too small for MIG UUIDs).
pub(super) const UUID_BUFFER_SIZE: usize = 96;
/// `NVML_DEVICE_NAME_V2_BUFFER_SIZE`.
pub(super) const NAME_BUFFER_SIZE: usize = 96;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_V2_SIZE` (`busIdLegacy`).
pub(super) const PCI_BUS_ID_LEGACY_SIZE: usize = 16;
/// `NVML_DEVICE_PCI_BUS_ID_BUFFER_SIZE` (`busId`).
pub(super) const PCI_BUS_ID_SIZE: usize = 32;

/// `nvmlPciInfo_t` as filled by `nvmlDeviceGetPciInfo_v3` (same layout as `_v2`).
/// The `char` arrays are `u8` here: same size and alignment, easier to read back.
#[repr(C)]
#[derive(Default)]
pub(super) struct PciInfo {
    pub bus_id_legacy: [u8; PCI_BUS_ID_LEGACY_SIZE],
    pub domain: c_uint,
    pub bus: c_uint,
    pub device: c_uint,
    pub pci_device_id: c_uint,
    pub pci_subsystem_id: c_uint,
    pub bus_id: [u8; PCI_BUS_ID_SIZE],
}

/// `nvmlMemory_t` (v1: total, free, used, all in bytes).
#[repr(C)]
#[derive(Default)]
pub(super) struct Memory {
    pub total: c_ulonglong,
    pub free: c_ulonglong,
    pub used: c_ulonglong,
}

/// `nvmlUtilization_t`: percent of the last sample period the GPU ran kernels, and its
/// memory was read or written.
#[repr(C)]
#[derive(Default)]
pub(super) struct Utilization {
    pub gpu: c_uint,
    pub memory: c_uint,
}

/// `nvmlEventData_t` as filled by `nvmlEventSetWait_v2`. The v1 call writes only the first
/// three fields, so the instance ids are pre-set to NVML's "not attributable" value.
#[repr(C)]
pub(super) struct EventData {
    pub device: RawDevice,
    pub event_type: c_ulonglong,
    pub event_data: c_ulonglong,
    pub gpu_instance_id: c_uint,
    pub compute_instance_id: c_uint,
}

const _: () = {
    assert!(size_of::<PciInfo>() == 68);
    assert!(size_of::<Memory>() == 24);
    assert!(size_of::<Utilization>() == 8);
    #[cfg(target_pointer_width = "64")]
    assert!(size_of::<EventData>() == 32);
};

pub(super) type InitFn = unsafe extern "C" fn() -> RawReturn;
pub(super) type ShutdownFn = unsafe extern "C" fn() -> RawReturn;
pub(super) type ErrorStringFn = unsafe extern "C" fn(RawReturn) -> *const std::ffi::c_char;
/// `(char *buffer, unsigned int length)`.
pub(super) type SystemStringFn = unsafe extern "C" fn(*mut std::ffi::c_char, c_uint) -> RawReturn;
pub(super) type IntOutFn = unsafe extern "C" fn(*mut c_int) -> RawReturn;
pub(super) type UintOutFn = unsafe extern "C" fn(*mut c_uint) -> RawReturn;
pub(super) type HandleByIndexFn = unsafe extern "C" fn(c_uint, *mut RawDevice) -> RawReturn;
pub(super) type HandleByUuidFn =
    unsafe extern "C" fn(*const std::ffi::c_char, *mut RawDevice) -> RawReturn;
/// `(nvmlDevice_t device, char *buffer, unsigned int length)`.
pub(super) type DeviceStringFn =
    unsafe extern "C" fn(RawDevice, *mut std::ffi::c_char, c_uint) -> RawReturn;
pub(super) type DeviceUintFn = unsafe extern "C" fn(RawDevice, *mut c_uint) -> RawReturn;
pub(super) type DeviceTwoUintFn =
    unsafe extern "C" fn(RawDevice, *mut c_uint, *mut c_uint) -> RawReturn;
pub(super) type DeviceTwoIntFn =
    unsafe extern "C" fn(RawDevice, *mut c_int, *mut c_int) -> RawReturn;
pub(super) type DeviceU64Fn = unsafe extern "C" fn(RawDevice, *mut c_ulonglong) -> RawReturn;
pub(super) type PciInfoFn = unsafe extern "C" fn(RawDevice, *mut PciInfo) -> RawReturn;
pub(super) type MemoryFn = unsafe extern "C" fn(RawDevice, *mut Memory) -> RawReturn;
pub(super) type UtilizationFn = unsafe extern "C" fn(RawDevice, *mut Utilization) -> RawReturn;
/// `(nvmlDevice_t device, <an int-sized C enum> which, unsigned int *value)`:
/// `nvmlDeviceGetTemperature` (`nvmlTemperatureSensors_t`) and `nvmlDeviceGetClockInfo`
/// (`nvmlClockType_t`).
pub(super) type DeviceEnumUintFn =
    unsafe extern "C" fn(RawDevice, c_uint, *mut c_uint) -> RawReturn;
pub(super) type MigByIndexFn = unsafe extern "C" fn(RawDevice, c_uint, *mut RawDevice) -> RawReturn;
pub(super) type DeviceHandleFn = unsafe extern "C" fn(RawDevice, *mut RawDevice) -> RawReturn;
pub(super) type RegisterEventsFn =
    unsafe extern "C" fn(RawDevice, c_ulonglong, RawEventSet) -> RawReturn;
pub(super) type EventSetCreateFn = unsafe extern "C" fn(*mut RawEventSet) -> RawReturn;
pub(super) type EventSetWaitFn =
    unsafe extern "C" fn(RawEventSet, *mut EventData, c_uint) -> RawReturn;
pub(super) type EventSetFreeFn = unsafe extern "C" fn(RawEventSet) -> RawReturn;
/// `(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)`; the enum is an
/// `int`-sized C enum.
pub(super) type NvLinkStateFn = unsafe extern "C" fn(RawDevice, c_uint, *mut c_uint) -> RawReturn;
/// `(nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci)`, the `_v2` layout.
pub(super) type NvLinkRemotePciFn =
    unsafe extern "C" fn(RawDevice, c_uint, *mut PciInfo) -> RawReturn;

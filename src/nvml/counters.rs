// SPDX-License-Identifier: Apache-2.0
//! The readings the metrics exporter adds to [`telemetry`](super::telemetry): reserved
//! memory, energy, encoder/decoder load, PCIe counters, field values (memory temperature,
//! NVLink bandwidth), ECC totals, retired pages, remapped rows and clock event reasons.
//!
//! Every function here is optional: the table [`CountersApi`] is resolved beside the main
//! one, and a driver without a function reports [`NvmlError::SymbolMissing`] for that
//! reading alone; a GPU that cannot measure something answers `NOT_SUPPORTED`. Callers
//! treat both as "no reading" ([`NvmlError::is_not_supported`]).
#![allow(unsafe_code)]

use std::ffi::{c_int, c_uint, c_ulonglong};

use libloading::Library;

use super::ffi::{RawDevice, RawReturn};
use super::{Device, NvmlError, Return, Sym, resolve};

/// `nvmlMemory_v2_t`: the `_v2` memory info, with the memory the driver reserves.
#[repr(C)]
#[derive(Default)]
struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlMemory_v2`: `NVML_STRUCT_VERSION(Memory, 2)`, the struct's size with the version
/// in the top byte.
const MEMORY_V2_VERSION: c_uint = size_of::<MemoryV2>() as c_uint | (2 << 24);

/// `nvmlValue_t`: a union of 8 bytes; read as the member `value_type` names.
#[repr(C)]
#[derive(Clone, Copy)]
union Value {
    double: f64,
    uint: c_uint,
    ulong: std::ffi::c_ulong,
    ulonglong: c_ulonglong,
    slonglong: i64,
    sint: c_int,
    ushort: u16,
}

/// `nvmlFieldValue_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: RawReturn,
    value: Value,
}

const _: () = {
    assert!(size_of::<MemoryV2>() == 40);
    assert!(size_of::<FieldValue>() == 40);
};

/// `NVML_FI_DEV_MEMORY_TEMP`: memory temperature, °C.
pub const FIELD_MEMORY_TEMPERATURE: u32 = 82;
/// `NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL`: NVLink counter set 0 over all links.
pub const FIELD_NVLINK_BANDWIDTH_C0_TOTAL: u32 = 66;

type MemoryV2Fn = unsafe extern "C" fn(RawDevice, *mut MemoryV2) -> RawReturn;
type U64OutFn = unsafe extern "C" fn(RawDevice, *mut c_ulonglong) -> RawReturn;
type UintOutFn = unsafe extern "C" fn(RawDevice, *mut c_uint) -> RawReturn;
/// `(device, unsigned int *utilization, unsigned int *samplingPeriodUs)`.
type CodecUtilFn = unsafe extern "C" fn(RawDevice, *mut c_uint, *mut c_uint) -> RawReturn;
/// `(device, nvmlPcieUtilCounter_t counter, unsigned int *value)`.
type PcieThroughputFn = unsafe extern "C" fn(RawDevice, c_uint, *mut c_uint) -> RawReturn;
/// `(device, int valuesCount, nvmlFieldValue_t *values)`.
type FieldValuesFn = unsafe extern "C" fn(RawDevice, c_int, *mut FieldValue) -> RawReturn;
/// `(device, nvmlMemoryErrorType_t, nvmlEccCounterType_t, unsigned long long *)`.
type TotalEccFn = unsafe extern "C" fn(RawDevice, c_uint, c_uint, *mut c_ulonglong) -> RawReturn;
/// `(device, nvmlPageRetirementCause_t, unsigned int *pageCount, unsigned long long *addresses)`.
type RetiredPagesFn =
    unsafe extern "C" fn(RawDevice, c_uint, *mut c_uint, *mut c_ulonglong) -> RawReturn;
/// `(device, unsigned int *corrRows, *uncRows, *isPending, *failureOccurred)`.
type RemappedRowsFn = unsafe extern "C" fn(
    RawDevice,
    *mut c_uint,
    *mut c_uint,
    *mut c_uint,
    *mut c_uint,
) -> RawReturn;

/// The exporter's optional functions, resolved at load beside [`super::Api`].
pub(super) struct CountersApi {
    memory_info_v2: Sym<MemoryV2Fn>,
    total_energy: Sym<U64OutFn>,
    encoder_utilization: Sym<CodecUtilFn>,
    decoder_utilization: Sym<CodecUtilFn>,
    pcie_replay_counter: Sym<UintOutFn>,
    pcie_throughput: Sym<PcieThroughputFn>,
    field_values: Sym<FieldValuesFn>,
    total_ecc_errors: Sym<TotalEccFn>,
    retired_pages: Sym<RetiredPagesFn>,
    retired_pages_pending: Sym<UintOutFn>,
    remapped_rows: Sym<RemappedRowsFn>,
    clocks_event_reasons: Sym<U64OutFn>,
}

impl CountersApi {
    pub(super) fn resolve(lib: &Library) -> CountersApi {
        // SAFETY: (every call) each field's type is the signature nvml.h declares for the
        // names listed; the older throttle-reasons name has the same signature.
        unsafe {
            CountersApi {
                memory_info_v2: resolve(lib, &["nvmlDeviceGetMemoryInfo_v2"]),
                total_energy: resolve(lib, &["nvmlDeviceGetTotalEnergyConsumption"]),
                encoder_utilization: resolve(lib, &["nvmlDeviceGetEncoderUtilization"]),
                decoder_utilization: resolve(lib, &["nvmlDeviceGetDecoderUtilization"]),
                pcie_replay_counter: resolve(lib, &["nvmlDeviceGetPcieReplayCounter"]),
                pcie_throughput: resolve(lib, &["nvmlDeviceGetPcieThroughput"]),
                field_values: resolve(lib, &["nvmlDeviceGetFieldValues"]),
                total_ecc_errors: resolve(lib, &["nvmlDeviceGetTotalEccErrors"]),
                retired_pages: resolve(lib, &["nvmlDeviceGetRetiredPages"]),
                retired_pages_pending: resolve(lib, &["nvmlDeviceGetRetiredPagesPendingStatus"]),
                remapped_rows: resolve(lib, &["nvmlDeviceGetRemappedRows"]),
                clocks_event_reasons: resolve(
                    lib,
                    &[
                        "nvmlDeviceGetCurrentClocksEventReasons",
                        "nvmlDeviceGetCurrentClocksThrottleReasons",
                    ],
                ),
            }
        }
    }
}

/// `nvmlDeviceGetMemoryInfo_v2`, in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryInfoV2 {
    pub total: u64,
    pub reserved: u64,
    pub free: u64,
    pub used: u64,
}

/// `nvmlPcieUtilCounter_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PcieDirection {
    /// `NVML_PCIE_UTIL_TX_BYTES` (0).
    Tx,
    /// `NVML_PCIE_UTIL_RX_BYTES` (1).
    Rx,
}

/// `nvmlMemoryErrorType_t` × `nvmlEccCounterType_t`: which ECC total to read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EccCounter {
    /// `NVML_MEMORY_ERROR_TYPE_UNCORRECTED` (1) when true, `_CORRECTED` (0) when false.
    pub uncorrected: bool,
    /// `NVML_AGGREGATE_ECC` (1, since the last inforom reset) when true, `NVML_VOLATILE_ECC`
    /// (0, since the driver loaded) when false.
    pub aggregate: bool,
}

/// `nvmlPageRetirementCause_t`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetirementCause {
    /// `NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS` (0).
    SingleBit,
    /// `NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR` (1).
    DoubleBit,
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failed: bool,
}

/// One value of `nvmlDeviceGetFieldValues`: the number, or the field's own error.
pub type FieldReading = Result<f64, Return>;

impl Device<'_> {
    fn counters(&self) -> &CountersApi {
        &self.nvml.api.counters
    }

    /// `nvmlDeviceGetMemoryInfo_v2`.
    pub fn memory_info_v2(&self) -> Result<MemoryInfoV2, NvmlError> {
        let init = MemoryV2 {
            version: MEMORY_V2_VERSION,
            ..MemoryV2::default()
        };
        let raw = self.out(&self.counters().memory_info_v2, init)?;
        Ok(MemoryInfoV2 {
            total: raw.total,
            reserved: raw.reserved,
            free: raw.free,
            used: raw.used,
        })
    }

    /// `nvmlDeviceGetTotalEnergyConsumption`: millijoules since the driver loaded.
    pub fn total_energy_consumption(&self) -> Result<u64, NvmlError> {
        self.out(&self.counters().total_energy, 0)
    }

    /// `nvmlDeviceGetEncoderUtilization`: percent (the sampling period is dropped).
    pub fn encoder_utilization(&self) -> Result<u32, NvmlError> {
        self.codec(&self.counters().encoder_utilization)
    }

    /// `nvmlDeviceGetDecoderUtilization`: percent.
    pub fn decoder_utilization(&self) -> Result<u32, NvmlError> {
        self.codec(&self.counters().decoder_utilization)
    }

    fn codec(&self, sym: &Sym<CodecUtilFn>) -> Result<u32, NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        let (mut utilization, mut period): (c_uint, c_uint) = (0, 0);
        // SAFETY: both are valid out-pointers for the unsigned ints the function writes.
        let ret = unsafe { f(self.handle, &mut utilization, &mut period) };
        self.nvml.check(name, ret)?;
        Ok(utilization)
    }

    /// `nvmlDeviceGetPcieReplayCounter`.
    pub fn pcie_replay_counter(&self) -> Result<u32, NvmlError> {
        self.out(&self.counters().pcie_replay_counter, 0)
    }

    /// `nvmlDeviceGetPcieThroughput`: KB/s over the driver's last 20 ms window.
    pub fn pcie_throughput(&self, direction: PcieDirection) -> Result<u32, NvmlError> {
        let (f, name) = self.nvml.function(&self.counters().pcie_throughput)?;
        let counter: c_uint = match direction {
            PcieDirection::Tx => 0,
            PcieDirection::Rx => 1,
        };
        let mut value: c_uint = 0;
        // SAFETY: `value` is a valid out-pointer; `counter` is a defined enum value.
        let ret = unsafe { f(self.handle, counter, &mut value) };
        self.nvml.check(name, ret)?;
        Ok(value)
    }

    /// `nvmlDeviceGetFieldValues` for `fields` (scope 0): one reading per field, in order,
    /// each the number (whatever its C type) or that field's own error.
    pub fn field_values(&self, fields: &[u32]) -> Result<Vec<FieldReading>, NvmlError> {
        let (f, name) = self.nvml.function(&self.counters().field_values)?;
        let mut values: Vec<FieldValue> = fields
            .iter()
            .map(|&field_id| FieldValue {
                field_id,
                scope_id: 0,
                timestamp: 0,
                latency_usec: 0,
                value_type: 0,
                nvml_return: 0,
                value: Value { ulonglong: 0 },
            })
            .collect();
        let count = c_int::try_from(values.len()).unwrap_or(c_int::MAX);
        // SAFETY: `values` holds `count` initialised nvmlFieldValue_t (layout checked
        // above), which the function reads the ids of and fills in.
        let ret = unsafe { f(self.handle, count, values.as_mut_ptr()) };
        self.nvml.check(name, ret)?;
        Ok(values.iter().map(field_reading).collect())
    }

    /// `nvmlDeviceGetTotalEccErrors`.
    pub fn total_ecc_errors(&self, counter: EccCounter) -> Result<u64, NvmlError> {
        let (f, name) = self.nvml.function(&self.counters().total_ecc_errors)?;
        let mut value: c_ulonglong = 0;
        // SAFETY: `value` is a valid out-pointer; both enums get defined values (0 or 1).
        let ret = unsafe {
            f(
                self.handle,
                c_uint::from(counter.uncorrected),
                c_uint::from(counter.aggregate),
                &mut value,
            )
        };
        self.nvml.check(name, ret)?;
        Ok(value)
    }

    /// `nvmlDeviceGetRetiredPages`, asking only for the count (no address buffer).
    pub fn retired_page_count(&self, cause: RetirementCause) -> Result<u32, NvmlError> {
        let (f, name) = self.nvml.function(&self.counters().retired_pages)?;
        let cause: c_uint = match cause {
            RetirementCause::SingleBit => 0,
            RetirementCause::DoubleBit => 1,
        };
        let mut count: c_uint = 0;
        // SAFETY: a count of 0 with a NULL address buffer asks for the count alone; the
        // function writes only `count`.
        let ret = unsafe { f(self.handle, cause, &mut count, std::ptr::null_mut()) };
        // With pages retired and no buffer, NVML says the (empty) buffer is too small and
        // still writes the count.
        if Return::from_raw(ret) == Return::InsufficientSize {
            return Ok(count);
        }
        self.nvml.check(name, ret)?;
        Ok(count)
    }

    /// `nvmlDeviceGetRetiredPagesPendingStatus`: whether pages wait for a reboot to retire.
    pub fn retired_pages_pending(&self) -> Result<bool, NvmlError> {
        Ok(self.out(&self.counters().retired_pages_pending, 0)? != 0)
    }

    /// `nvmlDeviceGetRemappedRows`.
    pub fn remapped_rows(&self) -> Result<RemappedRows, NvmlError> {
        let (f, name) = self.nvml.function(&self.counters().remapped_rows)?;
        let (mut corr, mut unc, mut pending, mut failed): (c_uint, c_uint, c_uint, c_uint) =
            (0, 0, 0, 0);
        // SAFETY: four valid out-pointers for the unsigned ints the function writes.
        let ret = unsafe { f(self.handle, &mut corr, &mut unc, &mut pending, &mut failed) };
        self.nvml.check(name, ret)?;
        Ok(RemappedRows {
            correctable: corr,
            uncorrectable: unc,
            pending: pending != 0,
            failed: failed != 0,
        })
    }

    /// `nvmlDeviceGetCurrentClocksEventReasons` (the older
    /// `nvmlDeviceGetCurrentClocksThrottleReasons` where that is all there is): a mask of
    /// `nvmlClocksEventReason*` bits.
    pub fn clocks_event_reasons(&self) -> Result<u64, NvmlError> {
        self.out(&self.counters().clocks_event_reasons, 0)
    }
}

/// A filled `nvmlFieldValue_t` as a number (`nvmlValueType_t` says which member is set).
fn field_reading(value: &FieldValue) -> FieldReading {
    let code = Return::from_raw(value.nvml_return);
    if code != Return::Success {
        return Err(code);
    }
    // SAFETY: NVML wrote the member `value_type` names; every member is plain data, so
    // reading the one it names is a valid read of initialised bytes.
    let number = unsafe {
        match value.value_type {
            0 => value.value.double,
            1 => f64::from(value.value.uint),
            2 => value.value.ulong as f64,
            3 => value.value.ulonglong as f64,
            4 => value.value.slonglong as f64,
            5 => f64::from(value.value.sint),
            6 => f64::from(value.value.ushort),
            _ => return Err(Return::Unknown),
        }
    };
    Ok(number)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_values_read_the_member_their_type_names() {
        let mut value = FieldValue {
            field_id: FIELD_MEMORY_TEMPERATURE,
            scope_id: 0,
            timestamp: 0,
            latency_usec: 0,
            value_type: 1,
            nvml_return: 0,
            value: Value { ulonglong: 0 },
        };
        value.value.uint = 71;
        assert_eq!(field_reading(&value), Ok(71.0), "case unsigned int");
        value.value_type = 3;
        value.value.ulonglong = 1 << 40;
        assert_eq!(field_reading(&value), Ok((1u64 << 40) as f64), "case u64");
        value.nvml_return = 3;
        assert_eq!(
            field_reading(&value),
            Err(Return::NotSupported),
            "case error"
        );
        assert_eq!(MEMORY_V2_VERSION, 40 | (2 << 24));
    }
}

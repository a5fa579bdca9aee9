// SPDX-License-Identifier: Apache-2.0
//! The C side of `telemetry.rs`: the exports the metrics exporter calls, and GPM samples.
//!
//! A GPM sample handle is a tagged number (never a pointer) naming an entry of [`SAMPLES`];
//! a sample remembers which GPU or GPU instance it was taken of, and `nvmlGpmMetricsGet`
//! answers the configured percentages for two samples of the same target.

use std::collections::BTreeMap;
use std::ffi::{c_int, c_uint, c_ulonglong, c_void};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, PoisonError};

use crate::state::{Dev, Ret, code};
use crate::telemetry::{ARGUMENT_VERSION_MISMATCH, MEMORY_V2_VERSION};
use crate::{RawDevice, log_call, put, with_readings};

/// `nvmlMemory_v2_t`.
#[repr(C)]
struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

/// `nvmlFieldValue_t` (the value union as its 8 raw bytes).
#[repr(C)]
struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: c_uint,
    value: u64,
}

/// `nvmlGpmSupport_t`.
#[repr(C)]
struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

/// The head of `nvmlGpmMetricsGet_t`; the `nvmlGpmMetric_t` array follows at offset 24.
#[repr(C)]
struct MetricsGetHead {
    version: c_uint,
    num_metrics: c_uint,
    sample1: *mut c_void,
    sample2: *mut c_void,
}

/// `nvmlGpmMetric_t`.
#[repr(C)]
struct GpmMetric {
    metric_id: c_uint,
    nvml_return: c_uint,
    value: f64,
    info: [*mut c_void; 3],
}

const _: () = {
    assert!(size_of::<MemoryV2>() == 40);
    assert!(size_of::<FieldValue>() == 40);
    assert!(size_of::<MetricsGetHead>() == 24);
    assert!(size_of::<GpmMetric>() == 40);
};

/// `NVML_GPM_SUPPORT_VERSION`, `NVML_GPM_METRICS_GET_VERSION`.
const GPM_SUPPORT_VERSION: c_uint = 1;
const GPM_METRICS_GET_VERSION: c_uint = 1;
/// Tag in the high bits of a sample handle ("gpms").
const SAMPLE_TAG: usize = 0x6770_6d73 << 32;

/// What a sample was taken of: a GPU's position and, for a GPU instance, its id.
type Target = (usize, Option<u32>);

/// Allocated samples by number: what each was last taken of (`None` until taken).
static SAMPLES: Mutex<BTreeMap<usize, Option<Target>>> = Mutex::new(BTreeMap::new());
static NEXT_SAMPLE: Mutex<usize> = Mutex::new(1);

fn sample_id(handle: *mut c_void) -> Result<usize, Ret> {
    let raw = handle.addr();
    if raw & !0xffff_ffff != SAMPLE_TAG {
        return Err(code::INVALID_ARGUMENT);
    }
    let id = raw & 0xffff_ffff;
    let samples = SAMPLES.lock().unwrap_or_else(PoisonError::into_inner);
    samples
        .contains_key(&id)
        .then_some(id)
        .ok_or(code::INVALID_ARGUMENT)
}

/// Records that sample `handle` was taken of `target`, after checking the target has GPM.
fn take_sample(device: RawDevice, instance: Option<u32>, sample: *mut c_void) -> Result<(), Ret> {
    let id = sample_id(sample)?;
    let gpu = with_readings(device, |node, dev| {
        node.gpm(dev, instance)?;
        Ok(dev.gpu())
    })?;
    let mut samples = SAMPLES.lock().unwrap_or_else(PoisonError::into_inner);
    samples.insert(id, Some((gpu, instance)));
    Ok(())
}

nvml_exports! {
    fn nvmlDeviceGetMemoryInfo_v2(device: RawDevice, memory: *mut c_void) {
        let memory = memory.cast::<MemoryV2>();
        if memory.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: a non-NULL `memory` points to an nvmlMemory_v2_t.
        let version = unsafe { (*memory).version };
        if version != MEMORY_V2_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (total, reserved, free, used) = with_readings(device, |node, dev| node.memory_v2(dev))?;
        // SAFETY: as above.
        unsafe { put(memory, MemoryV2 { version, total, reserved, free, used }) }
    }
    fn nvmlDeviceGetTotalEnergyConsumption(device: RawDevice, energy: *mut c_ulonglong) {
        let value = with_readings(device, |node, dev| node.total_energy(dev))?;
        // SAFETY: NVML's contract: `energy` is NULL or points to an unsigned long long.
        unsafe { put(energy, value) }
    }
    fn nvmlDeviceGetEncoderUtilization(device: RawDevice, utilization: *mut c_uint, period_us: *mut c_uint) {
        let value = with_readings(device, |node, dev| node.codec_utilization(dev, false))?;
        // SAFETY: NVML's contract: both are NULL or point to unsigned ints.
        unsafe { put(period_us, 1_000_000)?; put(utilization, value) }
    }
    fn nvmlDeviceGetDecoderUtilization(device: RawDevice, utilization: *mut c_uint, period_us: *mut c_uint) {
        let value = with_readings(device, |node, dev| node.codec_utilization(dev, true))?;
        // SAFETY: NVML's contract: both are NULL or point to unsigned ints.
        unsafe { put(period_us, 1_000_000)?; put(utilization, value) }
    }
    fn nvmlDeviceGetPcieReplayCounter(device: RawDevice, value: *mut c_uint) {
        let count = with_readings(device, |node, dev| node.pcie_replay(dev))?;
        // SAFETY: NVML's contract: `value` is NULL or points to an unsigned int.
        unsafe { put(value, count) }
    }
    fn nvmlDeviceGetPcieThroughput(device: RawDevice, counter: c_uint, value: *mut c_uint) {
        let kbps = with_readings(device, |node, dev| node.pcie_throughput(dev, counter))?;
        // SAFETY: NVML's contract: `value` is NULL or points to an unsigned int.
        unsafe { put(value, kbps) }
    }
    fn nvmlDeviceGetFieldValues(device: RawDevice, count: c_int, values: *mut c_void) {
        let values = values.cast::<FieldValue>();
        let Ok(count) = usize::try_from(count) else {
            return Err(code::INVALID_ARGUMENT);
        };
        if values.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: `values` points to `count` nvmlFieldValue_t.
        let values = unsafe { std::slice::from_raw_parts_mut(values, count) };
        with_readings(device, |node, dev| {
            for value in values.iter_mut() {
                match node.field_value(dev, value.field_id) {
                    Ok((value_type, bits)) => {
                        value.value_type = value_type;
                        value.value = bits;
                        value.nvml_return = code::SUCCESS;
                    }
                    Err(error) => value.nvml_return = error,
                }
            }
            Ok(())
        })
    }
    fn nvmlDeviceGetTotalEccErrors(device: RawDevice, error_type: c_uint, counter_type: c_uint, count: *mut c_ulonglong) {
        let value = with_readings(device, |node, dev| node.ecc_total(dev, error_type, counter_type))?;
        // SAFETY: NVML's contract: `count` is NULL or points to an unsigned long long.
        unsafe { put(count, value) }
    }
    fn nvmlDeviceGetRetiredPages(device: RawDevice, cause: c_uint, count: *mut c_uint, addresses: *mut c_ulonglong) {
        let pages = with_readings(device, |node, dev| node.retired_pages(dev, cause))?;
        if count.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: `count` is non-NULL and, by NVML's contract, points to an unsigned int.
        let room = unsafe { count.read_unaligned() };
        // SAFETY: as above.
        unsafe { put(count, pages)? };
        if room < pages || addresses.is_null() && pages > 0 {
            return Err(code::INSUFFICIENT_SIZE);
        }
        for at in 0..pages as usize {
            // SAFETY: the caller said `addresses` holds `room` >= `pages` entries.
            unsafe { addresses.add(at).write_unaligned(0x1000 * at as u64) };
        }
        Ok(())
    }
    fn nvmlDeviceGetRetiredPagesPendingStatus(device: RawDevice, pending: *mut c_uint) {
        let value = with_readings(device, |node, dev| node.retired_pending(dev))?;
        // SAFETY: NVML's contract: `pending` is NULL or points to an nvmlEnableState_t.
        unsafe { put(pending, c_uint::from(value)) }
    }
    fn nvmlDeviceGetRemappedRows(device: RawDevice, corr: *mut c_uint, unc: *mut c_uint, pending: *mut c_uint, failed: *mut c_uint) {
        let rows = with_readings(device, |node, dev| node.remapped_rows(dev))?;
        // SAFETY: NVML's contract: each is NULL or points to an unsigned int.
        unsafe {
            put(corr, rows.correctable)?;
            put(unc, rows.uncorrectable)?;
            put(pending, c_uint::from(rows.pending))?;
            put(failed, c_uint::from(rows.failed))
        }
    }
    fn nvmlDeviceGetCurrentClocksEventReasons(device: RawDevice, reasons: *mut c_ulonglong) {
        let value = with_readings(device, |node, dev| node.clocks_event_reasons(dev))?;
        // SAFETY: NVML's contract: `reasons` is NULL or points to an unsigned long long.
        unsafe { put(reasons, value) }
    }
    fn nvmlDeviceGetCurrentClocksThrottleReasons(device: RawDevice, reasons: *mut c_ulonglong) {
        let value = with_readings(device, |node, dev| node.clocks_event_reasons(dev))?;
        // SAFETY: as for nvmlDeviceGetCurrentClocksEventReasons.
        unsafe { put(reasons, value) }
    }
    fn nvmlGpmQueryDeviceSupport(device: RawDevice, support: *mut c_void) {
        let support = support.cast::<GpmSupport>();
        if support.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: a non-NULL `support` points to an nvmlGpmSupport_t.
        if unsafe { (*support).version } != GPM_SUPPORT_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let supported = with_readings(device, |node, dev| Ok(node.gpm(dev, None).is_ok()))?;
        // SAFETY: as above.
        unsafe { (*support).is_supported_device = c_uint::from(supported) };
        Ok(())
    }
    fn nvmlGpmSampleAlloc(sample: *mut *mut c_void) {
        let id = {
            let mut next = NEXT_SAMPLE.lock().unwrap_or_else(PoisonError::into_inner);
            let id = *next;
            *next += 1;
            id
        };
        SAMPLES.lock().unwrap_or_else(PoisonError::into_inner).insert(id, None);
        // SAFETY: NVML's contract: `sample` is NULL or points to an nvmlGpmSample_t.
        unsafe { put(sample, std::ptr::without_provenance_mut(SAMPLE_TAG | id)) }
    }
    fn nvmlGpmSampleFree(sample: *mut c_void) {
        let id = sample_id(sample)?;
        SAMPLES.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
        Ok(())
    }
    fn nvmlGpmSampleGet(device: RawDevice, sample: *mut c_void) {
        take_sample(device, None, sample)
    }
    fn nvmlGpmMigSampleGet(device: RawDevice, gpu_instance_id: c_uint, sample: *mut c_void) {
        take_sample(device, Some(gpu_instance_id), sample)
    }
    fn nvmlGpmMetricsGet(request: *mut c_void) {
        let head = request.cast::<MetricsGetHead>();
        if head.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: NVML's contract: a non-NULL `request` points to an nvmlGpmMetricsGet_t.
        let (version, count, first, second) =
            unsafe { ((*head).version, (*head).num_metrics, (*head).sample1, (*head).sample2) };
        if version != GPM_METRICS_GET_VERSION {
            return Err(ARGUMENT_VERSION_MISMATCH);
        }
        let (first, second) = (sample_id(first)?, sample_id(second)?);
        let target = {
            let samples = SAMPLES.lock().unwrap_or_else(PoisonError::into_inner);
            match (samples.get(&first).copied().flatten(), samples.get(&second).copied().flatten()) {
                (Some(a), Some(b)) if a == b => a,
                _ => return Err(code::INVALID_ARGUMENT),
            }
        };
        let (gpu, instance) = target;
        let device = std::ptr::without_provenance_mut(Dev::Gpu(gpu).handle());
        with_readings(device, |node, dev| {
            let gpm = node.gpm(dev, instance)?;
            // SAFETY: the metrics array follows the head (offset 24), with room for
            // `num_metrics` entries by NVML's contract.
            let metrics = unsafe {
                std::slice::from_raw_parts_mut(
                    request.cast::<u8>().add(size_of::<MetricsGetHead>()).cast::<GpmMetric>(),
                    count as usize,
                )
            };
            for metric in metrics {
                match gpm.metric(metric.metric_id) {
                    Ok(value) => {
                        metric.value = value;
                        metric.nvml_return = code::SUCCESS;
                    }
                    Err(error) => metric.nvml_return = error,
                }
            }
            Ok(())
        })
    }
}

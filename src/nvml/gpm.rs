// SPDX-License-Identifier: Apache-2.0
//! GPU Performance Monitoring (GPM, Hopper and later): [`GpmSample`] (an `nvmlGpmSample_t`,
//! freed on drop), taking samples of a GPU or of one MIG GPU instance, and computing
//! metrics between two samples. Every function is optional: a driver without GPM reports
//! [`NvmlError::SymbolMissing`], a GPU without it `NOT_SUPPORTED`.
#![allow(unsafe_code)]

use std::ffi::{c_uint, c_void};
use std::fmt;
use std::sync::Arc;

use libloading::Library;

use super::ffi::{RawDevice, RawReturn};
use super::{Device, Nvml, NvmlError, Return, Sym, resolve};

/// `nvmlGpmSample_t`: `struct nvmlGpmSample_st *`, opaque.
type RawSample = *mut c_void;

/// `NVML_GPM_SUPPORT_VERSION`.
const SUPPORT_VERSION: c_uint = 1;
/// `NVML_GPM_METRICS_GET_VERSION`.
const METRICS_GET_VERSION: c_uint = 1;
/// Room for metrics in `nvmlGpmMetricsGet_t`: `NVML_GPM_METRIC_MAX` of the newest header
/// (333; older headers have 98). NVML only touches the first `numMetrics` entries, so a
/// larger array than the driver's header is harmless, a smaller one would not be.
const METRIC_SLOTS: usize = 333;

/// `NVML_GPM_METRIC_GRAPHICS_UTIL`: percent of time the graphics engine was busy.
pub const GPM_METRIC_GRAPHICS_UTIL: u32 = 1;
/// `NVML_GPM_METRIC_ANY_TENSOR_UTIL`: percent of cycles any tensor pipe was busy.
pub const GPM_METRIC_ANY_TENSOR_UTIL: u32 = 5;
/// `NVML_GPM_METRIC_DRAM_BW_UTIL`: percent of peak DRAM bandwidth used.
pub const GPM_METRIC_DRAM_BW_UTIL: u32 = 10;

/// `nvmlGpmSupport_t`.
#[repr(C)]
struct Support {
    version: c_uint,
    is_supported_device: c_uint,
}

/// `nvmlGpmMetric_t`'s `metricInfo`: three C strings NVML points at.
#[repr(C)]
#[derive(Clone, Copy)]
struct MetricInfo {
    short_name: *mut c_void,
    long_name: *mut c_void,
    unit: *mut c_void,
}

/// `nvmlGpmMetric_t`.
#[repr(C)]
#[derive(Clone, Copy)]
struct Metric {
    metric_id: c_uint,
    nvml_return: RawReturn,
    value: f64,
    info: MetricInfo,
}

/// `nvmlGpmMetricsGet_t`.
#[repr(C)]
struct MetricsGet {
    version: c_uint,
    num_metrics: c_uint,
    sample1: RawSample,
    sample2: RawSample,
    metrics: [Metric; METRIC_SLOTS],
}

#[cfg(target_pointer_width = "64")]
const _: () = {
    assert!(size_of::<Metric>() == 40);
    assert!(std::mem::offset_of!(MetricsGet, metrics) == 24);
};

type QuerySupportFn = unsafe extern "C" fn(RawDevice, *mut Support) -> RawReturn;
type SampleAllocFn = unsafe extern "C" fn(*mut RawSample) -> RawReturn;
type SampleFreeFn = unsafe extern "C" fn(RawSample) -> RawReturn;
type SampleGetFn = unsafe extern "C" fn(RawDevice, RawSample) -> RawReturn;
type MigSampleGetFn = unsafe extern "C" fn(RawDevice, c_uint, RawSample) -> RawReturn;
type MetricsGetFn = unsafe extern "C" fn(*mut MetricsGet) -> RawReturn;

/// The GPM functions, resolved at load beside [`super::Api`].
pub(super) struct GpmApi {
    query_support: Sym<QuerySupportFn>,
    sample_alloc: Sym<SampleAllocFn>,
    sample_free: Sym<SampleFreeFn>,
    sample_get: Sym<SampleGetFn>,
    mig_sample_get: Sym<MigSampleGetFn>,
    metrics_get: Sym<MetricsGetFn>,
}

impl GpmApi {
    pub(super) fn resolve(lib: &Library) -> GpmApi {
        // SAFETY: (every call) each field's type is the signature nvml.h declares.
        unsafe {
            GpmApi {
                query_support: resolve(lib, &["nvmlGpmQueryDeviceSupport"]),
                sample_alloc: resolve(lib, &["nvmlGpmSampleAlloc"]),
                sample_free: resolve(lib, &["nvmlGpmSampleFree"]),
                sample_get: resolve(lib, &["nvmlGpmSampleGet"]),
                mig_sample_get: resolve(lib, &["nvmlGpmMigSampleGet"]),
                metrics_get: resolve(lib, &["nvmlGpmMetricsGet"]),
            }
        }
    }
}

/// A GPM sample buffer that keeps its [`Nvml`] alive by `Arc`; freed when dropped.
pub struct GpmSample {
    nvml: Arc<Nvml>,
    handle: RawSample,
}

// SAFETY: an nvmlGpmSample_t is an opaque token of a thread-safe library that the `Arc`
// keeps loaded; filling one is `&mut`, so Rust's borrows serialise writers.
unsafe impl Send for GpmSample {}
// SAFETY: as for Send; shared use only reads the sample (as `nvmlGpmMetricsGet` input).
unsafe impl Sync for GpmSample {}

impl fmt::Debug for GpmSample {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("GpmSample").field(&self.handle).finish()
    }
}

impl GpmSample {
    /// `nvmlGpmSampleAlloc`.
    pub fn new(nvml: &Arc<Nvml>) -> Result<GpmSample, NvmlError> {
        let handle = nvml.out(&nvml.api.gpm.sample_alloc, std::ptr::null_mut())?;
        Ok(GpmSample {
            nvml: Arc::clone(nvml),
            handle,
        })
    }
}

impl Drop for GpmSample {
    fn drop(&mut self) {
        if let Some(free) = self.nvml.api.gpm.sample_free.f {
            // SAFETY: the handle came from nvmlGpmSampleAlloc and is freed exactly once.
            let ret = unsafe { free(self.handle) };
            if ret != 0 {
                tracing::debug!(code = %Return::from_raw(ret), "nvmlGpmSampleFree failed");
            }
        }
    }
}

impl Device<'_> {
    /// `nvmlGpmQueryDeviceSupport`.
    pub fn gpm_supported(&self) -> Result<bool, NvmlError> {
        let init = Support {
            version: SUPPORT_VERSION,
            is_supported_device: 0,
        };
        Ok(self
            .out(&self.nvml.api.gpm.query_support, init)?
            .is_supported_device
            != 0)
    }

    /// `nvmlGpmSampleGet`: takes a sample of this GPU into `sample`.
    pub fn gpm_sample(&self, sample: &mut GpmSample) -> Result<(), NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.gpm.sample_get)?;
        // SAFETY: both handles came from this NVML; the sample is exclusively borrowed.
        let ret = unsafe { f(self.handle, sample.handle) };
        self.nvml.check(name, ret)
    }

    /// `nvmlGpmMigSampleGet`: takes a sample of GPU instance `gpu_instance_id` of this GPU.
    pub fn gpm_mig_sample(
        &self,
        gpu_instance_id: u32,
        sample: &mut GpmSample,
    ) -> Result<(), NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.gpm.mig_sample_get)?;
        // SAFETY: as for `gpm_sample`.
        let ret = unsafe { f(self.handle, gpu_instance_id, sample.handle) };
        self.nvml.check(name, ret)
    }
}

impl Nvml {
    /// `nvmlGpmMetricsGet`: `metric_ids` between the samples `first` and `second` (of the
    /// same GPU or GPU instance, `first` older); one result per id, in order, each the value
    /// or that metric's own error.
    pub fn gpm_metrics(
        &self,
        first: &GpmSample,
        second: &GpmSample,
        metric_ids: &[u32],
    ) -> Result<Vec<Result<f64, Return>>, NvmlError> {
        let (f, name) = self.function(&self.api.gpm.metrics_get)?;
        let empty = Metric {
            metric_id: 0,
            nvml_return: 0,
            value: 0.0,
            info: MetricInfo {
                short_name: std::ptr::null_mut(),
                long_name: std::ptr::null_mut(),
                unit: std::ptr::null_mut(),
            },
        };
        let ids = &metric_ids[..metric_ids.len().min(METRIC_SLOTS)];
        let mut request = Box::new(MetricsGet {
            version: METRICS_GET_VERSION,
            num_metrics: ids.len() as c_uint,
            sample1: first.handle,
            sample2: second.handle,
            metrics: [empty; METRIC_SLOTS],
        });
        for (slot, &id) in request.metrics.iter_mut().zip(ids) {
            slot.metric_id = id;
        }
        // SAFETY: `request` is a valid nvmlGpmMetricsGet_t (layout checked above) with
        // room for at least `num_metrics` entries; the samples are live handles.
        let ret = unsafe { f(&mut *request) };
        self.check(name, ret)?;
        Ok(request.metrics[..ids.len()]
            .iter()
            .map(|metric| match Return::from_raw(metric.nvml_return) {
                Return::Success => Ok(metric.value),
                code => Err(code),
            })
            .collect())
    }
}

// SPDX-License-Identifier: Apache-2.0
//! NVML events: [`EventSet`] (an `nvmlEventSet_t`, freed on drop) and the [`Event`]s it
//! yields, which the device plugin's health check waits on. Like [`Device`], a set borrows
//! the [`Nvml`] it came from; a [`SharedEventSet`] holds it by `Arc` instead, for a set that
//! lives beside its library in a long-lived struct (the plugin's metrics keep one).
#![allow(unsafe_code)]

use std::fmt;
use std::mem::ManuallyDrop;
use std::sync::Arc;

use super::ffi::{self, RawEventSet};
use super::{Device, Nvml, NvmlError, Return};

/// `nvmlEventTypeSingleBitEccError`: a corrected (single-bit) ECC error.
pub const EVENT_TYPE_SINGLE_BIT_ECC_ERROR: u64 = 0x1;
/// `nvmlEventTypeDoubleBitEccError`: an uncorrectable (double-bit) ECC error.
pub const EVENT_TYPE_DOUBLE_BIT_ECC_ERROR: u64 = 0x2;
/// `nvmlEventTypeXidCriticalError`: the event the device plugin's health check watches.
pub const EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 0x8;

/// What `gpuInstanceId` / `computeInstanceId` hold in an event that no MIG instance caused.
pub const INSTANCE_ID_NONE: u32 = 0xFFFF_FFFF;

/// An NVML event set; freed when dropped.
pub struct EventSet<'a> {
    pub(super) nvml: &'a Nvml,
    pub(super) handle: RawEventSet,
}

// SAFETY: an nvmlEventSet_t is an opaque token and NVML is thread-safe, so the set may be
// moved to (and waited on from) another thread while the `'a` borrow keeps NVML loaded.
unsafe impl Send for EventSet<'_> {}
// SAFETY: as for Send; `EventSet` itself has no interior mutability.
unsafe impl Sync for EventSet<'_> {}

impl fmt::Debug for EventSet<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("EventSet").field(&self.handle).finish()
    }
}

/// One event out of [`EventSet::wait`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The GPU the event happened on (the parent GPU for a MIG instance's event).
    pub device: Device<'a>,
    /// One `nvmlEventType*` bit, e.g. [`EVENT_TYPE_XID_CRITICAL_ERROR`].
    pub event_type: u64,
    /// For XID events, the XID (999 when the driver does not know it).
    pub event_data: u64,
    /// The MIG GPU instance the event is attributed to, or [`INSTANCE_ID_NONE`].
    pub gpu_instance_id: u32,
    /// The MIG compute instance the event is attributed to, or [`INSTANCE_ID_NONE`].
    pub compute_instance_id: u32,
}

impl<'a> EventSet<'a> {
    /// `nvmlDeviceRegisterEvents`: adds `event_types` of `device` to this set.
    pub fn register(&self, device: &Device, event_types: u64) -> Result<(), NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.register_events)?;
        // SAFETY: both handles came from this NVML; the call takes them by value.
        let ret = unsafe { f(device.handle, event_types, self.handle) };
        self.nvml.check(name, ret)
    }

    /// `nvmlEventSetWait_v2`: the next event, or `None` when none came within `timeout_ms`.
    pub fn wait(&self, timeout_ms: u32) -> Result<Option<Event<'a>>, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.event_set_wait)?;
        let mut data = ffi::EventData {
            device: std::ptr::null_mut(),
            event_type: 0,
            event_data: 0,
            gpu_instance_id: INSTANCE_ID_NONE,
            compute_instance_id: INSTANCE_ID_NONE,
        };
        // SAFETY: `data` is a valid nvmlEventData_t (the v2 layout, a superset of v1's).
        let ret = unsafe { f(self.handle, &mut data, timeout_ms) };
        if Return::from_raw(ret) == Return::Timeout {
            return Ok(None);
        }
        self.nvml.check(name, ret)?;
        Ok(Some(Event {
            device: Device {
                nvml: self.nvml,
                handle: data.device,
            },
            event_type: data.event_type,
            event_data: data.event_data,
            gpu_instance_id: data.gpu_instance_id,
            compute_instance_id: data.compute_instance_id,
        }))
    }
}

impl Drop for EventSet<'_> {
    fn drop(&mut self) {
        free(self.nvml, self.handle);
    }
}

/// `nvmlEventSetFree`, logging a failure (there is nobody to return it to).
fn free(nvml: &Nvml, handle: RawEventSet) {
    if let Some(free) = nvml.api.event_set_free.f {
        // SAFETY: the handle came from nvmlEventSetCreate and its owner frees it exactly once.
        let ret = unsafe { free(handle) };
        if ret != 0 {
            tracing::debug!(code = %Return::from_raw(ret), "nvmlEventSetFree failed");
        }
    }
}

/// An NVML event set that keeps its [`Nvml`] alive by `Arc`; freed when dropped. NVML's
/// sets are not safe to wait on from two threads at once, so callers serialise
/// [`SharedEventSet::with`] (a `Mutex` around it will do).
pub struct SharedEventSet {
    nvml: Arc<Nvml>,
    handle: RawEventSet,
}

// SAFETY: as for `EventSet`: an opaque token of a thread-safe library that the `Arc` keeps
// loaded.
unsafe impl Send for SharedEventSet {}
// SAFETY: as for Send; the set is only used through `with`, whose callers serialise it.
unsafe impl Sync for SharedEventSet {}

impl fmt::Debug for SharedEventSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SharedEventSet").field(&self.handle).finish()
    }
}

impl SharedEventSet {
    /// `nvmlEventSetCreate` on `nvml`, held by `Arc`.
    pub fn new(nvml: &Arc<Nvml>) -> Result<SharedEventSet, NvmlError> {
        let set = nvml.event_set()?;
        // The borrowed set must not free the handle: ownership moves to the shared one.
        let handle = ManuallyDrop::new(set).handle;
        Ok(SharedEventSet {
            nvml: Arc::clone(nvml),
            handle,
        })
    }

    /// The library the set belongs to.
    pub fn nvml(&self) -> &Nvml {
        &self.nvml
    }

    /// Runs `f` with the set as a borrowed [`EventSet`] (to register devices, or wait).
    pub fn with<R>(&self, f: impl FnOnce(&EventSet<'_>) -> R) -> R {
        // A view that never frees: `SharedEventSet` owns the handle and frees it on drop.
        let set = ManuallyDrop::new(EventSet {
            nvml: &self.nvml,
            handle: self.handle,
        });
        f(&set)
    }
}

impl Drop for SharedEventSet {
    fn drop(&mut self) {
        free(&self.nvml, self.handle);
    }
}

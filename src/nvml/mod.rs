// SPDX-License-Identifier: Apache-2.0
//! NVML, loaded at run time: the crate's only dynamic loading and one of its two homes of
//! `unsafe`.
//!
//! `libnvidia-ml.so.1` is `dlopen`ed, never linked, so every binary starts on a node without
//! a driver and the runtime's fast path never loads it at all. [`Nvml::load`] opens the
//! library, copies the function pointers it needs out of it and calls `nvmlInit_v2`; the
//! safe wrappers ([`Device`], [`EventSet`]) borrow the [`Nvml`] so no handle outlives the
//! library. Like NVIDIA's own bindings we resolve the versioned names (`_v2`, `_v3`) and fall
//! back to the old ones where the layout is the same. Functions that older drivers lack
//! (MIG, events) are looked up at load but only reported missing when called, so an old
//! driver still yields a plain GPU inventory.
//!
//! This module knows nothing of the inventory or the device plugin; it only turns C calls
//! into `Result`s. It never panics and never prints.
//!
//! This file loads the library and holds its function table; `ffi` has the C types,
//! `error` the return codes and [`NvmlError`], `device`, `events`, `nvlink`, `partition`
//! (fabric and MIG attributes) and `telemetry` the safe wrappers. The telemetry calls (utilisation, temperature, power, clocks) are
//! optional too: a driver without one reports that one reading missing, nothing more.
#![allow(unsafe_code)]

mod counters;
mod device;
mod error;
mod events;
mod ffi;
mod gpm;
mod nvlink;
mod partition;
mod telemetry;

use std::ffi::{CStr, CString, c_char, c_uint};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::Library;

use ffi::{RawDevice, RawReturn};

pub use counters::{
    EccCounter, FIELD_MEMORY_TEMPERATURE, FIELD_NVLINK_BANDWIDTH_C0_TOTAL, FieldReading,
    MemoryInfoV2, PcieDirection, RemappedRows, RetirementCause,
};
pub use device::{Device, MemoryInfo, PciInfo};
pub use error::{NvmlError, Return};
pub use events::{
    EVENT_TYPE_DOUBLE_BIT_ECC_ERROR, EVENT_TYPE_SINGLE_BIT_ECC_ERROR,
    EVENT_TYPE_XID_CRITICAL_ERROR, Event, EventSet, INSTANCE_ID_NONE, SharedEventSet,
};
pub use gpm::{
    GPM_METRIC_ANY_TENSOR_UTIL, GPM_METRIC_DRAM_BW_UTIL, GPM_METRIC_GRAPHICS_UTIL, GpmSample,
};
pub use nvlink::NVLINK_MAX_LINKS;
pub use partition::{FABRIC_STATE_COMPLETED, FabricInfo, MigAttributes};
pub use telemetry::{Clock, Utilization};

/// A resolved (or missing) function: the name found, or the preferred name when none was.
struct Sym<F> {
    name: &'static str,
    f: Option<F>,
}

impl<F> Sym<F> {
    /// The name, when the library lacks the function.
    fn missing(&self) -> Option<&'static str> {
        self.f.is_none().then_some(self.name)
    }
}

/// The function table, copied out of the library at load. The pointers stay valid as long
/// as the `Library` they came from, which [`Nvml`] owns next to them.
struct Api {
    init: Sym<ffi::InitFn>,
    shutdown: Sym<ffi::ShutdownFn>,
    error_string: Sym<ffi::ErrorStringFn>,
    driver_version: Sym<ffi::SystemStringFn>,
    cuda_driver_version: Sym<ffi::IntOutFn>,
    device_count: Sym<ffi::UintOutFn>,
    handle_by_index: Sym<ffi::HandleByIndexFn>,
    handle_by_uuid: Sym<ffi::HandleByUuidFn>,
    uuid: Sym<ffi::DeviceStringFn>,
    name: Sym<ffi::DeviceStringFn>,
    minor_number: Sym<ffi::DeviceUintFn>,
    brand: Sym<ffi::DeviceUintFn>,
    pci_info: Sym<ffi::PciInfoFn>,
    memory_info: Sym<ffi::MemoryFn>,
    compute_capability: Sym<ffi::DeviceTwoIntFn>,
    mig_mode: Sym<ffi::DeviceTwoUintFn>,
    max_mig_device_count: Sym<ffi::DeviceUintFn>,
    mig_by_index: Sym<ffi::MigByIndexFn>,
    is_mig_device: Sym<ffi::DeviceUintFn>,
    gpu_instance_id: Sym<ffi::DeviceUintFn>,
    compute_instance_id: Sym<ffi::DeviceUintFn>,
    parent: Sym<ffi::DeviceHandleFn>,
    supported_event_types: Sym<ffi::DeviceU64Fn>,
    register_events: Sym<ffi::RegisterEventsFn>,
    event_set_create: Sym<ffi::EventSetCreateFn>,
    event_set_wait: Sym<ffi::EventSetWaitFn>,
    event_set_free: Sym<ffi::EventSetFreeFn>,
    nvlink_state: Sym<ffi::NvLinkStateFn>,
    nvlink_remote_pci: Sym<ffi::NvLinkRemotePciFn>,
    utilization: Sym<ffi::UtilizationFn>,
    temperature: Sym<ffi::DeviceEnumUintFn>,
    power_usage: Sym<ffi::DeviceUintFn>,
    clock_info: Sym<ffi::DeviceEnumUintFn>,
    /// The metrics exporter's readings (`counters`) and GPM (`gpm`), all optional.
    counters: counters::CountersApi,
    gpm: gpm::GpmApi,
    fabric_info: Sym<partition::FabricInfoFn>,
    fabric_info_v: Sym<partition::FabricInfoVFn>,
    attributes: Sym<partition::AttributesFn>,
}

/// Looks up the first of `names` that the library exports.
///
/// # Safety
/// `F` must be the `extern "C"` function pointer type that `nvml.h` declares for every one
/// of `names`.
unsafe fn resolve<F: Copy>(lib: &Library, names: &[&'static str]) -> Sym<F> {
    for &name in names {
        // SAFETY: the caller guarantees `F` is the symbol's C signature; the pointer is
        // copied out and only used while `lib` is alive (both live in `Nvml`).
        if let Ok(symbol) = unsafe { lib.get::<F>(name.as_bytes()) } {
            return Sym {
                name,
                f: Some(*symbol),
            };
        }
    }
    Sym {
        name: names.first().copied().unwrap_or("?"),
        f: None,
    }
}

impl Api {
    fn resolve(lib: &Library) -> Api {
        // SAFETY: (every call) each field's type is the signature nvml.h declares for the
        // names listed, transcribed in `ffi`; older names are listed only where the
        // signature is the same and the struct they fill is the same or, for
        // nvmlEventSetWait, a prefix of the newer one's.
        unsafe {
            Api {
                init: resolve(lib, &["nvmlInit_v2", "nvmlInit"]),
                shutdown: resolve(lib, &["nvmlShutdown"]),
                error_string: resolve(lib, &["nvmlErrorString"]),
                driver_version: resolve(lib, &["nvmlSystemGetDriverVersion"]),
                cuda_driver_version: resolve(
                    lib,
                    &[
                        "nvmlSystemGetCudaDriverVersion_v2",
                        "nvmlSystemGetCudaDriverVersion",
                    ],
                ),
                device_count: resolve(lib, &["nvmlDeviceGetCount_v2", "nvmlDeviceGetCount"]),
                handle_by_index: resolve(
                    lib,
                    &[
                        "nvmlDeviceGetHandleByIndex_v2",
                        "nvmlDeviceGetHandleByIndex",
                    ],
                ),
                handle_by_uuid: resolve(lib, &["nvmlDeviceGetHandleByUUID"]),
                uuid: resolve(lib, &["nvmlDeviceGetUUID"]),
                name: resolve(lib, &["nvmlDeviceGetName"]),
                minor_number: resolve(lib, &["nvmlDeviceGetMinorNumber"]),
                // `nvmlBrandType_t` is a C enum: an `unsigned int`-sized value.
                brand: resolve(lib, &["nvmlDeviceGetBrand"]),
                pci_info: resolve(lib, &["nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetPciInfo_v2"]),
                memory_info: resolve(lib, &["nvmlDeviceGetMemoryInfo"]),
                compute_capability: resolve(lib, &["nvmlDeviceGetCudaComputeCapability"]),
                mig_mode: resolve(lib, &["nvmlDeviceGetMigMode"]),
                max_mig_device_count: resolve(lib, &["nvmlDeviceGetMaxMigDeviceCount"]),
                mig_by_index: resolve(lib, &["nvmlDeviceGetMigDeviceHandleByIndex"]),
                is_mig_device: resolve(lib, &["nvmlDeviceIsMigDeviceHandle"]),
                gpu_instance_id: resolve(lib, &["nvmlDeviceGetGpuInstanceId"]),
                compute_instance_id: resolve(lib, &["nvmlDeviceGetComputeInstanceId"]),
                parent: resolve(lib, &["nvmlDeviceGetDeviceHandleFromMigDeviceHandle"]),
                supported_event_types: resolve(lib, &["nvmlDeviceGetSupportedEventTypes"]),
                register_events: resolve(lib, &["nvmlDeviceRegisterEvents"]),
                event_set_create: resolve(lib, &["nvmlEventSetCreate"]),
                event_set_wait: resolve(lib, &["nvmlEventSetWait_v2", "nvmlEventSetWait"]),
                event_set_free: resolve(lib, &["nvmlEventSetFree"]),
                nvlink_state: resolve(lib, &["nvmlDeviceGetNvLinkState"]),
                // Only `_v2`: the original call fills the older, shorter nvmlPciInfo_t.
                nvlink_remote_pci: resolve(lib, &["nvmlDeviceGetNvLinkRemotePciInfo_v2"]),
                utilization: resolve(lib, &["nvmlDeviceGetUtilizationRates"]),
                temperature: resolve(lib, &["nvmlDeviceGetTemperature"]),
                power_usage: resolve(lib, &["nvmlDeviceGetPowerUsage"]),
                clock_info: resolve(lib, &["nvmlDeviceGetClockInfo"]),
                counters: counters::CountersApi::resolve(lib),
                gpm: gpm::GpmApi::resolve(lib),
                fabric_info: resolve(lib, &["nvmlDeviceGetGpuFabricInfo"]),
                fabric_info_v: resolve(lib, &["nvmlDeviceGetGpuFabricInfoV"]),
                // nvml.h maps the unversioned name to `_v2`; the struct is the same.
                attributes: resolve(
                    lib,
                    &["nvmlDeviceGetAttributes_v2", "nvmlDeviceGetAttributes"],
                ),
            }
        }
    }

    /// The functions any driver nvshim supports exports; a library lacking one is not a
    /// usable libnvidia-ml, so [`Nvml::load`] refuses it up front.
    fn first_missing_required(&self) -> Option<&'static str> {
        [
            self.init.missing(),
            self.shutdown.missing(),
            self.error_string.missing(),
            self.driver_version.missing(),
            self.device_count.missing(),
            self.handle_by_index.missing(),
            self.uuid.missing(),
            self.name.missing(),
            self.minor_number.missing(),
            self.pci_info.missing(),
            self.memory_info.missing(),
        ]
        .into_iter()
        .flatten()
        .next()
    }

    /// Turns a return code into a `Result`, with NVML's description of the failure.
    fn check(&self, function: &'static str, ret: RawReturn) -> Result<(), NvmlError> {
        let code = Return::from_raw(ret);
        if code == Return::Success {
            return Ok(());
        }
        Err(NvmlError::Call {
            function,
            code,
            message: self.error_string(code),
        })
    }

    fn error_string(&self, code: Return) -> String {
        if let Some(f) = self.error_string.f {
            // SAFETY: nvmlErrorString accepts any code and returns NULL or a pointer to a
            // static NUL-terminated string.
            let text = unsafe { f(code.raw()) };
            if !text.is_null() {
                // SAFETY: checked non-NULL above; NVML's strings are static and terminated.
                return unsafe { CStr::from_ptr(text) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        code.to_string()
    }
}

/// A loaded and initialised NVML. Shuts NVML down when dropped.
pub struct Nvml {
    library: PathBuf,
    api: Api,
    // Declared last so it is dropped (dlclose) after `Drop::drop` has run nvmlShutdown.
    _lib: Library,
}

// `Nvml` is Send + Sync because its fields are (the library handle, a path, plain function
// pointers); that is only sound to rely on because NVML itself is thread-safe: nvml.h says
// simultaneous calls from multiple threads are allowed. Checked here so a future field that
// breaks it fails the build.
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Nvml>();
};

impl fmt::Debug for Nvml {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Nvml")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl Nvml {
    /// Opens `library` (a path, or a bare name such as `libnvidia-ml.so.1` that the dynamic
    /// loader searches for), resolves NVML's functions and calls `nvmlInit_v2` (or
    /// `nvmlInit` on libraries without it).
    pub fn load(library: &Path) -> Result<Nvml, NvmlError> {
        // SAFETY: loading runs the library's ELF constructors. We only ever load NVML (or
        // a stand-in for it), whose constructors do not touch our process state.
        let lib = unsafe { Library::new(library) }.map_err(|source| NvmlError::Open {
            library: library.to_path_buf(),
            source,
        })?;
        let api = Api::resolve(&lib);
        if let Some(name) = api.first_missing_required() {
            return Err(NvmlError::SymbolMissing {
                library: library.to_path_buf(),
                name,
            });
        }
        let Some(init) = api.init.f else {
            return Err(NvmlError::SymbolMissing {
                library: library.to_path_buf(),
                name: api.init.name,
            });
        };
        // SAFETY: nvmlInit_v2/nvmlInit take no arguments; the library is loaded. Init runs
        // before `Nvml` exists, so a failed init is never matched by an nvmlShutdown.
        api.check(api.init.name, unsafe { init() })?;
        Ok(Nvml {
            library: library.to_path_buf(),
            api,
            _lib: lib,
        })
    }

    /// The library this was loaded from, as given to [`Nvml::load`].
    pub fn library(&self) -> &Path {
        &self.library
    }

    /// `nvmlSystemGetDriverVersion`, e.g. `550.54.15`.
    pub fn driver_version(&self) -> Result<String, NvmlError> {
        let (f, name) = self.function(&self.api.driver_version)?;
        self.string_out(name, ffi::DRIVER_VERSION_BUFFER_SIZE, |buffer, length| {
            // SAFETY: `string_out` passes a buffer writable for the `length` it passes.
            unsafe { f(buffer, length) }
        })
    }

    /// `nvmlSystemGetCudaDriverVersion_v2`: the CUDA driver API version as NVML encodes it,
    /// `1000 * major + 10 * minor` (12040 for CUDA 12.4).
    pub fn cuda_driver_version(&self) -> Result<i32, NvmlError> {
        self.out(&self.api.cuda_driver_version, 0)
    }

    /// `nvmlDeviceGetCount_v2`: the GPUs this process can see (MIG devices not counted).
    pub fn device_count(&self) -> Result<u32, NvmlError> {
        self.out(&self.api.device_count, 0)
    }

    /// `nvmlDeviceGetHandleByIndex_v2`; indices are in PCI bus order.
    pub fn device_by_index(&self, index: u32) -> Result<Device<'_>, NvmlError> {
        let (f, name) = self.function(&self.api.handle_by_index)?;
        let mut handle: RawDevice = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer for an nvmlDevice_t.
        self.check(name, unsafe { f(index, &mut handle) })?;
        Ok(Device { nvml: self, handle })
    }

    /// `nvmlDeviceGetHandleByUUID`: a GPU (`GPU-…`) or, on drivers that support it, a MIG
    /// device (`MIG-…`).
    pub fn device_by_uuid(&self, uuid: &str) -> Result<Device<'_>, NvmlError> {
        let (f, name) = self.function(&self.api.handle_by_uuid)?;
        let c_uuid = CString::new(uuid).map_err(|_| NvmlError::InvalidUuid {
            uuid: uuid.to_string(),
        })?;
        let mut handle: RawDevice = std::ptr::null_mut();
        // SAFETY: `c_uuid` is NUL-terminated and outlives the call; `handle` is a valid
        // out-pointer.
        self.check(name, unsafe { f(c_uuid.as_ptr(), &mut handle) })?;
        Ok(Device { nvml: self, handle })
    }

    /// `nvmlEventSetCreate`: an empty set to register devices' events in.
    pub fn event_set(&self) -> Result<EventSet<'_>, NvmlError> {
        let handle = self.out(&self.api.event_set_create, std::ptr::null_mut())?;
        Ok(EventSet { nvml: self, handle })
    }

    /// The function behind `sym`, or the "missing" error naming it.
    fn function<F: Copy>(&self, sym: &Sym<F>) -> Result<(F, &'static str), NvmlError> {
        match sym.f {
            Some(f) => Ok((f, sym.name)),
            None => Err(NvmlError::SymbolMissing {
                library: self.library.clone(),
                name: sym.name,
            }),
        }
    }

    fn check(&self, function: &'static str, ret: RawReturn) -> Result<(), NvmlError> {
        self.api.check(function, ret)
    }

    /// Calls a function shaped `(T *)` and returns what it wrote over `init`.
    fn out<T>(
        &self,
        sym: &Sym<unsafe extern "C" fn(*mut T) -> RawReturn>,
        init: T,
    ) -> Result<T, NvmlError> {
        let (f, name) = self.function(sym)?;
        let mut value = init;
        // SAFETY: `value` is a valid, initialised `T`, and `sym`'s type (nvml.h's signature,
        // transcribed in `ffi`) says the function writes one `T` there.
        self.check(name, unsafe { f(&mut value) })?;
        Ok(value)
    }

    /// Has `fill` write a string into a zeroed `size`-byte buffer (given as pointer and
    /// length, as NVML's string getters take it) and reads it back; `name` is the function
    /// `fill` calls, for the error.
    fn string_out(
        &self,
        name: &'static str,
        size: usize,
        fill: impl FnOnce(*mut c_char, c_uint) -> RawReturn,
    ) -> Result<String, NvmlError> {
        let mut buffer = vec![0u8; size];
        let ret = fill(buffer.as_mut_ptr().cast::<c_char>(), buffer.len() as c_uint);
        self.check(name, ret)?;
        Ok(c_string(&buffer))
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        if let Some(shutdown) = self.api.shutdown.f {
            // SAFETY: `load` only returns an `Nvml` after a successful init, so this is the
            // matching nvmlShutdown; it takes no arguments. Its result has nowhere to go.
            let ret = unsafe { shutdown() };
            if ret != 0 {
                tracing::debug!(code = %Return::from_raw(ret), "nvmlShutdown failed");
            }
        }
    }
}

/// Reads a NUL-terminated string out of a C buffer (the whole buffer if NVML left no NUL).
fn c_string(buffer: &[u8]) -> String {
    let bytes = match CStr::from_bytes_until_nul(buffer) {
        Ok(text) => text.to_bytes(),
        Err(_) => buffer,
    };
    String::from_utf8_lossy(bytes).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn c_strings_stop_at_nul_or_buffer_end() {
        assert_eq!(c_string(b"550.54.15\0junk"), "550.54.15");
        assert_eq!(c_string(b"no-nul"), "no-nul");
        assert_eq!(c_string(b"\0"), "");
    }

    #[test]
    fn a_missing_library_is_an_error_naming_it() {
        let path = Path::new("/nonexistent/nvshim-test/libnvidia-ml.so.1");
        let Err(error) = Nvml::load(path) else {
            panic!("loading {} should fail", path.display());
        };
        let message = error.to_string();
        assert!(matches!(error, NvmlError::Open { .. }), "{message}");
        assert!(message.contains(&path.display().to_string()), "{message}");
        // dlerror's own text, which libloading 0.9 keeps in the source.
        assert!(message.contains("No such file"), "{message}");
    }
}

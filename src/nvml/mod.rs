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
#![allow(unsafe_code)]

mod ffi;

use std::ffi::{CStr, CString, c_char, c_uint};
use std::fmt;
use std::path::{Path, PathBuf};

use libloading::Library;

use ffi::{RawDevice, RawEventSet, RawReturn};

/// `nvmlEventTypeXidCriticalError`: the event the device plugin's health check watches.
pub const EVENT_TYPE_XID_CRITICAL_ERROR: u64 = 0x8;

/// What `gpuInstanceId` / `computeInstanceId` hold in an event that no MIG instance caused.
pub const INSTANCE_ID_NONE: u32 = 0xFFFF_FFFF;

/// `NVML_DEVICE_MIG_ENABLE`.
const MIG_ENABLE: c_uint = 1;

macro_rules! returns {
    ($($(#[$doc:meta])* $variant:ident = $value:literal => $cname:literal,)*) => {
        /// NVML's `nvmlReturn_t`, with the values of `nvml.h`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Return {
            $($(#[$doc])* $variant,)*
            /// A code this crate does not know (a newer driver's).
            Other(u32),
        }

        impl Return {
            /// The typed code for a raw `nvmlReturn_t`.
            pub fn from_raw(raw: u32) -> Return {
                match raw {
                    $($value => Return::$variant,)*
                    other => Return::Other(other),
                }
            }

            /// The raw `nvmlReturn_t` value.
            pub fn raw(self) -> u32 {
                match self {
                    $(Return::$variant => $value,)*
                    Return::Other(raw) => raw,
                }
            }

            /// The C constant's name, e.g. `NVML_ERROR_NOT_FOUND`; `None` for [`Return::Other`].
            pub fn c_name(self) -> Option<&'static str> {
                match self {
                    $(Return::$variant => Some($cname),)*
                    Return::Other(_) => None,
                }
            }
        }
    };
}

returns! {
    Success = 0 => "NVML_SUCCESS",
    Uninitialized = 1 => "NVML_ERROR_UNINITIALIZED",
    InvalidArgument = 2 => "NVML_ERROR_INVALID_ARGUMENT",
    NotSupported = 3 => "NVML_ERROR_NOT_SUPPORTED",
    NoPermission = 4 => "NVML_ERROR_NO_PERMISSION",
    AlreadyInitialized = 5 => "NVML_ERROR_ALREADY_INITIALIZED",
    NotFound = 6 => "NVML_ERROR_NOT_FOUND",
    InsufficientSize = 7 => "NVML_ERROR_INSUFFICIENT_SIZE",
    InsufficientPower = 8 => "NVML_ERROR_INSUFFICIENT_POWER",
    DriverNotLoaded = 9 => "NVML_ERROR_DRIVER_NOT_LOADED",
    Timeout = 10 => "NVML_ERROR_TIMEOUT",
    IrqIssue = 11 => "NVML_ERROR_IRQ_ISSUE",
    LibraryNotFound = 12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
    FunctionNotFound = 13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
    CorruptedInforom = 14 => "NVML_ERROR_CORRUPTED_INFOROM",
    GpuIsLost = 15 => "NVML_ERROR_GPU_IS_LOST",
    ResetRequired = 16 => "NVML_ERROR_RESET_REQUIRED",
    OperatingSystem = 17 => "NVML_ERROR_OPERATING_SYSTEM",
    LibRmVersionMismatch = 18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    InUse = 19 => "NVML_ERROR_IN_USE",
    Memory = 20 => "NVML_ERROR_MEMORY",
    NoData = 21 => "NVML_ERROR_NO_DATA",
    /// `NVML_ERROR_VGPU_ECC_NOT_SUPPORTED` in `nvml.h`.
    VgpuEccNotSupported = 22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
    InsufficientResources = 23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
    FreqNotSupported = 24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
    ArgumentVersionMismatch = 25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    Deprecated = 26 => "NVML_ERROR_DEPRECATED",
    NotReady = 27 => "NVML_ERROR_NOT_READY",
    GpuNotFound = 28 => "NVML_ERROR_GPU_NOT_FOUND",
    InvalidState = 29 => "NVML_ERROR_INVALID_STATE",
    Unknown = 999 => "NVML_ERROR_UNKNOWN",
}

impl fmt::Display for Return {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.c_name() {
            Some(name) => f.write_str(name),
            None => write!(f, "nvmlReturn_t {}", self.raw()),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// `dlopen` failed: no such file, wrong architecture, unresolved dependencies.
    #[error("cannot load the NVML library {}: {}", library.display(), dl_reason(source))]
    Open {
        library: PathBuf,
        #[source]
        source: libloading::Error,
    },
    /// The library lacks a function we need (an old driver, or not NVML at all).
    #[error("the NVML library {} has no function {name} (driver too old, or not libnvidia-ml?)", library.display())]
    SymbolMissing {
        library: PathBuf,
        name: &'static str,
    },
    /// An NVML call returned an error; `message` is NVML's own `nvmlErrorString` text.
    #[error("{function} failed: {message} ({code})")]
    Call {
        function: &'static str,
        code: Return,
        message: String,
    },
    /// A UUID with an interior NUL cannot be passed to C.
    #[error("invalid GPU UUID {uuid:?}: it contains a NUL byte")]
    InvalidUuid { uuid: String },
}

impl NvmlError {
    /// The NVML code of a failed call, `None` for load errors.
    pub fn code(&self) -> Option<Return> {
        match self {
            NvmlError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the driver cannot answer this query on this device: the call returned
    /// `NOT_SUPPORTED`, or the library predates the function.
    pub fn is_not_supported(&self) -> bool {
        matches!(
            self,
            NvmlError::SymbolMissing { .. }
                | NvmlError::Call {
                    code: Return::NotSupported | Return::FunctionNotFound,
                    ..
                }
        )
    }
}

/// libloading 0.9 keeps `dlerror()`'s text in the error's source; the message alone only
/// says "dlopen failed".
fn dl_reason(error: &libloading::Error) -> String {
    match std::error::Error::source(error) {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    }
}

/// A resolved (or missing) function: the name found, or the preferred name when none was.
struct Sym<F> {
    name: &'static str,
    f: Option<F>,
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
        // SAFETY (every call): each field's type is the signature nvml.h declares for the
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
            }
        }
    }

    /// The functions any driver nvshim supports exports; a library lacking one is not a
    /// usable libnvidia-ml, so [`Nvml::load`] refuses it up front.
    fn first_missing_required(&self) -> Option<&'static str> {
        [
            (self.init.name, self.init.f.is_some()),
            (self.shutdown.name, self.shutdown.f.is_some()),
            (self.error_string.name, self.error_string.f.is_some()),
            (self.driver_version.name, self.driver_version.f.is_some()),
            (self.device_count.name, self.device_count.f.is_some()),
            (self.handle_by_index.name, self.handle_by_index.f.is_some()),
            (self.uuid.name, self.uuid.f.is_some()),
            (self.name.name, self.name.f.is_some()),
            (self.minor_number.name, self.minor_number.f.is_some()),
            (self.pci_info.name, self.pci_info.f.is_some()),
            (self.memory_info.name, self.memory_info.f.is_some()),
        ]
        .into_iter()
        .find_map(|(name, present)| (!present).then_some(name))
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
        let mut buffer = [0u8; ffi::DRIVER_VERSION_BUFFER_SIZE];
        // SAFETY: `buffer` is writable for the length we pass.
        let ret = unsafe { f(buffer.as_mut_ptr().cast::<c_char>(), buffer.len() as c_uint) };
        self.check(name, ret)?;
        Ok(c_string(&buffer))
    }

    /// `nvmlSystemGetCudaDriverVersion_v2`: the CUDA driver API version as NVML encodes it,
    /// `1000 * major + 10 * minor` (12040 for CUDA 12.4).
    pub fn cuda_driver_version(&self) -> Result<i32, NvmlError> {
        let (f, name) = self.function(&self.api.cuda_driver_version)?;
        let mut version = 0;
        // SAFETY: `version` is a valid out-pointer to an int.
        self.check(name, unsafe { f(&mut version) })?;
        Ok(version)
    }

    /// `nvmlDeviceGetCount_v2`: the GPUs this process can see (MIG devices not counted).
    pub fn device_count(&self) -> Result<u32, NvmlError> {
        let (f, name) = self.function(&self.api.device_count)?;
        let mut count: c_uint = 0;
        // SAFETY: `count` is a valid out-pointer to an unsigned int.
        self.check(name, unsafe { f(&mut count) })?;
        Ok(count)
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
        let (f, name) = self.function(&self.api.event_set_create)?;
        let mut handle: RawEventSet = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer for an nvmlEventSet_t.
        self.check(name, unsafe { f(&mut handle) })?;
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

/// A GPU or MIG device handle, valid while the [`Nvml`] it came from is alive.
#[derive(Clone, Copy)]
pub struct Device<'a> {
    nvml: &'a Nvml,
    handle: RawDevice,
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
        self.uint(&self.nvml.api.minor_number)
    }

    /// `nvmlDeviceGetPciInfo_v3`.
    pub fn pci_info(&self) -> Result<PciInfo, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.pci_info)?;
        let mut raw = ffi::PciInfo {
            bus_id_legacy: [0; ffi::PCI_BUS_ID_LEGACY_SIZE],
            domain: 0,
            bus: 0,
            device: 0,
            pci_device_id: 0,
            pci_subsystem_id: 0,
            bus_id: [0; ffi::PCI_BUS_ID_SIZE],
        };
        // SAFETY: `raw` is a valid nvmlPciInfo_t (layout checked in `ffi`).
        self.nvml.check(name, unsafe { f(self.handle, &mut raw) })?;
        Ok(PciInfo {
            bus_id: c_string(&raw.bus_id),
            domain: raw.domain,
            bus: raw.bus,
            device: raw.device,
            pci_device_id: raw.pci_device_id,
            pci_subsystem_id: raw.pci_subsystem_id,
        })
    }

    /// `nvmlDeviceGetMemoryInfo`.
    pub fn memory_info(&self) -> Result<MemoryInfo, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.memory_info)?;
        let mut raw = ffi::Memory::default();
        // SAFETY: `raw` is a valid nvmlMemory_t.
        self.nvml.check(name, unsafe { f(self.handle, &mut raw) })?;
        Ok(MemoryInfo {
            total: raw.total,
            free: raw.free,
            used: raw.used,
        })
    }

    /// `nvmlDeviceGetCudaComputeCapability`: `(major, minor)`, e.g. `(8, 0)`.
    pub fn cuda_compute_capability(&self) -> Result<(i32, i32), NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.compute_capability)?;
        let (mut major, mut minor) = (0, 0);
        // SAFETY: both are valid out-pointers to ints.
        self.nvml
            .check(name, unsafe { f(self.handle, &mut major, &mut minor) })?;
        Ok((major, minor))
    }

    /// `nvmlDeviceGetMigMode`: `(current, pending)`. `NOT_SUPPORTED` on GPUs without MIG.
    pub fn mig_mode(&self) -> Result<(bool, bool), NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.mig_mode)?;
        let (mut current, mut pending): (c_uint, c_uint) = (0, 0);
        // SAFETY: both are valid out-pointers to unsigned ints.
        self.nvml
            .check(name, unsafe { f(self.handle, &mut current, &mut pending) })?;
        Ok((current == MIG_ENABLE, pending == MIG_ENABLE))
    }

    /// `nvmlDeviceGetMaxMigDeviceCount`: how many MIG device slots to probe with
    /// [`Device::mig_device_by_index`] (zero when MIG is off).
    pub fn max_mig_device_count(&self) -> Result<u32, NvmlError> {
        self.uint(&self.nvml.api.max_mig_device_count)
    }

    /// `nvmlDeviceGetMigDeviceHandleByIndex`: `NOT_FOUND` for an empty slot.
    pub fn mig_device_by_index(&self, index: u32) -> Result<Device<'a>, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.mig_by_index)?;
        let mut handle: RawDevice = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer for an nvmlDevice_t.
        self.nvml
            .check(name, unsafe { f(self.handle, index, &mut handle) })?;
        Ok(Device {
            nvml: self.nvml,
            handle,
        })
    }

    /// `nvmlDeviceIsMigDeviceHandle`.
    pub fn is_mig_device(&self) -> Result<bool, NvmlError> {
        Ok(self.uint(&self.nvml.api.is_mig_device)? != 0)
    }

    /// `nvmlDeviceGetGpuInstanceId` (MIG devices only).
    pub fn gpu_instance_id(&self) -> Result<u32, NvmlError> {
        self.uint(&self.nvml.api.gpu_instance_id)
    }

    /// `nvmlDeviceGetComputeInstanceId` (MIG devices only).
    pub fn compute_instance_id(&self) -> Result<u32, NvmlError> {
        self.uint(&self.nvml.api.compute_instance_id)
    }

    /// `nvmlDeviceGetDeviceHandleFromMigDeviceHandle`: the GPU a MIG device lives on.
    pub fn parent(&self) -> Result<Device<'a>, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.parent)?;
        let mut handle: RawDevice = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer for an nvmlDevice_t.
        self.nvml
            .check(name, unsafe { f(self.handle, &mut handle) })?;
        Ok(Device {
            nvml: self.nvml,
            handle,
        })
    }

    /// `nvmlDeviceGetSupportedEventTypes`: a mask of `nvmlEventType*` bits.
    pub fn supported_event_types(&self) -> Result<u64, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.supported_event_types)?;
        let mut types = 0;
        // SAFETY: `types` is a valid out-pointer to an unsigned long long.
        self.nvml
            .check(name, unsafe { f(self.handle, &mut types) })?;
        Ok(types)
    }

    fn uint(&self, sym: &Sym<ffi::DeviceUintFn>) -> Result<u32, NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        let mut value: c_uint = 0;
        // SAFETY: every function of this type takes (nvmlDevice_t, unsigned int *).
        self.nvml
            .check(name, unsafe { f(self.handle, &mut value) })?;
        Ok(value)
    }

    fn string(&self, sym: &Sym<ffi::DeviceStringFn>, size: usize) -> Result<String, NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        let mut buffer = vec![0u8; size];
        // SAFETY: `buffer` is writable for the length we pass.
        let ret = unsafe {
            f(
                self.handle,
                buffer.as_mut_ptr().cast::<c_char>(),
                buffer.len() as c_uint,
            )
        };
        self.nvml.check(name, ret)?;
        Ok(c_string(&buffer))
    }
}

/// An NVML event set; freed when dropped.
pub struct EventSet<'a> {
    nvml: &'a Nvml,
    handle: RawEventSet,
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
        if let Some(free) = self.nvml.api.event_set_free.f {
            // SAFETY: the handle came from nvmlEventSetCreate and is freed exactly once.
            let ret = unsafe { free(self.handle) };
            if ret != 0 {
                tracing::debug!(code = %Return::from_raw(ret), "nvmlEventSetFree failed");
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_codes_round_trip() {
        let cases = [
            (0, Return::Success, "NVML_SUCCESS"),
            (2, Return::InvalidArgument, "NVML_ERROR_INVALID_ARGUMENT"),
            (9, Return::DriverNotLoaded, "NVML_ERROR_DRIVER_NOT_LOADED"),
            (10, Return::Timeout, "NVML_ERROR_TIMEOUT"),
            (29, Return::InvalidState, "NVML_ERROR_INVALID_STATE"),
            (999, Return::Unknown, "NVML_ERROR_UNKNOWN"),
        ];
        for (raw, code, name) in cases {
            assert_eq!(Return::from_raw(raw), code, "case {name}");
            assert_eq!(code.raw(), raw, "case {name}");
            assert_eq!(code.to_string(), name, "case {name}");
        }
        assert_eq!(Return::from_raw(30), Return::Other(30));
        assert_eq!(Return::Other(30).to_string(), "nvmlReturn_t 30");
    }

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

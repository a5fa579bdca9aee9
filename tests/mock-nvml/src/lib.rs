// SPDX-License-Identifier: Apache-2.0
//! A mock `libnvidia-ml.so.1` for nvshim's tests: the NVML C ABI (the subset nvshim, the
//! device plugin and `nvidia-smi -L` use), answering from a JSON config instead of a driver.
//!
//! Like the real library it reports only GPUs whose `/dev/nvidia<minor>` exists, so inside
//! a container it sees exactly the devices that were injected. Every exported call is
//! appended to `$MOCK_NVML_CALL_LOG`, and so is `loaded` when the library is mapped, so a
//! test can prove that a code path never touched NVML. See README.md for the config.
//!
//! No panic crosses the C boundary: each export runs inside `catch_unwind` and reports a
//! panic as `NVML_ERROR_UNKNOWN`.

mod abi;
mod config;
mod readings;
mod state;
mod telemetry;

use abi::{Memory, PciInfo};

use std::ffi::{CStr, c_char, c_int, c_uint, c_ulonglong, c_void};
use std::io::Write;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use state::{BusId, Dev, Node, Ret, State, code};

#[cfg(not(target_pointer_width = "64"))]
compile_error!("the mock NVML encodes handles in 64-bit pointers");

type RawDevice = *mut c_void;
type RawEventSet = *mut c_void;

/// The env variable naming the call log.
const CALL_LOG_ENV: &str = "MOCK_NVML_CALL_LOG";

static STATE: Mutex<State> = Mutex::new(State::new());

/// The state, with the event file's `gone` and `wait-error` lines applied.
fn state() -> MutexGuard<'static, State> {
    // A panic while holding the lock leaves consistent data (every update is one step).
    let mut state = STATE.lock().unwrap_or_else(PoisonError::into_inner);
    state.refresh();
    state
}

/// Runs `f` on the node, or answers `UNINITIALIZED` before `nvmlInit`.
fn with_node<T>(f: impl FnOnce(&Node) -> Result<T, Ret>) -> Result<T, Ret> {
    let state = state();
    f(state.node()?)
}

/// Runs `f` on the node and the device behind `handle`.
fn with_device<T>(
    handle: RawDevice,
    f: impl FnOnce(&Node, Dev) -> Result<T, Ret>,
) -> Result<T, Ret> {
    with_node(|node| f(node, node.device(handle.addr())?))
}

/// Like [`with_device`], with the GPUs' readings (utilisation, temperature, power, clock,
/// memory used) re-read first if the config file has changed.
fn with_readings<T>(
    handle: RawDevice,
    f: impl FnOnce(&Node, Dev) -> Result<T, Ret>,
) -> Result<T, Ret> {
    let mut state = state();
    state.refresh_readings();
    let node = state.node()?;
    f(node, node.device(handle.addr())?)
}

/// `nvmlUtilization_t`.
#[repr(C)]
struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

/// Appends `name` to the call log: one `O_APPEND` write per line, so parallel processes
/// sharing a log never interleave within a line. Failures are ignored (it is a test aid).
fn log_call(name: &str) {
    let Some(path) = std::env::var_os(CALL_LOG_ENV) else {
        return;
    };
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
    {
        let _ = file.write_all(format!("{name}\n").as_bytes());
    }
}

extern "C" fn on_load() {
    let _ = catch_unwind(|| log_call("loaded"));
}

/// Runs when the library is mapped (dlopen or process start), before any NVML call.
#[used]
#[unsafe(link_section = ".init_array")]
static ON_LOAD: extern "C" fn() = on_load;

/// Writes `value` through a caller's out-pointer.
///
/// # Safety
/// `ptr` must be NULL or valid for a write of `T`, as the NVML API requires of callers.
unsafe fn put<T>(ptr: *mut T, value: T) -> Result<(), Ret> {
    if ptr.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    // SAFETY: non-NULL, and valid for writes per the caller's contract.
    unsafe { ptr.write_unaligned(value) };
    Ok(())
}

/// Copies `text` and a NUL into a caller's `(char *buffer, unsigned int length)`.
///
/// # Safety
/// `buffer` must be NULL or valid for `length` bytes of writes.
unsafe fn put_str(buffer: *mut c_char, length: c_uint, text: &str) -> Result<(), Ret> {
    if buffer.is_null() {
        return Err(code::INVALID_ARGUMENT);
    }
    let bytes = text.as_bytes();
    if (length as usize) < bytes.len() + 1 {
        return Err(code::INSUFFICIENT_SIZE);
    }
    // SAFETY: the buffer holds at least `bytes.len() + 1` bytes (checked above) and
    // cannot overlap our own string.
    unsafe {
        std::ptr::copy_nonoverlapping(bytes.as_ptr(), buffer.cast::<u8>(), bytes.len());
        buffer.add(bytes.len()).write(0);
    }
    Ok(())
}

fn device_handle(dev: Dev) -> RawDevice {
    std::ptr::without_provenance_mut(dev.handle())
}

/// Defines exported NVML functions: logs the call, runs the body (a `Result<(), Ret>`)
/// inside `catch_unwind`, and returns the code.
macro_rules! nvml_exports {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block)*) => {$(
        #[unsafe(no_mangle)]
        unsafe extern "C" fn $name($($arg: $ty),*) -> Ret {
            log_call(stringify!($name));
            let result = catch_unwind(AssertUnwindSafe(|| -> Result<(), Ret> { $body }));
            match result {
                Ok(Ok(())) => code::SUCCESS,
                Ok(Err(code)) => code,
                Err(_) => code::UNKNOWN,
            }
        }
    )*};
}

// After the macro, so that the module can use it.
mod partition;

fn init(_flags: c_uint) -> Result<(), Ret> {
    match state().init() {
        code::SUCCESS => Ok(()),
        error => Err(error),
    }
}

/// The original `nvmlPciInfo_t` that `nvmlDeviceGetPciInfo` (v1) fills.
#[repr(C)]
struct PciInfoV1 {
    bus_id: [u8; 16],
    domain: c_uint,
    bus: c_uint,
    device: c_uint,
    pci_device_id: c_uint,
    pci_subsystem_id: c_uint,
    reserved: [c_uint; 4],
}

/// Every mock GPU claims to be an A100 on the bus (device 0x20B0, vendor 0x10DE).
const PCI_DEVICE_ID: c_uint = 0x20B0_10DE;
const PCI_SUBSYSTEM_ID: c_uint = 0x134F_10DE;

fn c_array<const N: usize>(text: &str) -> [u8; N] {
    let mut out = [0u8; N];
    let len = text.len().min(N - 1);
    out[..len].copy_from_slice(&text.as_bytes()[..len]);
    out
}

fn pci_info(handle: RawDevice) -> Result<PciInfo, Ret> {
    with_device(handle, |node, dev| Ok(pci_info_at(node.gpu(dev).bus_id)))
}

/// What NVML reports for the device at `bus_id`.
fn pci_info_at(bus_id: BusId) -> PciInfo {
    PciInfo {
        bus_id_legacy: c_array(&bus_id.legacy()),
        domain: bus_id.domain,
        bus: bus_id.bus,
        device: bus_id.device,
        pci_device_id: PCI_DEVICE_ID,
        pci_subsystem_id: PCI_SUBSYSTEM_ID,
        bus_id: c_array(&bus_id.nvml()),
    }
}

/// Link `link` of a GPU (MIG devices have no NVLink of their own).
fn nvlink(node: &Node, dev: Dev, link: c_uint) -> Result<Option<state::NvLink>, Ret> {
    match dev {
        Dev::Mig(..) => Err(code::NOT_SUPPORTED),
        Dev::Gpu(_) => node.gpu(dev).nvlink(link as usize),
    }
}

/// `nvmlEventData_t` as `nvmlEventSetWait_v2` fills it.
#[repr(C)]
struct EventData {
    device: RawDevice,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

/// The older `nvmlEventData_t` that `nvmlEventSetWait` (v1) fills.
#[repr(C)]
struct EventDataV1 {
    device: RawDevice,
    event_type: c_ulonglong,
    event_data: c_ulonglong,
}

/// How often a waiting `nvmlEventSetWait` looks for due events.
const POLL_INTERVAL: Duration = Duration::from_millis(10);

/// Waits up to `timeout_ms` for an event of `set`, polling without holding the lock.
fn event_wait(set: RawEventSet, timeout_ms: c_uint) -> Result<state::Event, Ret> {
    let deadline = Instant::now() + Duration::from_millis(u64::from(timeout_ms));
    loop {
        if let Some(event) = state().poll(set.addr(), Instant::now())? {
            return Ok(event);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(code::TIMEOUT);
        }
        std::thread::sleep(POLL_INTERVAL.min(deadline - now));
    }
}

nvml_exports! {
    fn nvmlInit() { init(0) }
    fn nvmlInit_v2() { init(0) }
    fn nvmlInitWithFlags(flags: c_uint) { init(flags) }
    fn nvmlShutdown() {
        match state().shutdown() {
            code::SUCCESS => Ok(()),
            error => Err(error),
        }
    }

    fn nvmlSystemGetDriverVersion(version: *mut c_char, length: c_uint) {
        let text = with_node(|node| Ok(node.driver_version.clone()))?;
        // SAFETY: the caller passes a buffer of `length` bytes (NVML's contract).
        unsafe { put_str(version, length, &text) }
    }
    fn nvmlSystemGetCudaDriverVersion(version: *mut c_int) {
        let value = with_node(|node| Ok(node.cuda_driver_version))?;
        // SAFETY: NVML's contract: `version` is NULL or points to an int.
        unsafe { put(version, value) }
    }
    fn nvmlSystemGetCudaDriverVersion_v2(version: *mut c_int) {
        let value = with_node(|node| Ok(node.cuda_driver_version))?;
        // SAFETY: as above.
        unsafe { put(version, value) }
    }

    fn nvmlDeviceGetCount(count: *mut c_uint) {
        let value = with_node(|node| Ok(node.gpus.len() as c_uint))?;
        // SAFETY: NVML's contract: `count` is NULL or points to an unsigned int.
        unsafe { put(count, value) }
    }
    fn nvmlDeviceGetCount_v2(count: *mut c_uint) {
        let value = with_node(|node| Ok(node.gpus.len() as c_uint))?;
        // SAFETY: as above.
        unsafe { put(count, value) }
    }

    fn nvmlDeviceGetHandleByIndex(index: c_uint, device: *mut RawDevice) {
        let handle = with_node(|node| handle_by_index(node, index))?;
        // SAFETY: NVML's contract: `device` is NULL or points to an nvmlDevice_t.
        unsafe { put(device, handle) }
    }
    fn nvmlDeviceGetHandleByIndex_v2(index: c_uint, device: *mut RawDevice) {
        let handle = with_node(|node| handle_by_index(node, index))?;
        // SAFETY: as above.
        unsafe { put(device, handle) }
    }
    fn nvmlDeviceGetHandleByUUID(uuid: *const c_char, device: *mut RawDevice) {
        let handle = with_node(|node| {
            if uuid.is_null() {
                return Err(code::INVALID_ARGUMENT);
            }
            // SAFETY: non-NULL; NVML's contract makes it a NUL-terminated string.
            let uuid = unsafe { CStr::from_ptr(uuid) }.to_string_lossy();
            node.lookup_uuid(&uuid).map(device_handle)
        })?;
        // SAFETY: NVML's contract: `device` is NULL or points to an nvmlDevice_t.
        unsafe { put(device, handle) }
    }

    fn nvmlDeviceGetUUID(device: RawDevice, uuid: *mut c_char, length: c_uint) {
        let text = with_device(device, |node, dev| Ok(node.uuid(dev)))?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(uuid, length, &text) }
    }
    fn nvmlDeviceGetName(device: RawDevice, name: *mut c_char, length: c_uint) {
        let text = with_device(device, |node, dev| Ok(node.name(dev)))?;
        // SAFETY: the caller passes a buffer of `length` bytes.
        unsafe { put_str(name, length, &text) }
    }
    fn nvmlDeviceGetMinorNumber(device: RawDevice, minor: *mut c_uint) {
        let value = with_device(device, |node, dev| match dev {
            Dev::Gpu(_) if !node.wsl => Ok(node.gpu(dev).config.minor),
            Dev::Gpu(_) | Dev::Mig(..) => Err(code::NOT_SUPPORTED),
        })?;
        // SAFETY: NVML's contract: `minor` is NULL or points to an unsigned int.
        unsafe { put(minor, value) }
    }

    fn nvmlDeviceGetBrand(device: RawDevice, brand: *mut c_uint) {
        let value = with_device(device, |node, dev| Ok(node.gpu(dev).config.brand()))?;
        // SAFETY: NVML's contract: `brand` is NULL or points to an nvmlBrandType_t (an
        // unsigned-int-sized enum).
        unsafe { put(brand, value) }
    }

    fn nvmlDeviceGetPciInfo(device: RawDevice, pci: *mut c_void) {
        let info = pci_info(device)?;
        let v1 = PciInfoV1 {
            bus_id: info.bus_id_legacy,
            domain: info.domain,
            bus: info.bus,
            device: info.device,
            pci_device_id: info.pci_device_id,
            pci_subsystem_id: info.pci_subsystem_id,
            reserved: [0; 4],
        };
        // SAFETY: v1 callers pass the v1 nvmlPciInfo_t.
        unsafe { put(pci.cast::<PciInfoV1>(), v1) }
    }
    fn nvmlDeviceGetPciInfo_v2(device: RawDevice, pci: *mut c_void) {
        let info = pci_info(device)?;
        // SAFETY: NVML's contract: `pci` is NULL or points to an nvmlPciInfo_t.
        unsafe { put(pci.cast::<PciInfo>(), info) }
    }
    fn nvmlDeviceGetPciInfo_v3(device: RawDevice, pci: *mut c_void) {
        let info = pci_info(device)?;
        // SAFETY: as above.
        unsafe { put(pci.cast::<PciInfo>(), info) }
    }

    fn nvmlDeviceGetMemoryInfo(device: RawDevice, memory: *mut c_void) {
        let (total, free, used) = with_readings(device, |node, dev| Ok(node.memory(dev)))?;
        // SAFETY: NVML's contract: `memory` is NULL or points to an nvmlMemory_t.
        unsafe { put(memory.cast::<Memory>(), Memory { total, free, used }) }
    }
    fn nvmlDeviceGetUtilizationRates(device: RawDevice, utilization: *mut c_void) {
        let (gpu, memory) = with_readings(device, |node, dev| node.utilization(dev))?;
        // SAFETY: NVML's contract: `utilization` is NULL or points to an nvmlUtilization_t.
        unsafe { put(utilization.cast::<Utilization>(), Utilization { gpu, memory }) }
    }
    fn nvmlDeviceGetTemperature(device: RawDevice, sensor: c_uint, temp: *mut c_uint) {
        let value = with_readings(device, |node, dev| node.temperature(dev, sensor))?;
        // SAFETY: NVML's contract: `temp` is NULL or points to an unsigned int.
        unsafe { put(temp, value) }
    }
    fn nvmlDeviceGetPowerUsage(device: RawDevice, power: *mut c_uint) {
        let value = with_readings(device, |node, dev| node.power(dev))?;
        // SAFETY: NVML's contract: `power` is NULL or points to an unsigned int.
        unsafe { put(power, value) }
    }
    fn nvmlDeviceGetClockInfo(device: RawDevice, clock_type: c_uint, clock: *mut c_uint) {
        let value = with_readings(device, |node, dev| node.clock(dev, clock_type))?;
        // SAFETY: NVML's contract: `clock` is NULL or points to an unsigned int.
        unsafe { put(clock, value) }
    }
    fn nvmlDeviceGetCudaComputeCapability(device: RawDevice, major: *mut c_int, minor: *mut c_int) {
        let (maj, min) = with_device(device, |node, dev| Ok(node.gpu(dev).config.compute_capability))?;
        if major.is_null() || minor.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: both non-NULL; NVML's contract makes them ints.
        unsafe {
            put(major, maj)?;
            put(minor, min)
        }
    }

    fn nvmlDeviceGetMigMode(device: RawDevice, current: *mut c_uint, pending: *mut c_uint) {
        let mode = with_device(device, |node, dev| {
            let gpu = node.gpu(dev);
            match dev {
                Dev::Mig(..) => Err(code::NOT_SUPPORTED),
                Dev::Gpu(_) if !gpu.mig_capable => Err(code::NOT_SUPPORTED),
                Dev::Gpu(_) => Ok(c_uint::from(gpu.config.mig_mode)),
            }
        })?;
        if current.is_null() || pending.is_null() {
            return Err(code::INVALID_ARGUMENT);
        }
        // SAFETY: both non-NULL; NVML's contract makes them unsigned ints.
        unsafe {
            put(current, mode)?;
            put(pending, mode)
        }
    }
    fn nvmlDeviceGetMaxMigDeviceCount(device: RawDevice, count: *mut c_uint) {
        let value = with_device(device, |node, dev| match dev {
            Dev::Mig(..) => Err(code::INVALID_ARGUMENT),
            // "Returns zero if MIG is not supported or enabled."
            Dev::Gpu(_) => Ok(node.gpu(dev).max_mig_devices() as c_uint),
        })?;
        // SAFETY: NVML's contract: `count` is NULL or points to an unsigned int.
        unsafe { put(count, value) }
    }
    fn nvmlDeviceGetMigDeviceHandleByIndex(device: RawDevice, index: c_uint, mig: *mut RawDevice) {
        let handle = with_device(device, |node, dev| {
            let gpu = node.gpu(dev);
            let index = index as usize;
            match dev {
                Dev::Mig(..) => Err(code::INVALID_ARGUMENT),
                Dev::Gpu(_) if !gpu.mig_capable => Err(code::NOT_SUPPORTED),
                Dev::Gpu(_) if index >= gpu.max_mig_devices() => Err(code::INVALID_ARGUMENT),
                Dev::Gpu(g) if index < gpu.mig_devices().len() => Ok(device_handle(Dev::Mig(g, index))),
                Dev::Gpu(_) => Err(code::NOT_FOUND),
            }
        })?;
        // SAFETY: NVML's contract: `mig` is NULL or points to an nvmlDevice_t.
        unsafe { put(mig, handle) }
    }
    fn nvmlDeviceIsMigDeviceHandle(device: RawDevice, is_mig: *mut c_uint) {
        let value = with_device(device, |_, dev| Ok(c_uint::from(matches!(dev, Dev::Mig(..)))))?;
        // SAFETY: NVML's contract: `is_mig` is NULL or points to an unsigned int.
        unsafe { put(is_mig, value) }
    }
    fn nvmlDeviceGetGpuInstanceId(device: RawDevice, id: *mut c_uint) {
        let value = with_device(device, |node, dev| match dev {
            Dev::Mig(g, m) => node.mig(g, m).map(|mig| mig.gpu_instance_id).ok_or(code::INVALID_ARGUMENT),
            Dev::Gpu(_) => Err(code::NOT_SUPPORTED),
        })?;
        // SAFETY: NVML's contract: `id` is NULL or points to an unsigned int.
        unsafe { put(id, value) }
    }
    fn nvmlDeviceGetComputeInstanceId(device: RawDevice, id: *mut c_uint) {
        let value = with_device(device, |node, dev| match dev {
            Dev::Mig(g, m) => node.mig(g, m).map(|mig| mig.compute_instance_id).ok_or(code::INVALID_ARGUMENT),
            Dev::Gpu(_) => Err(code::NOT_SUPPORTED),
        })?;
        // SAFETY: as above.
        unsafe { put(id, value) }
    }
    fn nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig: RawDevice, device: *mut RawDevice) {
        let handle = with_device(mig, |_, dev| match dev {
            Dev::Mig(g, _) => Ok(device_handle(Dev::Gpu(g))),
            Dev::Gpu(_) => Err(code::INVALID_ARGUMENT),
        })?;
        // SAFETY: NVML's contract: `device` is NULL or points to an nvmlDevice_t.
        unsafe { put(device, handle) }
    }

    fn nvmlDeviceGetSupportedEventTypes(device: RawDevice, types: *mut c_ulonglong) {
        let value = with_device(device, |_, dev| match dev {
            Dev::Gpu(_) => Ok(state::SUPPORTED_EVENTS),
            Dev::Mig(..) => Err(code::NOT_SUPPORTED),
        })?;
        // SAFETY: NVML's contract: `types` is NULL or points to an unsigned long long.
        unsafe { put(types, value) }
    }
    fn nvmlDeviceRegisterEvents(device: RawDevice, types: c_ulonglong, set: RawEventSet) {
        state().register(device.addr(), types, set.addr())
    }
    fn nvmlEventSetCreate(set: *mut RawEventSet) {
        if set.is_null() {
            state().node()?;
            return Err(code::INVALID_ARGUMENT);
        }
        let handle = state().create_event_set()?;
        // SAFETY: non-NULL; NVML's contract makes it an nvmlEventSet_t.
        unsafe { put(set, std::ptr::without_provenance_mut(handle)) }
    }
    fn nvmlEventSetWait(set: RawEventSet, data: *mut c_void, timeout_ms: c_uint) {
        if data.is_null() {
            state().node()?;
            return Err(code::INVALID_ARGUMENT);
        }
        let event = event_wait(set, timeout_ms)?;
        let out = EventDataV1 {
            device: device_handle(event.device),
            event_type: event.event_type,
            event_data: event.data,
        };
        // SAFETY: non-NULL; v1 callers pass the v1 nvmlEventData_t.
        unsafe { put(data.cast::<EventDataV1>(), out) }
    }
    fn nvmlEventSetWait_v2(set: RawEventSet, data: *mut c_void, timeout_ms: c_uint) {
        if data.is_null() {
            state().node()?;
            return Err(code::INVALID_ARGUMENT);
        }
        let event = event_wait(set, timeout_ms)?;
        let out = EventData {
            device: device_handle(event.device),
            event_type: event.event_type,
            event_data: event.data,
            gpu_instance_id: event.gpu_instance_id,
            compute_instance_id: event.compute_instance_id,
        };
        // SAFETY: non-NULL; NVML's contract makes it an nvmlEventData_t.
        unsafe { put(data.cast::<EventData>(), out) }
    }
    fn nvmlEventSetFree(set: RawEventSet) {
        state().free_event_set(set.addr())
    }

    fn nvmlDeviceGetNvLinkState(device: RawDevice, link: c_uint, is_active: *mut c_uint) {
        let value = with_device(device, |node, dev| {
            Ok(nvlink(node, dev, link)?.is_some_and(|l| l.active))
        })?;
        // SAFETY: NVML's contract: `is_active` is NULL or points to an nvmlEnableState_t.
        unsafe { put(is_active, c_uint::from(value)) }
    }
    fn nvmlDeviceGetNvLinkRemotePciInfo_v2(device: RawDevice, link: c_uint, pci: *mut c_void) {
        let info = with_device(device, |node, dev| match nvlink(node, dev, link)? {
            Some(l) if l.active => Ok(pci_info_at(l.remote)),
            // A link that is down has no far end to describe.
            _ => Err(code::NOT_SUPPORTED),
        })?;
        // SAFETY: NVML's contract: `pci` is NULL or points to an nvmlPciInfo_t.
        unsafe { put(pci.cast::<PciInfo>(), info) }
    }
}

fn handle_by_index(node: &Node, index: c_uint) -> Result<RawDevice, Ret> {
    node.by_index(index as usize).map(device_handle)
}

/// `nvmlErrorString`: NVML's descriptions, word for word. Works before init, like NVML's.
#[unsafe(no_mangle)]
extern "C" fn nvmlErrorString(result: Ret) -> *const c_char {
    log_call("nvmlErrorString");
    error_string(result).as_ptr()
}

fn error_string(result: Ret) -> &'static CStr {
    match result {
        0 => c"Success",
        1 => c"Uninitialized",
        2 => c"Invalid Argument",
        3 => c"Not Supported",
        4 => c"Insufficient Permissions",
        5 => c"Already Initialized",
        6 => c"Not Found",
        7 => c"Insufficient Size",
        8 => c"Insufficient External Power",
        9 => c"Driver Not Loaded",
        10 => c"Timeout",
        11 => c"Interrupt request issue",
        12 => c"NVML Shared Library Not Found",
        13 => c"Function Not Found",
        14 => c"Corrupted infoROM",
        15 => c"GPU is lost",
        16 => c"GPU requires restart",
        17 => c"The operating system has blocked the request.",
        18 => c"RM has detected an NVML/RM version mismatch.",
        19 => c"In use by another client",
        20 => c"Insufficient Memory",
        21 => c"No data",
        22 => c"The requested vGPU operation is not available because ECC is enabled",
        23 => c"Ran out of critical resources, other than memory",
        24 => c"Frequency not supported",
        25 => c"Argument version mismatch",
        26 => c"The requested functionality has been deprecated",
        27 => c"The system is not ready for the request",
        28 => c"No supported GPUs were found",
        29 => c"Resource not in correct state to perform requested operation",
        _ => c"Unknown Error",
    }
}

// After `nvml_exports!`, which it uses: the metrics exporter's calls (telemetry.rs).
mod telemetry_abi;

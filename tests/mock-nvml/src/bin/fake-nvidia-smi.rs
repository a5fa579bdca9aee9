// SPDX-License-Identifier: Apache-2.0
//! A stand-in `nvidia-smi` for tests: loads `libnvidia-ml.so.1` through the normal loader
//! (no path, so inside a container the container's `ld.so.cache` decides which library that
//! is) and prints what NVML reports. `-L` matches the real tool's output line for line; with
//! no arguments it prints a short table. Failures print the real tool's messages and exit
//! with its codes (the NVML return code; 12 when the library cannot be loaded).

use std::ffi::{CStr, c_char, c_int, c_uint, c_void};
use std::process::ExitCode;

use libloading::Library;

type Ret = c_uint;
type Device = *mut c_void;

const SUCCESS: Ret = 0;
const DRIVER_NOT_LOADED: Ret = 9;
const NOT_FOUND: Ret = 6;
const LIBRARY_NOT_FOUND: u8 = 12;

// The same C structs the mock fills, so the two sides cannot drift apart.
#[path = "../abi.rs"]
mod abi;
use abi::{Memory, PciInfo};

/// The NVML functions this tool calls, with nvml.h's signatures.
struct Api {
    init: unsafe extern "C" fn() -> Ret,
    shutdown: unsafe extern "C" fn() -> Ret,
    error_string: unsafe extern "C" fn(Ret) -> *const c_char,
    driver_version: unsafe extern "C" fn(*mut c_char, c_uint) -> Ret,
    cuda_version: unsafe extern "C" fn(*mut c_int) -> Ret,
    count: unsafe extern "C" fn(*mut c_uint) -> Ret,
    by_index: unsafe extern "C" fn(c_uint, *mut Device) -> Ret,
    name: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    uuid: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
    pci: unsafe extern "C" fn(Device, *mut PciInfo) -> Ret,
    memory: unsafe extern "C" fn(Device, *mut Memory) -> Ret,
    mig_mode: Option<unsafe extern "C" fn(Device, *mut c_uint, *mut c_uint) -> Ret>,
    max_mig: Option<unsafe extern "C" fn(Device, *mut c_uint) -> Ret>,
    mig_by_index: Option<unsafe extern "C" fn(Device, c_uint, *mut Device) -> Ret>,
    _lib: Library,
}

/// Looks up `name` as a `T`.
///
/// # Safety
/// `T` must be the function pointer type nvml.h declares for `name`.
unsafe fn symbol<T: Copy>(lib: &Library, name: &str) -> Result<T, String> {
    // SAFETY: per the caller; the pointer is used only while `lib` (kept in `Api`) lives.
    unsafe { lib.get::<T>(name.as_bytes()) }
        .map(|s| *s)
        .map_err(|e| format!("{name}: {e}"))
}

impl Api {
    fn load() -> Result<Api, String> {
        // SAFETY: loading NVML runs only its own constructors.
        let lib = unsafe { Library::new("libnvidia-ml.so.1") }.map_err(|e| {
            let detail = std::error::Error::source(&e).map(|s| s.to_string());
            detail.unwrap_or_else(|| e.to_string())
        })?;
        // SAFETY (all lookups): the types are nvml.h's signatures for these names.
        unsafe {
            Ok(Api {
                init: symbol(&lib, "nvmlInit_v2").or_else(|_| symbol(&lib, "nvmlInit"))?,
                shutdown: symbol(&lib, "nvmlShutdown")?,
                error_string: symbol(&lib, "nvmlErrorString")?,
                driver_version: symbol(&lib, "nvmlSystemGetDriverVersion")?,
                cuda_version: symbol(&lib, "nvmlSystemGetCudaDriverVersion_v2")
                    .or_else(|_| symbol(&lib, "nvmlSystemGetCudaDriverVersion"))?,
                count: symbol(&lib, "nvmlDeviceGetCount_v2")?,
                by_index: symbol(&lib, "nvmlDeviceGetHandleByIndex_v2")?,
                name: symbol(&lib, "nvmlDeviceGetName")?,
                uuid: symbol(&lib, "nvmlDeviceGetUUID")?,
                pci: symbol(&lib, "nvmlDeviceGetPciInfo_v3")?,
                memory: symbol(&lib, "nvmlDeviceGetMemoryInfo")?,
                mig_mode: symbol(&lib, "nvmlDeviceGetMigMode").ok(),
                max_mig: symbol(&lib, "nvmlDeviceGetMaxMigDeviceCount").ok(),
                mig_by_index: symbol(&lib, "nvmlDeviceGetMigDeviceHandleByIndex").ok(),
                _lib: lib,
            })
        }
    }

    fn message(&self, ret: Ret) -> String {
        // SAFETY: nvmlErrorString returns NULL or a static NUL-terminated string.
        let text = unsafe { (self.error_string)(ret) };
        if text.is_null() {
            return format!("NVML error {ret}");
        }
        // SAFETY: non-NULL, static and terminated.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    }

    fn check(&self, ret: Ret) -> Result<(), Failure> {
        if ret == SUCCESS {
            Ok(())
        } else {
            Err(Failure {
                code: ret,
                message: self.message(ret),
            })
        }
    }

    /// Calls a `(device, char *, length)` getter.
    fn string(
        &self,
        f: unsafe extern "C" fn(Device, *mut c_char, c_uint) -> Ret,
        device: Device,
    ) -> Result<String, Failure> {
        let mut buffer = [0u8; 96];
        // SAFETY: the buffer is writable for the length passed.
        self.check(unsafe { f(device, buffer.as_mut_ptr().cast(), buffer.len() as c_uint) })?;
        Ok(c_str(&buffer))
    }
}

fn c_str(buffer: &[u8]) -> String {
    let bytes = CStr::from_bytes_until_nul(buffer).map_or(buffer, CStr::to_bytes);
    String::from_utf8_lossy(bytes).into_owned()
}

struct Failure {
    code: Ret,
    message: String,
}

struct MigInfo {
    profile: String,
    uuid: String,
}

struct GpuInfo {
    name: String,
    uuid: String,
    bus_id: String,
    memory: Memory,
    mig_enabled: Option<bool>,
    migs: Vec<MigInfo>,
}

fn gpu(api: &Api, index: u32) -> Result<GpuInfo, Failure> {
    let mut device: Device = std::ptr::null_mut();
    // SAFETY: `device` is a valid out-pointer.
    api.check(unsafe { (api.by_index)(index, &mut device) })?;
    let mut pci = PciInfo {
        bus_id_legacy: [0; 16],
        domain: 0,
        bus: 0,
        device: 0,
        pci_device_id: 0,
        pci_subsystem_id: 0,
        bus_id: [0; 32],
    };
    // SAFETY: `pci` is a valid nvmlPciInfo_t.
    api.check(unsafe { (api.pci)(device, &mut pci) })?;
    let mut memory = Memory::default();
    // SAFETY: `memory` is a valid nvmlMemory_t.
    api.check(unsafe { (api.memory)(device, &mut memory) })?;

    let mut mig_enabled = None;
    if let Some(mig_mode) = api.mig_mode {
        let (mut current, mut pending) = (0, 0);
        // SAFETY: both are valid out-pointers; NOT_SUPPORTED just means no MIG.
        if unsafe { mig_mode(device, &mut current, &mut pending) } == SUCCESS {
            mig_enabled = Some(current == 1);
        }
    }
    let mut migs = Vec::new();
    if let (Some(true), Some(max_mig), Some(by_index)) =
        (mig_enabled, api.max_mig, api.mig_by_index)
    {
        let mut max = 0;
        // SAFETY: `max` is a valid out-pointer.
        api.check(unsafe { max_mig(device, &mut max) })?;
        for slot in 0..max {
            let mut mig: Device = std::ptr::null_mut();
            // SAFETY: `mig` is a valid out-pointer.
            let ret = unsafe { by_index(device, slot, &mut mig) };
            if ret != SUCCESS {
                continue;
            }
            let name = api.string(api.name, mig)?;
            let profile = name
                .rsplit_once("MIG ")
                .map_or(name.as_str(), |(_, p)| p)
                .to_string();
            migs.push(MigInfo {
                profile,
                uuid: api.string(api.uuid, mig)?,
            });
        }
    }
    Ok(GpuInfo {
        name: api.string(api.name, device)?,
        uuid: api.string(api.uuid, device)?,
        bus_id: c_str(&pci.bus_id),
        memory,
        mig_enabled,
        migs,
    })
}

fn run(api: &Api, list: bool) -> Result<(), Failure> {
    let mut count = 0;
    // SAFETY: `count` is a valid out-pointer.
    api.check(unsafe { (api.count)(&mut count) })?;
    if count == 0 {
        return Err(Failure {
            code: NOT_FOUND,
            message: "No devices were found".into(),
        });
    }
    let gpus = (0..count)
        .map(|i| gpu(api, i))
        .collect::<Result<Vec<_>, _>>()?;
    if list {
        for (index, gpu) in gpus.iter().enumerate() {
            println!("GPU {index}: {} (UUID: {})", gpu.name, gpu.uuid);
            for (m, mig) in gpu.migs.iter().enumerate() {
                println!(
                    "  MIG {:<11} Device {m:>2}: (UUID: {})",
                    mig.profile, mig.uuid
                );
            }
        }
        return Ok(());
    }

    let mut version = [0u8; 80];
    // SAFETY: the buffer is writable for the length passed.
    api.check(unsafe {
        (api.driver_version)(version.as_mut_ptr().cast(), version.len() as c_uint)
    })?;
    let version = c_str(&version);
    let mut cuda = 0;
    // SAFETY: `cuda` is a valid out-pointer.
    api.check(unsafe { (api.cuda_version)(&mut cuda) })?;
    let cuda = format!("{}.{}", cuda / 1000, (cuda % 1000) / 10);
    let rule = format!("+{}+", "-".repeat(90));
    println!("{rule}");
    println!(
        "| {:<89}|",
        format!("NVIDIA-SMI {version}    Driver Version: {version}    CUDA Version: {cuda}")
    );
    println!(
        "| {:<4} {:<35}| {:<17}| {:<10}| {:<16}|",
        "GPU", "Name", "Bus-Id", "MIG M.", "Memory-Usage"
    );
    println!("{rule}");
    for (index, gpu) in gpus.iter().enumerate() {
        let mig = match gpu.mig_enabled {
            Some(true) => "Enabled",
            Some(false) => "Disabled",
            None => "N/A",
        };
        let memory = format!(
            "{}MiB / {}MiB",
            gpu.memory.used >> 20,
            gpu.memory.total >> 20
        );
        println!(
            "| {index:>4} {:<35}| {:<17}| {mig:<10}| {memory:<16}|",
            gpu.name, gpu.bus_id
        );
        for mig in &gpu.migs {
            println!(
                "| {:>4} {:<35}| {:<17}| {:<10}| {:<16}|",
                "",
                format!("  MIG {}", mig.profile),
                "",
                "",
                ""
            );
        }
    }
    println!("{rule}");
    Ok(())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let list = match args
        .iter()
        .map(String::as_str)
        .collect::<Vec<_>>()
        .as_slice()
    {
        [] => false,
        ["-L"] | ["--list-gpus"] => true,
        other => {
            println!(
                "Invalid combination of input arguments {other:?}. Please run 'nvidia-smi -h' for help."
            );
            return ExitCode::from(2);
        }
    };
    let api = match Api::load() {
        Ok(api) => api,
        Err(why) => {
            println!(
                "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system. Please make sure that the NVIDIA Display Driver is properly installed and present in your system.\nPlease also try adding directory that contains libnvidia-ml.so to your system PATH."
            );
            eprintln!("{why}");
            return ExitCode::from(LIBRARY_NOT_FOUND);
        }
    };
    // SAFETY: nvmlInit takes no arguments.
    let ret = unsafe { (api.init)() };
    if ret != SUCCESS {
        if ret == DRIVER_NOT_LOADED {
            println!(
                "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
            );
        }
        println!("Failed to initialize NVML: {}", api.message(ret));
        return exit_code(ret);
    }
    let result = run(&api, list);
    // SAFETY: matches the successful init above.
    unsafe { (api.shutdown)() };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            println!("{}", failure.message);
            exit_code(failure.code)
        }
    }
}

/// nvidia-smi exits with the NVML return code, 255 for anything that does not fit.
fn exit_code(ret: Ret) -> ExitCode {
    ExitCode::from(u8::try_from(ret).ok().filter(|&c| c != 0).unwrap_or(255))
}

// SPDX-License-Identifier: Apache-2.0
//! The mock's state and behaviour, in safe Rust: which GPUs are visible, what each handle
//! means, and which events are due. `lib.rs` only moves values across the C boundary.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{Config, GpuConfig, MigConfig, NvLinkConfig, XidEventConfig};
use crate::readings::ConfigFile;

mod events;
mod gpu;
pub use events::*;
use events::{EventSet, event, read_new_lines};
use gpu::expand_nvlinks;
pub use gpu::*;

/// `nvmlReturn_t` values (nvml.h).
pub mod code {
    pub const SUCCESS: u32 = 0;
    pub const UNINITIALIZED: u32 = 1;
    pub const INVALID_ARGUMENT: u32 = 2;
    pub const NOT_SUPPORTED: u32 = 3;
    pub const NOT_FOUND: u32 = 6;
    pub const INSUFFICIENT_SIZE: u32 = 7;
    pub const DRIVER_NOT_LOADED: u32 = 9;
    pub const TIMEOUT: u32 = 10;
    pub const GPU_IS_LOST: u32 = 15;
    pub const ARGUMENT_VERSION_MISMATCH: u32 = 25;
    pub const UNKNOWN: u32 = 999;
}

pub type Ret = u32;

pub const EVENT_SINGLE_BIT_ECC: u64 = 0x1;
pub const EVENT_DOUBLE_BIT_ECC: u64 = 0x2;
pub const EVENT_XID: u64 = 0x8;
/// What every mock GPU supports (an A100 supports more; these are the ones health checks use).
pub const SUPPORTED_EVENTS: u64 = EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID;
/// `gpuInstanceId` / `computeInstanceId` of an event no MIG instance caused.
pub const NO_INSTANCE: u32 = 0xFFFF_FFFF;
/// `nvmlDeviceGetMaxMigDeviceCount` on a GPU in MIG mode (seven 1g slices on an A100/H100).
const MAX_MIG_DEVICES: usize = 7;
/// `NVML_NVLINK_MAX_LINKS`: link numbers at or past it are `INVALID_ARGUMENT` on every GPU.
pub const NVLINK_MAX_LINKS: usize = 18;
/// How many links a GPU with NVLink has at least (an A100 has 12); links past a GPU's own
/// count are `INVALID_ARGUMENT`, as on real GPUs.
const NVLINK_MIN_LINKS: usize = 12;

pub const CONFIG_ENV: &str = "MOCK_NVML_CONFIG";
pub const DEV_ROOT_ENV: &str = "MOCK_NVML_DEV_ROOT";

// Handles are tagged integers, never dereferenced: a tag in the high 32 bits (so a stray
// pointer is rejected), the GPU's position in bits 16..32 and the MIG slot + 1 (0 for the
// GPU itself) in bits 0..16.
const DEVICE_TAG: usize = 0x6e76_6d6c << 32; // "nvml"
const EVENT_SET_TAG: usize = 0x6576_6e74 << 32; // "evnt"
const TAG_MASK: usize = 0xffff_ffff << 32;

/// What a device handle refers to: a GPU (by position) or one of its MIG devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dev {
    Gpu(usize),
    Mig(usize, usize),
}

impl Dev {
    pub fn gpu(self) -> usize {
        match self {
            Dev::Gpu(gpu) | Dev::Mig(gpu, _) => gpu,
        }
    }

    pub fn handle(self) -> usize {
        match self {
            Dev::Gpu(gpu) => DEVICE_TAG | (gpu << 16),
            Dev::Mig(gpu, mig) => DEVICE_TAG | (gpu << 16) | (mig + 1),
        }
    }
}

/// The node as this process's NVML sees it, fixed at `nvmlInit`.
#[derive(Debug)]
pub struct Node {
    pub driver_version: String,
    pub cuda_driver_version: i32,
    /// Visible GPUs, in PCI bus order.
    pub gpus: Vec<Gpu>,
    /// Per GPU: whether a `gone` line has made it disappear.
    lost: Vec<bool>,
    xid_events: Vec<XidEventConfig>,
    event_file: Option<PathBuf>,
    /// The config file the node came from, whose readings are re-read when it changes
    /// (`None` for a node built from a config in memory).
    pub(crate) config_file: Option<ConfigFile>,
    /// A WSL2 node (the config's `wsl`): GPUs have no minor numbers.
    pub wsl: bool,
}

impl Node {
    /// Reads `$MOCK_NVML_CONFIG` and looks for the GPUs' device nodes. The error says why
    /// the "driver" is not there.
    pub fn from_env() -> Result<Node, String> {
        let Some(path) = std::env::var_os(CONFIG_ENV) else {
            return Err(format!(
                "{CONFIG_ENV} is not set, so there is no GPU node to mock"
            ));
        };
        let path = PathBuf::from(path);
        let (config, file) = ConfigFile::read(&path)?;
        let dev_root = std::env::var_os(DEV_ROOT_ENV)
            .map(PathBuf::from)
            .or_else(|| config.dev_root.clone())
            .unwrap_or_else(|| PathBuf::from("/dev"));
        let mut node = Node::new(config, &dev_root)
            .map_err(|error| format!("invalid {CONFIG_ENV} file {}: {error}", path.display()))?;
        node.config_file = Some(file);
        Ok(node)
    }

    /// Keeps the GPUs whose `<dev_root>/nvidia<minor>` exists (on a WSL node, all of
    /// them while `<dev_root>/dxg` exists), as the real driver only reports GPUs this
    /// process can open, and sorts them into PCI bus order.
    pub fn new(config: Config, dev_root: &Path) -> Result<Node, String> {
        let mut gpus = Vec::new();
        let dxg = config.wsl && dev_root.join("dxg").exists();
        for gpu in config.gpus {
            let bus_id = BusId::parse(&gpu.bus_id).ok_or_else(|| {
                format!(
                    "GPU {} has bus_id {:?}, not domain:bus:device.function",
                    gpu.uuid, gpu.bus_id
                )
            })?;
            let nvlinks = expand_nvlinks(&gpu)?;
            let visible = if config.wsl {
                dxg
            } else {
                dev_root.join(format!("nvidia{}", gpu.minor)).exists()
            };
            if !visible {
                continue;
            }
            let (major, minor) = gpu.compute_capability;
            let mig_capable = gpu.mig_mode
                || !gpu.mig_devices.is_empty()
                || (major, minor) == (8, 0)
                || major >= 9;
            gpus.push(Gpu {
                config: gpu,
                bus_id,
                mig_capable,
                nvlinks,
            });
        }
        gpus.sort_by_key(|gpu| gpu.bus_id);
        Ok(Node {
            driver_version: config.driver_version,
            cuda_driver_version: config.cuda_driver_version,
            lost: vec![false; gpus.len()],
            gpus,
            xid_events: config.xid_events,
            event_file: config.event_file,
            config_file: None,
            wsl: config.wsl,
        })
    }

    /// Decodes a handle; `INVALID_ARGUMENT` for anything we did not hand out and
    /// `GPU_IS_LOST` for a GPU (or MIG device of one) that is gone.
    pub fn device(&self, handle: usize) -> Result<Dev, Ret> {
        let dev = self.decode(handle)?;
        if self.is_lost(dev) {
            return Err(code::GPU_IS_LOST);
        }
        Ok(dev)
    }

    /// Decodes a handle, lost or not.
    fn decode(&self, handle: usize) -> Result<Dev, Ret> {
        if handle & TAG_MASK != DEVICE_TAG {
            return Err(code::INVALID_ARGUMENT);
        }
        let gpu_index = (handle >> 16) & 0xffff;
        let slot = handle & 0xffff;
        let gpu = self.gpus.get(gpu_index).ok_or(code::INVALID_ARGUMENT)?;
        match slot {
            0 => Ok(Dev::Gpu(gpu_index)),
            slot if slot <= gpu.mig_devices().len() => Ok(Dev::Mig(gpu_index, slot - 1)),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    /// Whether `dev`'s GPU has disappeared (a `gone` line in the event file).
    pub fn is_lost(&self, dev: Dev) -> bool {
        self.lost.get(dev.gpu()).copied().unwrap_or(false)
    }

    /// `nvmlDeviceGetHandleByIndex`: the GPU at `index`; `GPU_IS_LOST` once it is gone
    /// (the indices of the others do not move, as with the real driver).
    pub fn by_index(&self, index: usize) -> Result<Dev, Ret> {
        if index >= self.gpus.len() {
            return Err(code::INVALID_ARGUMENT);
        }
        let dev = Dev::Gpu(index);
        if self.is_lost(dev) {
            return Err(code::GPU_IS_LOST);
        }
        Ok(dev)
    }

    /// `nvmlDeviceGetHandleByUUID`: `NOT_FOUND` for an unknown UUID, `GPU_IS_LOST` for one
    /// that is gone.
    pub fn lookup_uuid(&self, uuid: &str) -> Result<Dev, Ret> {
        let dev = self.by_uuid(uuid).ok_or(code::NOT_FOUND)?;
        if self.is_lost(dev) {
            return Err(code::GPU_IS_LOST);
        }
        Ok(dev)
    }

    pub fn gpu(&self, dev: Dev) -> &Gpu {
        // `dev` came from `device` or `by_uuid`, so the index is in range.
        &self.gpus[dev.gpu()]
    }

    pub fn mig(&self, gpu: usize, mig: usize) -> Option<&MigConfig> {
        self.gpus.get(gpu)?.mig_devices().get(mig)
    }

    /// A GPU or MIG device by UUID, among the visible ones, lost or not.
    pub fn by_uuid(&self, uuid: &str) -> Option<Dev> {
        self.gpus.iter().enumerate().find_map(|(g, gpu)| {
            if gpu.config.uuid == uuid {
                return Some(Dev::Gpu(g));
            }
            gpu.mig_devices()
                .iter()
                .position(|mig| mig.uuid == uuid)
                .map(|m| Dev::Mig(g, m))
        })
    }

    pub fn name(&self, dev: Dev) -> String {
        match dev {
            Dev::Gpu(g) => self.gpus[g].config.name.clone(),
            Dev::Mig(g, m) => {
                let gpu = &self.gpus[g];
                let profile = gpu
                    .mig_devices()
                    .get(m)
                    .map_or("", |mig| mig.profile.as_str());
                format!("{} MIG {profile}", gpu.config.name)
            }
        }
    }

    pub fn uuid(&self, dev: Dev) -> String {
        match dev {
            Dev::Gpu(g) => self.gpus[g].config.uuid.clone(),
            Dev::Mig(g, m) => self
                .mig(g, m)
                .map(|mig| mig.uuid.clone())
                .unwrap_or_default(),
        }
    }

    /// `(total, free, used)`.
    pub fn memory(&self, dev: Dev) -> (u64, u64, u64) {
        match dev {
            Dev::Gpu(g) => {
                let config = &self.gpus[g].config;
                let used = config.memory_used_bytes.min(config.memory_total_bytes);
                (
                    config.memory_total_bytes,
                    config.memory_total_bytes - used,
                    used,
                )
            }
            Dev::Mig(g, m) => {
                let total = self.mig(g, m).map_or(0, |mig| mig.memory_total_bytes);
                let used = self.mig_memory_used(g, m).min(total);
                (total, total - used, used)
            }
        }
    }
}

/// Everything behind the C API: NVML's init reference count, the node, the event sets.
#[derive(Debug)]
pub struct State {
    refcount: u32,
    node: Option<Node>,
    sets: BTreeMap<usize, EventSet>,
    next_set: usize,
    /// How far [`State::refresh`] has read the event file (for `gone` and `wait-error`).
    control_offset: u64,
    /// Failures the next waits return, oldest first.
    wait_errors: VecDeque<Ret>,
}

impl State {
    pub const fn new() -> State {
        State {
            refcount: 0,
            node: None,
            sets: BTreeMap::new(),
            next_set: 1,
            control_offset: 0,
            wait_errors: VecDeque::new(),
        }
    }

    /// Applies the event file's new `gone` and `wait-error` lines. These change the node for
    /// every caller, so one reader (this one) takes them, once, before each call; the event
    /// sets' own readers take the event lines.
    pub fn refresh(&mut self) {
        let Some(node) = self.node.as_mut() else {
            return;
        };
        let Some(path) = node.event_file.clone() else {
            return;
        };
        for line in read_new_lines(&path, &mut self.control_offset) {
            match line {
                Ok(Line::Gone(uuid)) => match node.by_uuid(&uuid) {
                    Some(dev) => node.lost[dev.gpu()] = true,
                    None => eprintln!(
                        "nvshim-mock-nvml: ignoring \"{uuid} gone\" in {}: no visible GPU has that UUID",
                        path.display()
                    ),
                },
                Ok(Line::WaitError(code)) => self.wait_errors.push_back(code),
                Ok(Line::Xid(..) | Line::DoubleBitEcc(..)) => {}
                Err(line) => eprintln!(
                    "nvshim-mock-nvml: ignoring line {line:?} in {}: expected \"<uuid> <xid>\", \"<uuid> dbe\", \"<uuid> gone\" or \"wait-error <code>\"",
                    path.display()
                ),
            }
        }
    }

    /// `nvmlInit*`: reference-counted like NVML's; the config is read on the first call.
    pub fn init(&mut self) -> Ret {
        if self.refcount > 0 {
            self.refcount += 1;
            return code::SUCCESS;
        }
        match Node::from_env() {
            Ok(node) => {
                self.node = Some(node);
                self.refcount = 1;
                code::SUCCESS
            }
            Err(why) => {
                eprintln!("nvshim-mock-nvml: nvmlInit failed (Driver Not Loaded): {why}");
                code::DRIVER_NOT_LOADED
            }
        }
    }

    /// `nvmlShutdown`: the last one forgets the node and every event set.
    pub fn shutdown(&mut self) -> Ret {
        if self.refcount == 0 {
            return code::UNINITIALIZED;
        }
        self.refcount -= 1;
        if self.refcount == 0 {
            self.node = None;
            self.sets.clear();
            self.control_offset = 0;
            self.wait_errors.clear();
        }
        code::SUCCESS
    }

    pub fn node(&self) -> Result<&Node, Ret> {
        self.node.as_ref().ok_or(code::UNINITIALIZED)
    }

    /// Re-reads the GPUs' readings if the config file has changed (see `readings`).
    pub fn refresh_readings(&mut self) {
        if let Some(node) = self.node.as_mut() {
            node.refresh_readings();
        }
    }

    pub fn create_event_set(&mut self) -> Result<usize, Ret> {
        let node = self.node.as_ref().ok_or(code::UNINITIALIZED)?;
        let set = EventSet {
            created: Instant::now(),
            registered: vec![0; node.gpus.len()],
            delivered: vec![false; node.xid_events.len()],
            file_offset: 0,
            pending: VecDeque::new(),
        };
        let id = self.next_set;
        self.next_set += 1;
        self.sets.insert(id, set);
        Ok(EVENT_SET_TAG | id)
    }

    pub fn free_event_set(&mut self, handle: usize) -> Result<(), Ret> {
        self.node()?;
        let id = set_id(handle)?;
        self.sets
            .remove(&id)
            .map(|_| ())
            .ok_or(code::INVALID_ARGUMENT)
    }

    /// `nvmlDeviceRegisterEvents`: GPUs only, and only the types they support.
    pub fn register(&mut self, device: usize, types: u64, set: usize) -> Result<(), Ret> {
        let node = self.node.as_ref().ok_or(code::UNINITIALIZED)?;
        let dev = node.device(device)?;
        let set = self
            .sets
            .get_mut(&set_id(set)?)
            .ok_or(code::INVALID_ARGUMENT)?;
        if matches!(dev, Dev::Mig(..)) || types & !SUPPORTED_EVENTS != 0 {
            return Err(code::NOT_SUPPORTED);
        }
        set.registered[dev.gpu()] |= types;
        Ok(())
    }

    /// The next due event of `set`, if any; collects newly due ones first.
    pub fn poll(&mut self, set: usize, now: Instant) -> Result<Option<Event>, Ret> {
        let node = self.node.as_ref().ok_or(code::UNINITIALIZED)?;
        let set = self
            .sets
            .get_mut(&set_id(set)?)
            .ok_or(code::INVALID_ARGUMENT)?;
        if let Some(error) = self.wait_errors.pop_front() {
            return Err(error);
        }
        for (i, xid) in node.xid_events.iter().enumerate() {
            if set.delivered[i] || now < set.created + Duration::from_millis(xid.delay_ms) {
                continue;
            }
            // Stays pending until its GPU is registered for XIDs.
            if let Some(event) = event(node, set, &xid.gpu_uuid, EVENT_XID, xid.xid) {
                set.delivered[i] = true;
                set.pending.push_back(event);
            }
        }
        if let Some(path) = &node.event_file {
            for line in read_new_lines(path, &mut set.file_offset) {
                let due = match line {
                    Ok(Line::Xid(uuid, xid)) => event(node, set, &uuid, EVENT_XID, xid),
                    Ok(Line::DoubleBitEcc(uuid)) => {
                        event(node, set, &uuid, EVENT_DOUBLE_BIT_ECC, 0)
                    }
                    // `refresh` takes these, and reports malformed lines.
                    Ok(Line::Gone(_) | Line::WaitError(_)) | Err(_) => None,
                };
                // Lines for GPUs not registered (or not visible) are dropped, as NVML drops
                // events nobody registered for.
                if let Some(event) = due {
                    set.pending.push_back(event);
                }
            }
        }
        Ok(set.pending.pop_front())
    }
}

fn set_id(handle: usize) -> Result<usize, Ret> {
    if handle & TAG_MASK == EVENT_SET_TAG {
        Ok(handle & !TAG_MASK)
    } else {
        Err(code::INVALID_ARGUMENT)
    }
}

#[cfg(test)]
mod tests;

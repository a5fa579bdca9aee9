// SPDX-License-Identifier: Apache-2.0
//! The mock's state and behaviour, in safe Rust: which GPUs are visible, what each handle
//! means, and which events are due. `lib.rs` only moves values across the C boundary.

use std::collections::{BTreeMap, VecDeque};
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::config::{Config, GpuConfig, MigConfig, NvLinkConfig, XidEventConfig};
use crate::readings::ConfigFile;

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

/// A PCI address.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct BusId {
    pub domain: u32,
    pub bus: u32,
    pub device: u32,
    pub function: u32,
}

impl BusId {
    /// Parses `domain:bus:device.function` in hex, any width or case.
    pub fn parse(raw: &str) -> Option<BusId> {
        let (domain, rest) = raw.trim().split_once(':')?;
        let (bus, rest) = rest.split_once(':')?;
        let (device, function) = rest.split_once('.')?;
        let bus_id = BusId {
            domain: u32::from_str_radix(domain, 16).ok()?,
            bus: u32::from_str_radix(bus, 16).ok()?,
            device: u32::from_str_radix(device, 16).ok()?,
            function: u32::from_str_radix(function, 16).ok()?,
        };
        (bus_id.bus <= 0xff && bus_id.device <= 0x1f && bus_id.function <= 7).then_some(bus_id)
    }

    /// `busId` as NVML writes it: `00000000:07:00.0`, upper case.
    pub fn nvml(&self) -> String {
        format!(
            "{:08X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }

    /// `busIdLegacy` (and the v1 `busId`): `0000:07:00.0`.
    pub fn legacy(&self) -> String {
        format!(
            "{:04X}:{:02X}:{:02X}.{:X}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

/// One visible GPU.
#[derive(Debug, Clone)]
pub struct Gpu {
    pub config: GpuConfig,
    pub bus_id: BusId,
    /// Whether MIG calls answer at all (A100/A30, Hopper and later, or whatever the
    /// config puts in MIG mode); other GPUs answer `NOT_SUPPORTED`, like a T4.
    pub mig_capable: bool,
    /// One entry per NVLink, in link order (the config's entries expanded by `count`).
    pub nvlinks: Vec<NvLink>,
}

/// One NVLink of a GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NvLink {
    pub remote: BusId,
    pub active: bool,
}

impl Gpu {
    /// Link `link` of this GPU: `NOT_SUPPORTED` without NVLink, `INVALID_ARGUMENT` past the
    /// GPU's last link, `None` for an existing link that is not wired (down).
    pub fn nvlink(&self, link: usize) -> Result<Option<NvLink>, Ret> {
        if self.nvlinks.is_empty() {
            return Err(code::NOT_SUPPORTED);
        }
        let links = self.nvlinks.len().clamp(NVLINK_MIN_LINKS, NVLINK_MAX_LINKS);
        if link >= links {
            return Err(code::INVALID_ARGUMENT);
        }
        Ok(self.nvlinks.get(link).copied())
    }
}

/// The config's NVLink entries, one per link.
fn expand_nvlinks(gpu: &GpuConfig) -> Result<Vec<NvLink>, String> {
    let mut links = Vec::new();
    for NvLinkConfig {
        remote_bus_id,
        count,
        active,
    } in &gpu.nvlinks
    {
        let remote = BusId::parse(remote_bus_id).ok_or_else(|| {
            format!(
                "GPU {} has an NVLink to {remote_bus_id:?}, not domain:bus:device.function",
                gpu.uuid
            )
        })?;
        links.extend((0..*count).map(|_| NvLink {
            remote,
            active: *active,
        }));
    }
    if links.len() > NVLINK_MAX_LINKS {
        return Err(format!(
            "GPU {} has {} NVLinks; NVML numbers at most {NVLINK_MAX_LINKS}",
            gpu.uuid,
            links.len()
        ));
    }
    Ok(links)
}

impl Gpu {
    /// The MIG devices NVML would enumerate: none unless MIG mode is on.
    pub fn mig_devices(&self) -> &[MigConfig] {
        if self.config.mig_mode {
            &self.config.mig_devices
        } else {
            &[]
        }
    }

    pub fn max_mig_devices(&self) -> usize {
        if self.config.mig_mode {
            MAX_MIG_DEVICES.max(self.config.mig_devices.len())
        } else {
            0
        }
    }
}

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

    /// Keeps the GPUs whose `<dev_root>/nvidia<minor>` exists, as the real driver only
    /// reports GPUs this process can open, and sorts them into PCI bus order.
    pub fn new(config: Config, dev_root: &Path) -> Result<Node, String> {
        let mut gpus = Vec::new();
        for gpu in config.gpus {
            let bus_id = BusId::parse(&gpu.bus_id).ok_or_else(|| {
                format!(
                    "GPU {} has bus_id {:?}, not domain:bus:device.function",
                    gpu.uuid, gpu.bus_id
                )
            })?;
            let nvlinks = expand_nvlinks(&gpu)?;
            if !dev_root.join(format!("nvidia{}", gpu.minor)).exists() {
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
                (total, total, 0)
            }
        }
    }
}

/// One parsed line of the event file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Line {
    /// `<uuid> <xid>`: an XID event.
    Xid(String, u64),
    /// `<uuid> dbe`: a double-bit ECC event.
    DoubleBitEcc(String),
    /// `<uuid> gone`: the GPU (the parent, for a MIG UUID) falls off the bus.
    Gone(String),
    /// `wait-error <code>`: the next `nvmlEventSetWait` of any set fails with `code`.
    WaitError(u32),
}

impl Line {
    fn parse(line: &str) -> Option<Line> {
        let mut words = line.split_whitespace();
        let (Some(first), Some(second), None) = (words.next(), words.next(), words.next()) else {
            return None;
        };
        match (first, second) {
            ("wait-error", code) => code.parse().ok().map(Line::WaitError),
            (uuid, "gone") => Some(Line::Gone(uuid.to_string())),
            (uuid, "dbe") => Some(Line::DoubleBitEcc(uuid.to_string())),
            (uuid, xid) => xid.parse().ok().map(|xid| Line::Xid(uuid.to_string(), xid)),
        }
    }
}

/// An event ready to hand out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    pub device: Dev,
    pub event_type: u64,
    pub data: u64,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
}

#[derive(Debug)]
struct EventSet {
    created: Instant,
    /// Registered event mask per visible GPU.
    registered: Vec<u64>,
    /// Which of the config's `xid_events` this set has delivered.
    delivered: Vec<bool>,
    /// How far into the event file this set has read (every set reads it from the start).
    file_offset: u64,
    pending: VecDeque<Event>,
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

/// An event of `event_type` on `uuid` (a GPU, or a MIG device of one) if its GPU is
/// registered for that type. A lost GPU still delivers (XID 79 is how a GPU says it fell
/// off the bus).
fn event(node: &Node, set: &EventSet, uuid: &str, event_type: u64, data: u64) -> Option<Event> {
    let dev = node.by_uuid(uuid)?;
    if set.registered.get(dev.gpu())? & event_type == 0 {
        return None;
    }
    let (gpu_instance_id, compute_instance_id) = match dev {
        Dev::Gpu(_) => (NO_INSTANCE, NO_INSTANCE),
        Dev::Mig(g, m) => node.mig(g, m).map_or((NO_INSTANCE, NO_INSTANCE), |mig| {
            (mig.gpu_instance_id, mig.compute_instance_id)
        }),
    };
    Some(Event {
        device: Dev::Gpu(dev.gpu()),
        event_type,
        data,
        gpu_instance_id,
        compute_instance_id,
    })
}

/// The complete lines appended since `offset`, parsed, advancing it past them; a malformed
/// line comes back as its text. A partial last line waits for its newline.
fn read_new_lines(path: &Path, offset: &mut u64) -> Vec<Result<Line, String>> {
    let Ok(mut file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut bytes = Vec::new();
    if file.seek(SeekFrom::Start(*offset)).is_err() || file.read_to_end(&mut bytes).is_err() {
        return Vec::new();
    }
    let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
        return Vec::new();
    };
    *offset += end as u64 + 1;
    String::from_utf8_lossy(&bytes[..end])
        .lines()
        .filter(|line| !line.trim().is_empty())
        .map(|line| Line::parse(line).ok_or_else(|| line.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(uuid: &str, bus_id: &str, minor: u32) -> GpuConfig {
        GpuConfig {
            name: "NVIDIA A100-SXM4-80GB".into(),
            uuid: uuid.into(),
            bus_id: bus_id.into(),
            minor,
            memory_total_bytes: 80 << 30,
            memory_used_bytes: 0,
            compute_capability: (8, 0),
            mig_mode: false,
            mig_devices: Vec::new(),
            nvlinks: Vec::new(),
            utilization_gpu_percent: Some(0),
            utilization_memory_percent: Some(0),
            temperature_celsius: Some(35),
            power_milliwatts: Some(60_000),
            sm_clock_mhz: Some(1410),
        }
    }

    #[test]
    fn bus_ids_parse_and_print_like_nvml() {
        let cases = [
            (
                "00000000:07:00.0",
                Some(("00000000:07:00.0", "0000:07:00.0")),
            ),
            ("0000:b1:00.1", Some(("00000000:B1:00.1", "0000:B1:00.1"))),
            ("0001:0a:1f.7", Some(("00000001:0A:1F.7", "0001:0A:1F.7"))),
            ("0000:07:20.0", None),
            ("garbage", None),
        ];
        for (raw, want) in cases {
            let got = BusId::parse(raw).map(|b| (b.nvml(), b.legacy()));
            let want = want.map(|(n, l)| (n.to_string(), l.to_string()));
            assert_eq!(got, want, "case {raw}");
        }
    }

    #[test]
    fn config_rejects_unknown_fields() {
        let cases = [
            (
                "top level",
                r#"{"driver_version":"1","cuda_driver_version":1,"gpus":[],"extra":1}"#,
            ),
            (
                "gpu",
                r#"{"driver_version":"1","cuda_driver_version":1,"gpus":[{"name":"x","uuid":"GPU-1","bus_id":"0:1:0.0","minor":0,"memory_total_bytes":1,"compute_capability":[8,0],"mig_mode":false,"colour":"green"}]}"#,
            ),
        ];
        for (name, json) in cases {
            let error = serde_json::from_str::<Config>(json).err();
            assert!(
                error
                    .as_ref()
                    .is_some_and(|e| e.to_string().contains("unknown field")),
                "case {name}: {error:?}"
            );
        }
    }

    #[test]
    fn only_gpus_with_device_nodes_are_visible_in_bus_order()
    -> Result<(), Box<dyn std::error::Error>> {
        let dev = tempfile::tempdir()?;
        for minor in [0, 2] {
            std::fs::write(dev.path().join(format!("nvidia{minor}")), "")?;
        }
        let config = Config {
            driver_version: "550.54.15".into(),
            cuda_driver_version: 12040,
            dev_root: None,
            gpus: vec![
                gpu("GPU-b1", "00000000:B1:00.0", 0),
                gpu("GPU-07", "00000000:07:00.0", 1),
                gpu("GPU-0a", "00000000:0A:00.0", 2),
            ],
            xid_events: Vec::new(),
            event_file: None,
        };
        let node = Node::new(config, dev.path())?;
        let uuids: Vec<_> = node.gpus.iter().map(|g| g.config.uuid.as_str()).collect();
        assert_eq!(uuids, ["GPU-0a", "GPU-b1"]);
        Ok(())
    }

    #[test]
    fn handles_round_trip_and_reject_strangers() -> Result<(), Box<dyn std::error::Error>> {
        let dev = tempfile::tempdir()?;
        std::fs::write(dev.path().join("nvidia0"), "")?;
        let mut with_mig = gpu("GPU-0", "0:7:0.0", 0);
        with_mig.mig_mode = true;
        with_mig.mig_devices = vec![MigConfig {
            gpu_instance_id: 1,
            compute_instance_id: 0,
            uuid: "MIG-0".into(),
            memory_total_bytes: 10 << 30,
            profile: "1g.10gb".into(),
        }];
        let config = Config {
            driver_version: "1".into(),
            cuda_driver_version: 12040,
            dev_root: None,
            gpus: vec![with_mig],
            xid_events: Vec::new(),
            event_file: None,
        };
        let mut node = Node::new(config, dev.path())?;
        for dev in [Dev::Gpu(0), Dev::Mig(0, 0)] {
            assert_eq!(node.device(dev.handle()), Ok(dev), "case {dev:?}");
        }
        for (name, handle) in [
            ("null", 0),
            ("stray pointer", 0x7fff_0000_1000),
            ("second GPU", Dev::Gpu(1).handle()),
            ("second MIG device", Dev::Mig(0, 1).handle()),
        ] {
            assert_eq!(
                node.device(handle),
                Err(code::INVALID_ARGUMENT),
                "case {name}"
            );
        }
        assert_eq!(
            node.name(Dev::Mig(0, 0)),
            "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
        );
        assert_eq!(node.by_uuid("MIG-0"), Some(Dev::Mig(0, 0)));
        node.lost[0] = true;
        for (case, got) in [
            ("GPU handle", node.device(Dev::Gpu(0).handle())),
            ("MIG handle", node.device(Dev::Mig(0, 0).handle())),
            ("GPU by index", node.by_index(0)),
            ("MIG by UUID", node.lookup_uuid("MIG-0")),
        ] {
            assert_eq!(got, Err(code::GPU_IS_LOST), "case lost {case}");
        }
        assert_eq!(node.lookup_uuid("GPU-x"), Err(code::NOT_FOUND));
        Ok(())
    }

    #[test]
    fn event_file_lines_are_read_once_and_only_when_complete()
    -> Result<(), Box<dyn std::error::Error>> {
        use std::io::Write;
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("events");
        let mut file = std::fs::File::create(&path)?;
        let mut offset = 0;
        file.write_all(b"GPU-1 79\nGPU-2 4")?;
        assert_eq!(
            read_new_lines(&path, &mut offset),
            [Ok(Line::Xid("GPU-1".to_string(), 79))]
        );
        file.write_all(b"8\nnot a line\n")?;
        assert_eq!(
            read_new_lines(&path, &mut offset),
            [
                Ok(Line::Xid("GPU-2".to_string(), 48)),
                Err("not a line".to_string())
            ]
        );
        assert_eq!(read_new_lines(&path, &mut offset), []);
        Ok(())
    }

    #[test]
    fn event_file_lines_parse() {
        let cases = [
            ("GPU-1 79", Some(Line::Xid("GPU-1".into(), 79))),
            ("  MIG-1   94 ", Some(Line::Xid("MIG-1".into(), 94))),
            ("GPU-1 dbe", Some(Line::DoubleBitEcc("GPU-1".into()))),
            ("GPU-1 gone", Some(Line::Gone("GPU-1".into()))),
            ("wait-error 999", Some(Line::WaitError(999))),
            ("wait-error soon", None),
            ("GPU-1", None),
            ("GPU-1 79 80", None),
            ("GPU-1 -1", None),
        ];
        for (line, want) in cases {
            assert_eq!(Line::parse(line), want, "case {line:?}");
        }
    }

    #[test]
    fn nvlinks_expand_and_bound_link_numbers() -> Result<(), Box<dyn std::error::Error>> {
        let dev = tempfile::tempdir()?;
        for minor in [0, 1] {
            std::fs::write(dev.path().join(format!("nvidia{minor}")), "")?;
        }
        let mut linked = gpu("GPU-0", "0:7:0.0", 0);
        linked.nvlinks = vec![
            NvLinkConfig {
                remote_bus_id: "0000:0f:00.0".into(),
                count: 2,
                active: true,
            },
            NvLinkConfig {
                remote_bus_id: "0000:47:00.0".into(),
                count: 1,
                active: false,
            },
        ];
        let config = Config {
            driver_version: "1".into(),
            cuda_driver_version: 12040,
            dev_root: None,
            gpus: vec![linked, gpu("GPU-1", "0:f:0.0", 1)],
            xid_events: Vec::new(),
            event_file: None,
        };
        let node = Node::new(config, dev.path())?;
        let link = |bus: &str, active| BusId::parse(bus).map(|remote| NvLink { remote, active });
        let cases = [
            ("first link", 0, 0, Ok(link("0:f:0.0", true))),
            ("second link", 0, 1, Ok(link("0:f:0.0", true))),
            ("inactive link", 0, 2, Ok(link("0:47:0.0", false))),
            ("unwired link", 0, 11, Ok(None)),
            ("past the GPU's links", 0, 12, Err(code::INVALID_ARGUMENT)),
            ("no NVLink", 1, 0, Err(code::NOT_SUPPORTED)),
        ];
        for (case, gpu, link, want) in cases {
            assert_eq!(node.gpus[gpu].nvlink(link), want, "case {case}");
        }
        Ok(())
    }
}

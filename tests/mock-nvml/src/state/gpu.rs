//! The GPUs the mock shows: PCI addresses, NVLinks.

use super::*;

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
pub(super) fn expand_nvlinks(gpu: &GpuConfig) -> Result<Vec<NvLink>, String> {
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

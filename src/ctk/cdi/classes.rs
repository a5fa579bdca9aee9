//! `nvidia-ctk cdi generate --mode gds|mofed|gdrcopy|nvswitch|imex`: a spec of one
//! device class, shaped as NVIDIA's (`pkg/nvcdi/gated.go`, `lib-imex.go`).
//!
//! - gds, mofed, gdrcopy, nvswitch: kind `<vendor>/<mode>` (`nvidia.com/gds`), one
//!   device `all` holding the class's nodes (and, for GDS, `/etc/cufile.json` and
//!   `/run/udev`, only when an `nvidia-fs` node exists, as NVIDIA's discoverer has it);
//! - imex: kind `<vendor>/imex-channel`, one device per channel (`nvidia.com/imex-channel=0`),
//!   named by its number, plus `all` unless `--no-all-device`.
//!
//! `--class` keeps its default `gpu` on the command line, as NVIDIA's does; in these
//! modes that default means the mode's own class. A class with nothing on the host is
//! an error naming what was looked for (NVIDIA would write a spec with no devices).

use crate::cdi::{self, ContainerEdits, Device, Spec};
use crate::discover::classes::{
    GDRCOPY_NODE, GDS_NODE_PREFIX, IMEX_CHANNEL_DIR, INFINIBAND_DIR, NVSWITCH_PREFIX,
    discover_classes, imex_channels_present,
};
use crate::discover::{DiscoverError, HostResources};
use crate::edits;
use crate::request::{DeviceClasses, parse_imex_channel};
use crate::roots::Roots;

/// The device-class modes of `--mode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassMode {
    Gds,
    Mofed,
    Gdrcopy,
    Nvswitch,
    Imex,
}

/// NVIDIA's class for the IMEX channels.
pub const IMEX_CHANNEL_CLASS: &str = "imex-channel";

impl ClassMode {
    /// The mode named `mode` (lowercase), if it is a class mode.
    pub fn parse(mode: &str) -> Option<Self> {
        Some(match mode {
            "gds" => Self::Gds,
            "mofed" => Self::Mofed,
            "gdrcopy" => Self::Gdrcopy,
            "nvswitch" => Self::Nvswitch,
            "imex" => Self::Imex,
            _ => return None,
        })
    }

    /// The CDI class NVIDIA gives the mode's spec.
    pub fn class(self) -> &'static str {
        match self {
            Self::Gds => "gds",
            Self::Mofed => "mofed",
            Self::Gdrcopy => "gdrcopy",
            Self::Nvswitch => "nvswitch",
            Self::Imex => IMEX_CHANNEL_CLASS,
        }
    }

    /// What the mode's discovery looks for, for an error.
    fn looked_for(self) -> String {
        match self {
            Self::Gds => format!("/dev/{GDS_NODE_PREFIX}*"),
            Self::Mofed => format!("{INFINIBAND_DIR}/uverbs* or {INFINIBAND_DIR}/rdma_cm"),
            Self::Gdrcopy => GDRCOPY_NODE.to_owned(),
            Self::Nvswitch => format!("/dev/nvidia-nvswitchctl or /dev/{NVSWITCH_PREFIX}*"),
            Self::Imex => format!("{IMEX_CHANNEL_DIR}/channel*"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClassSpecError {
    #[error(transparent)]
    Discover(#[from] DiscoverError),
    #[error("no device for --mode {mode}: nothing matches {looked_for} under the dev root {dev}")]
    Nothing {
        mode: &'static str,
        looked_for: String,
        dev: String,
    },
    #[error(
        "invalid --device-id {id:?} for --mode imex: {reason} (valid: channel numbers \
         0-1048575, optionally written channel<n>, or all)"
    )]
    BadChannel { id: String, reason: &'static str },
    #[error("IMEX channel {channel}: {what} does not exist under the dev root {dev}")]
    NoChannel {
        channel: u32,
        what: String,
        dev: String,
    },
    #[error("--device-id {id:?} does not apply to --mode {mode}: its one device is all")]
    NotAll { id: String, mode: &'static str },
}

/// The spec of `mode` on the host `roots` describe, of kind `<vendor>/<class>`.
pub fn generate(
    mode: ClassMode,
    roots: &Roots,
    vendor: &str,
    class: &str,
    all_device: bool,
    device_ids: &[String],
) -> Result<Spec, ClassSpecError> {
    let class = if class == "gpu" { mode.class() } else { class };
    let nothing = || ClassSpecError::Nothing {
        mode: mode.class().trim_end_matches("-channel"),
        looked_for: mode.looked_for(),
        dev: roots.dev.display().to_string(),
    };
    let picked: Vec<&String> = device_ids.iter().filter(|d| *d != "all").collect();
    let devices = if mode == ClassMode::Imex {
        imex_devices(roots, &picked, all_device)?
    } else {
        if let Some(id) = picked.first() {
            return Err(ClassSpecError::NotAll {
                id: (*id).clone(),
                mode: mode.class(),
            });
        }
        let classes = DeviceClasses {
            gds: mode == ClassMode::Gds,
            mofed: mode == ClassMode::Mofed,
            gdrcopy: mode == ClassMode::Gdrcopy,
            nvswitch: mode == ClassMode::Nvswitch,
            ..DeviceClasses::default()
        };
        let edits = edits::build(&discover_classes(roots, &classes)?);
        if edits.device_nodes.is_empty() {
            return Err(nothing());
        }
        vec![device("all", edits)]
    };
    if devices.is_empty() {
        return Err(nothing());
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: format!("{vendor}/{class}"),
        annotations: Default::default(),
        devices,
        container_edits: ContainerEdits::default(),
    };
    spec.cdi_version = cdi::minimum_version(&spec).to_owned();
    Ok(spec)
}

/// One device per channel (the ones asked for, or every channel present), then `all`.
fn imex_devices(
    roots: &Roots,
    picked: &[&String],
    all_device: bool,
) -> Result<Vec<Device>, ClassSpecError> {
    let mut channels = if picked.is_empty() {
        imex_channels_present(roots)?
    } else {
        picked
            .iter()
            .map(|id| {
                parse_imex_channel(id).map_err(|reason| ClassSpecError::BadChannel {
                    id: (*id).clone(),
                    reason,
                })
            })
            .collect::<Result<Vec<_>, _>>()?
    };
    channels.sort_unstable();
    channels.dedup();
    let mut devices = Vec::new();
    let mut all = ContainerEdits::default();
    for channel in channels {
        let resources = discover_classes(
            roots,
            &DeviceClasses {
                imex_channels: vec![channel],
                ..DeviceClasses::default()
            },
        )?;
        if let Some(missing) = missing_required(&resources) {
            return Err(ClassSpecError::NoChannel {
                channel,
                what: missing,
                dev: roots.dev.display().to_string(),
            });
        }
        let edits = edits::build(&resources);
        all.merge(&edits);
        devices.push(device(&channel.to_string(), edits));
    }
    if all_device && !devices.is_empty() {
        devices.push(device("all", all));
    }
    Ok(devices)
}

fn missing_required(resources: &HostResources) -> Option<String> {
    resources
        .missing
        .iter()
        .find(|m| m.required)
        .map(|m| m.what.clone())
}

fn device(name: &str, container_edits: ContainerEdits) -> Device {
    Device {
        name: name.to_owned(),
        annotations: Default::default(),
        container_edits,
    }
}

#[cfg(test)]
#[path = "classes_tests.rs"]
mod tests;

//! The device classes a GPU container may ask for besides GPUs: IMEX channels
//! (`NVIDIA_IMEX_CHANNELS`, or `imex/<n>` volume mounts) and the four gated classes
//! `NVIDIA_GDS`, `NVIDIA_MOFED`, `NVIDIA_GDRCOPY`, `NVIDIA_NVSWITCH`.
//!
//! NVIDIA's rules, which [`build`] follows:
//! - only a GPU container asks (its device request is not `void`; `none` counts);
//! - a gated class acts for the value `enabled` only, any other value is ignored;
//! - IMEX channels: with `features.ignore-imex-channel-requests` nothing is read; with
//!   `accept-nvidia-visible-devices-as-volume-mounts`, `/dev/null` mounts at
//!   `/var/run/nvidia-container-devices/imex/<n>` win over the variable; the variable
//!   is a comma list where `void`, `none` or `all` anywhere means no channel (NVIDIA
//!   ignores `all`), and it is dropped for an unprivileged container unless
//!   `accept-nvidia-visible-devices-envvar-when-unprivileged`, like a device request.
//!
//! A channel is a number `0..2^20` (the kernel's minor numbers: the channel is the
//! minor of `/dev/nvidia-caps-imex-channels/channel<n>`), optionally written
//! `channel<n>`. Pure, like the rest of `request`.

use serde::Serialize;

use super::{
    IgnoredRequest, InputMount, Quoted, RequestError, VOLUME_MOUNT_IMEX_PREFIX, VOLUME_MOUNT_ROOT,
    VOLUME_MOUNT_SOURCE,
};

/// `NVIDIA_IMEX_CHANNELS`: the IMEX channels a container gets.
pub const ENV_IMEX_CHANNELS: &str = "NVIDIA_IMEX_CHANNELS";
/// `NVIDIA_GDS=enabled`: GPUDirect Storage (`/dev/nvidia-fs*`, `cufile.json`, udev).
pub const ENV_GDS: &str = "NVIDIA_GDS";
/// `NVIDIA_MOFED=enabled`: the MOFED/RDMA nodes (`/dev/infiniband/uverbs*`, `rdma_cm`).
pub const ENV_MOFED: &str = "NVIDIA_MOFED";
/// `NVIDIA_GDRCOPY=enabled`: `/dev/gdrdrv`.
pub const ENV_GDRCOPY: &str = "NVIDIA_GDRCOPY";
/// `NVIDIA_NVSWITCH=enabled`: `/dev/nvidia-nvswitchctl` and `/dev/nvidia-nvswitch*`.
pub const ENV_NVSWITCH: &str = "NVIDIA_NVSWITCH";
/// The one value that turns a gated class on.
pub const GATE_ENABLED: &str = "enabled";
/// The optional prefix of a channel id (`channel3` is channel 3).
pub const IMEX_CHANNEL_PREFIX: &str = "channel";
/// Channels are minor numbers: 20 bits.
pub const IMEX_CHANNEL_LIMIT: u32 = 1 << 20;

/// What a GPU container asks for besides GPUs. Empty for a container that asks for no
/// GPU, whatever its variables say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct DeviceClasses {
    /// IMEX channel numbers, ascending, each once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub imex_channels: Vec<u32>,
    #[serde(skip_serializing_if = "is_false")]
    pub gds: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub mofed: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub gdrcopy: bool,
    #[serde(skip_serializing_if = "is_false")]
    pub nvswitch: bool,
    /// Missing IMEX channel nodes are created on the host (NVIDIA's default; off with
    /// `features.disable-imex-channel-creation`).
    #[serde(skip)]
    pub create_imex_channels: bool,
    /// An `NVIDIA_IMEX_CHANNELS` request dropped because the container is unprivileged.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignored_imex: Option<IgnoredRequest>,
    /// Gate variables set to something other than `enabled` (`NVIDIA_GDS="yes"`), for
    /// a debug log line: NVIDIA ignores them silently.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ignored_gates: Vec<String>,
}

fn is_false(b: &bool) -> bool {
    !b
}

impl DeviceClasses {
    /// Whether nothing beyond GPUs is asked for.
    pub fn is_empty(&self) -> bool {
        self.imex_channels.is_empty() && !self.gds && !self.mofed && !self.gdrcopy && !self.nvswitch
    }

    /// For `skip_serializing_if`: nothing asked and nothing ignored.
    pub fn is_unset(&self) -> bool {
        self.is_empty() && self.ignored_imex.is_none() && self.ignored_gates.is_empty()
    }
}

/// The request policy's part for the classes (NVIDIA's keys).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClassPolicy {
    pub accept_envvar_when_unprivileged: bool,
    pub accept_volume_mounts: bool,
    /// `features.ignore-imex-channel-requests`.
    pub ignore_imex_channel_requests: bool,
    /// `!features.disable-imex-channel-creation`.
    pub create_imex_channels: bool,
}

/// The classes a GPU container asks for. `env` looks a variable up (the last value of
/// a key wins); `privileged` is `CAP_SYS_ADMIN` in the bounding set.
pub fn build<'a>(
    env: impl Fn(&str) -> Option<&'a str>,
    mounts: &[InputMount],
    privileged: bool,
    policy: ClassPolicy,
) -> Result<DeviceClasses, RequestError> {
    let mut classes = DeviceClasses {
        create_imex_channels: policy.create_imex_channels,
        ..DeviceClasses::default()
    };
    for (name, flag) in [
        (ENV_GDS, &mut classes.gds),
        (ENV_MOFED, &mut classes.mofed),
        (ENV_GDRCOPY, &mut classes.gdrcopy),
        (ENV_NVSWITCH, &mut classes.nvswitch),
    ] {
        match env(name) {
            Some(GATE_ENABLED) => *flag = true,
            Some(other) if !other.is_empty() => classes
                .ignored_gates
                .push(format!("{name}={}", Quoted::new(other))),
            _ => {}
        }
    }
    if policy.ignore_imex_channel_requests {
        return Ok(classes);
    }
    if policy.accept_volume_mounts {
        let from_mounts = imex_mounts(mounts)?;
        if !from_mounts.is_empty() {
            classes.imex_channels = sorted(from_mounts);
            return Ok(classes);
        }
    }
    let Some(value) = env(ENV_IMEX_CHANNELS) else {
        return Ok(classes);
    };
    let elements: Vec<&str> = value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .collect();
    // NVIDIA's special words win over ids anywhere in the list; `all` is ignored.
    if elements.is_empty()
        || elements
            .iter()
            .any(|e| matches!(*e, "void" | "none" | "all"))
    {
        return Ok(classes);
    }
    if !privileged && !policy.accept_envvar_when_unprivileged {
        classes.ignored_imex = Some(IgnoredRequest {
            variables: vec![ENV_IMEX_CHANNELS.to_string()],
            value: value.to_string(),
        });
        return Ok(classes);
    }
    let channels = elements
        .iter()
        .map(|e| {
            parse_imex_channel(e).map_err(|reason| RequestError::InvalidImexChannel {
                element: Quoted::new(e),
                origin: format!("{ENV_IMEX_CHANNELS} {}", Quoted::new(value)),
                reason,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    classes.imex_channels = sorted(channels);
    Ok(classes)
}

/// Channels named by `/dev/null` mounts at `<root>/imex/<n>`, each mount once.
fn imex_mounts(mounts: &[InputMount]) -> Result<Vec<u32>, RequestError> {
    let mut channels = Vec::new();
    for mount in mounts {
        let Some(source) = &mount.source else {
            continue;
        };
        if super::clean_path(source) != VOLUME_MOUNT_SOURCE {
            continue;
        }
        let destination = super::clean_path(&mount.destination);
        let Some(id) = destination
            .strip_prefix(VOLUME_MOUNT_ROOT)
            .and_then(|rest| rest.strip_prefix('/'))
            .and_then(|rest| rest.strip_prefix(VOLUME_MOUNT_IMEX_PREFIX))
        else {
            continue;
        };
        let channel =
            parse_imex_channel(id).map_err(|reason| RequestError::InvalidImexChannel {
                element: Quoted::new(id),
                origin: format!("volume mount {}", Quoted::new(&destination)),
                reason,
            })?;
        channels.push(channel);
    }
    Ok(channels)
}

fn sorted(mut channels: Vec<u32>) -> Vec<u32> {
    channels.sort_unstable();
    channels.dedup();
    channels
}

/// One channel id: `<n>` or `channel<n>`, `n` decimal (no sign, no spaces) and below
/// 2^20. The error says what is wrong, for [`RequestError::InvalidImexChannel`].
pub fn parse_imex_channel(id: &str) -> Result<u32, &'static str> {
    let digits = id.strip_prefix(IMEX_CHANNEL_PREFIX).unwrap_or(id);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err("not a channel number");
    }
    match digits.parse::<u64>() {
        Ok(n) if n < u64::from(IMEX_CHANNEL_LIMIT) => u32::try_from(n).map_err(|_| "too large"),
        _ => Err("out of range"),
    }
}

/// The vendors whose class kinds are planned in memory when no spec file defines a
/// name: NVIDIA's (`nvidia.com/gds`) and its JIT vendor (`runtime.nvidia.com/gds`).
pub const CLASS_VENDORS: [&str; 2] = ["nvidia.com", "runtime.nvidia.com"];

/// Adds the CDI device `kind=name` to `classes` when `kind` is one of the classes'
/// kinds (`<vendor>/gds`, `mofed`, `gdrcopy`, `nvswitch` with the one name `all`;
/// `<vendor>/imex-channel` with a channel number); `None` for any other kind.
pub fn add_cdi_name(
    classes: &mut DeviceClasses,
    kind: &str,
    name: &str,
) -> Option<Result<(), RequestError>> {
    let (vendor, class) = kind.split_once('/')?;
    if !CLASS_VENDORS.contains(&vendor) {
        return None;
    }
    let flag = match class {
        "gds" => &mut classes.gds,
        "mofed" => &mut classes.mofed,
        "gdrcopy" => &mut classes.gdrcopy,
        "nvswitch" => &mut classes.nvswitch,
        "imex-channel" => {
            return Some(match parse_imex_channel(name) {
                Ok(n) => {
                    if !classes.imex_channels.contains(&n) {
                        classes.imex_channels.push(n);
                        classes.imex_channels.sort_unstable();
                    }
                    Ok(())
                }
                Err(reason) => Err(RequestError::InvalidImexChannel {
                    element: Quoted::new(name),
                    origin: format!("CDI device {}", Quoted::new(&format!("{kind}={name}"))),
                    reason,
                }),
            });
        }
        _ => return None,
    };
    if name != "all" {
        return Some(Err(RequestError::ClassDevice {
            name: Quoted::new(&format!("{kind}={name}")),
        }));
    }
    *flag = true;
    Some(Ok(()))
}

#[cfg(test)]
#[path = "classes_tests.rs"]
mod tests;

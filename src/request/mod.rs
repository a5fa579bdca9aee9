//! What a container asks for: a device list, a set of driver capabilities and the
//! `NVIDIA_REQUIRE_*` constraints the node must meet.
//!
//! [`build`] turns [`ContainerInputs`] (a container's env, mounts, annotations and
//! privilege, as the `bundle` module reads them) into a [`Request`], following NVIDIA's
//! precedence rules under a [`RequestPolicy`] from `config.toml`. The strings come from
//! untrusted places (an image's `ENV`, a pod spec, a kubelet `Allocate` answer), so
//! parsing is strict: every element is checked against the grammar NVIDIA's tools
//! accept, and an error names where the value came from, quotes the bad element
//! (shortened if huge) and says what would be valid.
//!
//! Pure: no I/O, no env, no globals. Nothing here looks at the node; resolving ids
//! against real GPUs and checking requirements against the driver is `select`'s job.

mod capabilities;
mod classes;
mod devices;
mod inputs;
mod mig_access;
mod require;

#[cfg(test)]
mod inputs_rules_tests;
#[cfg(test)]
mod inputs_tests;

use std::fmt;

use serde::Serialize;

pub use capabilities::{Capability, DriverCapabilities};
pub use classes::{
    ClassPolicy, DeviceClasses, ENV_GDRCOPY, ENV_GDS, ENV_IMEX_CHANNELS, ENV_MOFED, ENV_NVSWITCH,
    GATE_ENABLED, IMEX_CHANNEL_LIMIT, IMEX_CHANNEL_PREFIX, add_cdi_name, parse_imex_channel,
};
pub use devices::{DeviceId, DeviceList, normalize_bus_id};
pub use inputs::{ContainerInputs, InputMount, RequestPolicy, build};
pub use mig_access::{
    ENV_MIG_CONFIG_DEVICES, ENV_MIG_MONITOR_DEVICES, MigAccess, parse_flag as parse_mig_access_flag,
};
pub use require::{Condition, ConditionError, Op, RequireKey, Requirement, compare_versions};

// NVIDIA's strings, spelled exactly as their tools read them.

/// `NVIDIA_VISIBLE_DEVICES`: which GPUs the container gets.
pub const ENV_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";
/// `NVIDIA_DRIVER_CAPABILITIES`: which parts of the driver the container gets.
pub const ENV_DRIVER_CAPABILITIES: &str = "NVIDIA_DRIVER_CAPABILITIES";
/// Every variable with this prefix is one requirement (except [`ENV_REQUIRE_JETPACK`]).
pub const ENV_REQUIRE_PREFIX: &str = "NVIDIA_REQUIRE_";
/// `NVIDIA_REQUIRE_CUDA`: its absence (with [`ENV_CUDA_VERSION`] set) marks a legacy image.
pub const ENV_REQUIRE_CUDA: &str = "NVIDIA_REQUIRE_CUDA";
/// `NVIDIA_REQUIRE_JETPACK`: a Tegra CSV-mount switch, not a requirement (matched as a prefix).
pub const ENV_REQUIRE_JETPACK: &str = "NVIDIA_REQUIRE_JETPACK";
/// The `NVIDIA_REQUIRE_JETPACK` value that makes Tegra's csv mode read every CSV file.
pub const JETPACK_CSV_MOUNTS_ALL: &str = "csv-mounts=all";
/// `NVIDIA_DISABLE_REQUIRE`: a Go `strconv.ParseBool` value; true drops every requirement.
pub const ENV_DISABLE_REQUIRE: &str = "NVIDIA_DISABLE_REQUIRE";
/// `CUDA_VERSION`: set by old CUDA images; with no `NVIDIA_REQUIRE_CUDA` the image is "legacy".
pub const ENV_CUDA_VERSION: &str = "CUDA_VERSION";
/// Device ids requested as volume mounts live under this container directory.
pub const VOLUME_MOUNT_ROOT: &str = "/var/run/nvidia-container-devices";
/// The host side of a device-request volume mount.
pub const VOLUME_MOUNT_SOURCE: &str = "/dev/null";
/// `cdi/<vendor>/<class>/<name>` under [`VOLUME_MOUNT_ROOT`] names a CDI device.
pub const VOLUME_MOUNT_CDI_PREFIX: &str = "cdi/";
/// `imex/<channel>` under [`VOLUME_MOUNT_ROOT`] names an IMEX channel (not a GPU).
pub const VOLUME_MOUNT_IMEX_PREFIX: &str = "imex/";
/// The default of `modes.cdi.annotation-prefixes`.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// The config key that lets unprivileged containers request devices through env vars.
pub const KEY_ACCEPT_ENVVAR_UNPRIVILEGED: &str =
    "accept-nvidia-visible-devices-envvar-when-unprivileged";
/// The config key that lets device requests come as `/dev/null` mounts under
/// [`VOLUME_MOUNT_ROOT`].
pub const KEY_ACCEPT_VOLUME_MOUNTS: &str = "accept-nvidia-visible-devices-as-volume-mounts";

/// The longest element quoted in full in an error message.
const QUOTE_MAX: usize = 64;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RequestError {
    #[error(
        "invalid device {element} in device list {list}: expected an index (0, 1, …), \
         GPU-<uuid>, MIG-<uuid>, <gpu>:<mig>, a PCI bus id (0000:07:00.0), \
         a CDI name (nvidia.com/gpu=0), all, none or void"
    )]
    InvalidDevice { element: Quoted, list: Quoted },
    #[error("invalid device {element} in device list {list}: {reason}")]
    MalformedUuid {
        element: Quoted,
        list: Quoted,
        reason: &'static str,
    },
    #[error("empty entry at position {position} in device list {list}")]
    EmptyEntry { position: usize, list: Quoted },
    #[error("{word:?} in device list {list} cannot be combined with other devices")]
    NotAlone { word: &'static str, list: Quoted },
    #[error(
        "unsupported driver capability {capability} in {list} \
         (valid: compat32, compute, display, graphics, ngx, utility, video, all)"
    )]
    UnknownCapability { capability: Quoted, list: Quoted },
    /// A value-level error, with where the value came from (an env var, an annotation,
    /// a volume mount).
    #[error("{origin}: {source}")]
    InInput {
        origin: String,
        #[source]
        source: Box<RequestError>,
    },
    #[error(
        "driver capability {capability:?} in {ENV_DRIVER_CAPABILITIES} {list} is not supported \
         on this node (supported-driver-capabilities: {supported})"
    )]
    UnsupportedCapability {
        capability: &'static str,
        list: Quoted,
        /// The supported set, comma-separated (`none` when empty).
        supported: String,
    },
    #[error(
        "{element} in annotation {key} is not a fully qualified CDI device name \
         (vendor.com/class=name)"
    )]
    NotCdiName { element: Quoted, key: Quoted },
    #[error(
        "volume mount {destination}: a CDI device is requested as \
         {VOLUME_MOUNT_ROOT}/cdi/<vendor>/<class>/<name>"
    )]
    BadCdiMount { destination: Quoted },
    #[error(
        "invalid {ENV_DISABLE_REQUIRE} {value}: expected 1, t, T, TRUE, true, True, \
         0, f, F, FALSE, false or False"
    )]
    InvalidDisableRequire { value: Quoted },
    #[error(
        "invalid {ENV_CUDA_VERSION} {value}: a legacy image ({ENV_CUDA_VERSION} set, \
         {ENV_REQUIRE_CUDA} unset) needs a version such as 12.4.1, which implies cuda>=12.4"
    )]
    InvalidCudaVersion { value: Quoted },
    #[error("invalid {variable} {value}: condition {condition}: {problem}")]
    InvalidRequirement {
        /// The variable's name, made safe to print (see [`shown_name`]).
        variable: String,
        value: Quoted,
        condition: Quoted,
        problem: Box<ConditionError>,
    },
    /// NVIDIA's hook: "cannot set MIG_CONFIG_DEVICES in non privileged container".
    #[error(
        "cannot set {variable} in a non-privileged container: configuring or monitoring \
         MIG needs CAP_SYS_ADMIN in the container's bounding set (a privileged container)"
    )]
    MigAccessUnprivileged { variable: &'static str },
    #[error(
        "invalid {variable} {value}: {element} is not supported (the only value is all: \
         every GPU the container gets)"
    )]
    InvalidMigAccess {
        variable: &'static str,
        element: Quoted,
        value: Quoted,
    },
    #[error(
        "invalid IMEX channel {element} in {origin}: {reason} (valid: 0-1048575, \
         optionally written channel<n>, e.g. 0,2 or channel3)"
    )]
    InvalidImexChannel {
        element: Quoted,
        /// The variable and its value, or the volume mount.
        origin: String,
        reason: &'static str,
    },
    #[error(
        "unknown CDI device {name}: the device classes gds, mofed, gdrcopy and nvswitch have one device, all"
    )]
    ClassDevice { name: Quoted },
}

/// A user-supplied value shown in an error: quoted, control characters escaped, and
/// cut to a readable length with the full size noted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quoted(String);

impl Quoted {
    pub fn new(value: &str) -> Self {
        if value.len() <= QUOTE_MAX {
            return Self(format!("{value:?}"));
        }
        let mut cut = QUOTE_MAX;
        while !value.is_char_boundary(cut) {
            cut -= 1;
        }
        Self(format!("{:?}… ({} bytes)", &value[..cut], value.len()))
    }
}

impl fmt::Display for Quoted {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An env var name as it appears in a message: bare when it looks like one
/// (`NVIDIA_REQUIRE_CUDA`), quoted and shortened otherwise (container env names are
/// untrusted too).
pub fn shown_name(name: &str) -> String {
    let plain = !name.is_empty()
        && name.len() <= QUOTE_MAX
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-' || b == b'.');
    if plain {
        name.to_string()
    } else {
        Quoted::new(name).to_string()
    }
}

/// Lexical path cleaning like Go's `filepath.Clean` for absolute paths: repeated
/// slashes, `.` and `..` are resolved, and there is no trailing slash. (A relative
/// path never matches what it is compared with, so its `..` handling is simplified.)
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    let joined = parts.join("/");
    if path.starts_with('/') {
        format!("/{joined}")
    } else if joined.is_empty() {
        ".".to_string()
    } else {
        joined
    }
}

/// Where a request's devices came from (for logs and `nvshim list --json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DeviceSource {
    /// Nothing asked for devices: not a GPU container.
    None,
    /// Given directly by the caller (`nvshim list --devices`, benches, tests).
    Explicit,
    /// `NVIDIA_VISIBLE_DEVICES`.
    Env,
    /// The `swarm-resource` env vars (e.g. `DOCKER_RESOURCE_GPU`).
    SwarmResource,
    /// `/dev/null` mounts under [`VOLUME_MOUNT_ROOT`] (`accept-…-as-volume-mounts`).
    VolumeMounts,
    /// Annotations with a `modes.cdi.annotation-prefixes` prefix.
    CdiAnnotations,
    /// No device variable, but a legacy CUDA image: `all`.
    LegacyImage,
}

impl fmt::Display for DeviceSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::None => "none",
            Self::Explicit => "explicit",
            Self::Env => ENV_VISIBLE_DEVICES,
            Self::SwarmResource => "swarm-resource env vars",
            Self::VolumeMounts => "volume mounts",
            Self::CdiAnnotations => "CDI annotations",
            Self::LegacyImage => "legacy CUDA image",
        })
    }
}

/// An env-var device request dropped because the container is unprivileged and
/// `accept-nvidia-visible-devices-envvar-when-unprivileged` is false. The runtime logs
/// this as a warning (NVIDIA logs the same case).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IgnoredRequest {
    /// The env vars the request came from (`NVIDIA_VISIBLE_DEVICES`, the swarm vars, or
    /// `CUDA_VERSION` for a legacy image's implied `all`).
    pub variables: Vec<String>,
    /// The device list that was asked for, as written.
    pub value: String,
}

impl fmt::Display for IgnoredRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<String> = self.variables.iter().map(|v| shown_name(v)).collect();
        write!(
            f,
            "ignoring the device request {} from {}: the container is unprivileged \
             (no CAP_SYS_ADMIN in its bounding set) and {KEY_ACCEPT_ENVVAR_UNPRIVILEGED} is false",
            Quoted::new(&self.value),
            names.join(", ")
        )
    }
}

/// A container's GPU request, ready to resolve.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Request {
    pub devices: DeviceList,
    pub capabilities: DriverCapabilities,
    /// Every `NVIDIA_REQUIRE_*` constraint (sorted by variable), plus a legacy image's
    /// implied `cuda>=X.Y`; empty when disabled or when no devices were requested.
    pub requirements: Vec<Requirement>,
    pub source: DeviceSource,
    /// Set when an env request was dropped by policy (then `devices` is `Void`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ignored: Option<IgnoredRequest>,
    /// `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES` (GPU containers only).
    #[serde(default, skip_serializing_if = "MigAccess::is_none")]
    pub mig_access: MigAccess,
    /// IMEX channels and the gated classes (GDS, MOFED, GDRCopy, NVSwitch); empty when
    /// no devices were requested.
    #[serde(skip_serializing_if = "DeviceClasses::is_unset")]
    pub classes: DeviceClasses,
    /// `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`: csv mode (Tegra) reads every CSV file,
    /// not only the base ones.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub csv_mounts_all: bool,
}

impl Request {
    /// A request given directly (no container inputs): no requirements.
    pub fn new(devices: DeviceList, capabilities: DriverCapabilities) -> Self {
        Self {
            devices,
            capabilities,
            requirements: Vec::new(),
            source: DeviceSource::Explicit,
            ignored: None,
            mig_access: MigAccess::default(),
            classes: DeviceClasses::default(),
            csv_mounts_all: false,
        }
    }
}

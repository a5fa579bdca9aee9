// SPDX-License-Identifier: Apache-2.0
//! NVIDIA's device plugin config file (`version: v1`, YAML or JSON) → [`FileSettings`].
//!
//! The serde structs mirror NVIDIA's camelCase keys and deny unknown ones, where NVIDIA
//! silently drops them. The file is shared with gpu-feature-discovery, so GFD's keys
//! (and a few of NVIDIA's plugin keys that mean nothing to nvshim) are accepted and
//! ignored. Features nvshim does not implement are errors rather than warnings, so a
//! config never quietly means less than it says. Values are checked here, with the line
//! they came from; precedence (flags > env > file) is the device plugin's business.
//! Pure: no file access except in [`load_file`].

use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, IgnoredAny};
use serde::{Deserialize, Deserializer};
use serde_saphyr::Spanned;

use super::values::parse_device_list_strategies;
use super::{
    DeviceIdStrategy, DeviceListStrategy, DiscoveryStrategy, FileSpot, K8sConfigError, MigStrategy,
    SharedResource, Sharing, SharingStrategy,
};

/// The resource names time-slicing and MPS may share: this one, or `nvidia.com/mig-<profile>`.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";
const MIG_RESOURCE_PREFIX: &str = "nvidia.com/mig-";

/// What a config file says; `None` where it says nothing (or an empty string).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FileSettings {
    pub mig_strategy: Option<MigStrategy>,
    pub fail_on_init_error: Option<bool>,
    pub driver_root: Option<PathBuf>,
    pub dev_root: Option<PathBuf>,
    pub pass_device_specs: Option<bool>,
    /// Non-empty when present; as written (repeats are dropped by `resolve`).
    pub device_list_strategies: Option<Vec<DeviceListStrategy>>,
    pub device_id_strategy: Option<DeviceIdStrategy>,
    pub cdi_annotation_prefix: Option<String>,
    /// `flags.mpsRoot`, absolute.
    pub mps_root: Option<PathBuf>,
    /// `sharing.timeSlicing` or `sharing.mps` (never both).
    pub sharing: Option<Sharing>,
    /// Where the `sharing.*` key is, for the checks that need the other settings too.
    pub sharing_at: Option<FileSpot>,
    pub container_driver_root: Option<PathBuf>,
    /// `flags.plugin.nvidiaCTKPath`: the hook binary the plugin's CDI spec runs.
    pub cdi_hook_path: Option<PathBuf>,
    /// `flags.deviceDiscoveryStrategy`.
    pub discovery: Option<DiscoveryStrategy>,
    /// gpu-feature-discovery's keys, for `nvshim labels`.
    pub gfd: GfdFileSettings,
    /// `flags.gdrcopyEnabled`, `flags.gdsEnabled`, `flags.mofedEnabled`.
    pub gdrcopy_enabled: Option<bool>,
    pub gds_enabled: Option<bool>,
    pub mofed_enabled: Option<bool>,
    /// `imex.channelIDs`: `[]` or `[0]` (NVIDIA's rule).
    pub imex_channel_ids: Option<Vec<u32>>,
    /// `imex.required`.
    pub imex_required: Option<bool>,
}

/// `flags.gfd.*` and `flags.useNodeFeatureAPI`: what gpu-feature-discovery reads from
/// the shared file. Values as written (`nvshim labels` checks them); `None` where unset.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GfdFileSettings {
    pub oneshot: Option<bool>,
    pub no_timestamp: Option<bool>,
    /// A Go duration such as `60s`.
    pub sleep_interval: Option<String>,
    pub output_file: Option<PathBuf>,
    pub machine_type_file: Option<PathBuf>,
    pub use_node_feature_api: Option<bool>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    version: Option<Spanned<String>>,
    flags: Option<RawFlags>,
    resources: Option<Spanned<RawResources>>,
    sharing: Option<RawSharing>,
    imex: Option<RawImex>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawFlags {
    mig_strategy: Option<Spanned<String>>,
    fail_on_init_error: Option<bool>,
    nvidia_driver_root: Option<String>,
    nvidia_dev_root: Option<String>,
    gdrcopy_enabled: Option<Spanned<bool>>,
    gds_enabled: Option<Spanned<bool>>,
    mofed_enabled: Option<Spanned<bool>>,
    device_discovery_strategy: Option<Spanned<String>>,
    mps_root: Option<Spanned<String>>,
    /// GFD only.
    #[serde(rename = "useNodeFeatureAPI")]
    use_node_feature_api: Option<bool>,
    plugin: Option<RawPluginFlags>,
    gfd: Option<RawGfdFlags>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawPluginFlags {
    pass_device_specs: Option<bool>,
    device_list_strategy: Option<Spanned<StringOrList>>,
    #[serde(rename = "deviceIDStrategy")]
    device_id_strategy: Option<Spanned<String>>,
    cdi_annotation_prefix: Option<String>,
    /// The hook binary the plugin's CDI spec runs.
    #[serde(rename = "nvidiaCTKPath")]
    nvidia_ctk_path: Option<String>,
    /// Where the plugin's container sees the host's driver root.
    container_driver_root: Option<String>,
    shared_devices_allocation_policy: Option<Spanned<String>>,
}

/// gpu-feature-discovery's keys (`flags.gfd`), which `nvshim labels` reads.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawGfdFlags {
    oneshot: Option<bool>,
    no_timestamp: Option<bool>,
    sleep_interval: Option<RawDuration>,
    output_file: Option<String>,
    machine_type_file: Option<String>,
}

/// `resources.{gpus,mig}`: NVIDIA's resource renaming, disabled there and here.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawResources {
    gpus: Option<Vec<IgnoredAny>>,
    mig: Option<Vec<IgnoredAny>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSharing {
    time_slicing: Option<Spanned<RawSharingKind>>,
    mps: Option<Spanned<RawSharingKind>>,
}

/// The body of `sharing.timeSlicing` and of `sharing.mps`: NVIDIA gives both one shape.
#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct RawSharingKind {
    rename_by_default: Option<bool>,
    fail_requests_greater_than_one: Option<bool>,
    resources: Option<Spanned<Vec<RawSharedResource>>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSharedResource {
    name: Spanned<String>,
    rename: Option<Spanned<String>>,
    devices: Option<Spanned<RawDevices>>,
    /// Signed, so that `-1` gets our range message rather than a type error.
    replicas: Spanned<i64>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawImex {
    /// Signed, so that `-1` gets our message rather than a type error.
    #[serde(rename = "channelIDs")]
    channel_ids: Option<Spanned<Vec<i64>>>,
    required: Option<bool>,
}

/// A Go duration as NVIDIA's config reads it: a string (`60s`) or a number of
/// nanoseconds, kept as text (`60000ms`) for `nvshim labels` to parse.
struct RawDuration(String);

impl<'de> Deserialize<'de> for RawDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl de::Visitor<'_> for Visit {
            type Value = RawDuration;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a duration such as 60s, or a number of nanoseconds")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDuration, E> {
                Ok(RawDuration(v.to_owned()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RawDuration, E> {
                Ok(RawDuration(if v.is_multiple_of(1_000_000) {
                    format!("{}ms", v / 1_000_000)
                } else {
                    format!("{v}ns")
                }))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RawDuration, E> {
                u64::try_from(v)
                    .map_err(|_| E::custom(format!("negative duration {v}")))
                    .and_then(|v| self.visit_u64(v))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// `deviceListStrategy: envvar` or `deviceListStrategy: [envvar, cdi-cri]`.
enum StringOrList {
    One(String),
    Many(Vec<String>),
}

impl<'de> Deserialize<'de> for StringOrList {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> de::Visitor<'de> for Visit {
            type Value = StringOrList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a device list strategy or a list of them")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<StringOrList, E> {
                Ok(StringOrList::One(v.to_owned()))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<StringOrList, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<String>()? {
                    items.push(item);
                }
                Ok(StringOrList::Many(items))
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// `devices:` in a shared resource: only the string `all` is kept apart.
enum RawDevices {
    All,
    Other,
}

impl<'de> Deserialize<'de> for RawDevices {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> de::Visitor<'de> for Visit {
            type Value = RawDevices;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("all, a count, or a list of device indices or UUIDs")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<RawDevices, E> {
                Ok(if v == "all" {
                    RawDevices::All
                } else {
                    RawDevices::Other
                })
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<RawDevices, E> {
                Ok(RawDevices::Other)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<RawDevices, E> {
                Ok(RawDevices::Other)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<RawDevices, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(RawDevices::Other)
            }
        }
        deserializer.deserialize_any(Visit)
    }
}

/// Reads and parses a config file.
pub fn load_file(path: &Path) -> Result<FileSettings, K8sConfigError> {
    let bytes = std::fs::read(path).map_err(|source| K8sConfigError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse_file(&bytes, path)
}

/// Parses config file content; `path` is only used in errors. Empty content (or only
/// comments) says nothing.
pub fn parse_file(bytes: &[u8], path: &Path) -> Result<FileSettings, K8sConfigError> {
    let raw: RawFile = serde_saphyr::from_slice(bytes).map_err(|e| K8sConfigError::Syntax {
        path: path.to_owned(),
        message: e.without_snippet().to_string(),
    })?;
    Checker { path }.check(raw)
}

/// Turns the raw structs into [`FileSettings`], rejecting what nvshim does not do.
struct Checker<'a> {
    path: &'a Path,
}

impl Checker<'_> {
    fn at<T>(&self, spanned: &Spanned<T>) -> FileSpot {
        FileSpot {
            path: self.path.to_owned(),
            line: spanned.referenced.line(),
        }
    }

    fn check(&self, raw: RawFile) -> Result<FileSettings, K8sConfigError> {
        if let Some(version) = &raw.version
            && !matches!(version.value.as_str(), "v1" | "")
        {
            return Err(K8sConfigError::Version {
                at: self.at(version),
                value: version.value.clone(),
            });
        }
        if let Some(resources) = &raw.resources {
            let named =
                |list: &Option<Vec<IgnoredAny>>| list.as_ref().is_some_and(|l| !l.is_empty());
            if named(&resources.value.gpus) || named(&resources.value.mig) {
                return Err(K8sConfigError::ResourceNaming {
                    at: self.at(resources),
                });
            }
        }
        let mut out = match raw.flags {
            Some(flags) => self.flags(flags)?,
            None => FileSettings::default(),
        };
        if let Some(imex) = &raw.imex {
            if let Some(ids) = &imex.channel_ids {
                // NVIDIA's plugin takes no channel or channel 0, nothing else.
                if !matches!(ids.value.as_slice(), [] | [0]) {
                    return Err(K8sConfigError::ImexChannels {
                        at: self.at(ids),
                        value: format!("{:?}", ids.value),
                    });
                }
                out.imex_channel_ids = Some(if ids.value.is_empty() {
                    vec![]
                } else {
                    vec![0]
                });
            }
            out.imex_required = imex.required;
        }
        if let Some(sharing) = raw.sharing {
            let chosen = match (sharing.time_slicing, sharing.mps) {
                // NVIDIA's plugin quietly prefers MPS; a config that says both means one
                // of them by mistake, so say which two keys clash.
                (Some(time_slicing), Some(mps)) => {
                    return Err(K8sConfigError::BothSharing {
                        at: self.at(&time_slicing),
                        mps: self.at(&mps),
                    });
                }
                (Some(time_slicing), None) => Some((time_slicing, SharingStrategy::TimeSlicing)),
                (None, Some(mps)) => Some((mps, SharingStrategy::Mps)),
                (None, None) => None,
            };
            if let Some((spanned, strategy)) = chosen {
                out.sharing_at = Some(self.at(&spanned));
                out.sharing = Some(self.sharing(spanned, strategy)?);
            }
        }
        Ok(out)
    }

    fn flags(&self, flags: RawFlags) -> Result<FileSettings, K8sConfigError> {
        let discovery: Option<DiscoveryStrategy> = self.parsed(
            flags.device_discovery_strategy.as_ref(),
            "flags.deviceDiscoveryStrategy",
        )?;
        let mps_root = match flags.mps_root.filter(|root| !root.value.is_empty()) {
            // Relative to what? The daemon and the plugin run in different containers;
            // only an absolute host path means the same directory to both.
            Some(root) if !Path::new(&root.value).is_absolute() => {
                return Err(K8sConfigError::MpsRootRelative {
                    at: self.at(&root),
                    value: root.value,
                });
            }
            Some(root) => Some(PathBuf::from(root.value)),
            None => None,
        };
        let mut out = FileSettings {
            mps_root,
            mig_strategy: self.parsed(flags.mig_strategy.as_ref(), "flags.migStrategy")?,
            fail_on_init_error: flags.fail_on_init_error,
            driver_root: non_empty(flags.nvidia_driver_root).map(PathBuf::from),
            dev_root: non_empty(flags.nvidia_dev_root).map(PathBuf::from),
            discovery,
            gdrcopy_enabled: flags.gdrcopy_enabled.map(|on| on.value),
            gds_enabled: flags.gds_enabled.map(|on| on.value),
            mofed_enabled: flags.mofed_enabled.map(|on| on.value),
            ..FileSettings::default()
        };
        out.gfd.use_node_feature_api = flags.use_node_feature_api;
        if let Some(gfd) = flags.gfd {
            out.gfd.oneshot = gfd.oneshot;
            out.gfd.no_timestamp = gfd.no_timestamp;
            out.gfd.sleep_interval = non_empty(gfd.sleep_interval.map(|d| d.0));
            // An empty output file is GFD's stdout.
            out.gfd.output_file = gfd.output_file.map(PathBuf::from);
            out.gfd.machine_type_file = non_empty(gfd.machine_type_file).map(PathBuf::from);
        }
        if let Some(plugin) = flags.plugin {
            if let Some(policy) = &plugin.shared_devices_allocation_policy
                && policy.value != "distributed"
            {
                return Err(K8sConfigError::AllocationPolicy {
                    at: self.at(policy),
                    value: policy.value.clone(),
                });
            }
            out.pass_device_specs = plugin.pass_device_specs;
            out.device_list_strategies = plugin
                .device_list_strategy
                .as_ref()
                .map(|strategies| self.strategies(strategies))
                .transpose()?;
            out.device_id_strategy = self.parsed(
                plugin.device_id_strategy.as_ref(),
                "flags.plugin.deviceIDStrategy",
            )?;
            out.cdi_annotation_prefix = non_empty(plugin.cdi_annotation_prefix);
            out.container_driver_root = non_empty(plugin.container_driver_root).map(PathBuf::from);
            out.cdi_hook_path = non_empty(plugin.nvidia_ctk_path).map(PathBuf::from);
        }
        Ok(out)
    }

    fn strategies(
        &self,
        spanned: &Spanned<StringOrList>,
    ) -> Result<Vec<DeviceListStrategy>, K8sConfigError> {
        const KEY: &str = "flags.plugin.deviceListStrategy";
        let strategies = match &spanned.value {
            // NVIDIA takes a string as one strategy; a comma list is our convenience,
            // matching the flag and env var.
            StringOrList::One(one) => parse_device_list_strategies(one),
            StringOrList::Many(many) => many.iter().map(|s| s.parse()).collect(),
        }
        .map_err(|e| self.value(spanned, KEY, e))?;
        if strategies.is_empty() {
            return Err(K8sConfigError::NoDeviceListStrategy {
                origin: format!("{}: {KEY}", self.at(spanned)),
            });
        }
        Ok(strategies)
    }

    /// `sharing.timeSlicing` or `sharing.mps`, checked the same way.
    fn sharing(
        &self,
        spanned: Spanned<RawSharingKind>,
        strategy: SharingStrategy,
    ) -> Result<Sharing, K8sConfigError> {
        let key = strategy.key();
        let at = self.at(&spanned);
        let raw = spanned.value;
        let Some(list) = raw.resources.filter(|list| !list.value.is_empty()) else {
            return Err(K8sConfigError::NoSharedResources { at, key });
        };
        let mut resources: Vec<SharedResource> = Vec::with_capacity(list.value.len());
        for resource in list.value {
            let name = resource.name.value.clone();
            // MPS shares whole GPUs only (MIG is refused with it), so a MIG resource
            // under sharing.mps could never match anything.
            let (shareable, valid) = match strategy {
                SharingStrategy::TimeSlicing => (
                    is_shareable(&name),
                    "nvidia.com/gpu, nvidia.com/mig-<profile>",
                ),
                SharingStrategy::Mps => (name == GPU_RESOURCE, "nvidia.com/gpu"),
            };
            if !shareable {
                return Err(K8sConfigError::SharedResourceName {
                    at: self.at(&resource.name),
                    key,
                    name,
                    valid,
                });
            }
            if resources.iter().any(|r| r.name == name) {
                return Err(K8sConfigError::DuplicateSharedResource {
                    at: self.at(&resource.name),
                    key,
                    name,
                });
            }
            // NVIDIA's plugin forces both back (with a warning); refusing them keeps a
            // config from quietly meaning less than it says.
            if let Some(rename) = resource.rename.as_ref().filter(|r| !r.value.is_empty()) {
                return Err(K8sConfigError::Rename {
                    at: self.at(rename),
                    key,
                    name,
                    rename: rename.value.clone(),
                });
            }
            if let Some(devices) = &resource.devices
                && matches!(devices.value, RawDevices::Other)
            {
                return Err(K8sConfigError::SharedDevices {
                    at: self.at(devices),
                    key,
                    name,
                });
            }
            let replicas = u32::try_from(resource.replicas.value)
                .ok()
                .filter(|&n| n >= 2)
                .ok_or_else(|| K8sConfigError::Replicas {
                    at: self.at(&resource.replicas),
                    key,
                    name: name.clone(),
                    replicas: resource.replicas.value,
                })?;
            resources.push(SharedResource { name, replicas });
        }
        Ok(Sharing {
            strategy,
            rename_by_default: raw.rename_by_default.unwrap_or(false),
            // NVIDIA's defaults: an MPS replica is a fixed slice of the GPU, so two of
            // them in one container is almost surely a mistake.
            fail_requests_greater_than_one: raw
                .fail_requests_greater_than_one
                .unwrap_or(strategy == SharingStrategy::Mps),
            resources,
        })
    }

    /// A strategy-like string parsed with its `FromStr`, errors placed at the value.
    fn parsed<T>(
        &self,
        spanned: Option<&Spanned<String>>,
        key: &'static str,
    ) -> Result<Option<T>, K8sConfigError>
    where
        T: std::str::FromStr<Err = K8sConfigError>,
    {
        spanned
            .map(|s| s.value.parse().map_err(|e| self.value(s, key, e)))
            .transpose()
    }

    fn value<T>(
        &self,
        spanned: &Spanned<T>,
        key: &'static str,
        source: K8sConfigError,
    ) -> K8sConfigError {
        K8sConfigError::FileValue {
            at: self.at(spanned),
            key,
            source: Box::new(source),
        }
    }
}

/// `nvidia.com/gpu` or `nvidia.com/mig-<profile>`, where a profile is like `1g.5gb`,
/// `1g.10gb.me` or `1c.3g.20gb` (NVIDIA writes a profile's `+` as `.` in resource names).
fn is_shareable(name: &str) -> bool {
    if name == GPU_RESOURCE {
        return true;
    }
    name.strip_prefix(MIG_RESOURCE_PREFIX)
        .is_some_and(|profile| {
            !profile.is_empty()
                && profile
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-'))
        })
}

fn non_empty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

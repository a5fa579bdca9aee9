//! [`ContainerInputs`] → [`Request`]: NVIDIA's rules for where a container's device
//! request comes from, which capabilities it gets and which requirements it carries.
//!
//! Devices, first source that yields any wins:
//! 1. annotations whose key has a `modes.cdi.annotation-prefixes` prefix, in key order,
//!    each a comma list of fully qualified CDI names;
//! 2. with `accept-nvidia-visible-devices-as-volume-mounts`, `/dev/null` mounts under
//!    `/var/run/nvidia-container-devices/` (`cdi/<vendor>/<class>/<name>` is a CDI name,
//!    `imex/…` is an IMEX channel and not ours to read here);
//! 3. the `swarm-resource` env vars, when any of them is set (values concatenated);
//! 4. `NVIDIA_VISIBLE_DEVICES`; unset means `void`, or `all` for a legacy image
//!    (`CUDA_VERSION` set, `NVIDIA_REQUIRE_CUDA` unset or empty).
//!
//! Env requests (3 and 4) from an unprivileged container are dropped, with a note for
//! the log, unless `accept-nvidia-visible-devices-envvar-when-unprivileged`; that is
//! the fix for any pod getting every GPU by setting `NVIDIA_VISIBLE_DEVICES=all`.
//! As NVIDIA does, a container that asks for no devices is not a GPU container: its
//! capability, requirement and MIG access (`NVIDIA_MIG_{CONFIG,MONITOR}_DEVICES`, see
//! `mig_access`) variables are not read, so junk there cannot fail it.

use std::collections::BTreeMap;

use super::mig_access::{self, ENV_MIG_CONFIG_DEVICES, ENV_MIG_MONITOR_DEVICES, MigAccess};
use super::{
    CDI_ANNOTATION_PREFIX, ClassPolicy, Condition, DeviceClasses, DeviceId, DeviceList,
    DeviceSource, DriverCapabilities, ENV_CUDA_VERSION, ENV_DISABLE_REQUIRE,
    ENV_DRIVER_CAPABILITIES, ENV_REQUIRE_CUDA, ENV_REQUIRE_JETPACK, ENV_REQUIRE_PREFIX,
    ENV_VISIBLE_DEVICES, IgnoredRequest, JETPACK_CSV_MOUNTS_ALL, Op, Quoted, Request, RequestError,
    RequireKey, Requirement, VOLUME_MOUNT_CDI_PREFIX, VOLUME_MOUNT_IMEX_PREFIX, VOLUME_MOUNT_ROOT,
    VOLUME_MOUNT_SOURCE, clean_path, devices, shown_name,
};

/// What the runtime reads from a container's `config.json` (the `bundle` module fills
/// it; tests build it directly).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ContainerInputs {
    /// `process.env`, `K=V`, in order. Entries without `=` are skipped.
    pub env: Vec<String>,
    pub mounts: Vec<InputMount>,
    /// `annotations`, in any order (keys are sorted here).
    pub annotations: Vec<(String, String)>,
    /// `CAP_SYS_ADMIN` is in `process.capabilities.bounding`.
    pub privileged: bool,
}

/// One entry of the spec's `mounts`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InputMount {
    pub destination: String,
    pub source: Option<String>,
}

/// The `config.toml` knobs that shape a request (NVIDIA's key names in the docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestPolicy {
    /// `accept-nvidia-visible-devices-envvar-when-unprivileged` (default true).
    pub accept_envvar_when_unprivileged: bool,
    /// `accept-nvidia-visible-devices-as-volume-mounts` (default false).
    pub accept_volume_mounts: bool,
    /// `swarm-resource`: env var names that replace `NVIDIA_VISIBLE_DEVICES` when set
    /// (e.g. `DOCKER_RESOURCE_GPU`; default none).
    pub swarm_resource: Vec<String>,
    /// `supported-driver-capabilities` (default all).
    pub supported_capabilities: DriverCapabilities,
    /// `disable-require` (default false).
    pub disable_require: bool,
    /// `nvidia-container-runtime.modes.cdi.annotation-prefixes` (default `cdi.k8s.io/`).
    /// An empty prefix is ignored (it would claim every annotation).
    pub annotation_prefixes: Vec<String>,
    /// `features.ignore-imex-channel-requests` (default false).
    pub ignore_imex_channel_requests: bool,
    /// `!features.disable-imex-channel-creation` (default true).
    pub create_imex_channels: bool,
}

impl Default for RequestPolicy {
    /// NVIDIA's defaults.
    fn default() -> Self {
        Self {
            accept_envvar_when_unprivileged: true,
            accept_volume_mounts: false,
            swarm_resource: Vec::new(),
            supported_capabilities: DriverCapabilities::all(),
            disable_require: false,
            annotation_prefixes: vec![CDI_ANNOTATION_PREFIX.to_string()],
            ignore_imex_channel_requests: false,
            create_imex_channels: true,
        }
    }
}

/// Builds the request a container makes. Pure.
pub fn build(inputs: &ContainerInputs, policy: &RequestPolicy) -> Result<Request, RequestError> {
    let env = Env::new(&inputs.env);
    let (devices, source, ignored) = device_request(inputs, &env, policy)?;
    if devices == DeviceList::Void {
        return Ok(Request {
            devices,
            capabilities: DriverCapabilities::default_set()
                .intersection(policy.supported_capabilities),
            requirements: Vec::new(),
            source,
            ignored,
            mig_access: MigAccess::default(),
            classes: DeviceClasses::default(),
            csv_mounts_all: false,
        });
    }
    let class_policy = ClassPolicy {
        accept_envvar_when_unprivileged: policy.accept_envvar_when_unprivileged,
        accept_volume_mounts: policy.accept_volume_mounts,
        ignore_imex_channel_requests: policy.ignore_imex_channel_requests,
        create_imex_channels: policy.create_imex_channels,
    };
    Ok(Request {
        devices,
        capabilities: capabilities(&env, policy)?,
        requirements: requirements(&env, policy)?,
        source,
        ignored,
        mig_access: mig_access::build(
            env.get(ENV_MIG_CONFIG_DEVICES),
            env.get(ENV_MIG_MONITOR_DEVICES),
            inputs.privileged,
        )?,
        classes: super::classes::build(
            |key| env.get(key),
            &inputs.mounts,
            inputs.privileged,
            class_policy,
        )?,
        csv_mounts_all: env.get(ENV_REQUIRE_JETPACK) == Some(JETPACK_CSV_MOUNTS_ALL),
    })
}

/// `process.env` as a lookup: the last occurrence of a key wins (as in Go's map build
/// and in the container's own environment).
struct Env<'a> {
    vars: BTreeMap<&'a str, &'a str>,
}

impl<'a> Env<'a> {
    fn new(entries: &'a [String]) -> Self {
        let vars = entries.iter().filter_map(|e| e.split_once('=')).collect();
        Self { vars }
    }

    fn get(&self, key: &str) -> Option<&'a str> {
        self.vars.get(key).copied()
    }

    /// NVIDIA's "legacy image": a non-empty `CUDA_VERSION` and an unset or empty
    /// `NVIDIA_REQUIRE_CUDA`.
    fn is_legacy(&self) -> bool {
        self.get(ENV_CUDA_VERSION).is_some_and(|v| !v.is_empty())
            && self.get(ENV_REQUIRE_CUDA).is_none_or(str::is_empty)
    }
}

type Devices = (DeviceList, DeviceSource, Option<IgnoredRequest>);

fn device_request(
    inputs: &ContainerInputs,
    env: &Env<'_>,
    policy: &RequestPolicy,
) -> Result<Devices, RequestError> {
    if let Some(list) = annotation_devices(&inputs.annotations, &policy.annotation_prefixes)? {
        return Ok((list, DeviceSource::CdiAnnotations, None));
    }
    if policy.accept_volume_mounts
        && let Some(list) = mount_devices(&inputs.mounts)?
    {
        return Ok((list, DeviceSource::VolumeMounts, None));
    }
    let Some((source, variables, value)) = env_request(env, policy) else {
        return Ok((DeviceList::Void, DeviceSource::None, None));
    };
    let origin = variables.iter().map(|v| shown_name(v)).collect::<Vec<_>>();
    let origin = origin.join(", ");
    if inputs.privileged || policy.accept_envvar_when_unprivileged {
        if source == DeviceSource::SwarmResource {
            // Each variable alone first, so an error names the one at fault.
            for name in &variables {
                let part = env.get(name).unwrap_or_default();
                if !part.trim().is_empty() {
                    part.parse::<DeviceList>()
                        .map_err(|e| in_input(shown_name(name), e))?;
                }
            }
        }
        let list = value
            .parse::<DeviceList>()
            .map_err(|e| in_input(origin, e))?;
        return Ok((list, source, None));
    }
    // Dropped unparsed (NVIDIA does not look at it either), unless it asks for nothing.
    if value.parse::<DeviceList>() == Ok(DeviceList::Void) {
        return Ok((DeviceList::Void, source, None));
    }
    let ignored = IgnoredRequest { variables, value };
    Ok((DeviceList::Void, source, Some(ignored)))
}

fn in_input(origin: String, source: RequestError) -> RequestError {
    RequestError::InInput {
        origin,
        source: Box::new(source),
    }
}

/// The env var device request: (source, the variables it came from, the list as text).
fn env_request(
    env: &Env<'_>,
    policy: &RequestPolicy,
) -> Option<(DeviceSource, Vec<String>, String)> {
    let swarm: Vec<(&str, &str)> = policy
        .swarm_resource
        .iter()
        .filter_map(|name| env.get(name).map(|value| (name.as_str(), value)))
        .collect();
    if !swarm.is_empty() {
        // Concatenated, blank values contributing nothing (as NVIDIA does).
        let value = swarm
            .iter()
            .map(|(_, v)| v.trim())
            .filter(|v| !v.is_empty())
            .collect::<Vec<_>>()
            .join(",");
        let names = swarm.iter().map(|(n, _)| n.to_string()).collect();
        return Some((DeviceSource::SwarmResource, names, value));
    }
    if let Some(value) = env.get(ENV_VISIBLE_DEVICES) {
        return Some((
            DeviceSource::Env,
            vec![ENV_VISIBLE_DEVICES.to_string()],
            value.to_string(),
        ));
    }
    env.is_legacy().then(|| {
        (
            DeviceSource::LegacyImage,
            vec![ENV_CUDA_VERSION.to_string()],
            "all".to_string(),
        )
    })
}

/// Devices named by CDI annotations; `None` when no annotation has a configured prefix.
fn annotation_devices(
    annotations: &[(String, String)],
    prefixes: &[String],
) -> Result<Option<DeviceList>, RequestError> {
    let matching: BTreeMap<&str, &str> = annotations
        .iter()
        .filter(|(key, _)| {
            prefixes
                .iter()
                .any(|p| !p.is_empty() && key.starts_with(p.as_str()))
        })
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    if matching.is_empty() {
        return Ok(None);
    }
    let mut ids: Vec<DeviceId> = Vec::new();
    for (key, value) in matching {
        for element in value.split(',').map(str::trim) {
            let id = element
                .split_once('=')
                .filter(|(kind, name)| devices::is_cdi_kind(kind) && devices::is_cdi_name(name))
                .map(|(kind, name)| DeviceId::Cdi {
                    kind: kind.to_string(),
                    name: name.to_string(),
                })
                .ok_or_else(|| RequestError::NotCdiName {
                    element: Quoted::new(element),
                    key: Quoted::new(key),
                })?;
            if !ids.contains(&id) {
                ids.push(id);
            }
        }
    }
    Ok(Some(DeviceList::Ids(ids)))
}

/// Devices named by `/dev/null` mounts under [`VOLUME_MOUNT_ROOT`]; `None` when there
/// are none (IMEX channel mounts do not count).
fn mount_devices(mounts: &[InputMount]) -> Result<Option<DeviceList>, RequestError> {
    let mut seen: Vec<String> = Vec::new();
    let mut elements: Vec<String> = Vec::new();
    for mount in mounts {
        let Some(source) = &mount.source else {
            continue;
        };
        if clean_path(source) != VOLUME_MOUNT_SOURCE {
            continue;
        }
        let destination = clean_path(&mount.destination);
        if seen.contains(&destination) {
            continue;
        }
        let Some(id) = destination
            .strip_prefix(VOLUME_MOUNT_ROOT)
            .and_then(|rest| rest.strip_prefix('/'))
            .filter(|id| !id.is_empty())
        else {
            continue;
        };
        let id = id.to_string();
        seen.push(destination.clone());
        if id.starts_with(VOLUME_MOUNT_IMEX_PREFIX) {
            continue;
        }
        let origin = || format!("volume mount {}", Quoted::new(&destination));
        let element = match id.strip_prefix(VOLUME_MOUNT_CDI_PREFIX) {
            Some(cdi) => cdi_mount_name(cdi).ok_or_else(|| RequestError::BadCdiMount {
                destination: Quoted::new(&destination),
            })?,
            None => {
                // Checked alone first, so an error names this mount.
                id.parse::<DeviceList>()
                    .map_err(|e| in_input(origin(), e))?;
                id
            }
        };
        elements.push(element);
    }
    if elements.is_empty() {
        return Ok(None);
    }
    let origin = format!("volume mounts under {VOLUME_MOUNT_ROOT}");
    let list = elements
        .join(",")
        .parse::<DeviceList>()
        .map_err(|e| in_input(origin, e))?;
    Ok(Some(list))
}

/// `<vendor>/<class>/<name>` (NVIDIA's form) or `<vendor>/<class>=<name>` → `vendor/class=name`.
fn cdi_mount_name(rest: &str) -> Option<String> {
    let (kind, name) = match rest.split_once('=') {
        Some(pair) => pair,
        None => {
            let (vendor, rest) = rest.split_once('/')?;
            let (class, name) = rest.split_once('/')?;
            return (devices::is_cdi_kind(&format!("{vendor}/{class}"))
                && devices::is_cdi_name(name))
            .then(|| format!("{vendor}/{class}={name}"));
        }
    };
    (devices::is_cdi_kind(kind) && devices::is_cdi_name(name)).then(|| format!("{kind}={name}"))
}

/// NVIDIA's hook rules: unset → `compute,utility` (all supported ones for a legacy
/// image); empty → `compute,utility`; `all` → every supported one; anything named must
/// be supported.
fn capabilities(env: &Env<'_>, policy: &RequestPolicy) -> Result<DriverCapabilities, RequestError> {
    let supported = policy.supported_capabilities;
    let default = DriverCapabilities::default_set().intersection(supported);
    let value = match env.get(ENV_DRIVER_CAPABILITIES) {
        None if env.is_legacy() => return Ok(supported),
        None => return Ok(default),
        Some(v) if v.trim().is_empty() => return Ok(default),
        Some(v) => v,
    };
    let requested: DriverCapabilities = value
        .parse()
        .map_err(|e| in_input(ENV_DRIVER_CAPABILITIES.to_string(), e))?;
    if value.split(',').any(|w| w.trim() == "all") {
        return Ok(supported);
    }
    if let Some(cap) = requested.iter().find(|c| !supported.contains(*c)) {
        let supported = if supported.is_empty() {
            "none".to_string()
        } else {
            supported.to_string()
        };
        return Err(RequestError::UnsupportedCapability {
            capability: cap.name(),
            list: Quoted::new(value),
            supported,
        });
    }
    Ok(requested)
}

/// Every `NVIDIA_REQUIRE_*` but `NVIDIA_REQUIRE_JETPACK*`, sorted by name, then a legacy
/// image's implied `cuda>=major.minor`; none when `disable-require` or
/// `NVIDIA_DISABLE_REQUIRE` is true.
fn requirements(env: &Env<'_>, policy: &RequestPolicy) -> Result<Vec<Requirement>, RequestError> {
    if policy.disable_require {
        return Ok(Vec::new());
    }
    if let Some(value) = env.get(ENV_DISABLE_REQUIRE)
        && parse_go_bool(value)?
    {
        return Ok(Vec::new());
    }
    let mut requirements = env
        .vars
        .range(ENV_REQUIRE_PREFIX..)
        .take_while(|(name, _)| name.starts_with(ENV_REQUIRE_PREFIX))
        .filter(|(name, _)| !name.starts_with(ENV_REQUIRE_JETPACK))
        .map(|(name, value)| Requirement::parse(name, value))
        .collect::<Result<Vec<_>, _>>()?;
    if env.is_legacy() {
        let raw = env.get(ENV_CUDA_VERSION).unwrap_or_default();
        let version = legacy_major_minor(raw).ok_or_else(|| RequestError::InvalidCudaVersion {
            value: Quoted::new(raw),
        })?;
        requirements.push(Requirement {
            variable: ENV_CUDA_VERSION.to_string(),
            alternatives: vec![vec![Condition {
                key: RequireKey::Cuda,
                op: Op::Ge,
                value: version,
            }]],
        });
    }
    Ok(requirements)
}

/// Go's `strconv.ParseBool`, except that an empty value means false (as if unset).
fn parse_go_bool(value: &str) -> Result<bool, RequestError> {
    match value {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Ok(true),
        "" | "0" | "f" | "F" | "FALSE" | "false" | "False" => Ok(false),
        _ => Err(RequestError::InvalidDisableRequire {
            value: Quoted::new(value),
        }),
    }
}

/// `major.minor` of a semver-ish `CUDA_VERSION` (`12.4.1` → `12.4`, `12` → `12.0`,
/// an optional leading `v` and `-pre`/`+build` suffix allowed), as NVIDIA derives the
/// legacy `cuda>=` requirement. Numbers have no leading zeros, as in semver.
fn legacy_major_minor(raw: &str) -> Option<String> {
    let version = raw.strip_prefix('v').unwrap_or(raw);
    let core = version.split(['-', '+']).next().unwrap_or_default();
    if core.len() < version.len() {
        let suffix = &version[core.len() + 1..];
        let ok = !suffix.is_empty()
            && suffix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"-+.".contains(&b));
        if !ok {
            return None;
        }
    }
    let parts: Vec<&str> = core.split('.').collect();
    let numeric = |p: &&str| {
        !p.is_empty()
            && p.len() <= 9
            && p.bytes().all(|b| b.is_ascii_digit())
            && (p.len() == 1 || !p.starts_with('0'))
    };
    if parts.len() > 3 || !parts.iter().all(numeric) {
        return None;
    }
    Some(format!("{}.{}", parts[0], parts.get(1).unwrap_or(&"0")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_clean_like_go() {
        let cases = [
            ("/a//b/./c/", "/a/b/c"),
            ("/a/b/../c", "/a/c"),
            ("/../a", "/a"),
            ("/", "/"),
        ];
        for (raw, want) in cases {
            assert_eq!(clean_path(raw), want, "case {raw:?}");
        }
    }
}

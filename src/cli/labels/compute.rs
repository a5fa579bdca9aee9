// SPDX-License-Identifier: Apache-2.0
//! The node's labels, from its inventory and the device plugin's MIG strategy and
//! sharing (time-slicing or MPS): gpu-feature-discovery's `nvidia.com/*` names with GFD's meanings, so
//! selectors written for GFD keep working. Pure: no I/O, no clock, no logging; a label
//! whose value the inventory does not give (procfs knows no memory) is left out.
//!
//! Where we differ from GFD, on purpose:
//! - A node with several GPU models. GFD logs a warning and lets one model win at random.
//!   Here the node-wide labels hold for *every* GPU the plugin may hand out:
//!   `gpu.product` is the model when all agree and `mixed` otherwise; `gpu.memory` is the
//!   smallest memory; `gpu.compute.{major,minor}` and `gpu.family` come from the lowest
//!   compute capability. So `gpu.memory Gt 40000` never lands a pod on a node that may
//!   give it a 16 GB GPU. Each model also gets `gpu.product.<model>.{count,memory,
//!   compute.major,compute.minor,family}` (on every node, so one selector works
//!   everywhere).
//! - `gpu.count` counts the GPUs the plugin advertises as `nvidia.com/gpu` (with the
//!   mixed strategy, the GPUs without MIG), not every GPU of the winning model. Only
//!   when every GPU is split into MIG devices do the `gpu.*` labels describe the
//!   MIG-enabled GPUs, with `gpu.replicas=0`, as GFD's do.
//! - `mps.capable` is `true` exactly when the config shares a resource with MPS, as
//!   GFD's is (GFD then refuses a node with MIG; the device plugin does that here, so
//!   the labels still describe the node).
//!
//! `gpu.mode`, `gpu.clique`, `vgpu.*` and the MIG attribute labels come from
//! [`DeviceFacts`] (sysfs and NVML beyond the inventory); `gfd.timestamp` is added by the
//! caller, which owns the clock.

use std::collections::{BTreeMap, BTreeSet};

use super::facts::{DeviceFacts, labels as device_labels, mig_attribute_labels};
use super::k8s::{MAX_NAME_LEN, is_valid_label_key, is_valid_label_value, sanitise};
use crate::inventory::{DriverInfo, Gpu, Inventory};
use crate::k8s_config::{GPU_RESOURCE, MigStrategy, Sharing, SharingStrategy};
use crate::nvml::MigAttributes;

/// Label key → value, in key order (the order of the output file).
pub type Labels = BTreeMap<String, String>;

/// Every label key starts with this.
pub const PREFIX: &str = "nvidia.com/";
/// `gpu.product` on a node whose GPUs are not all one model.
pub const MIXED_PRODUCT: &str = "mixed";
/// `gpu.machine` when the DMI product name cannot be read.
pub const UNKNOWN_MACHINE: &str = "unknown";
/// Prefix of the per-profile resources and labels of the mixed MIG strategy.
const MIG_PREFIX: &str = "mig-";
/// The per-model labels: `gpu.product.<model>.<suffix>`.
const MODEL_KEY: &str = "gpu.product.";
/// The longest per-model suffix; the model part of the key gets what is left of 63.
const LONGEST_MODEL_SUFFIX: &str = ".compute.major";
const BYTES_PER_MIB: u64 = 1024 * 1024;

/// What the labels describe.
#[derive(Debug, Clone, Copy)]
pub struct Facts<'a> {
    pub inventory: &'a Inventory,
    /// Whether the inventory came from NVML. procfs cannot tell whether a GPU can do
    /// MIG, so `mig.capable` is left out without NVML.
    pub from_nvml: bool,
    /// The machine's DMI product name as read, `None` when it could not be.
    pub machine: Option<&'a str>,
    /// PCI classes, vGPUs, fabric ids and MIG attributes.
    pub devices: &'a DeviceFacts,
}

/// The device plugin settings the labels follow, so that they describe what the
/// plugin advertises.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LabelSettings {
    pub mig_strategy: MigStrategy,
    /// `sharing.timeSlicing` or `sharing.mps`.
    pub sharing: Option<Sharing>,
}

impl LabelSettings {
    /// How many replicas each device of `resource` is advertised as.
    fn replicas(&self, resource: &str) -> u32 {
        self.sharing
            .as_ref()
            .and_then(|sharing| sharing.replicas(resource))
            .unwrap_or(1)
    }

    /// With `renameByDefault` the shared resource gets a `.shared` name instead of the
    /// product getting a `-SHARED` suffix (GFD's rule).
    fn renamed(&self) -> bool {
        self.sharing.as_ref().is_some_and(|s| s.rename_by_default)
    }

    /// GFD's `sharing-strategy` value for a resource with `replicas` replicas.
    fn strategy(&self, replicas: u32) -> &'static str {
        match &self.sharing {
            Some(sharing) if replicas > 1 => sharing.strategy.label(),
            _ => "none",
        }
    }

    fn mps(&self) -> bool {
        self.sharing
            .as_ref()
            .is_some_and(|s| s.strategy == SharingStrategy::Mps)
    }
}

/// The labels for the node. Empty when the node has no GPU, as GFD does.
pub fn compute(facts: &Facts<'_>, settings: &LabelSettings) -> Labels {
    let mut out = Out::default();
    let mut gpus: Vec<&Gpu> = facts.inventory.gpus.iter().collect();
    for (name, value) in device_labels(facts.devices) {
        out.put(name, value);
    }
    if gpus.is_empty() {
        return out.labels;
    }
    gpus.sort_by_key(|g| g.index);

    let machine = facts.machine.map(|m| sanitise(m, MAX_NAME_LEN));
    out.put(
        "gpu.machine",
        match machine {
            Some(m) if !m.is_empty() => m,
            _ => UNKNOWN_MACHINE.to_string(),
        },
    );
    versions(&mut out, &facts.inventory.driver);
    if facts.from_nvml || gpus.iter().any(|g| mig_on(g)) {
        let capable = gpus
            .iter()
            .any(|g| g.mig_enabled.is_some() || !g.mig_devices.is_empty());
        out.put("mig.capable", capable.to_string());
    }
    out.put("mps.capable", settings.mps().to_string());

    let (on, off): (Vec<&Gpu>, Vec<&Gpu>) = gpus.iter().partition(|g| mig_on(g));
    match settings.mig_strategy {
        MigStrategy::None => whole_gpus(&mut out, &gpus, settings, true),
        MigStrategy::Mixed => {
            out.put("mig.strategy", "mixed".to_string());
            if off.is_empty() {
                // Every GPU is split: describe them as GFD does, with 0 replicas.
                whole_gpus(&mut out, &on, settings, false);
            } else {
                whole_gpus(&mut out, &off, settings, true);
            }
            mig_profiles(&mut out, &on, settings, facts.devices);
        }
        MigStrategy::Single => {
            out.put("mig.strategy", "single".to_string());
            if on.is_empty() {
                whole_gpus(&mut out, &gpus, settings, true);
            } else {
                single_mig(&mut out, &on, &off, settings, facts.devices);
            }
        }
    }
    out.labels
}

/// Whether MIG is on (the plugin's test): NVML says so, or the GPU has MIG devices.
fn mig_on(gpu: &Gpu) -> bool {
    gpu.mig_enabled == Some(true) || !gpu.mig_devices.is_empty()
}

/// The labels being built. Keys are checked as they go in: a key built from a product
/// or profile name that cannot be a label key is left out rather than written for NFD
/// to reject.
#[derive(Default)]
struct Out {
    labels: Labels,
}

impl Out {
    fn put(&mut self, name: &str, value: String) {
        let key = format!("{PREFIX}{name}");
        if is_valid_label_key(&key) && is_valid_label_value(&value) {
            self.labels.insert(key, value);
        }
    }
}

/// `cuda.driver.*` / `cuda.driver-version.*` from the driver version (`550.54.15`), and
/// `cuda.runtime.*` / `cuda.runtime-version.*` from the CUDA version it supports (`12.4`).
/// GFD's names: "driver" is the kernel driver, "runtime" the CUDA driver API version.
fn versions(out: &mut Out, driver: &DriverInfo) {
    let parts: Vec<&str> = driver.version.trim().split('.').collect();
    let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
    if (2..=3).contains(&parts.len()) && parts.iter().all(numeric) {
        let (major, minor) = (parts[0].to_string(), parts[1].to_string());
        let rev = parts.get(2).map_or(String::new(), |r| (*r).to_string());
        for (name, value) in [
            ("cuda.driver.major", &major),
            ("cuda.driver.minor", &minor),
            ("cuda.driver.rev", &rev),
            ("cuda.driver-version.major", &major),
            ("cuda.driver-version.minor", &minor),
            ("cuda.driver-version.revision", &rev),
        ] {
            out.put(name, value.clone());
        }
        out.put("cuda.driver-version.full", parts.join("."));
    }
    let cuda = driver.cuda_version.as_deref().and_then(parse_major_minor);
    if let Some((major, minor)) = cuda {
        for (name, value) in [
            ("cuda.runtime.major", major.to_string()),
            ("cuda.runtime.minor", minor.to_string()),
            ("cuda.runtime-version.major", major.to_string()),
            ("cuda.runtime-version.minor", minor.to_string()),
            ("cuda.runtime-version.full", format!("{major}.{minor}")),
        ] {
            out.put(name, value);
        }
    }
}

/// `8.0` → (8, 0).
fn parse_major_minor(text: &str) -> Option<(u32, u32)> {
    let (major, minor) = text.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.parse().ok()?))
}

/// The architecture family NVIDIA names for a compute capability.
pub fn family(major: u32, minor: u32) -> &'static str {
    match (major, minor) {
        (1, _) => "tesla",
        (2, _) => "fermi",
        (3, _) => "kepler",
        (5, _) => "maxwell",
        (6, _) => "pascal",
        (7, 0..5) => "volta",
        (7, _) => "turing",
        (8, 9) => "ada-lovelace",
        (8, _) => "ampere",
        (9, _) => "hopper",
        (10 | 12, _) => "blackwell",
        (13, _) => "rubin",
        _ => "undefined",
    }
}

/// What a set of GPUs (or MIG devices) has in common, as label values.
struct Summary {
    /// The model's name, or [`MIXED_PRODUCT`].
    model: String,
    /// The smallest memory in MiB, when every device reports one.
    memory_mib: Option<u64>,
    /// The lowest compute capability, when every GPU reports one.
    compute: Option<(u32, u32)>,
}

fn summarise<'g>(gpus: impl IntoIterator<Item = &'g Gpu> + Clone) -> Summary {
    let names: BTreeSet<&str> = gpus.clone().into_iter().map(|g| g.name.as_str()).collect();
    let model = match names.len() {
        1 => names
            .into_iter()
            .next()
            .unwrap_or(MIXED_PRODUCT)
            .to_string(),
        _ => MIXED_PRODUCT.to_string(),
    };
    Summary {
        model,
        memory_mib: min_all(gpus.clone().into_iter().map(|g| g.memory_bytes.map(mib))),
        compute: min_all(
            gpus.into_iter()
                .map(|g| g.compute_capability.as_deref().and_then(parse_major_minor)),
        ),
    }
}

/// The least of the values, or `None` when any is unknown (or there are none).
fn min_all<T: Ord>(values: impl IntoIterator<Item = Option<T>>) -> Option<T> {
    let mut least: Option<T> = None;
    for value in values {
        let value = value?;
        least = Some(match least {
            Some(l) if l <= value => l,
            _ => value,
        });
    }
    least
}

fn mib(bytes: u64) -> u64 {
    bytes / BYTES_PER_MIB
}

/// `<model>[-<part>…][-SHARED]` as one valid label value: the model is cut first, so
/// that the MIG profile and the sharing mark survive a long name.
fn product(model: &str, parts: &[&str], shared: bool) -> String {
    let mut tail: Vec<String> = parts
        .iter()
        .map(|p| sanitise(p, MAX_NAME_LEN))
        .filter(|p| !p.is_empty())
        .collect();
    if shared {
        tail.push("SHARED".to_string());
    }
    let tail = tail.join("-");
    let room = MAX_NAME_LEN.saturating_sub(tail.len() + 1);
    let model = sanitise(model, if tail.is_empty() { MAX_NAME_LEN } else { room });
    let joined = match (model.is_empty(), tail.is_empty()) {
        (_, true) => model,
        (true, false) => tail,
        (false, false) => format!("{model}-{tail}"),
    };
    sanitise(&joined, MAX_NAME_LEN)
}

/// `<resource>.replicas` and `<resource>.sharing-strategy`. 0 replicas (GFD's value for
/// MIG-enabled GPUs described as a whole) means the devices are not advertised at all.
fn sharing(out: &mut Out, settings: &LabelSettings, prefix: &str, replicas: u32) {
    out.put(&format!("{prefix}.replicas"), replicas.to_string());
    out.put(
        &format!("{prefix}.sharing-strategy"),
        settings.strategy(replicas).to_string(),
    );
}

fn architecture(out: &mut Out, prefix: &str, compute: Option<(u32, u32)>) {
    // GFD leaves these out when the major is 0 (NVML did not say).
    if let Some((major, minor)) = compute.filter(|(major, _)| *major != 0) {
        out.put(&format!("{prefix}.compute.major"), major.to_string());
        out.put(&format!("{prefix}.compute.minor"), minor.to_string());
        out.put(
            &format!("{prefix}.family"),
            family(major, minor).to_string(),
        );
    }
}

/// The `gpu.*` labels for GPUs advertised (or, when `advertised` is false, described)
/// as whole GPUs, and the per-model labels.
fn whole_gpus(out: &mut Out, gpus: &[&Gpu], settings: &LabelSettings, advertised: bool) {
    let summary = summarise(gpus.iter().copied());
    let replicas = if advertised {
        settings.replicas(GPU_RESOURCE)
    } else {
        0
    };
    let shared = replicas > 1 && !settings.renamed();
    out.put("gpu.count", gpus.len().to_string());
    out.put("gpu.product", product(&summary.model, &[], shared));
    if let Some(memory) = summary.memory_mib {
        out.put("gpu.memory", memory.to_string());
    }
    sharing(out, settings, "gpu", replicas);
    architecture(out, "gpu", summary.compute);

    let room = MAX_NAME_LEN - MODEL_KEY.len() - LONGEST_MODEL_SUFFIX.len();
    let mut models: BTreeMap<String, Vec<&Gpu>> = BTreeMap::new();
    for gpu in gpus {
        let model = sanitise(&gpu.name, room);
        if !model.is_empty() {
            models.entry(model).or_default().push(gpu);
        }
    }
    for (model, gpus) in models {
        let prefix = format!("{MODEL_KEY}{model}");
        let summary = summarise(gpus.iter().copied());
        out.put(&format!("{prefix}.count"), gpus.len().to_string());
        if let Some(memory) = summary.memory_mib {
            out.put(&format!("{prefix}.memory"), memory.to_string());
        }
        architecture(out, &prefix, summary.compute);
    }
}

/// Mixed strategy: `mig-<profile>.*` for every profile with at least one MIG device,
/// named as the plugin names the resource (`+` becomes `.`).
fn mig_profiles(out: &mut Out, on: &[&Gpu], settings: &LabelSettings, facts: &DeviceFacts) {
    let mut profiles: BTreeMap<String, Vec<(&Gpu, Option<u64>)>> = BTreeMap::new();
    let mut named: BTreeMap<String, &str> = BTreeMap::new();
    for gpu in on {
        for mig in &gpu.mig_devices {
            let name = mig.profile.replace('+', ".");
            named.entry(name.clone()).or_insert(mig.profile.as_str());
            profiles
                .entry(name)
                .or_default()
                .push((gpu, mig.memory_bytes));
        }
    }
    for (profile, devices) in profiles {
        let prefix = format!("{MIG_PREFIX}{profile}");
        let replicas = settings.replicas(&format!("{PREFIX}{prefix}"));
        let parents = summarise(devices.iter().map(|(gpu, _)| *gpu));
        let shared = replicas > 1 && !settings.renamed();
        out.put(&format!("{prefix}.count"), devices.len().to_string());
        out.put(
            &format!("{prefix}.product"),
            product(&parents.model, &["MIG", &profile], shared),
        );
        let memory = min_all(devices.iter().map(|(_, bytes)| bytes.map(mib)));
        if let Some(memory) = memory {
            out.put(&format!("{prefix}.memory"), memory.to_string());
        }
        sharing(out, settings, &prefix, replicas);
        let attributes = named
            .get(&profile)
            .and_then(|p| facts.mig_attributes.get(*p));
        mig_attributes(out, &prefix, attributes);
    }
}

/// GFD's per-profile attribute labels (NVML's view of one device of the profile); its
/// `memory` replaces the one from the device's memory info.
fn mig_attributes(out: &mut Out, prefix: &str, attributes: Option<&MigAttributes>) {
    for (name, value) in attributes.map(mig_attribute_labels).into_iter().flatten() {
        out.put(&format!("{prefix}.{name}"), value);
    }
}

/// Single strategy with MIG on somewhere: the MIG devices are `nvidia.com/gpu`. When the
/// node breaks the strategy's rules (the plugin refuses to start), GFD's `-MIG-INVALID`
/// labels with zero counts.
fn single_mig(
    out: &mut Out,
    on: &[&Gpu],
    off: &[&Gpu],
    settings: &LabelSettings,
    device_facts: &DeviceFacts,
) {
    let profiles: BTreeSet<&str> = on
        .iter()
        .flat_map(|g| g.mig_devices.iter().map(|m| m.profile.as_str()))
        .collect();
    let empty = on.iter().any(|g| g.mig_devices.is_empty());
    let first = on.first().map_or("", |g| g.name.as_str());
    let profile = match profiles.iter().next() {
        Some(profile) if off.is_empty() && !empty && profiles.len() == 1 => *profile,
        _ => {
            out.put("gpu.product", product(first, &["MIG", "INVALID"], false));
            for name in ["gpu.count", "gpu.replicas", "gpu.memory"] {
                out.put(name, "0".to_string());
            }
            out.put("gpu.sharing-strategy", "none".to_string());
            return;
        }
    };
    let parents = summarise(on.iter().copied());
    let replicas = settings.replicas(GPU_RESOURCE);
    let shared = replicas > 1 && !settings.renamed();
    let devices: Vec<_> = on.iter().flat_map(|g| g.mig_devices.iter()).collect();
    out.put("gpu.count", devices.len().to_string());
    out.put(
        "gpu.product",
        product(&parents.model, &["MIG", profile], shared),
    );
    if let Some(memory) = min_all(devices.iter().map(|m| m.memory_bytes.map(mib))) {
        out.put("gpu.memory", memory.to_string());
    }
    sharing(out, settings, "gpu", replicas);
    architecture(out, "gpu", parents.compute);
    mig_attributes(out, "gpu", device_facts.mig_attributes.get(profile));
}

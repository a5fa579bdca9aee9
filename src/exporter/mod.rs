// SPDX-License-Identifier: Apache-2.0
//! The dcgm-exporter-compatible metrics core: DCGM field names and labels, read from NVML
//! (no DCGM), written in the Prometheus text format 0.0.4.
//!
//! - [`catalogue`]: every field we serve, with its NVML source;
//! - [`Counters`]: the set to export (`--collectors` CSV, or the compiled-in default);
//! - [`Exporter`]: the node's GPUs and MIG GPU instances, found at start; each
//!   [`Exporter::render`] reads them (blocking NVML calls) and writes the exposition;
//! - [`Holders`]: which containers hold each GPU or instance, for the pod labels.
//!
//! The HTTP server, the kubelet client and the command line live elsewhere and call this.

pub mod catalogue;
mod collectors;
mod exposition;
mod holders;
mod sample;
mod xid;

use std::sync::{Arc, Mutex, MutexGuard};

use crate::nvml::{Device, Nvml, NvmlError};

pub use catalogue::{Field, FieldInfo, MetricKind};
pub use collectors::{CollectorsError, Counter, Counters, DEFAULT_COUNTERS_CSV, LineProblem};
pub use exposition::CONTENT_TYPE;
pub use holders::{ContainerDevices, Holders};
pub use xid::XidWatch;

use holders::{Holder, Unit};
use sample::{GpmTrack, Readings};

/// dcgm-exporter's variable for the node's name (a DaemonSet sets it from the downward API).
pub const NODE_NAME_ENV: &str = "NODE_NAME";

/// The `Hostname` label as dcgm-exporter makes it: [`NODE_NAME_ENV`], else the host name,
/// else empty (no label).
pub fn hostname() -> String {
    std::env::var(NODE_NAME_ENV)
        .ok()
        .filter(|name| !name.is_empty())
        .or_else(|| {
            nix::unistd::gethostname()
                .ok()
                .and_then(|name| name.into_string().ok())
        })
        .unwrap_or_default()
}

/// Why the exporter cannot start.
#[derive(Debug, thiserror::Error)]
pub enum ExporterError {
    #[error("cannot list the node's GPUs through NVML: {0}")]
    Nvml(#[from] NvmlError),
}

/// A MIG GPU instance of a GPU.
#[derive(Debug, Clone)]
struct Instance {
    gpu_instance_id: u32,
    gpu_instance_id_text: String,
    /// e.g. `1g.10gb`, from the MIG device's name.
    profile: String,
    /// The MIG devices (compute instances) in it: `(slot, uuid)`; the first is read for
    /// the instance's memory.
    mig_devices: Vec<(u32, String)>,
}

/// A GPU, with the label values that never change.
#[derive(Debug, Clone)]
struct Gpu {
    index: u32,
    index_text: String,
    uuid: String,
    bus_id: String,
    /// `nvidia<minor>`.
    device: String,
    model: String,
    instances: Vec<Instance>,
}

/// What scrapes carry over: XID events and GPM samples.
struct ScrapeState {
    xids: Option<XidWatch>,
    /// The last XID per GPU.
    last_xid: Vec<Option<u64>>,
    gpm_gpus: Vec<Option<GpmTrack>>,
    gpm_instances: Vec<Vec<Option<GpmTrack>>>,
}

/// The node's GPUs as a metrics source; see the module docs.
pub struct Exporter {
    nvml: Arc<Nvml>,
    counters: Counters,
    /// Per field (by catalogue position): whether it is in `counters`.
    wanted: Vec<bool>,
    hostname: String,
    driver_version: String,
    gpus: Vec<Gpu>,
    state: Mutex<ScrapeState>,
}

impl std::fmt::Debug for Exporter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Exporter")
            .field("gpus", &self.gpus.len())
            .field("counters", &self.counters.counters.len())
            .finish_non_exhaustive()
    }
}

impl Exporter {
    /// Lists the GPUs and MIG instances, registers for XID events (when the set has
    /// `XID_ERRORS`) and takes the first GPM samples (when it has a PROF field).
    pub fn new(
        nvml: Arc<Nvml>,
        counters: Counters,
        hostname: String,
    ) -> Result<Exporter, ExporterError> {
        let driver_version = nvml.driver_version()?;
        let mut gpus = Vec::new();
        for index in 0..nvml.device_count()? {
            // A GPU NVML cannot describe (fallen off the bus, say) is left out; the others
            // are still exported.
            match gpu_at(&nvml, index) {
                Ok(gpu) => gpus.push(gpu),
                Err(error) => {
                    tracing::warn!(index, %error, "GPU left out of the metrics: NVML cannot describe it");
                }
            }
        }
        let wanted = |field| counters.contains(field);
        let xids = counters
            .contains(Field::XidErrors)
            .then(|| XidWatch::new(&nvml, gpus.iter().map(|gpu| gpu.uuid.clone()).collect()));
        let (mut gpm_gpus, mut gpm_instances) = (Vec::new(), Vec::new());
        for gpu in &gpus {
            let device = nvml.device_by_uuid(&gpu.uuid).ok();
            let start = |instance| {
                let device = device.as_ref()?;
                sample::wants_gpm(&wanted).then(|| GpmTrack::start(&nvml, device, instance))?
            };
            gpm_gpus.push(start(None));
            gpm_instances.push(
                gpu.instances
                    .iter()
                    .map(|i| start(Some(i.gpu_instance_id)))
                    .collect(),
            );
        }
        let state = ScrapeState {
            xids,
            last_xid: vec![None; gpus.len()],
            gpm_gpus,
            gpm_instances,
        };
        let mut wanted = vec![false; catalogue::CATALOGUE.len()];
        for counter in &counters.counters {
            if let Some(slot) = wanted.get_mut(counter.field as usize) {
                *slot = true;
            }
        }
        Ok(Exporter {
            nvml,
            wanted,
            counters,
            hostname,
            driver_version,
            gpus,
            state: Mutex::new(state),
        })
    }

    /// The metrics set.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    fn lock_state(&self) -> MutexGuard<'_, ScrapeState> {
        // Every update leaves the state valid, so a poisoned lock still holds a usable one.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The unit a device id (without its `::<n>` replica suffix) names.
    fn unit_of_device_id(&self, id: &str) -> Option<Unit> {
        if id.starts_with("GPU-") {
            return self.gpus.iter().position(|g| g.uuid == id).map(Unit::Gpu);
        }
        if id.starts_with("MIG-") {
            return self.gpus.iter().enumerate().find_map(|(g, gpu)| {
                let at = gpu
                    .instances
                    .iter()
                    .position(|i| i.mig_devices.iter().any(|(_, uuid)| uuid == id))?;
                Some(Unit::Instance(g, at))
            });
        }
        if let Some((gpu, slot)) = id.split_once(':') {
            let (gpu, slot) = (gpu.parse::<u32>().ok()?, slot.parse::<u32>().ok()?);
            let g = self.gpus.iter().position(|g| g.index == gpu)?;
            let at = self.gpus[g]
                .instances
                .iter()
                .position(|i| i.mig_devices.iter().any(|(s, _)| *s == slot))?;
            return Some(Unit::Instance(g, at));
        }
        // GKE's device plugin (dcgm-exporter's `--kubernetes-gpu-id-type=device-name`).
        if id.starts_with("nvidia") {
            return self.gpus.iter().position(|g| g.device == id).map(Unit::Gpu);
        }
        let index = id.parse::<u32>().ok()?;
        self.gpus
            .iter()
            .position(|g| g.index == index)
            .map(Unit::Gpu)
    }

    /// Reads every GPU and instance (blocking NVML calls) and appends the exposition to
    /// `out`, with pod labels from `holders`. Safe to call from several threads: scrapes
    /// take turns on the XID and GPM state.
    pub fn render(&self, holders: &Holders, out: &mut String) {
        let mut state = self.lock_state();
        let wanted = |field: Field| self.wanted.get(field as usize).copied().unwrap_or(false);
        let devices: Vec<Option<Device<'_>>> = self
            .gpus
            .iter()
            .map(|gpu| self.nvml.device_by_uuid(&gpu.uuid).ok())
            .collect();
        let ScrapeState {
            xids,
            last_xid,
            gpm_gpus,
            gpm_instances,
        } = &mut *state;
        if let Some(watch) = xids.as_mut() {
            watch.drain(&devices, |gpu, xid| {
                if let Some(slot) = last_xid.get_mut(gpu) {
                    *slot = Some(xid);
                }
            });
        }
        let mut gpu_readings = Vec::with_capacity(self.gpus.len());
        let mut instance_readings = Vec::with_capacity(self.gpus.len());
        for (g, (gpu, device)) in self.gpus.iter().zip(&devices).enumerate() {
            let mut readings = Readings::new();
            let mut per_instance = Vec::with_capacity(gpu.instances.len());
            if let Some(device) = device {
                sample::read_gpu(device, &wanted, &mut readings);
                if let Some(Some(track)) = gpm_gpus.get_mut(g) {
                    track.read(&self.nvml, device, &wanted, &mut readings);
                }
                for (i, instance) in gpu.instances.iter().enumerate() {
                    let mut readings = Readings::new();
                    if let Some((_, uuid)) = instance.mig_devices.first()
                        && let Ok(mig) = self.nvml.device_by_uuid(uuid)
                    {
                        sample::read_memory(&mig, &wanted, &mut readings);
                    }
                    if let Some(Some(track)) = gpm_instances.get_mut(g).and_then(|t| t.get_mut(i)) {
                        track.read(&self.nvml, device, &wanted, &mut readings);
                    }
                    per_instance.push(readings);
                }
            }
            let watching = xids.as_ref().is_some_and(|w| w.is_watching(g));
            if watching && wanted(Field::XidErrors) {
                let last = last_xid.get(g).copied().flatten().unwrap_or(0);
                readings.set(Field::XidErrors, Some(last as f64));
            }
            gpu_readings.push(readings);
            instance_readings.push(per_instance);
        }
        drop(state);
        self.write(holders, &gpu_readings, &instance_readings, out);
    }

    fn write(
        &self,
        holders: &Holders,
        gpus: &[Readings],
        instances: &[Vec<Readings>],
        out: &mut String,
    ) {
        let driver_label = self
            .counters
            .counters
            .iter()
            .find(|c| c.kind == MetricKind::Label && c.field == Field::DriverVersion)
            .map(|c| c.name.as_str());
        for counter in &self.counters.counters {
            if counter.kind == MetricKind::Label {
                continue;
            }
            let per_instance = catalogue::info(counter.field).per_instance;
            let mut header = false;
            let mut series = |out: &mut String, labels: &[(&str, &str)], value: f64| {
                if !header {
                    exposition::write_header(
                        out,
                        &counter.name,
                        &counter.help,
                        counter.kind.as_str(),
                    );
                    header = true;
                }
                exposition::write_sample(out, &counter.name, labels, value);
            };
            for (g, gpu) in self.gpus.iter().enumerate() {
                if let Some(value) = gpus.get(g).and_then(|r| r.get(counter.field)) {
                    let base = self.labels(gpu, None, driver_label);
                    for_holders(holders.of(Unit::Gpu(g)), &base, |labels| {
                        series(out, labels, value)
                    });
                }
                if !per_instance {
                    continue;
                }
                for (i, instance) in gpu.instances.iter().enumerate() {
                    let readings = instances.get(g).and_then(|r| r.get(i));
                    let Some(value) = readings.and_then(|r| r.get(counter.field)) else {
                        continue;
                    };
                    let base = self.labels(gpu, Some(instance), driver_label);
                    for_holders(holders.of(Unit::Instance(g, i)), &base, |labels| {
                        series(out, labels, value)
                    });
                }
            }
        }
    }

    /// The labels every series of `gpu` (or of its `instance`) has, in dcgm-exporter's
    /// order.
    fn labels<'a>(
        &'a self,
        gpu: &'a Gpu,
        instance: Option<&'a Instance>,
        driver_label: Option<&'a str>,
    ) -> Vec<(&'a str, &'a str)> {
        let mut labels = vec![
            ("gpu", gpu.index_text.as_str()),
            ("UUID", gpu.uuid.as_str()),
            ("pci_bus_id", gpu.bus_id.as_str()),
            ("device", gpu.device.as_str()),
            ("modelName", gpu.model.as_str()),
        ];
        if let Some(instance) = instance {
            labels.push(("GPU_I_PROFILE", instance.profile.as_str()));
            labels.push(("GPU_I_ID", instance.gpu_instance_id_text.as_str()));
        }
        // dcgm-exporter's `--no-hostname` leaves the label off.
        if !self.hostname.is_empty() {
            labels.push(("Hostname", self.hostname.as_str()));
        }
        if let Some(name) = driver_label {
            labels.push((name, self.driver_version.as_str()));
        }
        labels
    }
}

/// Calls `emit` once per holder with `base` and the holder's labels (`container`,
/// `namespace`, `pod`, and `vgpu` for a shared GPU), or once with `base` alone when nobody
/// holds the unit.
fn for_holders(holders: &[Holder], base: &[(&str, &str)], mut emit: impl FnMut(&[(&str, &str)])) {
    if holders.is_empty() {
        emit(base);
        return;
    }
    let mut labels = base.to_vec();
    for holder in holders {
        labels.truncate(base.len());
        labels.push(("container", holder.container.as_str()));
        labels.push(("namespace", holder.namespace.as_str()));
        labels.push(("pod", holder.pod.as_str()));
        if let Some(vgpu) = &holder.vgpu {
            labels.push(("vgpu", vgpu.as_str()));
        }
        emit(&labels);
    }
}

/// The GPU at NVML index `index`, with its MIG instances.
fn gpu_at(nvml: &Nvml, index: u32) -> Result<Gpu, NvmlError> {
    let device = nvml.device_by_index(index)?;
    Ok(Gpu {
        index,
        index_text: index.to_string(),
        uuid: device.uuid()?,
        bus_id: device.pci_info()?.bus_id,
        device: device
            .minor_number()
            .map(|minor| format!("nvidia{minor}"))
            .unwrap_or_default(),
        model: device.name()?,
        instances: instances_of(&device),
    })
}

/// The MIG GPU instances of a GPU in MIG mode (none otherwise), grouping its MIG devices
/// (compute instances) by GPU instance id.
fn instances_of(device: &Device<'_>) -> Vec<Instance> {
    if !matches!(device.mig_mode(), Ok((true, _))) {
        return Vec::new();
    }
    let mut instances: Vec<Instance> = Vec::new();
    for slot in 0..device.max_mig_device_count().unwrap_or(0) {
        let Ok(mig) = device.mig_device_by_index(slot) else {
            continue;
        };
        let (Ok(uuid), Ok(id)) = (mig.uuid(), mig.gpu_instance_id()) else {
            continue;
        };
        match instances.iter_mut().find(|i| i.gpu_instance_id == id) {
            Some(instance) => instance.mig_devices.push((slot, uuid)),
            None => {
                let name = mig.name().unwrap_or_default();
                let profile = name
                    .rsplit_once(" MIG ")
                    .map(|(_, profile)| profile.to_string())
                    .unwrap_or_default();
                instances.push(Instance {
                    gpu_instance_id: id,
                    gpu_instance_id_text: id.to_string(),
                    profile,
                    mig_devices: vec![(slot, uuid)],
                });
            }
        }
    }
    instances
}

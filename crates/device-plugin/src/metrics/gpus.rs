// SPDX-License-Identifier: Apache-2.0
//! The per-GPU half of a scrape: [`NodeView`] (the served node's GPUs, their NVML library,
//! health board, device ids and an XID event set) samples every GPU's readings, and
//! [`GpuCollector`] encodes them as gauges labelled `gpu`, `uuid`, `model` and the `pod`,
//! `namespace` and `container` holding the GPU.
//!
//! A reading NVML cannot give (a driver without the function, a GPU in MIG mode without
//! utilisation, a board without a power sensor, a GPU that fell off the bus) is left out
//! of that GPU's series, never reported as 0. A GPU that several containers share (time
//! slicing, or MIG devices of one GPU) has one series per container, each with the GPU's
//! readings; one that nobody holds has one series with empty pod labels.

use std::sync::{Arc, Mutex, MutexGuard};

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Unit;

use super::pods::{DeviceIds, Holder, Holders};
use crate::health::HealthBoard;
use crate::resources::Resource;
use nvshim::exporter::XidWatch;
use nvshim::inventory::Inventory;
use nvshim::nvml::{Clock, Device, MemoryInfo, Nvml, NvmlError, Utilization};

/// Labels of the XID counter. Pod labels are left off on purpose: a counter must keep one
/// identity for as long as the GPU does, whoever holds it.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub(super) struct XidLabels {
    gpu: u32,
    uuid: String,
    model: String,
    xid: u64,
}

/// One GPU as the metrics name it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct GpuName {
    index: u32,
    uuid: String,
    model: String,
}

/// The served node, as the metrics sample it.
pub(super) struct NodeView {
    nvml: Arc<Nvml>,
    gpus: Vec<GpuName>,
    board: Arc<HealthBoard>,
    ids: DeviceIds,
    xids: Mutex<XidWatch>,
}

impl std::fmt::Debug for NodeView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeView")
            .field("gpus", &self.gpus)
            .finish_non_exhaustive()
    }
}

/// One GPU's readings at one scrape.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct GpuSample {
    name: GpuName,
    /// `None` when the board tracks no device of the GPU.
    healthy: Option<bool>,
    utilization: Option<Utilization>,
    memory: Option<MemoryInfo>,
    temperature_celsius: Option<u32>,
    power_milliwatts: Option<u32>,
    sm_clock_mhz: Option<u32>,
}

impl NodeView {
    /// The view of a node being served; registers for its GPUs' XID events at once, so
    /// none that happen before the first scrape is missed.
    pub(super) fn new(
        nvml: &Arc<Nvml>,
        inventory: &Inventory,
        resources: &[Resource],
        board: &Arc<HealthBoard>,
    ) -> NodeView {
        let gpus: Vec<GpuName> = inventory
            .gpus
            .iter()
            .map(|gpu| GpuName {
                index: gpu.index,
                uuid: gpu.uuid.clone(),
                model: gpu.name.clone(),
            })
            .collect();
        let xids = XidWatch::new(nvml, gpus.iter().map(|gpu| gpu.uuid.clone()).collect());
        NodeView {
            nvml: Arc::clone(nvml),
            gpus,
            board: Arc::clone(board),
            ids: DeviceIds::new(inventory, resources),
            xids: Mutex::new(xids),
        }
    }

    pub(super) fn device_ids(&self) -> &DeviceIds {
        &self.ids
    }

    fn lock_xids(&self) -> MutexGuard<'_, XidWatch> {
        // Every update leaves the watch valid, so a poisoned lock still holds a usable one.
        self.xids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Reads every GPU, and counts the XID events since the last scrape into `xids`.
    /// Blocking: NVML calls.
    pub(super) fn sample(&self, xids: &Family<XidLabels, Counter>) -> Vec<GpuSample> {
        let devices: Vec<Option<Device<'_>>> = self
            .gpus
            .iter()
            .map(|gpu| self.nvml.device_by_uuid(&gpu.uuid).ok())
            .collect();
        self.count_xids(&devices, xids);
        self.gpus
            .iter()
            .zip(&devices)
            .map(|(name, device)| {
                let units = self.board.units_of_gpu(name.index);
                let healthy =
                    (!units.is_empty()).then(|| units.iter().all(|u| self.board.is_healthy(*u)));
                let read = |f: &dyn Fn(&Device<'_>) -> Result<u32, NvmlError>| {
                    device.as_ref().and_then(|d| f(d).ok())
                };
                GpuSample {
                    name: name.clone(),
                    healthy,
                    utilization: device.as_ref().and_then(|d| d.utilization_rates().ok()),
                    memory: device.as_ref().and_then(|d| d.memory_info().ok()),
                    temperature_celsius: read(&|d| d.temperature()),
                    power_milliwatts: read(&|d| d.power_usage()),
                    sm_clock_mhz: read(&|d| d.clock_info(Clock::Sm)),
                }
            })
            .collect()
    }

    /// Takes the XID events off the set (building it again if it broke) and counts each
    /// on its GPU. `devices` are this scrape's handles, in `self.gpus` order.
    fn count_xids(&self, devices: &[Option<Device<'_>>], xids: &Family<XidLabels, Counter>) {
        self.lock_xids().drain(devices, |at, xid| {
            let Some(gpu) = self.gpus.get(at) else {
                return;
            };
            xids.get_or_create(&XidLabels {
                gpu: gpu.index,
                uuid: gpu.uuid.clone(),
                model: gpu.model.clone(),
                xid,
            })
            .inc();
        });
    }
}

/// Encodes one scrape's [`GpuSample`]s.
#[derive(Debug)]
pub(super) struct GpuCollector {
    samples: Vec<GpuSample>,
    holders: Holders,
}

/// A gauge family: its name (after the prefix, before the unit), help, unit and how to
/// read it off a sample.
struct Gauge {
    name: &'static str,
    help: &'static str,
    unit: Option<Unit>,
    value: fn(&GpuSample) -> Option<f64>,
}

fn gauges() -> [Gauge; 8] {
    let ratio = || Some(Unit::Other("ratio".to_owned()));
    [
        Gauge {
            name: "gpu_utilization",
            help: "Share of the last sample period the GPU ran kernels (NVML utilization.gpu / 100).",
            unit: ratio(),
            value: |s| s.utilization.map(|u| f64::from(u.gpu) / 100.0),
        },
        Gauge {
            name: "gpu_memory_utilization",
            help: "Share of the last sample period device memory was read or written (NVML utilization.memory / 100).",
            unit: ratio(),
            value: |s| s.utilization.map(|u| f64::from(u.memory) / 100.0),
        },
        Gauge {
            name: "gpu_memory_used",
            help: "Device memory in use.",
            unit: Some(Unit::Bytes),
            value: |s| s.memory.map(|m| m.used as f64),
        },
        Gauge {
            name: "gpu_memory_total",
            help: "Device memory in all.",
            unit: Some(Unit::Bytes),
            value: |s| s.memory.map(|m| m.total as f64),
        },
        Gauge {
            name: "gpu_temperature",
            help: "GPU die temperature.",
            unit: Some(Unit::Celsius),
            value: |s| s.temperature_celsius.map(f64::from),
        },
        Gauge {
            name: "gpu_power",
            help: "Power draw of the whole board.",
            unit: Some(Unit::Other("watts".to_owned())),
            value: |s| s.power_milliwatts.map(|mw| f64::from(mw) / 1000.0),
        },
        Gauge {
            name: "gpu_sm_clock",
            help: "Current SM clock.",
            unit: Some(Unit::Other("hertz".to_owned())),
            value: |s| s.sm_clock_mhz.map(|mhz| f64::from(mhz) * 1e6),
        },
        Gauge {
            name: "gpu_healthy",
            help: "1 while the plugin advertises the GPU (and all its MIG devices) as healthy, else 0.",
            unit: None,
            value: |s| s.healthy.map(|h| if h { 1.0 } else { 0.0 }),
        },
    ]
}

/// The labels of a GPU that nobody holds.
static NOBODY: [Holder; 1] = [Holder {
    pod: String::new(),
    namespace: String::new(),
    container: String::new(),
}];

impl GpuCollector {
    pub(super) fn new(samples: Vec<GpuSample>, holders: Holders) -> GpuCollector {
        GpuCollector { samples, holders }
    }

    fn holders_of(&self, gpu: u32) -> &[Holder] {
        match self.holders.get(&gpu) {
            Some(holders) if !holders.is_empty() => holders,
            _ => &NOBODY,
        }
    }

    fn encode_gauge(&self, encoder: &mut DescriptorEncoder<'_>, gauge: &Gauge) -> std::fmt::Result {
        if self.samples.iter().all(|s| (gauge.value)(s).is_none()) {
            return Ok(());
        }
        let mut family = encoder.encode_descriptor(
            gauge.name,
            gauge.help,
            gauge.unit.as_ref(),
            MetricType::Gauge,
        )?;
        for sample in &self.samples {
            let Some(value) = (gauge.value)(sample) else {
                continue;
            };
            let gpu = sample.name.index.to_string();
            for holder in self.holders_of(sample.name.index) {
                let labels = [
                    ("gpu", gpu.as_str()),
                    ("uuid", sample.name.uuid.as_str()),
                    ("model", sample.name.model.as_str()),
                    ("pod", holder.pod.as_str()),
                    ("namespace", holder.namespace.as_str()),
                    ("container", holder.container.as_str()),
                ];
                ConstGauge::new(value).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

impl Collector for GpuCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> std::fmt::Result {
        for gauge in &gauges() {
            self.encode_gauge(&mut encoder, gauge)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::collections::HashMap;

    use prometheus_client::encoding::text::encode_registry;
    use prometheus_client::registry::Registry;

    use super::*;

    /// The value of each series of `name`, by its label text.
    fn series(text: &str, name: &str) -> HashMap<String, f64> {
        text.lines()
            .filter_map(|line| {
                let rest = line.strip_prefix(name)?;
                let (labels, value) = rest.rsplit_once(' ')?;
                Some((labels.to_owned(), value.parse().ok()?))
            })
            .collect()
    }

    fn sample(index: u32) -> GpuSample {
        GpuSample {
            name: GpuName {
                index,
                uuid: format!("GPU-{index}"),
                model: "NVIDIA A100-SXM4-80GB".into(),
            },
            healthy: Some(true),
            utilization: Some(Utilization { gpu: 50, memory: 7 }),
            memory: Some(MemoryInfo {
                total: 80,
                free: 60,
                used: 20,
            }),
            temperature_celsius: Some(41),
            power_milliwatts: Some(123_500),
            sm_clock_mhz: Some(1410),
        }
    }

    fn encode(samples: Vec<GpuSample>, holders: Holders) -> String {
        let mut registry = Registry::with_prefix("nvshim");
        registry.register_collector(Box::new(GpuCollector::new(samples, holders)));
        let mut text = String::new();
        encode_registry(&mut text, &registry).unwrap();
        text
    }

    #[test]
    fn gauges_carry_units_in_their_names_and_pod_labels() {
        let mut without_power = sample(1);
        without_power.power_milliwatts = None;
        without_power.healthy = Some(false);
        let holder = |pod: &str| Holder {
            pod: pod.into(),
            namespace: "ns".into(),
            container: "c".into(),
        };
        let holders = Holders::from([(1, vec![holder("p1"), holder("p2")])]);
        let text = encode(vec![sample(0), without_power], holders);
        let free = r#"{gpu="0",uuid="GPU-0",model="NVIDIA A100-SXM4-80GB",pod="",namespace="",container=""}"#;
        let held = |pod: &str| {
            format!(
                r#"{{gpu="1",uuid="GPU-1",model="NVIDIA A100-SXM4-80GB",pod="{pod}",namespace="ns",container="c"}}"#
            )
        };
        // (case, metric, labels, value)
        let cases: [(&str, &str, String, Option<f64>); 10] = [
            (
                "utilization",
                "nvshim_gpu_utilization_ratio",
                free.into(),
                Some(0.5),
            ),
            (
                "memory utilization",
                "nvshim_gpu_memory_utilization_ratio",
                free.into(),
                Some(0.07),
            ),
            (
                "memory used",
                "nvshim_gpu_memory_used_bytes",
                free.into(),
                Some(20.0),
            ),
            (
                "memory total",
                "nvshim_gpu_memory_total_bytes",
                held("p2"),
                Some(80.0),
            ),
            (
                "temperature",
                "nvshim_gpu_temperature_celsius",
                held("p1"),
                Some(41.0),
            ),
            ("power", "nvshim_gpu_power_watts", free.into(), Some(123.5)),
            (
                "no power reading",
                "nvshim_gpu_power_watts",
                held("p1"),
                None,
            ),
            (
                "clock",
                "nvshim_gpu_sm_clock_hertz",
                free.into(),
                Some(1.41e9),
            ),
            ("healthy", "nvshim_gpu_healthy", free.into(), Some(1.0)),
            ("unhealthy", "nvshim_gpu_healthy", held("p2"), Some(0.0)),
        ];
        for (case, metric, labels, want) in cases {
            let got = series(&text, metric).get(&labels).copied();
            assert_eq!(got, want, "case {case}:\n{text}");
        }
        assert!(
            text.contains("# UNIT nvshim_gpu_power_watts watts"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE nvshim_gpu_sm_clock_hertz gauge"),
            "{text}"
        );
    }

    #[test]
    fn a_family_without_readings_is_left_out() {
        let mut bare = sample(0);
        bare.utilization = None;
        let text = encode(vec![bare], Holders::default());
        assert!(!text.contains("utilization"), "{text}");
        assert!(text.contains("nvshim_gpu_temperature_celsius"), "{text}");
    }
}

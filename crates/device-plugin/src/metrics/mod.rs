// SPDX-License-Identifier: Apache-2.0
//! Prometheus metrics of the device plugin: `GET /metrics` on `--metrics-addr` (off by
//! default). With `--metrics-names=dcgm` (the default) the GPU families are
//! dcgm-exporter's (`DCGM_FI_*`, from `nvshim::exporter`, the same as `nvshim exporter`
//! serves) and the whole text is the Prometheus format 0.0.4; with `nvshim`, our
//! `nvshim_gpu_*` gauges in OpenMetrics. The plugin's own `nvshim_plugin_*` families are
//! in both.
//!
//! ```text
//! gpus     nvshim names: per-GPU gauges sampled from NVML at each scrape; XID events
//!          counted from an event set of our own, drained at each scrape
//! dcgm     dcgm names: nvshim::exporter's families, pod labels from kubelet's answer
//! classic  the plugin's families rewritten from OpenMetrics to the 0.0.4 format
//! pods     kubelet's pod-resources API (List) → which pod and container hold each GPU
//! http     the /metrics listener (hyper, HTTP/1.1) on the plugin's runtime
//! ```
//!
//! [`Metrics`] is the one handle the rest of the plugin sees: the server counts
//! allocations, their latency and registrations through it, `node` hands it each node's
//! GPUs, and a task counts health flips off the [`HealthBoard`]'s change channel. A
//! disabled handle (the default) holds nothing and every hook is a no-op.
//!
//! Why sample at scrape time rather than cache: the readings cost a few NVML calls per
//! GPU (microseconds against the mock, well under a millisecond on a driver), a scrape
//! comes every 15 to 60 s, and sampling then keeps no thread, timer or state between
//! scrapes. The NVML calls run on tokio's blocking pool, so a GPU that makes NVML hang
//! stalls a scrape, never `Allocate`. Pod labels are rebuilt on every scrape, so the
//! series of a pod that is gone disappear with it; the only families that grow are keyed
//! by resource, GPU and XID, all bounded by the node.
//!
//! This module never decides anything about devices and never writes the health board.

mod classic;
mod dcgm;
mod gpus;
mod http;
pub mod pods;

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::{encode_eof, encode_registry};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::{Registry, Unit};

use super::config::{MetricsNames, Settings};
use super::health::HealthBoard;
use super::resources::{Resource, Unit as DeviceUnit};
use gpus::{GpuCollector, NodeView, XidLabels};
use nvshim::exporter::{CollectorsError, Counters, Exporter};
use nvshim::inventory::Inventory;
use nvshim::nvml::Nvml;
use pods::{Holders, PodResources};

pub(crate) use http::serve;

/// The prefix of every metric name.
pub const PREFIX: &str = "nvshim";
/// The node's name, for the `Hostname` label (dcgm-exporter's variable; the DaemonSet
/// sets it from the downward API).
pub use nvshim::exporter::NODE_NAME_ENV as ENV_NODE_NAME;
/// The `Content-Type` of a scrape with our names: OpenMetrics text, which Prometheus
/// asks for first.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which GPU families a scrape has.
#[derive(Debug, Clone)]
pub enum Names {
    /// dcgm-exporter's, for this set of fields.
    Dcgm(Counters),
    /// Ours (`nvshim_gpu_*`).
    Nvshim,
}

/// The GPUs a scrape reads, in the form the names need.
#[derive(Debug, Clone)]
enum NodeSource {
    Ours(Arc<NodeView>),
    Dcgm(Arc<Exporter>),
}

/// Why a scrape could not be answered.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot encode the metrics")]
    Encode(#[source] std::fmt::Error),
    #[error("the NVML sampler of a scrape failed")]
    Sampler(#[source] tokio::task::JoinError),
    #[error("--metrics-collectors: {0}")]
    Collectors(#[from] CollectorsError),
}

/// The plugin's metrics, or nothing when they are off. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    shared: Option<Arc<Shared>>,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    resource: String,
    result: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResourceLabels {
    resource: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TransitionLabels {
    to: &'static str,
}

type Histograms = Family<ResourceLabels, Histogram, fn() -> Histogram>;

#[derive(Debug)]
struct Shared {
    names: Names,
    /// Everything that lives across scrapes: the plugin's counters and, with our names,
    /// the XID counter.
    registry: Registry,
    allocations: Family<OutcomeLabels, Counter>,
    allocate_seconds: Histograms,
    registrations: Family<OutcomeLabels, Counter>,
    transitions: Family<TransitionLabels, Counter>,
    xid_errors: Family<XidLabels, Counter>,
    /// The GPUs of the node being served; replaced on every rebuild.
    node: Mutex<Option<NodeSource>>,
    /// Kubelet's pod-resources API, unless turned off.
    pods: Option<PodResources>,
}

/// `Allocate` handler time: 25 µs to about 0.1 s, doubling.
fn allocate_histogram() -> Histogram {
    Histogram::new(exponential_buckets(25e-6, 2.0, 13))
}

fn outcome(ok: bool) -> &'static str {
    if ok { "success" } else { "failure" }
}

impl Metrics {
    /// Metrics that are off: every hook does nothing.
    pub fn disabled() -> Metrics {
        Metrics::default()
    }

    /// Metrics that are on, with pod labels from kubelet's pod-resources API at
    /// `pod_resources` (when given and present at scrape time).
    pub fn enabled(pod_resources: Option<PathBuf>, names: Names) -> Metrics {
        let mut registry = Registry::with_prefix(PREFIX);
        let allocations = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "plugin_allocations",
            "Container allocations answered by Allocate, by resource and result",
            allocations.clone(),
        );
        let allocate_seconds: Histograms =
            Family::new_with_constructor(allocate_histogram as fn() -> Histogram);
        registry.register_with_unit(
            "plugin_allocate_duration",
            "Time the plugin spent answering one Allocate call, by resource",
            Unit::Seconds,
            allocate_seconds.clone(),
        );
        let registrations = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "plugin_registrations",
            "Register calls to kubelet, by resource and result",
            registrations.clone(),
        );
        let transitions = Family::<TransitionLabels, Counter>::default();
        registry.register(
            "plugin_health_transitions",
            "Devices (GPUs or MIG devices) turning healthy or unhealthy",
            transitions.clone(),
        );
        let xid_errors = Family::<XidLabels, Counter>::default();
        if matches!(names, Names::Nvshim) {
            // With dcgm's names, DCGM_FI_DEV_XID_ERRORS says it.
            registry.register(
                "gpu_xid_errors",
                "XID errors NVML reported, by GPU and XID",
                xid_errors.clone(),
            );
        }
        Metrics {
            shared: Some(Arc::new(Shared {
                names,
                registry,
                allocations,
                allocate_seconds,
                registrations,
                transitions,
                xid_errors,
                node: Mutex::new(None),
                pods: pod_resources.map(PodResources::new),
            })),
        }
    }

    /// On when `settings.metrics_addr` is set, with the names and fields it asks for; a
    /// collectors file that cannot be read or has a field we cannot serve is an error.
    pub fn for_settings(settings: &Settings) -> Result<Metrics, MetricsError> {
        if settings.metrics_addr.is_none() {
            return Ok(Metrics::disabled());
        }
        let names = match settings.metrics_names {
            MetricsNames::Nvshim => Names::Nvshim,
            MetricsNames::Dcgm => Names::Dcgm(match &settings.metrics_collectors {
                Some(path) => Counters::load(path)?,
                None => Counters::default_set(),
            }),
        };
        Ok(Metrics::enabled(
            settings.pod_resources_socket.clone(),
            names,
        ))
    }

    /// The `Content-Type` of what [`Metrics::render`] returns.
    pub fn content_type(&self) -> &'static str {
        match self.shared.as_deref().map(|shared| &shared.names) {
            Some(Names::Dcgm(_)) => nvshim::exporter::CONTENT_TYPE,
            _ => CONTENT_TYPE,
        }
    }

    pub fn is_enabled(&self) -> bool {
        self.shared.is_some()
    }

    /// Counts one `Allocate` call of `containers` container requests and its time.
    pub fn allocated(&self, resource: &str, containers: usize, ok: bool, took: Duration) {
        let Some(shared) = &self.shared else { return };
        let labels = OutcomeLabels {
            resource: resource.to_owned(),
            result: outcome(ok),
        };
        shared
            .allocations
            .get_or_create(&labels)
            .inc_by(containers as u64);
        shared
            .allocate_seconds
            .get_or_create(&ResourceLabels {
                resource: labels.resource,
            })
            .observe(took.as_secs_f64());
    }

    /// Counts one `Register` call to kubelet.
    pub fn registered(&self, resource: &str, ok: bool) {
        let Some(shared) = &self.shared else { return };
        shared
            .registrations
            .get_or_create(&OutcomeLabels {
                resource: resource.to_owned(),
                result: outcome(ok),
            })
            .inc();
    }

    /// Samples these GPUs from now on (the node being served after a start or rebuild),
    /// and starts counting their XID events.
    pub fn observe(
        &self,
        nvml: &Arc<Nvml>,
        inventory: &Inventory,
        resources: &[Resource],
        board: &Arc<HealthBoard>,
    ) {
        let Some(shared) = &self.shared else { return };
        let source = match &shared.names {
            Names::Nvshim => Some(NodeSource::Ours(Arc::new(NodeView::new(
                nvml, inventory, resources, board,
            )))),
            Names::Dcgm(counters) => {
                match Exporter::new(
                    Arc::clone(nvml),
                    counters.clone(),
                    nvshim::exporter::hostname(),
                ) {
                    Ok(exporter) => Some(NodeSource::Dcgm(Arc::new(exporter))),
                    Err(error) => {
                        tracing::warn!(%error, "GPU metrics are off until the next rebuild");
                        None
                    }
                }
            }
        };
        *shared.lock_node() = source;
    }

    /// Samples no GPU (a node without NVML or GPUs, served with fail-on-init-error off).
    pub fn forget_node(&self) {
        if let Some(shared) = &self.shared {
            *shared.lock_node() = None;
        }
    }

    /// Counts `board`'s health flips (per device) until the board is dropped. Spawns a
    /// task on the current tokio runtime; outside one it does nothing.
    pub fn watch_health(&self, board: &Arc<HealthBoard>) {
        let Some(shared) = &self.shared else { return };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::debug!("no async runtime; health transitions are not counted");
            return;
        };
        let weak = Arc::downgrade(board);
        let mut changes = board.subscribe();
        let mut last = board.snapshot();
        let transitions = shared.transitions.clone();
        runtime.spawn(async move {
            // Ends when the board (and with it the channel's sender) is dropped.
            while changes.changed().await.is_ok() {
                let Some(board) = weak.upgrade() else { break };
                let now = board.snapshot();
                drop(board);
                for (to, n) in flips(&last, &now) {
                    transitions
                        .get_or_create(&TransitionLabels { to })
                        .inc_by(n);
                }
                last = now;
            }
        });
    }

    /// One scrape: the pod labels (from kubelet, bounded by a short timeout), then the
    /// NVML readings on the blocking pool, then the whole exposition.
    pub async fn render(&self) -> Result<String, MetricsError> {
        let Some(shared) = self.shared.clone() else {
            let mut text = String::new();
            encode_eof(&mut text).map_err(MetricsError::Encode)?;
            return Ok(text);
        };
        let source = shared.lock_node().clone();
        match source {
            Some(NodeSource::Dcgm(exporter)) => {
                let containers = match &shared.pods {
                    Some(pods) => pods.containers().await,
                    None => Vec::new(),
                };
                tokio::task::spawn_blocking(move || {
                    let mut text = String::with_capacity(32 * 1024);
                    dcgm::render(&exporter, &containers, &mut text);
                    shared.append_own_classic(&mut text)?;
                    Ok(text)
                })
                .await
                .map_err(MetricsError::Sampler)?
            }
            Some(NodeSource::Ours(view)) => {
                let holders = match &shared.pods {
                    Some(pods) => pods.holders(view.device_ids()).await,
                    None => Holders::default(),
                };
                tokio::task::spawn_blocking(move || shared.encode(Some(&view), holders))
                    .await
                    .map_err(MetricsError::Sampler)?
            }
            None if matches!(shared.names, Names::Dcgm(_)) => {
                let mut text = String::new();
                shared.append_own_classic(&mut text)?;
                Ok(text)
            }
            None => shared.encode(None, Holders::default()),
        }
    }
}

impl Shared {
    fn lock_node(&self) -> MutexGuard<'_, Option<NodeSource>> {
        // The guarded value is replaced whole, so a poisoned lock still holds a valid one.
        self.node.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The plugin's own families, in the 0.0.4 format, after the GPU families.
    fn append_own_classic(&self, text: &mut String) -> Result<(), MetricsError> {
        let mut openmetrics = String::with_capacity(4 * 1024);
        encode_registry(&mut openmetrics, &self.registry).map_err(MetricsError::Encode)?;
        classic::append_as_classic(&openmetrics, text);
        Ok(())
    }

    /// Samples the GPUs (draining their XID events into the counter first) and encodes
    /// everything.
    fn encode(&self, view: Option<&NodeView>, holders: Holders) -> Result<String, MetricsError> {
        let mut gpus = Registry::with_prefix(PREFIX);
        if let Some(view) = view {
            let samples = view.sample(&self.xid_errors);
            gpus.register_collector(Box::new(GpuCollector::new(samples, holders)));
        }
        let mut text = String::with_capacity(16 * 1024);
        encode_registry(&mut text, &gpus).map_err(MetricsError::Encode)?;
        encode_registry(&mut text, &self.registry).map_err(MetricsError::Encode)?;
        encode_eof(&mut text).map_err(MetricsError::Encode)?;
        Ok(text)
    }
}

/// How many devices turned healthy and unhealthy between two board snapshots (both in
/// unit order). A device that is new in `now` is not a flip.
fn flips(
    before: &[(DeviceUnit, super::health::UnitHealth)],
    now: &[(DeviceUnit, super::health::UnitHealth)],
) -> Vec<(&'static str, u64)> {
    let (mut healthy, mut unhealthy) = (0u64, 0u64);
    for (unit, health) in now {
        let Ok(at) = before.binary_search_by_key(unit, |(u, _)| *u) else {
            continue;
        };
        match (before[at].1.is_healthy(), health.is_healthy()) {
            (false, true) => healthy += 1,
            (true, false) => unhealthy += 1,
            _ => {}
        }
    }
    [("healthy", healthy), ("unhealthy", unhealthy)]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use crate::health::UnitHealth;

    fn unit(gpu: u32) -> DeviceUnit {
        DeviceUnit { gpu, mig: None }
    }

    #[test]
    fn flips_count_changes_of_known_devices_only() {
        let sick = UnitHealth::Unhealthy {
            reason: "XID 79".into(),
            xid: Some(79),
        };
        let before = vec![
            (unit(0), UnitHealth::Healthy),
            (unit(1), sick.clone()),
            (unit(2), UnitHealth::Healthy),
        ];
        let now = vec![
            (unit(0), sick.clone()),
            (unit(1), UnitHealth::Healthy),
            (unit(2), sick.clone()),
            (unit(3), sick),
        ];
        assert_eq!(flips(&before, &now), [("healthy", 1), ("unhealthy", 2)]);
        assert_eq!(flips(&now, &now), []);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn plugin_counters_and_a_disabled_handle() {
        let off = Metrics::disabled();
        off.allocated("nvidia.com/gpu", 1, true, Duration::from_micros(40));
        assert_eq!(off.render().await.unwrap(), "# EOF\n");

        let on = Metrics::enabled(None, Names::Nvshim);
        on.allocated("nvidia.com/gpu", 2, true, Duration::from_micros(40));
        on.allocated("nvidia.com/gpu", 1, false, Duration::from_micros(90));
        on.registered("nvidia.com/gpu", true);
        let text = on.render().await.unwrap();
        for want in [
            "nvshim_plugin_allocations_total{resource=\"nvidia.com/gpu\",result=\"success\"} 2",
            "nvshim_plugin_allocations_total{resource=\"nvidia.com/gpu\",result=\"failure\"} 1",
            "nvshim_plugin_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 2",
            "nvshim_plugin_registrations_total{resource=\"nvidia.com/gpu\",result=\"success\"} 1",
        ] {
            assert!(text.contains(want), "missing {want:?} in:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[tokio::test(flavor = "current_thread")]
    async fn health_flips_are_counted_off_the_board() {
        let metrics = Metrics::enabled(None, Names::Nvshim);
        let board = Arc::new(HealthBoard::new([unit(0), unit(1)]));
        metrics.watch_health(&board);
        let sick = UnitHealth::Unhealthy {
            reason: "XID 79".into(),
            xid: Some(79),
        };
        assert!(board.set(&[unit(0), unit(1)], &sick));
        let want = "nvshim_plugin_health_transitions_total{to=\"unhealthy\"} 2";
        let mut text = String::new();
        for _ in 0..100 {
            tokio::task::yield_now().await;
            text = metrics.render().await.unwrap();
            if text.contains(want) {
                break;
            }
        }
        assert!(text.contains(want), "{text}");
    }
}

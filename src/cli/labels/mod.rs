// SPDX-License-Identifier: Apache-2.0
//! `nvshim labels`: the node's GPU labels (gpu-feature-discovery's `nvidia.com/*` set) in
//! Node Feature Discovery's local feature file format, one `key=value` a line, sorted.
//!
//! ```text
//! mod       one shot or the --sleep-interval loop, reading the node, writing the file
//! gfd       gpu-feature-discovery's flags, env vars and flags.gfd keys → Resolved
//! compute   inventory × MIG strategy × time-slicing → labels (pure)
//! facts     PCI class, vGPU capability (sysfs), fabric and MIG attributes (NVML)
//! feature_discovery  the `gpu-feature-discovery` name: GFD's command line and defaults
//! node_feature  the labels as NFD's NodeFeature object (--use-node-feature-api)
//! apiserver the in-cluster config and one HTTPS request (rustls, ring)
//! k8s       Kubernetes' label key/value rules and the value sanitiser (pure)
//! stop      the loop's wait: the interval, or SIGTERM/SIGINT (signalfd + poll)
//! ```
//!
//! The file is replaced atomically (temp file, fsync, rename; the temp file's name starts
//! with a dot, which NFD's worker skips) and only when a label changed. In the loop,
//! SIGTERM and SIGINT end the run and remove the file, as GFD does, so that a node whose
//! labeller is gone does not keep advertising stale labels. The MIG strategy and
//! time-slicing come from the device plugin's own config file (`--config-file`), so the
//! labels describe what the plugin advertises; `--mig-strategy` overrides the file.
//! `nvidia.com/gfd.timestamp` is the run's start, stamped once as GFD does, so the loop's
//! "only when a label changed" still holds.

pub mod apiserver;
mod compute;
pub mod facts;
pub mod feature_discovery;
pub mod gfd;
mod k8s;
pub mod node_feature;
pub(crate) mod stop;

#[cfg(test)]
mod deployments_tests;
#[cfg(test)]
mod gfd_tests;
#[cfg(test)]
mod mig_attribute_tests;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use compute::{Facts, LabelSettings, Labels, MIXED_PRODUCT, PREFIX, compute, family};
pub use facts::DeviceFacts;
pub use gfd::{LabelsArgs, Output, Resolved};
pub use k8s::{MAX_NAME_LEN, is_valid_label_key, is_valid_label_value, sanitise};

use super::{CliError, HostArgs};
use crate::files::write::{self, WriteError};
use crate::inventory::nvml::library_path;
use crate::inventory::{Backend, Inventory, InventoryError};
use crate::k8s_config::{FileSettings, K8sConfigError, load_file};
use crate::nvml::Nvml;
use apiserver::{ApiError, ApiServer};
use node_feature::Target;
use stop::{StopSignals, Wake};

/// Where NFD's worker reads local feature files; `nvshim` is our file's name there.
pub const DEFAULT_OUTPUT: &str = "/etc/kubernetes/node-feature-discovery/features.d/nvshim";
/// GFD's `--namespace` default, when neither it nor the service account names one.
pub const DEFAULT_NAMESPACE: &str = "default";
/// The machine's model, as GFD reads it for `nvidia.com/gpu.machine`.
pub const MACHINE_TYPE_FILE: &str = "/sys/class/dmi/id/product_name";

#[derive(Debug, thiserror::Error)]
pub enum LabelsError {
    #[error("invalid interval {value:?}: {reason} (e.g. 60s, 5m, 1h30m; units ms, s, m, h)")]
    Interval { value: String, reason: &'static str },
    /// A bad value from an env var or config key named by `origin`.
    #[error("{origin}: {source}")]
    In {
        origin: &'static str,
        #[source]
        source: Box<LabelsError>,
    },
    #[error("{name}: {source}")]
    Env {
        name: &'static str,
        #[source]
        source: K8sConfigError,
    },
    #[error(
        "--use-node-feature-api needs the node's name: set --node-name or NODE_NAME (in a \
         DaemonSet, from the downward API's spec.nodeName)"
    )]
    NodeName,
    #[error(
        "--kubeconfig {}: not supported; the NodeFeature output uses the pod's in-cluster \
         config (unset KUBECONFIG, or run in a pod)", .0.display()
    )]
    Kubeconfig(PathBuf),
    #[error("NodeFeature {name}: {source}")]
    NodeFeature {
        name: String,
        #[source]
        source: ApiError,
    },
    #[error("--device-discovery-strategy: {0}")]
    Discovery(#[source] K8sConfigError),
    #[error(transparent)]
    Config(#[from] K8sConfigError),
    #[error(transparent)]
    Inventory(#[from] InventoryError),
    #[error(transparent)]
    Write(#[from] WriteError),
    #[error("cannot write the labels to stdout: {0}")]
    Stdout(#[source] io::Error),
    #[error("cannot listen for SIGTERM and SIGINT: {0}")]
    Signals(#[source] io::Error),
    #[error("cannot remove {} on exit: {source}", path.display())]
    Remove {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl LabelsError {
    /// Names where a bad value came from.
    fn in_origin(self, origin: &'static str) -> Self {
        Self::In {
            origin,
            source: Box::new(self),
        }
    }
}

pub fn run(host: &HostArgs, args: &LabelsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let env = |name: &str| std::env::var(name).ok();
    // Kept across reloads, so a signal between two runs is not lost (or fatal).
    let mut signals = None;
    loop {
        match labeller(host, args, &env)?.run(out, &mut signals)? {
            Ended::Done => return Ok(()),
            // As GFD: SIGHUP reads the flags' files and env again and relabels at once.
            Ended::Reload => tracing::info!("SIGHUP: reloading the configuration"),
        }
    }
}

/// How a run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    Done,
    /// SIGHUP: resolve everything again and start over.
    Reload,
}

/// Everything one run needs, resolved once.
struct Labeller {
    host: HostArgs,
    resolved: Resolved,
    settings: LabelSettings,
    /// `gfd.timestamp`: when this run started, as GFD stamps it (once, not every round,
    /// so the loop still rewrites the file only when a label changed).
    timestamp: Option<u64>,
    /// The API server and the object, for the NodeFeature output.
    node_feature: Option<(ApiServer, Target)>,
}

fn labeller(
    host: &HostArgs,
    args: &LabelsArgs,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<Labeller, LabelsError> {
    let file = match gfd::config_file(args, env) {
        Some(path) => load_file(&path)?,
        None => FileSettings::default(),
    };
    let resolved = gfd::resolve(args, env, &file)?;
    let mut host = host.clone();
    if let Some(root) = &resolved.driver_root {
        host.driver_root = Some(root.clone());
    }
    if resolved.nvml_only {
        host.backend = Backend::Nvml;
    }
    let settings = LabelSettings {
        mig_strategy: resolved.mig_strategy,
        sharing: resolved.sharing.clone(),
    };
    let node_feature = match &resolved.output {
        Output::NodeFeature { node, namespace } => {
            let name = format!("{}{node}", node_feature::NAME_PREFIX);
            let api = ApiServer::in_cluster(env)
                .map_err(|source| LabelsError::NodeFeature { name, source })?;
            let namespace = namespace
                .clone()
                .or_else(|| api.namespace.clone())
                .unwrap_or_else(|| DEFAULT_NAMESPACE.to_string());
            let target = Target {
                node: node.clone(),
                namespace,
            };
            Some((api, target))
        }
        Output::Stdout | Output::File(_) => None,
    };
    Ok(Labeller {
        host,
        timestamp: resolved.timestamp.then(unix_now),
        resolved,
        settings,
        node_feature,
    })
}

impl Labeller {
    fn run(
        &self,
        out: &mut dyn Write,
        signals: &mut Option<StopSignals>,
    ) -> Result<Ended, LabelsError> {
        let Some(interval) = self.resolved.interval else {
            let labels = match self.labels() {
                Ok(labels) => labels,
                // GFD's `--fail-on-init-error=false`: a node whose GPUs cannot be read
                // is not a failed run.
                Err(error) if !self.resolved.fail_on_init_error => {
                    tracing::error!("{error}; no labels written (--fail-on-init-error=false)");
                    return Ok(Ended::Done);
                }
                Err(error) => return Err(error),
            };
            return self
                .emit(&labels, &render(&labels), out)
                .map(|_| Ended::Done);
        };
        if signals.is_none() {
            // Listen before the first round, so that a signal during it is not fatal.
            *signals = Some(StopSignals::listen().map_err(LabelsError::Signals)?);
        }
        match signals {
            Some(stop) => self.repeat(interval, out, stop),
            None => Ok(Ended::Done),
        }
    }

    /// Relabels every `interval` until SIGTERM, SIGINT or SIGQUIT (or SIGHUP, which
    /// ends the run for a reload and keeps the labels). A failed round (NVML gone for a
    /// moment, a full disk) is logged and leaves the previous labels in place.
    fn repeat(
        &self,
        interval: Duration,
        out: &mut dyn Write,
        stop: &StopSignals,
    ) -> Result<Ended, LabelsError> {
        let mut last: Option<String> = None;
        let mut first = true;
        loop {
            let round = self.labels().map(|labels| {
                let text = render(&labels);
                (labels, text)
            });
            // As GFD: with --fail-on-init-error (the default), a node whose GPUs cannot be
            // read at start is an error; later failures keep the previous labels.
            if first && self.resolved.fail_on_init_error && round.is_err() {
                return round.map(|_| Ended::Done);
            }
            first = false;
            match round {
                Ok((_, text)) if last.as_ref() == Some(&text) && self.to_stdout() => {}
                Ok((labels, text)) => match self.emit(&labels, &text, out) {
                    Ok(changed) => {
                        if changed {
                            tracing::info!(labels = text.lines().count(), "labels written");
                        }
                        last = Some(text);
                    }
                    Err(error) => tracing::error!("{error}; trying again in {interval:?}"),
                },
                Err(error) => {
                    tracing::error!(
                        "{error}; keeping the previous labels, trying again in {interval:?}"
                    );
                }
            }
            match stop.wait(interval).map_err(LabelsError::Signals)? {
                Wake::Elapsed => {}
                Wake::Stop => break,
                Wake::Reload => return Ok(Ended::Reload),
            }
        }
        tracing::info!("stopping");
        // Unlike GFD, which leaves its NodeFeature object behind, the object goes with
        // the labeller, as the file does: a node without one advertises nothing stale.
        if let Some((api, target)) = &self.node_feature {
            return node_feature::remove(api, target)
                .map(|()| Ended::Done)
                .map_err(|source| LabelsError::NodeFeature {
                    name: target.name(),
                    source,
                });
        }
        let Output::File(output) = &self.resolved.output else {
            return Ok(Ended::Done);
        };
        let path = write::resolve(output);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(Ended::Done),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Ended::Done),
            Err(source) => Err(LabelsError::Remove { path, source }),
        }
    }

    fn to_stdout(&self) -> bool {
        self.resolved.output == Output::Stdout
    }

    /// Reads the node and computes its labels.
    fn labels(&self) -> Result<Labels, LabelsError> {
        let (backend, inventory) = load(&self.host)?;
        let machine = read_machine(&self.resolved.machine_type_file);
        let nvml = (backend == Backend::Nvml).then(|| self.nvml()).flatten();
        let devices = facts::read(&self.host.roots().proc, &inventory, nvml.as_ref());
        let facts = Facts {
            inventory: &inventory,
            from_nvml: backend == Backend::Nvml,
            machine: machine.as_deref(),
            devices: &devices,
        };
        let mut labels = compute(&facts, &self.settings);
        if let Some(timestamp) = self.timestamp {
            labels.insert(TIMESTAMP_LABEL.to_string(), timestamp.to_string());
        }
        Ok(labels)
    }

    /// NVML again, for the facts the inventory does not keep (fabric, MIG attributes);
    /// `None`, logged, when it cannot be loaded (those labels are then left out).
    fn nvml(&self) -> Option<Nvml> {
        let roots = self.host.roots();
        let library = self
            .host
            .nvml_lib
            .clone()
            .unwrap_or_else(|| library_path(&roots));
        match Nvml::load(&library) {
            Ok(nvml) => Some(nvml),
            Err(error) => {
                tracing::warn!("{error}; leaving out the fabric and MIG attribute labels");
                None
            }
        }
    }

    /// Writes `text` (the rendered `labels`) to stdout, replaces the file with it unless
    /// it already holds exactly that, or publishes `labels` as the NodeFeature object;
    /// says whether anything changed.
    fn emit(&self, labels: &Labels, text: &str, out: &mut dyn Write) -> Result<bool, LabelsError> {
        if let Some((api, target)) = &self.node_feature {
            let published = node_feature::publish(api, target, labels).map_err(|source| {
                LabelsError::NodeFeature {
                    name: target.name(),
                    source,
                }
            })?;
            tracing::info!(object = %target.name(), ?published, "NodeFeature");
            return Ok(published != node_feature::Published::Unchanged);
        }
        let Output::File(output) = &self.resolved.output else {
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(LabelsError::Stdout)?;
            return Ok(true);
        };
        let path = write::resolve(output);
        let existing = write::read(&path)?;
        if existing.as_ref().is_some_and(|old| old.text == text) {
            return Ok(false);
        }
        write::replace(&path, text.as_bytes(), existing.as_ref(), false)?;
        Ok(true)
    }
}

/// GFD's label holding when the labels were made (seconds since the epoch).
pub const TIMESTAMP_LABEL: &str = "nvidia.com/gfd.timestamp";

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The file's text: `key=value` lines in key order.
fn render(labels: &Labels) -> String {
    labels.iter().map(|(k, v)| format!("{k}={v}\n")).collect()
}

fn load(host: &HostArgs) -> Result<(Backend, Inventory), LabelsError> {
    Ok(host.inventory()?)
}

/// The DMI product name; `None` (labelled `unknown`, as GFD does) when it cannot be read.
fn read_machine(path: &Path) -> Option<String> {
    match std::fs::read_to_string(path) {
        Ok(text) => Some(text),
        Err(error) => {
            tracing::debug!(path = %path.display(), %error, "no machine type");
            None
        }
    }
}

/// A Go-style duration of whole units: `60s`, `5m`, `1h30m`, `500ms`. Zero is refused (it
/// would relabel in a tight loop).
pub fn parse_interval(text: &str) -> Result<Duration, LabelsError> {
    let err = |reason| LabelsError::Interval {
        value: text.to_string(),
        reason,
    };
    if text.is_empty() {
        return Err(err("empty"));
    }
    let mut total = Duration::ZERO;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(err("expected a number"));
        }
        let (number, tail) = rest.split_at(digits);
        let number: u64 = number.parse().map_err(|_| err("number too large"))?;
        let unit_len = tail.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, tail) = tail.split_at(unit_len);
        let millis = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "" => return Err(err("missing unit")),
            _ => return Err(err("unknown unit")),
        };
        let part = number
            .checked_mul(millis)
            .map(Duration::from_millis)
            .ok_or_else(|| err("too long"))?;
        total = total.checked_add(part).ok_or_else(|| err("too long"))?;
        rest = tail;
    }
    if total.is_zero() {
        return Err(err("must be more than zero"));
    }
    Ok(total)
}

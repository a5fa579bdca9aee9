// SPDX-License-Identifier: Apache-2.0
//! `nvshim labels`: the node's GPU labels (gpu-feature-discovery's `nvidia.com/*` set) in
//! Node Feature Discovery's local feature file format, one `key=value` a line, sorted.
//!
//! ```text
//! mod       flags, one shot or the --interval loop, reading the node, writing the file
//! compute   inventory × MIG strategy × time-slicing → labels (pure)
//! k8s       Kubernetes' label key/value rules and the value sanitiser (pure)
//! stop      the loop's wait: the interval, or SIGTERM/SIGINT (signalfd + poll)
//! ```
//!
//! The file is replaced atomically (temp file, fsync, rename; the temp file's name starts
//! with a dot, which NFD's worker skips) and only when a label changed. In the loop,
//! SIGTERM and SIGINT end the run and remove the file, as GFD does, so that a node whose
//! labeller is gone does not keep advertising stale labels. The MIG strategy and
//! time-slicing come from the device plugin's own config file (`--config`), so the labels
//! describe what the plugin advertises; `--mig-strategy` overrides the file.

mod compute;
mod k8s;
mod stop;

#[cfg(test)]
mod deployments_tests;
#[cfg(test)]
mod tests;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;

pub use compute::{Facts, LabelSettings, Labels, MIXED_PRODUCT, PREFIX, compute, family};
pub use k8s::{MAX_NAME_LEN, is_valid_label_key, is_valid_label_value, sanitise};

use super::{CliError, HostArgs};
use crate::files::write::{self, WriteError};
use crate::inventory::{Backend, Inventory, InventoryError};
use crate::k8s_config::{FileSettings, K8sConfigError, MigStrategy, load_file};
use stop::StopSignals;

/// Where NFD's worker reads local feature files; `nvshim` is our file's name there.
pub const DEFAULT_OUTPUT: &str = "/etc/kubernetes/node-feature-discovery/features.d/nvshim";
/// The machine's model, as GFD reads it for `nvidia.com/gpu.machine`.
pub const MACHINE_TYPE_FILE: &str = "/sys/class/dmi/id/product_name";
/// `--output` value meaning stdout.
const STDOUT: &str = "-";

#[derive(Debug, Args)]
pub struct LabelsArgs {
    /// The NFD local feature file to write ("-": stdout).
    #[arg(long, short = 'o', value_name = "FILE", default_value = DEFAULT_OUTPUT)]
    pub output: PathBuf,
    /// Relabel every DURATION (e.g. 60s, 5m, 1h30m) until SIGTERM or SIGINT, rewriting
    /// the file only when a label changed; without it, label once and exit.
    #[arg(long, value_name = "DURATION", value_parser = parse_interval)]
    pub interval: Option<Duration>,
    /// How the device plugin advertises MIG devices: none, single or mixed
    /// [default: the config file's flags.migStrategy, else none].
    #[arg(long, value_name = "STRATEGY")]
    pub mig_strategy: Option<MigStrategy>,
    /// The device plugin's config file (version: v1), for flags.migStrategy and
    /// sharing.timeSlicing or sharing.mps (gpu.replicas, gpu.sharing-strategy, the -SHARED
    /// product, mps.capable).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The file holding the machine's model, for nvidia.com/gpu.machine.
    #[arg(long, value_name = "FILE", default_value = MACHINE_TYPE_FILE)]
    pub machine_type_file: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum LabelsError {
    #[error("invalid interval {value:?}: {reason} (e.g. 60s, 5m, 1h30m; units ms, s, m, h)")]
    Interval { value: String, reason: &'static str },
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

pub fn run(host: &HostArgs, args: &LabelsArgs, out: &mut dyn Write) -> Result<(), CliError> {
    Ok(labeller(host, args)?.run(out)?)
}

/// Everything one run needs, resolved once.
struct Labeller<'a> {
    host: &'a HostArgs,
    args: &'a LabelsArgs,
    settings: LabelSettings,
}

fn labeller<'a>(host: &'a HostArgs, args: &'a LabelsArgs) -> Result<Labeller<'a>, LabelsError> {
    let file = match &args.config {
        Some(path) => load_file(path)?,
        None => FileSettings::default(),
    };
    let settings = LabelSettings {
        mig_strategy: args.mig_strategy.or(file.mig_strategy).unwrap_or_default(),
        sharing: file.sharing,
    };
    Ok(Labeller {
        host,
        args,
        settings,
    })
}

impl Labeller<'_> {
    fn run(&self, out: &mut dyn Write) -> Result<(), LabelsError> {
        let Some(interval) = self.args.interval else {
            let text = render(&self.labels()?);
            return self.emit(&text, out).map(|_| ());
        };
        self.repeat(interval, out)
    }

    /// Relabels every `interval` until SIGTERM or SIGINT. A failed round (NVML gone for
    /// a moment, a full disk) is logged and leaves the previous labels in place.
    fn repeat(&self, interval: Duration, out: &mut dyn Write) -> Result<(), LabelsError> {
        // Listen before the first round, so that a signal during it is not fatal.
        let stop = StopSignals::listen().map_err(LabelsError::Signals)?;
        let mut last: Option<String> = None;
        loop {
            let round = self.labels().map(|labels| render(&labels));
            match round {
                Ok(text) if last.as_ref() == Some(&text) && self.to_stdout() => {}
                Ok(text) => match self.emit(&text, out) {
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
            if stop.wait(interval).map_err(LabelsError::Signals)? {
                break;
            }
        }
        tracing::info!("stopping");
        if self.to_stdout() {
            return Ok(());
        }
        let path = write::resolve(&self.args.output);
        match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(LabelsError::Remove { path, source }),
        }
    }

    fn to_stdout(&self) -> bool {
        self.args.output.as_os_str() == STDOUT
    }

    /// Reads the node and computes its labels.
    fn labels(&self) -> Result<Labels, LabelsError> {
        let (backend, inventory) = load(self.host)?;
        let machine = read_machine(&self.args.machine_type_file);
        let facts = Facts {
            inventory: &inventory,
            from_nvml: backend == Backend::Nvml,
            machine: machine.as_deref(),
        };
        Ok(compute(&facts, &self.settings))
    }

    /// Writes `text` to stdout, or replaces the file with it unless it already holds
    /// exactly that; says whether anything was written.
    fn emit(&self, text: &str, out: &mut dyn Write) -> Result<bool, LabelsError> {
        if self.to_stdout() {
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .map_err(LabelsError::Stdout)?;
            return Ok(true);
        }
        let path = write::resolve(&self.args.output);
        let existing = write::read(&path)?;
        if existing.as_ref().is_some_and(|old| old.text == text) {
            return Ok(false);
        }
        write::replace(&path, text.as_bytes(), existing.as_ref(), false)?;
        Ok(true)
    }
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

// SPDX-License-Identifier: Apache-2.0
//! `nvshim exporter`: the GPU metrics of [`crate::exporter`] on `/metrics`, with
//! dcgm-exporter's command line (flags, short names and environment variables), so its
//! systemd units, DaemonSets and Helm values carry over.
//!
//! ```text
//! start    collectors file → NVML (found as `info` finds it) → Exporter → bind --address
//! scrape   the text of the last render if younger than --collect-interval; else kubelet's
//!          pod resources (--kubernetes), the NVML readings, a new render
//! stop     SIGTERM or SIGINT (a signalfd) ends the accept loop
//! ```
//!
//! A scrape within `--collect-interval` of the last render gets the same text, as
//! dcgm-exporter hands out what DCGM last collected at that interval; it also bounds what
//! a client scraping in a loop can make NVML and kubelet do.

mod settings;

use std::io;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{CliError, HostArgs};
use crate::exporter::{CONTENT_TYPE, CollectorsError, Counters, Exporter, ExporterError, Holders};
use crate::inventory;
use crate::kubelet::pod_resources;
use crate::metrics_server::{self, AddressError};
use crate::nvml::{Nvml, NvmlError};
pub use settings::{ExporterArgs, GpuIdType, Settings};

/// How long one scrape waits for kubelet's pod resources.
const KUBELET_TIMEOUT: Duration = Duration::from_millis(500);

/// Why the exporter cannot start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ExporterCommandError {
    #[error("{0}")]
    Settings(String),
    #[error(transparent)]
    Collectors(#[from] CollectorsError),
    #[error("cannot load NVML from {library}: {source}")]
    Nvml {
        library: String,
        #[source]
        source: NvmlError,
    },
    #[error(transparent)]
    Exporter(#[from] ExporterError),
    #[error(transparent)]
    Address(#[from] AddressError),
    #[error("cannot listen for SIGTERM and SIGINT: {0}")]
    Signals(#[source] io::Error),
    #[error("the metrics server failed: {0}")]
    Serve(#[source] io::Error),
}

/// Runs the exporter until SIGTERM or SIGINT.
pub fn run(host: &HostArgs, args: &ExporterArgs) -> Result<(), CliError> {
    let settings = Settings::resolve(args, &|name| std::env::var(name).ok())
        .map_err(ExporterCommandError::Settings)?;
    Ok(serve(host, &settings)?)
}

fn serve(host: &HostArgs, settings: &Settings) -> Result<(), ExporterCommandError> {
    let counters = match &settings.collectors {
        Some(path) => Counters::load(path)?,
        None => Counters::default_set(),
    };
    let library = host
        .nvml_lib
        .clone()
        .unwrap_or_else(|| inventory::nvml::library_path(&host.roots()));
    let nvml = Nvml::load(&library).map_err(|source| ExporterCommandError::Nvml {
        library: library.display().to_string(),
        source,
    })?;
    let hostname = match settings.no_hostname {
        true => String::new(),
        false => crate::exporter::hostname(),
    };
    let exporter = Exporter::new(Arc::new(nvml), counters, hostname)?;
    // Blocked before the server starts its threads, so they inherit the mask.
    // SIGHUP is left alone: dcgm-exporter restarts on it, a systemd unit restarts us.
    let stop = super::labels::stop::StopSignals::listen_to(&[Signal::SIGTERM, Signal::SIGINT])
        .map_err(ExporterCommandError::Signals)?;
    let listener = metrics_server::bind(&settings.address)?;
    match listener.local_addr() {
        Ok(addr) => tracing::info!(%addr, "serving metrics"),
        Err(error) => tracing::info!(%error, "serving metrics"),
    }
    let scrapes = Arc::new(Scrapes::new(exporter, settings.clone()));
    let handler: metrics_server::Handler = Arc::new(move || Ok(scrapes.text()));
    metrics_server::serve(listener, handler, CONTENT_TYPE, &stop)
        .map_err(ExporterCommandError::Serve)?;
    // Take the signal off the signalfd: left pending, it would kill the process when
    // the mask comes back as `stop` drops.
    let _ = stop.wait(Duration::ZERO);
    tracing::info!("stopping on SIGTERM/SIGINT");
    Ok(())
}

/// Renders scrapes, reusing a render younger than the collect interval.
struct Scrapes {
    exporter: Exporter,
    settings: Settings,
    last: Mutex<Option<(Instant, String)>>,
    /// Whether the last kubelet call failed (logged once until one works again).
    kubelet_failing: Mutex<bool>,
}

impl Scrapes {
    fn new(exporter: Exporter, settings: Settings) -> Scrapes {
        Scrapes {
            exporter,
            settings,
            last: Mutex::new(None),
            kubelet_failing: Mutex::new(false),
        }
    }

    fn text(&self) -> String {
        // One render at a time: a scrape that waits here gets the text just made.
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((at, text)) = last.as_ref()
            && at.elapsed() < self.settings.collect_interval
        {
            return text.clone();
        }
        let holders = self.holders();
        let mut text = String::with_capacity(last.as_ref().map_or(16 * 1024, |(_, t)| t.len()));
        self.exporter.render(&holders, &mut text);
        *last = Some((Instant::now(), text.clone()));
        text
    }

    fn holders(&self) -> Holders {
        if !self.settings.kubernetes {
            return Holders::default();
        }
        let socket = &self.settings.pod_resources_socket;
        let listed = pod_resources::list(socket, KUBELET_TIMEOUT);
        let mut failing = self
            .kubelet_failing
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        match listed {
            Ok(containers) => {
                if std::mem::take(&mut *failing) {
                    tracing::info!(socket = %socket.display(), "kubelet's pod-resources API answers again");
                }
                Holders::from_containers_named(
                    &self.exporter,
                    &containers,
                    &self.settings.resource_names,
                )
            }
            Err(error) => {
                if !std::mem::replace(&mut *failing, true) {
                    tracing::warn!(%error, "GPU metrics go without pod labels until kubelet answers");
                }
                Holders::default()
            }
        }
    }
}

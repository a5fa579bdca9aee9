// SPDX-License-Identifier: Apache-2.0
//! The health event loop: NVML events and periodic re-probes in, [`HealthBoard`] updates
//! out. It runs on its own thread for the plugin's lifetime and is the board's only writer;
//! the gRPC server only reads the board.
//!
//! What it does, and where that differs from NVIDIA's plugin (`internal/rm/health.go`):
//!
//! - **Events.** Like NVIDIA, one event set with XID critical errors and double- and
//!   single-bit ECC errors (masked by what each GPU supports), registered on every
//!   physical GPU. A GPU whose registration fails is marked unhealthy with the NVML error
//!   as the reason; `NOT_SUPPORTED` is only logged (a driver too old for events).
//! - **Which XIDs count.** [`HealthChecks::is_fatal`]: NVIDIA's ignored list (13, 31, 43,
//!   45, 68, 109) plus `DP_DISABLE_HEALTHCHECKS`, overridden by `DP_ENABLE_HEALTHCHECKS`.
//!   NVIDIA skips ECC events; we count a double-bit ECC event as XID 48 (the XID the driver
//!   raises for one), so it is fatal exactly when XID 48 is and `DP_DISABLE_HEALTHCHECKS=48`
//!   silences both. Single-bit (corrected) errors are only logged.
//! - **Which devices an event marks.** An event carrying a MIG GPU instance (and compute
//!   instance) id marks the MIG devices it names; any other event marks *every* unit of
//!   the GPU — the GPU and all its MIG devices, and so every replica of them. NVIDIA's
//!   plugin (v0.20.0) marks only one logical device per physical GPU (issue #1929). An
//!   event whose GPU cannot be identified marks every unit of every GPU, as NVIDIA does.
//! - **NVML failures.** A failed wait marks every unit unhealthy, as NVIDIA does; then,
//!   unlike NVIDIA (which gives up on health checks), we drop the set, back off and build
//!   a new one.
//! - **Recovery.** NVIDIA never marks a device healthy again. Every
//!   [`WatchOptions::reprobe_interval`] we look at every GPU: one that has disappeared
//!   (not found by UUID, or NVML says it is lost) is marked unhealthy; an unhealthy one
//!   that is still there, answers a query, has its events registered, and has had no
//!   fatal event for [`WatchOptions::recovery_quiet_period`] is marked healthy again.
//! - **`DP_DISABLE_HEALTHCHECKS=all`.** With nothing re-enabled the loop does not run, as
//!   in NVIDIA's plugin. With some XIDs re-enabled it runs, but only those XIDs mark
//!   devices: registration failures, NVML failures and lost GPUs are then only logged.
//!
//! It must not block on the gRPC side: it only writes the board, which never waits.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{HealthBoard, UnitHealth};
use crate::config::HealthChecks;
use crate::resources::Unit;
use nvshim::inventory::{Gpu, Inventory};
use nvshim::nvml::{
    Device, EVENT_TYPE_DOUBLE_BIT_ECC_ERROR, EVENT_TYPE_SINGLE_BIT_ECC_ERROR,
    EVENT_TYPE_XID_CRITICAL_ERROR, Event, EventSet, INSTANCE_ID_NONE, Nvml, NvmlError, Return,
};

/// The events registered on each GPU (masked by what it supports), as NVIDIA registers them.
const WATCHED_EVENTS: u64 = EVENT_TYPE_XID_CRITICAL_ERROR
    | EVENT_TYPE_DOUBLE_BIT_ECC_ERROR
    | EVENT_TYPE_SINGLE_BIT_ECC_ERROR;

/// The XID the driver reports for a double-bit ECC error; a DBE event counts as it.
const DOUBLE_BIT_ECC_XID: u64 = 48;

/// The longest wait between attempts to rebuild the event set after NVML failures.
const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// Timing of the loop. The defaults suit production; tests shorten them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchOptions {
    /// How long one `nvmlEventSetWait` blocks. It bounds how late `stop` is noticed and
    /// how late a re-probe runs; keep it at most 200 ms. Default 100 ms.
    pub wait_timeout: Duration,
    /// How often every GPU is re-probed (gone? recovered?). Default 30 s.
    pub reprobe_interval: Duration,
    /// How long an unhealthy GPU must go without a fatal event before a re-probe may
    /// mark it healthy again. Default 5 min.
    pub recovery_quiet_period: Duration,
    /// The first pause after an NVML failure before the event set is rebuilt; it doubles
    /// on each failure in a row, up to a minute. Default 1 s.
    pub retry_backoff: Duration,
}

impl Default for WatchOptions {
    fn default() -> Self {
        Self {
            wait_timeout: Duration::from_millis(100),
            reprobe_interval: Duration::from_secs(30),
            recovery_quiet_period: Duration::from_secs(5 * 60),
            retry_backoff: Duration::from_secs(1),
        }
    }
}

/// Why the loop could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The library has no event API (a driver too old for events): retrying cannot help.
    #[error("the NVML library {} cannot deliver events (driver too old?), so health checks are off", library.display())]
    EventsUnsupported {
        library: PathBuf,
        #[source]
        source: NvmlError,
    },
}

/// Watches the inventory's GPUs and keeps `board` up to date until `stop` is set (checked
/// at least every [`WatchOptions::wait_timeout`]), with the policy the [module
/// docs](self) describe. Meant for its own thread. Returns `Ok` at once when the health
/// checks are disabled, and an error only when NVML cannot deliver events at all; every
/// other failure is reported on the board and retried.
pub fn run(
    nvml: &Nvml,
    inventory: &Inventory,
    checks: &HealthChecks,
    board: &HealthBoard,
    stop: &AtomicBool,
    options: &WatchOptions,
) -> Result<(), HealthError> {
    if checks.disable_all && !checks.enable_all && checks.enabled.is_empty() {
        tracing::info!("health checks are disabled (DP_DISABLE_HEALTHCHECKS=all)");
        return Ok(());
    }
    let mut watch = Watch::new(nvml, inventory, checks, board, options);
    let timeout_ms = u32::try_from(options.wait_timeout.as_millis())
        .unwrap_or(u32::MAX)
        .max(1);
    let mut backoff = options.retry_backoff;
    let mut next_probe = Instant::now() + options.reprobe_interval;
    while !stopped(stop) {
        let set = match nvml.event_set() {
            Ok(set) => set,
            Err(source) if source.is_not_supported() => {
                return Err(HealthError::EventsUnsupported {
                    library: nvml.library().to_path_buf(),
                    source,
                });
            }
            Err(error) => {
                watch.nvml_failed("creating an event set", &error, backoff);
                pause(stop, backoff, options.wait_timeout);
                backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
                continue;
            }
        };
        watch.register_all(&set);
        let error = loop {
            if stopped(stop) {
                return Ok(());
            }
            let now = Instant::now();
            if now >= next_probe {
                watch.reprobe(&set);
                next_probe = now + options.reprobe_interval;
            }
            match set.wait(timeout_ms) {
                Ok(event) => {
                    backoff = options.retry_backoff;
                    if let Some(event) = event {
                        watch.on_event(&event);
                    }
                }
                Err(error) => break error,
            }
        };
        watch.nvml_failed("waiting for events", &error, backoff);
        drop(set);
        pause(stop, backoff, options.wait_timeout);
        backoff = backoff.saturating_mul(2).min(MAX_BACKOFF);
    }
    Ok(())
}

fn stopped(stop: &AtomicBool) -> bool {
    // A plain flag guarding no other data: relaxed is enough.
    stop.load(Ordering::Relaxed)
}

/// Sleeps for `duration` in steps of at most `step`, returning early once `stop` is set.
fn pause(stop: &AtomicBool, duration: Duration, step: Duration) {
    let end = Instant::now() + duration;
    while !stopped(stop) {
        let now = Instant::now();
        if now >= end {
            return;
        }
        std::thread::sleep(step.max(Duration::from_millis(1)).min(end - now));
    }
}

/// The loop's view of one GPU.
struct Watched<'a> {
    gpu: &'a Gpu,
    /// The handle its events were registered with, so events map to GPUs without an NVML
    /// call (NVML hands out one handle per device).
    handle: Option<Device<'a>>,
    /// Whether its events are registered in the current set (or it supports none, which
    /// is only logged).
    registered: bool,
    /// When it last had a fatal event or was marked unhealthy for any reason.
    last_fault: Option<Instant>,
    /// Whether the last probe found it gone.
    gone: bool,
}

struct Watch<'a> {
    nvml: &'a Nvml,
    checks: &'a HealthChecks,
    board: &'a HealthBoard,
    options: &'a WatchOptions,
    gpus: Vec<Watched<'a>>,
}

/// What a re-probe found.
enum Probe {
    /// Found by UUID and answering.
    Present,
    /// Not found, or NVML says it is lost.
    Gone(NvmlError),
    /// Found, but a query failed some other way: neither gone nor fit to recover.
    Unanswered(NvmlError),
}

impl<'a> Watch<'a> {
    fn new(
        nvml: &'a Nvml,
        inventory: &'a Inventory,
        checks: &'a HealthChecks,
        board: &'a HealthBoard,
        options: &'a WatchOptions,
    ) -> Self {
        let gpus = inventory
            .gpus
            .iter()
            .map(|gpu| Watched {
                gpu,
                handle: None,
                registered: false,
                last_fault: None,
                gone: false,
            })
            .collect();
        Self {
            nvml,
            checks,
            board,
            options,
            gpus,
        }
    }

    /// Whether failures other than fatal XIDs (registration, NVML, lost GPUs) mark
    /// devices; `DP_DISABLE_HEALTHCHECKS=all` turns them off.
    fn device_checks(&self) -> bool {
        !self.checks.disable_all
    }

    /// Marks `units` of GPU `i` unhealthy (and restarts its quiet period); returns whether
    /// any of them flipped.
    fn fault(&mut self, i: usize, units: &[Unit], reason: String, xid: Option<u64>) -> bool {
        self.gpus[i].last_fault = Some(Instant::now());
        self.board
            .set(units, &UnitHealth::Unhealthy { reason, xid })
    }

    /// Marks every unit of GPU `i` unhealthy unless device checks are off; logs a flip at
    /// warn level and a repeat at debug level.
    fn device_fault(&mut self, i: usize, reason: String) {
        let gpu = self.gpus[i].gpu;
        if !self.device_checks() {
            self.gpus[i].last_fault = Some(Instant::now());
            tracing::debug!(gpu = gpu.index, uuid = %gpu.uuid, %reason, "not marking the GPU unhealthy: DP_DISABLE_HEALTHCHECKS=all");
            return;
        }
        let units = self.board.units_of_gpu(gpu.index);
        if self.fault(i, &units, reason.clone(), None) {
            tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, %reason, "marking the GPU unhealthy");
        } else {
            tracing::debug!(gpu = gpu.index, uuid = %gpu.uuid, %reason, "GPU still unhealthy");
        }
    }

    /// Registers every GPU (except those found gone) in a fresh set.
    fn register_all(&mut self, set: &EventSet<'a>) {
        for i in 0..self.gpus.len() {
            self.gpus[i].registered = false;
            self.gpus[i].handle = None;
            if !self.gpus[i].gone {
                self.register(i, set);
            }
        }
    }

    fn register(&mut self, i: usize, set: &EventSet<'a>) {
        let gpu = self.gpus[i].gpu;
        let outcome = self.nvml.device_by_uuid(&gpu.uuid).and_then(|device| {
            let mask = WATCHED_EVENTS & device.supported_event_types()?;
            if mask != 0 {
                set.register(&device, mask)?;
            }
            Ok((device, mask))
        });
        match outcome {
            Ok((device, mask)) => {
                if mask & EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
                    tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, "the GPU reports no XID events; only a lost GPU will mark it unhealthy");
                }
                self.gpus[i].handle = Some(device);
                self.gpus[i].registered = true;
            }
            Err(error) if error.is_not_supported() => {
                // NVIDIA only logs this case ("too old to support healthchecking").
                tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, %error, "the GPU cannot report health events; only a lost GPU will mark it unhealthy");
                self.gpus[i].registered = true;
            }
            Err(error) => {
                self.gpus[i].registered = false;
                let reason = format!(
                    "cannot watch GPU {} ({}) for health events: {error}",
                    gpu.index, gpu.uuid
                );
                self.device_fault(i, reason);
            }
        }
    }

    /// NVML failed creating or waiting on the set: every unit is marked and every GPU must
    /// register again.
    fn nvml_failed(&mut self, context: &str, error: &NvmlError, backoff: Duration) {
        tracing::warn!(%error, retry_in = ?backoff, "NVML failed {context}; marking every device unhealthy and rebuilding the event set");
        let reason = format!("NVML failed {context}: {error}");
        for i in 0..self.gpus.len() {
            self.gpus[i].registered = false;
            self.gpus[i].handle = None;
            self.device_fault(i, reason.clone());
        }
    }

    /// The GPU an event came from: by handle, else by asking NVML for its UUID.
    fn gpu_of(&self, device: &Device) -> Option<usize> {
        if let Some(i) = self
            .gpus
            .iter()
            .position(|w| w.handle.as_ref() == Some(device))
        {
            return Some(i);
        }
        let uuid = device.uuid().ok()?;
        self.gpus.iter().position(|w| w.gpu.uuid == uuid)
    }

    fn on_event(&mut self, event: &Event) {
        let (what, xid, counts_as) = match event.event_type {
            EVENT_TYPE_XID_CRITICAL_ERROR => (
                format!("XID {}", event.event_data),
                Some(event.event_data),
                event.event_data,
            ),
            EVENT_TYPE_DOUBLE_BIT_ECC_ERROR => {
                ("double-bit ECC error".to_string(), None, DOUBLE_BIT_ECC_XID)
            }
            EVENT_TYPE_SINGLE_BIT_ECC_ERROR => {
                tracing::debug!("corrected single-bit ECC error; ignored");
                return;
            }
            other => {
                tracing::debug!(
                    event_type = other,
                    "ignoring an NVML event we did not ask for"
                );
                return;
            }
        };
        let found = self.gpu_of(&event.device);
        if !self.checks.is_fatal(counts_as) {
            tracing::info!(gpu = ?found.map(|i| self.gpus[i].gpu.index), event = %what, "ignoring a non-fatal event (an application error, or listed in DP_DISABLE_HEALTHCHECKS)");
            return;
        }
        let Some(i) = found else {
            // NVIDIA marks every device when it cannot tell where an event came from.
            let reason = format!("{what} on an unidentified GPU");
            tracing::warn!(xid, %reason, "marking every device unhealthy");
            for i in 0..self.gpus.len() {
                let units = self.board.units_of_gpu(self.gpus[i].gpu.index);
                self.fault(i, &units, reason.clone(), xid);
            }
            return;
        };
        let gpu = self.gpus[i].gpu;
        let known = self.board.units_of_gpu(gpu.index);
        for (units, place) in targets(
            gpu,
            &known,
            event.gpu_instance_id,
            event.compute_instance_id,
        ) {
            let reason = format!("{what} on {place}");
            tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, xid, %reason, units = units.len(), "marking unhealthy");
            self.fault(i, &units, reason, xid);
        }
        // A fatal event restarts the quiet period even when no advertised unit matched.
        self.gpus[i].last_fault = Some(Instant::now());
    }

    /// Looks at every GPU: marks gone ones, retries registration, recovers quiet ones.
    fn reprobe(&mut self, set: &EventSet<'a>) {
        let quiet = self.options.recovery_quiet_period;
        for i in 0..self.gpus.len() {
            let gpu = self.gpus[i].gpu;
            match self.probe(gpu) {
                Probe::Gone(error) => {
                    let was_gone = std::mem::replace(&mut self.gpus[i].gone, true);
                    self.gpus[i].registered = false;
                    self.gpus[i].handle = None;
                    if !was_gone {
                        tracing::warn!(gpu = gpu.index, uuid = %gpu.uuid, %error, "GPU is gone");
                    }
                    let reason = format!("GPU {} ({}) is gone: {error}", gpu.index, gpu.uuid);
                    self.device_fault(i, reason);
                }
                Probe::Unanswered(error) => {
                    tracing::debug!(gpu = gpu.index, uuid = %gpu.uuid, %error, "GPU did not answer the re-probe; leaving its health as it is");
                }
                Probe::Present => {
                    if std::mem::replace(&mut self.gpus[i].gone, false) {
                        tracing::info!(gpu = gpu.index, uuid = %gpu.uuid, "GPU is back");
                    }
                    if !self.gpus[i].registered {
                        self.register(i, set);
                    }
                    if !self.gpus[i].registered {
                        continue;
                    }
                    let units = self.board.units_of_gpu(gpu.index);
                    if units.iter().all(|u| self.board.is_healthy(*u)) {
                        continue;
                    }
                    if self.gpus[i]
                        .last_fault
                        .is_some_and(|at| at.elapsed() < quiet)
                    {
                        continue;
                    }
                    if self.board.set(&units, &UnitHealth::Healthy) {
                        tracing::info!(gpu = gpu.index, uuid = %gpu.uuid, quiet_period = ?quiet, "GPU recovered: it answers NVML and had no fatal event for the quiet period");
                    }
                }
            }
        }
    }

    /// Whether `gpu` is still there: found by UUID, and answering a cheap query that goes
    /// to the driver (memory info).
    fn probe(&self, gpu: &Gpu) -> Probe {
        let lost = |error: &NvmlError| {
            matches!(
                error.code(),
                Some(Return::NotFound | Return::GpuIsLost | Return::GpuNotFound)
            )
        };
        let device = match self.nvml.device_by_uuid(&gpu.uuid) {
            Ok(device) => device,
            Err(error) if lost(&error) => return Probe::Gone(error),
            Err(error) => return Probe::Unanswered(error),
        };
        match device.memory_info() {
            Ok(_) => Probe::Present,
            Err(error) if error.is_not_supported() => Probe::Present,
            Err(error) if lost(&error) => Probe::Gone(error),
            Err(error) => Probe::Unanswered(error),
        }
    }
}

/// The units a fatal event on `gpu` marks, in groups that share how the reason names
/// them (each group is one board update, so a reader never sees half a GPU marked).
/// `known` is what the board holds for the GPU. An event with a MIG GPU instance id (and,
/// unless it is [`INSTANCE_ID_NONE`], compute instance id) marks the advertised MIG devices
/// it names, one group each; anything else — a GPU-wide event, or one naming no advertised
/// MIG device (for example with MIG strategy `none`, where only the whole GPU is
/// advertised) — marks every known unit of the GPU, as one group.
fn targets(
    gpu: &Gpu,
    known: &[Unit],
    gpu_instance_id: u32,
    compute_instance_id: u32,
) -> Vec<(Vec<Unit>, String)> {
    if gpu_instance_id != INSTANCE_ID_NONE {
        let migs: Vec<(Vec<Unit>, String)> = gpu
            .mig_devices
            .iter()
            .filter(|mig| {
                mig.gpu_instance_id == gpu_instance_id
                    && (compute_instance_id == INSTANCE_ID_NONE
                        || mig.compute_instance_id == compute_instance_id)
            })
            .map(|mig| {
                let unit = Unit {
                    gpu: gpu.index,
                    mig: Some(mig.index),
                };
                let place = format!("MIG device {}:{} ({})", gpu.index, mig.index, mig.uuid);
                (unit, place)
            })
            .filter(|(unit, _)| known.contains(unit))
            .map(|(unit, place)| (vec![unit], place))
            .collect();
        if !migs.is_empty() {
            return migs;
        }
    }
    if known.is_empty() {
        return Vec::new();
    }
    vec![(known.to_vec(), format!("GPU {} ({})", gpu.index, gpu.uuid))]
}

#[cfg(test)]
#[path = "monitor_tests.rs"]
mod tests;

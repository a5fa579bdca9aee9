// SPDX-License-Identifier: Apache-2.0
//! XID errors: an NVML event set registered for the XID events of a list of GPUs, drained
//! without waiting at each scrape. The set is built again after it breaks (an NVML error
//! while waiting), and a driver that cannot deliver events is noted once and left alone.

use std::sync::Arc;

use crate::nvml::{Device, EVENT_TYPE_XID_CRITICAL_ERROR, Nvml, NvmlError, SharedEventSet};

/// How many events one drain takes at most, so a storm of events cannot stall a scrape.
pub const MAX_EVENTS_PER_DRAIN: usize = 256;

enum Events {
    Watching(SharedEventSet),
    /// Building or waiting on the set failed; built again at the next drain.
    Broken,
    /// The driver cannot deliver events at all.
    Unsupported,
}

/// XID events of some GPUs (by UUID); callers serialise [`XidWatch::drain`] (a `Mutex`).
pub struct XidWatch {
    nvml: Arc<Nvml>,
    uuids: Vec<String>,
    /// Per GPU (in `uuids` order): whether its XID events are registered.
    registered: Vec<bool>,
    events: Events,
}

impl XidWatch {
    /// Registers for the XID events of the GPUs `uuids`, at once, so none that happen
    /// before the first drain is missed.
    pub fn new(nvml: &Arc<Nvml>, uuids: Vec<String>) -> XidWatch {
        let mut watch = XidWatch {
            nvml: Arc::clone(nvml),
            registered: vec![false; uuids.len()],
            uuids,
            events: Events::Broken,
        };
        watch.build();
        watch
    }

    /// Whether the XID events of the GPU at `position` (of `uuids`) are being watched.
    pub fn is_watching(&self, position: usize) -> bool {
        matches!(self.events, Events::Watching(_))
            && self.registered.get(position).copied().unwrap_or(false)
    }

    fn build(&mut self) {
        let set = match SharedEventSet::new(&self.nvml) {
            Ok(set) => set,
            Err(error) if error.is_not_supported() => {
                tracing::info!(%error, "NVML cannot deliver events; XID errors are not reported");
                self.events = Events::Unsupported;
                return;
            }
            Err(error) => {
                tracing::debug!(%error, "cannot create an NVML event set for XID errors; trying again at the next scrape");
                self.events = Events::Broken;
                return;
            }
        };
        for (uuid, registered) in self.uuids.iter().zip(&mut self.registered) {
            let result = set.with(|events| {
                let device = self.nvml.device_by_uuid(uuid)?;
                if device.supported_event_types()? & EVENT_TYPE_XID_CRITICAL_ERROR == 0 {
                    return Ok(false);
                }
                events.register(&device, EVENT_TYPE_XID_CRITICAL_ERROR)?;
                Ok::<bool, NvmlError>(true)
            });
            *registered = match result {
                Ok(watched) => watched,
                Err(error) => {
                    tracing::debug!(%uuid, %error, "XID errors of this GPU are not reported");
                    false
                }
            };
        }
        self.events = Events::Watching(set);
    }

    /// Takes the pending XID events off the set and calls `seen(position, xid)` for each
    /// on a watched GPU (its position in `uuids`), oldest first. `devices` are handles of
    /// the GPUs in `uuids` order (`None` where NVML lost one), to match events by handle
    /// before asking NVML for a UUID.
    pub fn drain(&mut self, devices: &[Option<Device<'_>>], mut seen: impl FnMut(usize, u64)) {
        if matches!(self.events, Events::Broken) {
            self.build();
        }
        let Events::Watching(set) = &self.events else {
            return;
        };
        let failed = set.with(|set| {
            for _ in 0..MAX_EVENTS_PER_DRAIN {
                let event = match set.wait(0) {
                    Ok(Some(event)) => event,
                    Ok(None) => return None,
                    Err(error) => return Some(error),
                };
                if event.event_type != EVENT_TYPE_XID_CRITICAL_ERROR {
                    continue;
                }
                let position = devices
                    .iter()
                    .position(|d| d.as_ref() == Some(&event.device))
                    .or_else(|| {
                        let uuid = event.device.uuid().ok()?;
                        self.uuids.iter().position(|u| *u == uuid)
                    });
                match position {
                    Some(position) => seen(position, event.event_data),
                    None => tracing::debug!(
                        xid = event.event_data,
                        "XID on a GPU that is not watched; ignored"
                    ),
                }
            }
            None
        });
        if let Some(error) = failed {
            tracing::debug!(%error, "waiting for XID events failed; the event set is built again at the next scrape");
            self.events = Events::Broken;
        }
    }
}

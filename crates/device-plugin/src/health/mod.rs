//! Device health: a board of per-unit health that the NVML event loop writes and the
//! gRPC server reads.
//!
//! Health is kept per physical [`Unit`] (a GPU or a MIG device), never per replica, so
//! every time-sliced replica of a unit reports the same health. A GPU-wide fault marks
//! the GPU and every MIG device on it. Every change bumps a generation counter on a
//! `tokio::sync::watch` channel so each `ListAndWatch` stream resends its list at once.
//!
//! [`run`] is the event loop that writes the board (XID events, lost GPUs, recovery);
//! [`monitor`] documents the policy and where it differs from NVIDIA's plugin.

pub mod monitor;

pub use monitor::{HealthError, WatchOptions, run};

use std::collections::BTreeMap;
use std::sync::Mutex;

use serde::Serialize;
use tokio::sync::watch;

use super::resources::Unit;

/// The health of one unit, with the reason it was last marked unhealthy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub enum UnitHealth {
    Healthy,
    Unhealthy {
        reason: String,
        /// The XID that caused it, when an XID did.
        xid: Option<u64>,
    },
}

impl UnitHealth {
    pub fn is_healthy(&self) -> bool {
        matches!(self, UnitHealth::Healthy)
    }
}

/// Shared, thread-safe health of every advertised unit. Cheap to read.
#[derive(Debug)]
pub struct HealthBoard {
    units: Mutex<BTreeMap<Unit, UnitHealth>>,
    changed: watch::Sender<u64>,
}

impl HealthBoard {
    /// A board where every given unit starts healthy.
    pub fn new(units: impl IntoIterator<Item = Unit>) -> Self {
        let units = units
            .into_iter()
            .map(|u| (u, UnitHealth::Healthy))
            .collect();
        let (changed, _) = watch::channel(0);
        Self {
            units: Mutex::new(units),
            changed,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Unit, UnitHealth>> {
        // A panic while holding the lock cannot leave the map half-updated (each
        // update is one insert), so a poisoned lock is still safe to use.
        self.units.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether a unit is healthy. Units the board does not know are unhealthy.
    pub fn is_healthy(&self, unit: Unit) -> bool {
        self.lock().get(&unit).is_some_and(UnitHealth::is_healthy)
    }

    /// The health of one unit, if the board knows it.
    pub fn get(&self, unit: Unit) -> Option<UnitHealth> {
        self.lock().get(&unit).cloned()
    }

    /// Every unit and its health, in unit order.
    pub fn snapshot(&self) -> Vec<(Unit, UnitHealth)> {
        self.lock().iter().map(|(u, h)| (*u, h.clone())).collect()
    }

    /// Sets the health of the listed units; returns whether anything changed (and
    /// then notifies subscribers once).
    pub fn set(&self, units: &[Unit], health: &UnitHealth) -> bool {
        let mut changed = false;
        {
            let mut map = self.lock();
            for unit in units {
                if let Some(current) = map.get_mut(unit)
                    && current != health
                {
                    // A new reason on an already unhealthy unit is kept (the last XID
                    // is what an operator wants to see) but is not a health change.
                    let flips = current.is_healthy() != health.is_healthy();
                    *current = health.clone();
                    changed |= flips;
                }
            }
        }
        if changed {
            self.changed.send_modify(|g| *g += 1);
        }
        changed
    }

    /// The units of a GPU: the GPU itself and every MIG device on it that the board knows.
    pub fn units_of_gpu(&self, gpu: u32) -> Vec<Unit> {
        self.lock()
            .keys()
            .filter(|u| u.gpu == gpu)
            .copied()
            .collect()
    }

    /// A receiver whose value changes whenever some unit's health flips.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(i: u32) -> Unit {
        Unit { gpu: i, mig: None }
    }

    #[test]
    fn flips_notify_and_reasons_do_not() {
        let board = HealthBoard::new([
            gpu(0),
            gpu(1),
            Unit {
                gpu: 1,
                mig: Some(0),
            },
        ]);
        let mut rx = board.subscribe();
        let bad = UnitHealth::Unhealthy {
            reason: "XID 79".into(),
            xid: Some(79),
        };
        assert!(board.set(&board.units_of_gpu(1), &bad));
        assert!(rx.has_changed().unwrap_or(false));
        rx.mark_unchanged();
        assert!(!board.is_healthy(Unit {
            gpu: 1,
            mig: Some(0)
        }));
        assert!(board.is_healthy(gpu(0)));
        let worse = UnitHealth::Unhealthy {
            reason: "XID 48".into(),
            xid: Some(48),
        };
        assert!(!board.set(&[gpu(1)], &worse), "still unhealthy: no flip");
        assert_eq!(board.get(gpu(1)), Some(worse));
        assert!(!rx.has_changed().unwrap_or(true));
        assert!(board.set(&[gpu(1)], &UnitHealth::Healthy));
        assert!(!board.is_healthy(gpu(7)), "unknown units are unhealthy");
    }
}

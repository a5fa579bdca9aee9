// SPDX-License-Identifier: Apache-2.0
//! The device plugin's health event loop (`nvshim_device_plugin::health::run`) against the mock
//! NVML on a simulated 8-GPU node with MIG on GPU 0 (two MIG devices), driven through the
//! node's event file (`<uuid> <xid>`, `<uuid> dbe`, `<uuid> gone`, `wait-error <code>`).
//!
//! The mock reads its config from the environment at `nvmlInit` and keeps one state per
//! process, so each test builds its node and re-runs this binary, filtered to itself, as a
//! child with the node's env; the child runs the loop on a thread and polls the board.
//! Each test gets its own node: an event set reads the event file from its start, so one
//! loop per node keeps earlier lines from being delivered twice.
//!
//! Negative cases ("stays healthy") append a fatal XID on another GPU after the line under
//! test and wait for that one: the loop handles events in file order, so once the sentinel
//! has landed, the line before it has been handled too.

use std::collections::BTreeSet;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use nvshim::inventory::{self, Inventory};
use nvshim::nvml::Nvml;
use nvshim_device_plugin::config::HealthChecks;
use nvshim_device_plugin::health::{self, HealthBoard, UnitHealth, WatchOptions};
use nvshim_device_plugin::resources::Unit;
use nvshim_testkit::{Artifacts, NodeSpec, SimNode};

type Error = Box<dyn std::error::Error>;
type TestResult = Result<(), Error>;

/// Set in a child to the name of the test it runs.
const CHILD_ENV: &str = "NVSHIM_PLUGIN_HEALTH_TEST";
/// Set in a child to the mock NVML library of its node.
const NVML_ENV: &str = "NVSHIM_PLUGIN_HEALTH_NVML";
/// Set in a child to its node's event file.
const EVENTS_ENV: &str = "NVSHIM_PLUGIN_HEALTH_EVENTS";

/// The brief's bound for an event to reach the board. The loop waits 100 ms at a time
/// and the mock looks for new lines every 10 ms, so this leaves wide headroom.
const PROMPTLY: Duration = Duration::from_secs(1);
/// For outcomes that take several re-probe ticks.
const EVENTUALLY: Duration = Duration::from_secs(10);
/// The GPU that carries the sentinel XID of negative cases.
const SENTINEL_GPU: u32 = 7;

/// What a child works with: the loaded mock, the inventory it reports, the event file.
struct Node {
    nvml: Nvml,
    inventory: Inventory,
    events: PathBuf,
}

impl Node {
    fn uuid(&self, gpu: u32) -> Result<&str, Error> {
        self.inventory
            .gpus
            .iter()
            .find(|g| g.index == gpu)
            .map(|g| g.uuid.as_str())
            .ok_or_else(|| format!("no GPU {gpu} in the inventory").into())
    }

    fn mig_uuid(&self, gpu: u32, mig: u32) -> Result<&str, Error> {
        self.inventory
            .gpus
            .iter()
            .find(|g| g.index == gpu)
            .and_then(|g| g.mig_devices.iter().find(|m| m.index == mig))
            .map(|m| m.uuid.as_str())
            .ok_or_else(|| format!("no MIG device {gpu}:{mig} in the inventory").into())
    }

    /// Appends `line` and its newline to the event file in one write.
    fn append(&self, line: &str) -> TestResult {
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&self.events)?;
        file.write_all(format!("{line}\n").as_bytes())?;
        Ok(())
    }

    /// Appends a fatal XID on [`SENTINEL_GPU`] and waits until it has landed.
    fn sentinel(&self, board: &HealthBoard) -> TestResult {
        self.append(&format!("{} 79", self.uuid(SENTINEL_GPU)?))?;
        eventually(board, PROMPTLY, "the sentinel XID on GPU 7", |b| {
            !b.is_healthy(gpu(SENTINEL_GPU))
        })
    }

    /// Every unit a mixed-strategy plugin would track: each GPU and each MIG device.
    fn units(&self) -> Vec<Unit> {
        let mut units = Vec::new();
        for g in &self.inventory.gpus {
            units.push(gpu(g.index));
            units.extend(g.mig_devices.iter().map(|m| mig(g.index, m.index)));
        }
        units
    }
}

fn gpu(index: u32) -> Unit {
    Unit {
        gpu: index,
        mig: None,
    }
}

fn mig(gpu: u32, mig: u32) -> Unit {
    Unit {
        gpu,
        mig: Some(mig),
    }
}

/// The parent builds the node and runs the child; the child loads the mock and runs
/// `checks`.
fn in_child(test: &str, checks: impl FnOnce(&Node) -> TestResult) -> TestResult {
    if std::env::var(CHILD_ENV).as_deref() == Ok(test) {
        let nvml = Nvml::load(Path::new(&std::env::var(NVML_ENV)?))?;
        let inventory = inventory::nvml::from_nvml(&nvml)?;
        let node = Node {
            nvml,
            inventory,
            events: PathBuf::from(std::env::var(EVENTS_ENV)?),
        };
        return checks(&node);
    }
    let dir = tempfile::tempdir()?;
    let artifacts = Artifacts::locate()?;
    let sim = SimNode::build(&NodeSpec::with_mig(8), &dir.path().join("node"), &artifacts)?;
    let library = sim
        .lib_dir()
        .join(format!("libnvidia-ml.so.{}", sim.library_version()));
    // The test's name in this binary: its path below the crate (`health::<test>`).
    let module = module_path!().split_once("::").map_or("", |(_, rest)| rest);
    let name = format!("{module}::{test}");
    let mut command = Command::new(std::env::current_exe()?);
    command
        .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
        .envs(sim.env())
        .env(CHILD_ENV, test)
        .env(NVML_ENV, library)
        .env(EVENTS_ENV, sim.dir.join("xid-events"))
        .env_remove("MOCK_NVML_DEV_ROOT");
    let output = command.output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if !output.status.success() || !stdout.contains("1 passed") {
        return Err(format!(
            "child for {test} failed ({})\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
            output.status
        )
        .into());
    }
    Ok(())
}

/// Runs the loop on a thread over a board of all of `node`'s units while `body` runs, then
/// stops it and checks that it ended cleanly.
fn watch(
    node: &Node,
    checks: &HealthChecks,
    options: &WatchOptions,
    body: impl FnOnce(&HealthBoard) -> TestResult,
) -> TestResult {
    let board = HealthBoard::new(node.units());
    let stop = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let looping = scope
            .spawn(|| health::run(&node.nvml, &node.inventory, checks, &board, &stop, options));
        let result = body(&board);
        stop.store(true, Ordering::Relaxed);
        match looping.join() {
            Ok(Ok(())) => result,
            Ok(Err(error)) => Err(error.into()),
            Err(_) => Err("the health loop panicked".into()),
        }
    })
}

/// Polls the board until `done` holds, failing with the board's state after `within`.
fn eventually(
    board: &HealthBoard,
    within: Duration,
    what: &str,
    done: impl Fn(&HealthBoard) -> bool,
) -> TestResult {
    let deadline = Instant::now() + within;
    loop {
        if done(board) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{what}: not seen within {within:?}; board: {:#?}",
                board.snapshot()
            )
            .into());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The units that are not healthy, in unit order.
fn unhealthy(board: &HealthBoard) -> Vec<Unit> {
    board
        .snapshot()
        .into_iter()
        .filter(|(_, h)| !h.is_healthy())
        .map(|(u, _)| u)
        .collect()
}

fn reason(board: &HealthBoard, unit: Unit) -> Option<(String, Option<u64>)> {
    match board.get(unit)? {
        UnitHealth::Healthy => None,
        UnitHealth::Unhealthy { reason, xid } => Some((reason, xid)),
    }
}

/// Options with re-probes every 20 ms and the given quiet period.
fn probing(quiet: Duration) -> WatchOptions {
    WatchOptions {
        reprobe_interval: Duration::from_millis(20),
        recovery_quiet_period: quiet,
        retry_backoff: Duration::from_millis(20),
        ..WatchOptions::default()
    }
}

#[test]
fn a_fatal_xid_marks_its_gpu_promptly() -> TestResult {
    in_child("a_fatal_xid_marks_its_gpu_promptly", |node| {
        let checks = HealthChecks::default();
        watch(node, &checks, &WatchOptions::default(), |board| {
            assert!(unhealthy(board).is_empty(), "all healthy at start");
            let uuid = node.uuid(3)?;
            node.append(&format!("{uuid} 79"))?;
            eventually(board, PROMPTLY, "XID 79 on GPU 3", |b| {
                !b.is_healthy(gpu(3))
            })?;
            assert_eq!(unhealthy(board), [gpu(3)]);
            assert_eq!(
                reason(board, gpu(3)),
                Some((format!("XID 79 on GPU 3 ({uuid})"), Some(79)))
            );
            Ok(())
        })
    })
}

#[test]
fn application_xids_are_ignored() -> TestResult {
    in_child("application_xids_are_ignored", |node| {
        watch(
            node,
            &HealthChecks::default(),
            &WatchOptions::default(),
            |board| {
                // NVIDIA's default ignore list, on GPU 2 and on a MIG device.
                for xid in [13, 31, 43, 45, 68, 109] {
                    node.append(&format!("{} {xid}", node.uuid(2)?))?;
                    node.append(&format!("{} {xid}", node.mig_uuid(0, 1)?))?;
                }
                node.sentinel(board)?;
                assert_eq!(unhealthy(board), [gpu(SENTINEL_GPU)]);
                Ok(())
            },
        )
    })
}

#[test]
fn dp_enable_healthchecks_makes_an_ignored_xid_fatal() -> TestResult {
    in_child(
        "dp_enable_healthchecks_makes_an_ignored_xid_fatal",
        |node| {
            // DP_DISABLE_HEALTHCHECKS=all DP_ENABLE_HEALTHCHECKS=13,79: only those are
            // fatal (79 for the sentinel).
            let checks = HealthChecks {
                disable_all: true,
                enabled: BTreeSet::from([13, 79]),
                ..HealthChecks::default()
            };
            watch(node, &checks, &WatchOptions::default(), |board| {
                node.append(&format!("{} 48", node.uuid(1)?))?;
                node.append(&format!("{} 13", node.uuid(2)?))?;
                node.sentinel(board)?;
                assert_eq!(unhealthy(board), [gpu(2), gpu(SENTINEL_GPU)]);
                assert_eq!(reason(board, gpu(2)).and_then(|(_, xid)| xid), Some(13));
                Ok(())
            })
        },
    )
}

#[test]
fn a_mig_xid_marks_only_its_mig_device() -> TestResult {
    in_child("a_mig_xid_marks_only_its_mig_device", |node| {
        watch(
            node,
            &HealthChecks::default(),
            &WatchOptions::default(),
            |board| {
                let uuid = node.mig_uuid(0, 1)?;
                node.append(&format!("{uuid} 94"))?;
                eventually(board, PROMPTLY, "XID 94 on MIG 0:1", |b| {
                    !b.is_healthy(mig(0, 1))
                })?;
                assert_eq!(unhealthy(board), [mig(0, 1)]);
                assert_eq!(
                    reason(board, mig(0, 1)),
                    Some((format!("XID 94 on MIG device 0:1 ({uuid})"), Some(94)))
                );
                Ok(())
            },
        )
    })
}

#[test]
fn a_gpu_wide_xid_marks_every_mig_device_of_the_gpu() -> TestResult {
    in_child("a_gpu_wide_xid_marks_every_mig_device_of_the_gpu", |node| {
        watch(
            node,
            &HealthChecks::default(),
            &WatchOptions::default(),
            |board| {
                let uuid = node.uuid(0)?;
                node.append(&format!("{uuid} 48"))?;
                eventually(board, PROMPTLY, "XID 48 on GPU 0", |b| {
                    !b.is_healthy(gpu(0))
                })?;
                let all = [gpu(0), mig(0, 0), mig(0, 1)];
                assert_eq!(unhealthy(board), all);
                for unit in all {
                    assert_eq!(
                        reason(board, unit),
                        Some((format!("XID 48 on GPU 0 ({uuid})"), Some(48))),
                        "case {unit:?}"
                    );
                }
                Ok(())
            },
        )
    })
}

#[test]
fn a_double_bit_ecc_error_counts_as_xid_48() -> TestResult {
    in_child("a_double_bit_ecc_error_counts_as_xid_48", |node| {
        watch(
            node,
            &HealthChecks::default(),
            &WatchOptions::default(),
            |board| {
                let uuid = node.uuid(1)?;
                node.append(&format!("{uuid} dbe"))?;
                eventually(board, PROMPTLY, "a DBE on GPU 1", |b| !b.is_healthy(gpu(1)))?;
                assert_eq!(
                    reason(board, gpu(1)),
                    Some((format!("double-bit ECC error on GPU 1 ({uuid})"), None))
                );
                Ok(())
            },
        )
    })
}

#[test]
fn units_recover_after_the_quiet_period() -> TestResult {
    in_child("units_recover_after_the_quiet_period", |node| {
        let options = probing(Duration::from_millis(200));
        watch(node, &HealthChecks::default(), &options, |board| {
            node.append(&format!("{} 79", node.uuid(0)?))?;
            eventually(board, PROMPTLY, "XID 79 on GPU 0", |b| {
                !b.is_healthy(gpu(0))
            })?;
            eventually(
                board,
                EVENTUALLY,
                "GPU 0 and its MIG devices healthy",
                |b| unhealthy(b).is_empty(),
            )
        })
    })
}

#[test]
fn no_recovery_before_the_quiet_period() -> TestResult {
    in_child("no_recovery_before_the_quiet_period", |node| {
        let options = probing(Duration::from_secs(3600));
        watch(node, &HealthChecks::default(), &options, |board| {
            node.append(&format!("{} 79", node.uuid(3)?))?;
            eventually(board, PROMPTLY, "XID 79 on GPU 3", |b| {
                !b.is_healthy(gpu(3))
            })?;
            // Ten re-probe ticks: any of them would have recovered it without the quiet
            // period.
            std::thread::sleep(options.reprobe_interval * 10);
            assert_eq!(unhealthy(board), [gpu(3)]);
            Ok(())
        })
    })
}

#[test]
fn a_gpu_that_disappears_is_gone_for_good() -> TestResult {
    in_child("a_gpu_that_disappears_is_gone_for_good", |node| {
        // No quiet period: only its absence keeps it unhealthy.
        let options = probing(Duration::ZERO);
        watch(node, &HealthChecks::default(), &options, |board| {
            let uuid = node.uuid(5)?;
            node.append(&format!("{uuid} gone"))?;
            eventually(board, EVENTUALLY, "GPU 5 gone", |b| !b.is_healthy(gpu(5)))?;
            std::thread::sleep(options.reprobe_interval * 10);
            assert_eq!(unhealthy(board), [gpu(5)]);
            let (reason, xid) = reason(board, gpu(5)).ok_or("GPU 5 has no reason")?;
            assert!(
                reason.starts_with(&format!("GPU 5 ({uuid}) is gone: ")),
                "{reason}"
            );
            assert!(reason.contains("NVML_ERROR_GPU_IS_LOST"), "{reason}");
            assert_eq!(xid, None);
            Ok(())
        })
    })
}

#[test]
fn a_gpu_that_cannot_register_is_unhealthy() -> TestResult {
    in_child("a_gpu_that_cannot_register_is_unhealthy", |node| {
        // Lost after the inventory was read but before the loop starts, so registering
        // its events fails.
        node.append(&format!("{} gone", node.uuid(6)?))?;
        watch(
            node,
            &HealthChecks::default(),
            &WatchOptions::default(),
            |board| {
                let uuid = node.uuid(6)?;
                eventually(board, PROMPTLY, "GPU 6 unregistered", |b| {
                    !b.is_healthy(gpu(6))
                })?;
                assert_eq!(unhealthy(board), [gpu(6)]);
                let (reason, _) = reason(board, gpu(6)).ok_or("GPU 6 has no reason")?;
                assert!(
                    reason.starts_with(&format!("cannot watch GPU 6 ({uuid}) for health events: ")),
                    "{reason}"
                );
                Ok(())
            },
        )
    })
}

#[test]
fn a_failed_wait_marks_everything_until_the_loop_recovers() -> TestResult {
    in_child(
        "a_failed_wait_marks_everything_until_the_loop_recovers",
        |node| {
            let options = probing(Duration::from_millis(200));
            watch(node, &HealthChecks::default(), &options, |board| {
                node.append("wait-error 999")?;
                let every = node.units();
                eventually(board, PROMPTLY, "every unit unhealthy", |b| {
                    unhealthy(b) == every
                })?;
                let (reason, _) = reason(board, mig(0, 1)).ok_or("MIG 0:1 has no reason")?;
                assert!(
                    reason.starts_with("NVML failed waiting for events: "),
                    "{reason}"
                );
                assert!(reason.contains("NVML_ERROR_UNKNOWN"), "{reason}");
                eventually(board, EVENTUALLY, "every unit healthy again", |b| {
                    unhealthy(b).is_empty()
                })?;
                // The rebuilt event set still delivers.
                node.append(&format!("{} 79", node.uuid(4)?))?;
                eventually(board, PROMPTLY, "XID 79 on GPU 4", |b| {
                    !b.is_healthy(gpu(4))
                })
            })
        },
    )
}

#[test]
fn the_stop_flag_ends_the_loop_promptly() -> TestResult {
    in_child("the_stop_flag_ends_the_loop_promptly", |node| {
        let board = HealthBoard::new(node.units());
        let stop = AtomicBool::new(false);
        let checks = HealthChecks::default();
        let options = WatchOptions::default();
        std::thread::scope(|scope| -> TestResult {
            let looping = scope.spawn(|| {
                health::run(
                    &node.nvml,
                    &node.inventory,
                    &checks,
                    &board,
                    &stop,
                    &options,
                )
            });
            std::thread::sleep(Duration::from_millis(300));
            assert!(!looping.is_finished(), "the loop runs until stopped");
            stop.store(true, Ordering::Relaxed);
            let deadline = Instant::now() + PROMPTLY;
            while !looping.is_finished() {
                if Instant::now() > deadline {
                    return Err(format!("the loop still runs {PROMPTLY:?} after stop").into());
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            match looping.join() {
                Ok(result) => Ok(result?),
                Err(_) => Err("the health loop panicked".into()),
            }
        })
    })
}

#[test]
fn disabled_health_checks_do_not_run() -> TestResult {
    in_child("disabled_health_checks_do_not_run", |node| {
        // DP_DISABLE_HEALTHCHECKS=all: `run` returns at once, without a stop.
        let checks = HealthChecks {
            disable_all: true,
            ..HealthChecks::default()
        };
        let board = HealthBoard::new(node.units());
        node.append(&format!("{} 79", node.uuid(3)?))?;
        let stop = AtomicBool::new(false);
        health::run(
            &node.nvml,
            &node.inventory,
            &checks,
            &board,
            &stop,
            &WatchOptions::default(),
        )?;
        assert!(unhealthy(&board).is_empty());
        Ok(())
    })
}

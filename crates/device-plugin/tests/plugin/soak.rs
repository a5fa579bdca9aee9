// SPDX-License-Identifier: Apache-2.0
//! Load and soak for the device plugin (issue 9, item 6; figures in `docs/soak.md`):
//! `nvidia-device-plugin` as a real process on a simulated 8-GPU node, 50 clients
//! calling `Allocate` back to back over its Unix socket for 60 s, while the fake
//! kubelet (`crate::common::kubelet`) restarts every 5 s: its socket deleted and re-created,
//! which makes the plugin stop its server, remove and re-bind its own socket and
//! register again.
//!
//! After each restart the plugin must register again within [`REREGISTER_WITHIN`],
//! the `ListAndWatch` stream the kubelet held must end, and a new one must list the 8
//! GPUs, as kubelet would open it. Each client keeps one connection and dials again
//! after any failure. At the end:
//! - the plugin is alive, never panicked, and exits 0 on SIGTERM;
//! - the fake kubelet got exactly one registration per kubelet (restarts + 1): the
//!   plugin registers once per kubelet it sees, never more;
//! - every `Allocate` answer named the GPUs asked for, and every failed call or dial
//!   fell in a restart window: from the restart until [`AFTER_REGISTRATION`] past the
//!   plugin's new registration (its server is down for part of that window);
//! - `VmRSS` at the end of the load is within [`RSS_SLACK_KIB`] of `VmRSS` after the
//!   warm-up (the first [`WARM_UP`], two restarts; both sampled under load), and the
//!   thread count is what it was then, under load and after it;
//! - the plugin has no more fds open after the load than before it (each count taken
//!   once closing connections are gone; one kubelet `ListAndWatch` stream open both
//!   times).
//!
//! The figures (calls, errors, window lengths, RSS over time) go to stderr. Timing is
//! reported, never asserted; the bounds above are limits for a debug build on a busy
//! two-core machine.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::kubelet::{FakeKubelet, dial_plugin};
use crate::common::node;
use crate::common::plugin_proc::{PluginProc, node_args};
use nix::sys::signal::Signal;
use nvshim_device_plugin::api::device_plugin_client::DevicePluginClient;
use nvshim_device_plugin::api::{AllocateRequest, ContainerAllocateRequest, Empty};
use nvshim_testkit::NodeSpec;
use tokio::time::{Instant, sleep, sleep_until, timeout};
use tonic::transport::{Channel, Endpoint, Uri};

const CLIENTS: usize = 50;
const DURATION: Duration = Duration::from_secs(60);
const RESTART_EVERY: Duration = Duration::from_secs(5);
/// The bound for registering with a restarted kubelet.
const REREGISTER_WITHIN: Duration = Duration::from_secs(3);
/// How long after its new registration a failure still counts as the restart's.
const AFTER_REGISTRATION: Duration = Duration::from_secs(1);
/// The time before the RSS and thread baseline: two kubelet restarts' worth.
const WARM_UP: Duration = Duration::from_secs(10);
const RSS_SLACK_KIB: u64 = 2 * 1024;
/// A limit for one call or dial, and for start-up and exit.
const LIMIT: Duration = Duration::from_secs(20);
/// How long a client waits before dialling again after a failure.
const REDIAL: Duration = Duration::from_millis(10);
const SAMPLE_EVERY: Duration = Duration::from_secs(1);
/// How long an fd count is watched for its settled value.
const FD_SETTLE: Duration = Duration::from_secs(3);

const GPU_SOCKET: &str = "nvidia-gpu.sock";
const VISIBLE: &str = "NVIDIA_VISIBLE_DEVICES";

/// What the clients saw.
#[derive(Default)]
struct Tally {
    ok: u64,
    /// When each failed call or dial happened and what it was.
    failures: Vec<(Instant, String)>,
    /// Answers that named other GPUs than asked for: never allowed.
    wrong: Vec<String>,
}

/// One restart of the fake kubelet.
struct Restart {
    at: Instant,
    registered: Instant,
}

/// One `/proc/<pid>/status` sample.
struct Sample {
    at: Duration,
    rss_kib: u64,
    threads: u64,
}

/// The plugin under test: `$NVSHIM_TEST_PLUGIN` (a release build, or a deliberately
/// weakened one) or cargo's build of it.
fn plugin_bin() -> PathBuf {
    std::env::var_os("NVSHIM_TEST_PLUGIN").map_or_else(
        || env!("CARGO_BIN_EXE_nvidia-device-plugin").into(),
        PathBuf::from,
    )
}

/// A client on the plugin's socket, or the dial's error.
async fn connect(socket: &Path) -> Result<DevicePluginClient<Channel>, String> {
    let endpoint = Endpoint::from_shared(format!("unix:{}", socket.display()))
        .map_err(|e| e.to_string())?
        .origin(Uri::from_static("http://localhost"))
        .connect_timeout(LIMIT);
    let channel = endpoint.connect().await.map_err(|e| format!("dial: {e}"))?;
    Ok(DevicePluginClient::new(channel))
}

/// Calls `Allocate` until `until`, two GPUs a call, rotating through the node's.
async fn client(n: usize, socket: PathBuf, uuids: Arc<Vec<String>>, until: Instant) -> Tally {
    let mut tally = Tally::default();
    let mut client = None;
    let mut call = n;
    while Instant::now() < until {
        let c = match client.as_mut() {
            Some(c) => c,
            None => match connect(&socket).await {
                Ok(c) => client.insert(c),
                Err(e) => {
                    tally.failures.push((Instant::now(), e));
                    sleep(REDIAL).await;
                    continue;
                }
            },
        };
        let first = call % uuids.len();
        let second = (first + 1 + n % (uuids.len() - 1)) % uuids.len();
        call += 1;
        let asked = vec![uuids[first].clone(), uuids[second].clone()];
        let request = AllocateRequest {
            container_requests: vec![ContainerAllocateRequest {
                devices_ids: asked.clone(),
            }],
        };
        match timeout(LIMIT, c.allocate(request)).await {
            Ok(Ok(answer)) => {
                let answer = answer.into_inner();
                let visible = answer
                    .container_responses
                    .first()
                    .and_then(|r| r.envs.get(VISIBLE))
                    .cloned()
                    .unwrap_or_default();
                let mut got: Vec<&str> = visible.split(',').collect();
                let mut want: Vec<&str> = asked.iter().map(String::as_str).collect();
                got.sort_unstable();
                want.sort_unstable();
                if got == want {
                    tally.ok += 1;
                } else {
                    tally.wrong.push(format!("asked {want:?}, got {visible:?}"));
                }
            }
            Ok(Err(status)) => {
                tally.failures.push((Instant::now(), format!("{status}")));
                client = None;
                sleep(REDIAL).await;
            }
            Err(_) => {
                tally
                    .failures
                    .push((Instant::now(), format!("no answer within {LIMIT:?}")));
                client = None;
            }
        }
    }
    tally
}

/// Opens `ListAndWatch` as kubelet does after a registration; checks its first list.
async fn watch(
    socket: &Path,
    case: &str,
) -> tonic::Streaming<nvshim_device_plugin::api::ListAndWatchResponse> {
    let mut client = dial_plugin(socket).await;
    let mut stream = client
        .list_and_watch(Empty {})
        .await
        .unwrap_or_else(|e| panic!("{case}: ListAndWatch: {e}"))
        .into_inner();
    let first = timeout(LIMIT, stream.message()).await;
    let count = match first {
        Ok(Ok(Some(list))) => list.devices.len(),
        other => panic!("{case}: no first device list: {other:?}"),
    };
    assert_eq!(count, 8, "{case}: devices listed");
    stream
}

/// Samples the plugin's RSS and threads every [`SAMPLE_EVERY`] until `until`.
async fn sample(pid: u32, start: Instant, until: Instant, into: Arc<Mutex<Vec<Sample>>>) {
    let status = format!("/proc/{pid}/status");
    while Instant::now() < until {
        let text = std::fs::read_to_string(&status).unwrap_or_default();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                .unwrap_or(0)
        };
        into.lock().unwrap().push(Sample {
            at: start.elapsed(),
            rss_kib: field("VmRSS:"),
            threads: field("Threads:"),
        });
        sleep(SAMPLE_EVERY).await;
    }
}

/// How many fds the process `pid` has open.
fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// The fewest fds `pid` has open over [`FD_SETTLE`] (a connection that is closing,
/// such as the one the plugin registered over, is not counted), and stops early once
/// that is at most `want`.
async fn settled_fds(pid: u32, want: usize) -> usize {
    let deadline = Instant::now() + FD_SETTLE;
    let mut fewest = open_fds(pid);
    while fewest > want && Instant::now() < deadline {
        sleep(Duration::from_millis(100)).await;
        fewest = fewest.min(open_fds(pid));
    }
    fewest
}

fn secs(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

#[tokio::test]
async fn fifty_allocate_streams_for_60_s_through_a_kubelet_restart_every_5_s() {
    let node = node(&NodeSpec::standard(8));
    let sim = &node.sim;
    let dir = tempfile::tempdir().unwrap();
    let sockets = dir.path().join("plugins");
    std::fs::create_dir(&sockets).unwrap();
    let mut kubelet = FakeKubelet::start(&sockets);
    let mut plugin = PluginProc::spawn(&plugin_bin(), &node_args(sim, &sockets), &sim.env());
    let socket = sockets.join(GPU_SOCKET);
    kubelet.wait_registrations(1, LIMIT).await;
    let mut stream = watch(&socket, "start").await;
    let fds_before = settled_fds(plugin.pid(), 0).await;

    let uuids = Arc::new(
        sim.spec
            .gpus
            .iter()
            .map(|g| g.uuid.clone())
            .collect::<Vec<_>>(),
    );
    let start = Instant::now();
    let until = start + DURATION;
    let clients: Vec<_> = (0..CLIENTS)
        .map(|n| tokio::spawn(client(n, socket.clone(), uuids.clone(), until)))
        .collect();
    let samples = Arc::new(Mutex::new(Vec::new()));
    let sampler = tokio::spawn(sample(plugin.pid(), start, until, samples.clone()));

    let restarts_wanted = (DURATION.as_secs() / RESTART_EVERY.as_secs() - 1) as u32;
    let mut restarts: Vec<Restart> = Vec::new();
    for k in 1..=restarts_wanted {
        sleep_until(start + RESTART_EVERY * k).await;
        let case = format!("restart {k}");
        let at = Instant::now();
        kubelet.restart().await;
        let all = kubelet
            .wait_registrations(k as usize + 1, REREGISTER_WITHIN)
            .await;
        let registered = all[k as usize].at;
        assert!(
            registered >= at.into_std(),
            "{case}: a registration came before the restart"
        );
        // The stream the old kubelet held ends; the new kubelet's lists the GPUs.
        match timeout(LIMIT, stream.message()).await {
            Ok(Err(_) | Ok(None)) => {}
            other => panic!("{case}: the old ListAndWatch stream goes on: {other:?}"),
        }
        stream = watch(&socket, &case).await;
        restarts.push(Restart {
            at,
            registered: registered.into(),
        });
        assert!(
            plugin.exited().is_none(),
            "{case}: the plugin exited\n{}",
            plugin.log()
        );
    }

    let mut tally = Tally::default();
    for c in clients {
        let t = c.await.unwrap();
        tally.ok += t.ok;
        tally.failures.extend(t.failures);
        tally.wrong.extend(t.wrong);
    }
    sampler.await.unwrap();
    let took = start.elapsed();

    // Still one registration per kubelet, a second after the last one.
    sleep(Duration::from_secs(1)).await;
    let registrations = kubelet.registrations();
    let rss_idle = plugin.status_kib("VmRSS").unwrap();
    let threads_idle = plugin.threads().unwrap();
    let fds_end = settled_fds(plugin.pid(), fds_before).await;
    let log = plugin.log();
    assert!(plugin.exited().is_none(), "the plugin exited\n{log}");
    plugin.signal(Signal::SIGTERM);
    let exit = plugin.exit(LIMIT).await;

    // Which restart window each failure falls in, and how far into it.
    let mut per_restart = vec![(0usize, Duration::ZERO); restarts.len()];
    let mut outside = Vec::new();
    for (when, what) in &tally.failures {
        let window = restarts
            .iter()
            .position(|r| *when >= r.at && *when <= r.registered + AFTER_REGISTRATION);
        match window {
            Some(i) => {
                per_restart[i].0 += 1;
                per_restart[i].1 = per_restart[i].1.max(*when - restarts[i].at);
            }
            None => outside.push(format!("{}: {what}", secs(*when - start))),
        }
    }
    let reregister: Vec<Duration> = restarts.iter().map(|r| r.registered - r.at).collect();
    let calls = tally.ok + tally.failures.len() as u64;
    eprintln!(
        "soak_plugin: {CLIENTS} clients for {}: {} Allocate answered ({:.0}/s), {} failed calls or dials ({:.3}%)",
        secs(took),
        tally.ok,
        tally.ok as f64 / took.as_secs_f64(),
        tally.failures.len(),
        100.0 * tally.failures.len() as f64 / calls.max(1) as f64,
    );
    eprintln!(
        "soak_plugin: {} kubelet restarts, {} registrations; re-registered after {}",
        restarts.len(),
        registrations.len(),
        reregister
            .iter()
            .map(|d| secs(*d))
            .collect::<Vec<_>>()
            .join(", ")
    );
    eprintln!(
        "soak_plugin: failures per restart (count, last one after): {}",
        per_restart
            .iter()
            .map(|(n, d)| format!("{n} @ {}", secs(*d)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let mut kinds: std::collections::BTreeMap<String, usize> = Default::default();
    for (_, what) in &tally.failures {
        let kind: String = what.chars().take(100).collect();
        *kinds.entry(kind).or_insert(0) += 1;
    }
    eprintln!("soak_plugin: failures by kind: {kinds:#?}");
    eprintln!("soak_plugin: plugin fds before the load {fds_before}, after it {fds_end}");
    let samples = samples.lock().unwrap();
    let baseline = samples
        .iter()
        .find(|s| s.at >= WARM_UP)
        .map_or((0, 0), |s| (s.rss_kib, s.threads));
    let (rss_end, threads_end) = samples.last().map_or((0, 0), |s| (s.rss_kib, s.threads));
    eprintln!(
        "soak_plugin: VmRSS KiB / threads by second: {}",
        samples
            .iter()
            .map(|s| format!("{:.0}s:{}/{}", s.at.as_secs_f64(), s.rss_kib, s.threads))
            .collect::<Vec<_>>()
            .join(" ")
    );
    eprintln!(
        "soak_plugin: VmRSS after warm-up {} KiB, at the end {} KiB ({:+} KiB), max {} KiB, \
         idle after the load {rss_idle} KiB; threads {} -> {} ({threads_idle} idle)",
        baseline.0,
        rss_end,
        rss_end as i64 - baseline.0 as i64,
        samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
        baseline.1,
        threads_end,
    );

    assert!(tally.wrong.is_empty(), "wrong answers: {:#?}", tally.wrong);
    assert!(tally.ok > 0, "no Allocate answered");
    assert!(
        outside.is_empty(),
        "failures outside a restart window: {outside:#?}"
    );
    assert_eq!(
        registrations.len(),
        restarts.len() + 1,
        "one registration per kubelet"
    );
    for r in &registrations {
        assert_eq!(r.request.resource_name, "nvidia.com/gpu", "{r:?}");
    }
    assert!(!log.contains("panicked"), "the plugin panicked:\n{log}");
    assert!(
        exit.is_some_and(|s| s.success()),
        "SIGTERM after the soak: {exit:?}\n{log}"
    );
    assert!(baseline.0 > 0, "no RSS sample after the warm-up");
    assert!(
        rss_end <= baseline.0 + RSS_SLACK_KIB,
        "VmRSS grew from {} KiB to {rss_end} KiB",
        baseline.0
    );
    assert_eq!(
        threads_end, baseline.1,
        "threads after the warm-up and at the end"
    );
    assert_eq!(threads_idle, baseline.1, "threads after the load");
    assert!(
        fds_end <= fds_before,
        "the plugin had {fds_before} fds open before the load and {fds_end} after it \
         (a kubelet stream open both times)"
    );
}

// SPDX-License-Identifier: Apache-2.0
//! Load and soak for the runtime (issue 9, item 6; figures in `docs/soak.md`): 1,000
//! GPU containers, each `nvidia-container-runtime create` (our runtime edits the
//! bundle, then execs real runc), `runc start` (the container runs `/bin/true`), wait
//! until runc sees it stopped, `runc delete`, by 8 worker threads in parallel on one
//! simulated 8-GPU node. Worker `w` asks for GPU `w` by index, so every worker's
//! injection differs (on the standard node GPU 6 is `/dev/nvidia7`).
//!
//! Each worker owns a bundle (its own copy of a glibc rootfs) and puts back its
//! `config.json` and the rootfs's `/etc/ld.so.cache` before every cycle, as
//! `benches/create.rs` does, so every create does the whole job: load and rewrite the
//! spec, write the links and the linker cache into the rootfs.
//!
//! Afterwards nothing may be left that was not there before:
//! - the host's mount points, as a multiset. The test's directory is first made a
//!   shared mount (as systemd makes `/`; this machine's `/` may be private), so a
//!   mount that escapes a container shows. Other processes' tempdirs and `nsfs`
//!   entries are left out, as in `tests/security/leaks.rs` (S9);
//! - the test process's open file descriptors;
//! - files in the bundles other than `config.json` and `rootfs`, and any file named
//!   `.nvshim-` (our temp files, `src/bundle/dir.rs` and `src/rootfs/mod.rs`) anywhere
//!   in them;
//! - processes whose command line, root or working directory is under the test's
//!   directory (our runtime, runc, `runc init`, containers), and zombies of ours;
//! - containers in the test's runc root (`runc list`) and cgroups named after ours.
//!
//! It runs with every other test (`cargo nextest run`) and prints its progress every
//! 100 cycles on stderr. Timing is reported, never asserted.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::{Node, node};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nvshim_testkit::{NodeSpec, runc_bundle};
use serde_json::Value;

const CYCLES: usize = 1_000;
const WORKERS: usize = 8;
const PROGRESS_EVERY: usize = 100;
/// How long a started `/bin/true` may take to be seen stopped: a limit, not a figure.
const STOP_WITHIN: Duration = Duration::from_secs(20);
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
/// What our temp files' names contain.
const TEMP_MARK: &str = ".nvshim-";

/// `dir` bind-mounted onto itself and made `rshared`, detached again on drop.
struct SharedMount(PathBuf);

impl SharedMount {
    fn new(dir: &Path) -> SharedMount {
        let flags = MsFlags::MS_BIND | MsFlags::MS_REC;
        mount(Some(dir), dir, None::<&str>, flags, None::<&str>).expect("bind the test dir");
        let guard = SharedMount(dir.to_path_buf());
        let flags = MsFlags::MS_SHARED | MsFlags::MS_REC;
        mount(None::<&str>, dir, None::<&str>, flags, None::<&str>).expect("make it rshared");
        guard
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

/// One worker's bundle and what to put back before each cycle.
struct Bundle {
    dir: PathBuf,
    spec: Vec<u8>,
    cache: Vec<u8>,
}

impl Bundle {
    fn new(dir: PathBuf, rootfs: &Path, gpu: usize) -> Bundle {
        let visible = format!("NVIDIA_VISIBLE_DEVICES={gpu}");
        let env = [
            visible.as_str(),
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        ];
        runc_bundle(&dir, rootfs, &["/bin/true"], &env).unwrap();
        Bundle {
            spec: fs::read(dir.join("config.json")).unwrap(),
            cache: fs::read(dir.join("rootfs/etc/ld.so.cache")).unwrap(),
            dir,
        }
    }

    fn reset(&self) {
        fs::write(self.dir.join("config.json"), &self.spec).unwrap();
        fs::write(self.dir.join("rootfs/etc/ld.so.cache"), &self.cache).unwrap();
    }
}

/// The shared part of the soak.
struct Soak {
    node: Node,
    dir: tempfile::TempDir,
    config: PathBuf,
    root: PathBuf,
    /// The container ids' prefix: unique to this process.
    prefix: String,
}

impl Soak {
    fn runc(&self, args: &[&str]) -> Output {
        Command::new("runc")
            .arg("--root")
            .arg(&self.root)
            .args(args)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// `runc state <id>`'s status.
    fn status(&self, id: &str) -> Result<String, String> {
        let out = self.runc(&["state", id]);
        if !out.status.success() {
            return Err(format!("runc state {id}: {}", text(&out.stderr)));
        }
        let state: Value = serde_json::from_slice(&out.stdout).map_err(|e| e.to_string())?;
        Ok(state["status"].as_str().unwrap_or("?").to_string())
    }

    /// One create/start/delete cycle; returns how long the create took.
    fn cycle(
        &self,
        bundle: &Bundle,
        minor: u32,
        errors: &File,
        id: &str,
    ) -> Result<Duration, String> {
        bundle.reset();
        // runc hands its stdio to the container, which outlives `create` until it is
        // started: no pipes here, or waiting for their end would wait for the start.
        errors.set_len(0).unwrap();
        let started = Instant::now();
        let status = Command::new(crate::common::runtime_bin())
            .env_clear()
            .env("PATH", PATH)
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", &self.config)
            .arg("--root")
            .arg(&self.root)
            .args(["create", "--bundle"])
            .arg(&bundle.dir)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(errors.try_clone().unwrap())
            .status()
            .unwrap();
        let created = started.elapsed();
        if !status.success() {
            return Err(format!("create {id}: {status}"));
        }
        // The runtime injected this worker's GPU (and only runc ran the container).
        let spec = fs::read_to_string(bundle.dir.join("config.json")).unwrap();
        let node = format!("\"/dev/nvidia{minor}\"");
        if !spec.contains(&node) || !spec.contains("\"/dev/nvidiactl\"") {
            return Err(format!("create {id}: {node} or nvidiactl not injected"));
        }
        let out = self.runc(&["start", id]);
        if !out.status.success() {
            return Err(format!("start {id}: {}", text(&out.stderr)));
        }
        let deadline = Instant::now() + STOP_WITHIN;
        loop {
            let status = self.status(id)?;
            if status == "stopped" {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("{id} still {status} after {STOP_WITHIN:?}"));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        let out = self.runc(&["delete", id]);
        if !out.status.success() {
            return Err(format!("delete {id}: {}", text(&out.stderr)));
        }
        Ok(created)
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).trim().to_string()
}

/// Host mount points with their counts, leaving out other processes' tempdirs and
/// `nsfs` (network namespaces of other tests' engines).
fn host_mounts(own: &Path) -> BTreeMap<String, usize> {
    let tmp = std::env::temp_dir().join(".tmp").display().to_string();
    let own = own.display().to_string();
    let mut points = BTreeMap::new();
    for line in fs::read_to_string("/proc/self/mountinfo").unwrap().lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let point = left.split(' ').nth(4).unwrap_or("").to_string();
        let fstype = right.split(' ').next().unwrap_or("");
        // The runtime's driver stages are kept on purpose, one per set of driver files
        // (`src/driver_stage/`; their own soak is `driver_stage.rs`).
        let stages = nvshim::config::Config::default().nvshim.driver_stage_dir;
        if (point.starts_with(&tmp) && !point.starts_with(&own))
            || fstype == "nsfs"
            || Path::new(&point).starts_with(&stages)
        {
            continue;
        }
        *points.entry(point).or_insert(0) += 1;
    }
    points
}

fn changed<K: Ord + std::fmt::Debug>(
    before: &BTreeMap<K, usize>,
    after: &BTreeMap<K, usize>,
) -> Vec<String> {
    let keys: std::collections::BTreeSet<&K> = before.keys().chain(after.keys()).collect();
    keys.into_iter()
        .filter_map(|k| {
            let (b, a) = (before.get(k).copied(), after.get(k).copied());
            (b != a).then(|| format!("{k:?}: {} -> {}", b.unwrap_or(0), a.unwrap_or(0)))
        })
        .collect()
}

/// This process's open fds by what they point at, with counts.
fn open_fds() -> BTreeMap<String, usize> {
    let mut fds = BTreeMap::new();
    for entry in fs::read_dir("/proc/self/fd").unwrap().flatten() {
        // The directory handle itself is gone by the time it is read.
        if let Ok(target) = fs::read_link(entry.path()) {
            *fds.entry(target.display().to_string()).or_insert(0) += 1;
        }
    }
    fds
}

/// Processes that point into `dir` (command line, root or cwd), and zombies whose
/// parent is this process.
fn processes_in(dir: &Path) -> Vec<String> {
    let me = std::process::id().to_string();
    let needle = dir.display().to_string();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        let pid = entry.file_name().to_string_lossy().into_owned();
        if pid == me || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let proc = entry.path();
        let cmdline = fs::read(proc.join("cmdline"))
            .map(|c| text(&c).replace('\0', " "))
            .unwrap_or_default();
        let points_in =
            |link: &str| fs::read_link(proc.join(link)).is_ok_and(|p| p.starts_with(dir));
        let stat = fs::read_to_string(proc.join("stat")).unwrap_or_default();
        // `pid (comm) state ppid …`; comm may hold spaces, so split after the last `)`.
        let after = stat.rsplit_once(')').map_or("", |(_, a)| a);
        let fields: Vec<&str> = after.split_whitespace().collect();
        let our_zombie = fields.first() == Some(&"Z") && fields.get(1) == Some(&me.as_str());
        if cmdline.contains(&needle) || points_in("root") || points_in("cwd") || our_zombie {
            found.push(format!(
                "{pid}: {cmdline} ({})",
                fields.first().unwrap_or(&"?")
            ));
        }
    }
    found
}

/// cgroup directories, in every v1 hierarchy and v2, named with `prefix`.
fn cgroups_named(prefix: &str) -> Vec<PathBuf> {
    fn walk(dir: &Path, prefix: &str, depth: u32, found: &mut Vec<PathBuf>) {
        let Ok(entries) = fs::read_dir(dir) else {
            return;
        };
        for entry in entries.flatten() {
            if !entry.file_type().is_ok_and(|t| t.is_dir()) {
                continue;
            }
            let path = entry.path();
            if entry.file_name().to_string_lossy().starts_with(prefix) {
                found.push(path);
            } else if depth > 0 {
                walk(&path, prefix, depth - 1, found);
            }
        }
    }
    let mut found = Vec::new();
    walk(Path::new("/sys/fs/cgroup"), prefix, 4, &mut found);
    found
}

/// Entries in a bundle other than `config.json` and `rootfs`, and every file under it
/// whose name holds [`TEMP_MARK`].
fn leftovers(bundle: &Path) -> Vec<PathBuf> {
    fn walk(dir: &Path, found: &mut Vec<PathBuf>) {
        for entry in fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_name().to_string_lossy().contains(TEMP_MARK) {
                found.push(path.clone());
            }
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                walk(&path, found);
            }
        }
    }
    let mut found: Vec<PathBuf> = fs::read_dir(bundle)
        .unwrap()
        .flatten()
        .filter(|e| !matches!(e.file_name().to_str(), Some("config.json" | "rootfs")))
        .map(|e| e.path())
        .collect();
    walk(bundle, &mut found);
    found
}

fn pct(sorted: &[Duration], p: usize) -> Duration {
    sorted[(sorted.len() - 1) * p / 100]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

#[test]
fn thousand_gpu_containers_by_8_workers_leave_nothing_behind() {
    let node = node(&NodeSpec::standard(8));
    let dir = tempfile::tempdir().unwrap();
    let _shared = SharedMount::new(dir.path());
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, node.sim.runtime_config("runc", None)).unwrap();
    let soak = Soak {
        prefix: format!("nvshim-soak-{}-", std::process::id()),
        root: dir.path().join("runc-root"),
        config,
        dir,
        node,
    };
    let bundles: Vec<(Bundle, u32)> = (0..WORKERS)
        .map(|w| {
            let bundle = Bundle::new(soak.dir.path().join(format!("bundle-{w}")), &rootfs, w);
            (bundle, soak.node.sim.spec.gpus[w].minor)
        })
        .collect();
    let own = [soak.dir.path(), soak.node.sim.dir.as_path()];
    let mounts_before = host_mounts(soak.dir.path());
    let fds_before = open_fds();
    let procs_before: Vec<String> = own.iter().flat_map(|d| processes_in(d)).collect();
    assert!(procs_before.is_empty(), "before: {procs_before:#?}");

    let done = AtomicUsize::new(0);
    let failed = AtomicBool::new(false);
    let start = Instant::now();
    let per_worker = CYCLES / WORKERS;
    let results: Vec<Result<Vec<Duration>, String>> = std::thread::scope(|s| {
        let workers: Vec<_> = bundles
            .iter()
            .enumerate()
            .map(|(w, (bundle, minor))| {
                let (soak, done, failed) = (&soak, &done, &failed);
                s.spawn(move || {
                    let errors_path = soak.dir.path().join(format!("worker-{w}.err"));
                    let errors = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&errors_path)
                        .unwrap();
                    let mut creates = Vec::with_capacity(per_worker);
                    for n in 0..per_worker {
                        if failed.load(Ordering::Relaxed) {
                            break;
                        }
                        let id = format!("{}{w}-{n}", soak.prefix);
                        match soak.cycle(bundle, *minor, &errors, &id) {
                            Ok(took) => creates.push(took),
                            Err(e) => {
                                failed.store(true, Ordering::Relaxed);
                                let stderr = fs::read_to_string(&errors_path).unwrap_or_default();
                                return Err(format!("worker {w}, cycle {n}: {e}\n{stderr}"));
                            }
                        }
                        let total = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if total.is_multiple_of(PROGRESS_EVERY) {
                            eprintln!(
                                "soak_runtime: {total}/{CYCLES} cycles, {:.1} s",
                                start.elapsed().as_secs_f64()
                            );
                        }
                    }
                    Ok(creates)
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let took = start.elapsed();

    // Clean up whatever a failure left, so the checks below report on the rest.
    let listed = soak.runc(&["list", "-q"]);
    let left_containers: Vec<String> = text(&listed.stdout).lines().map(String::from).collect();
    for id in &left_containers {
        soak.runc(&["delete", "--force", id]);
    }
    let errors: Vec<&String> = results.iter().filter_map(|r| r.as_ref().err()).collect();
    assert!(errors.is_empty(), "cycles failed:\n{errors:#?}");
    assert!(
        listed.status.success(),
        "runc list: {}",
        text(&listed.stderr)
    );
    assert!(
        left_containers.is_empty(),
        "containers left: {left_containers:?}"
    );

    let mut creates: Vec<Duration> = results.into_iter().flat_map(Result::unwrap).collect();
    assert_eq!(creates.len(), CYCLES, "every cycle ran");
    creates.sort();
    eprintln!(
        "soak_runtime: {CYCLES} cycles by {WORKERS} workers in {:.1} s ({:.1} cycles/s); \
         create median {}, p99 {}, max {}",
        took.as_secs_f64(),
        CYCLES as f64 / took.as_secs_f64(),
        ms(pct(&creates, 50)),
        ms(pct(&creates, 99)),
        ms(creates[creates.len() - 1]),
    );

    let mounts = changed(&mounts_before, &host_mounts(soak.dir.path()));
    let fds = changed(&fds_before, &open_fds());
    let procs: Vec<String> = own.iter().flat_map(|d| processes_in(d)).collect();
    let cgroups = cgroups_named(&soak.prefix);
    let files: Vec<PathBuf> = bundles
        .iter()
        .flat_map(|(b, _)| leftovers(&b.dir))
        .collect();
    eprintln!(
        "soak_runtime: leaks: {} mounts, {} fds ({} open), {} processes, {} cgroups, {} files",
        mounts.len(),
        fds.len(),
        fds_before.values().sum::<usize>(),
        procs.len(),
        cgroups.len(),
        files.len()
    );
    assert!(mounts.is_empty(), "host mounts changed: {mounts:#?}");
    assert!(fds.is_empty(), "open fds changed: {fds:#?}");
    assert!(procs.is_empty(), "processes left: {procs:#?}");
    assert!(cgroups.is_empty(), "cgroups left: {cgroups:#?}");
    assert!(files.is_empty(), "files left in the bundles: {files:#?}");
}

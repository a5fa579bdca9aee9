//! S8 (CVE-2024-0132/CVE-2025-23359 and the CVE-2026-24260 class: a check-then-use
//! race on image paths; `docs/security.md`): while a container is created, a thread
//! on the host swaps the rootfs's library directory and its `/etc` with symlinks to a
//! host directory, back and forth, as fast as `renameat2(RENAME_EXCHANGE)` goes.
//! Whatever moment our runtime, prestart hook or `link-driver` hook resolves a path
//! at, the host directory must never receive a file, a link or a mount. A create that
//! fails because the tree changed under it is allowed; an escape is not.
//!
//! 50 containers per path; the links are absolute or `..`-climbing. Their in-root
//! meaning exists (an empty directory), so resolving through a link at the wrong
//! moment still succeeds inside the root; a build that followed the link on the host
//! side would write there.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;

use crate::harness::{Job, LIB, Lab, Sentinel, Snapshot, Via, climbing, no_host_mounts_under};
use nix::fcntl::{RenameFlags, renameat2};
use serde_json::Value;

const ROUNDS: usize = 50;

/// Exchanges each `(dir, name)` with `name.swap` in `dir` until stopped.
struct Swapper {
    stop: Arc<AtomicBool>,
    thread: JoinHandle<u64>,
}

impl Swapper {
    fn start(pairs: Vec<(PathBuf, &'static str)>) -> Swapper {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let dirs: Vec<(fs::File, &str, String)> = pairs
                .iter()
                .map(|(dir, name)| (fs::File::open(dir).unwrap(), *name, format!("{name}.swap")))
                .collect();
            let mut swaps = 0;
            while !flag.load(Ordering::Relaxed) {
                for (dir, name, swap) in &dirs {
                    let done =
                        renameat2(dir, *name, dir, swap.as_str(), RenameFlags::RENAME_EXCHANGE);
                    swaps += u64::from(done.is_ok());
                }
            }
            swaps
        });
        Swapper { stop, thread }
    }

    /// Stops the thread; returns how many exchanges it made.
    fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap()
    }
}

/// Puts `name.swap` next to `rel` (a directory of the rootfs): a symlink to the host
/// sentinel, absolute or climbing.
fn plant(rootfs: &Path, rel: &str, s: &Sentinel, climb: bool) {
    let target = if climb {
        climbing(&s.dir)
    } else {
        s.dir.clone()
    };
    std::os::unix::fs::symlink(target, rootfs.join(format!("{rel}.swap"))).unwrap();
}

/// The installed runc's version when it is one that creates missing mount
/// destinations with a check on a path string and then a create on the same string:
/// runc before 1.1.14 and 1.2.0-rc1/rc2 (CVE-2024-45310, GHSA-jfvp-7x6p-h2pv). Under
/// this race such a runc can leave an *empty* file on the host where a mount
/// destination of `config.json` would go. That is runc's own mountpoint creation, not
/// a file we write: the runtime and CDI paths hand their mounts to runc, while our
/// prestart hook creates its mountpoints itself (and gets no such allowance).
fn runc_with_mkdirall_race() -> Option<String> {
    let out = std::process::Command::new("runc")
        .arg("--version")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    let version = text
        .lines()
        .next()?
        .strip_prefix("runc version ")?
        .trim()
        .to_string();
    let numbers: Vec<u32> = version
        .split(|c: char| !c.is_ascii_digit())
        .take(3)
        .map(|n| n.parse().unwrap_or(0))
        .collect();
    let old = numbers.as_slice() < [1, 1, 14].as_slice()
        || version.starts_with("1.2.0-rc1")
        || version.starts_with("1.2.0-rc2");
    old.then_some(version)
}

/// Removes what runc's mountpoint race left in the sentinel (see
/// [`runc_with_mkdirall_race`]) and returns it; anything else stays for the caller's
/// check to fail on. Through a swapped directory (`/etc` or the library directory) a
/// mount destination below it lands at the same place below the sentinel: an empty
/// file, and for a nested destination (`/etc/vulkan/icd.d/nvidia_icd.json`, with
/// `graphics`) the directories runc made on the way to it.
fn take_runc_mountpoints(s: &Sentinel, before: &Snapshot, spec: &Value) -> Vec<String> {
    let destinations: Vec<PathBuf> = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|m| {
            let dest = Path::new(m["destination"].as_str()?);
            ["/etc", &format!("/{LIB}")]
                .iter()
                .find_map(|dir| dest.strip_prefix(dir).ok())
                .map(Path::to_path_buf)
        })
        .collect();
    let snapshot = s.snapshot();
    let new = |path: &Path| !before.entries().contains_key(path);
    let is = |path: &Path, kind: &str| {
        snapshot
            .entries()
            .get(path)
            .is_some_and(|what| what.starts_with(kind))
    };
    let mut taken = Vec::new();
    for rel in destinations {
        let path = s.dir.join(&rel);
        if new(&path) && is(&path, "file \"\" ") {
            fs::remove_file(&path).unwrap();
            taken.push(rel.display().to_string());
        }
        // The directories runc made on the way, with or without the file at the end
        // (only mount destinations' parents: none of our writes has such a parent).
        // Deepest first, so a directory is empty once its runc-made children are gone.
        for d in path
            .ancestors()
            .skip(1)
            .take_while(|d| *d != s.dir.as_path())
        {
            if new(d) && is(d, "dir ") && fs::remove_dir(d).is_ok() {
                taken.push(format!("{}/", d.strip_prefix(&s.dir).unwrap().display()));
            }
        }
    }
    taken
}

fn race(via: Via) {
    let lab = Lab::build();
    let s = Sentinel::create();
    fs::write(s.dir.join("ld.so.cache"), "HOST CACHE").unwrap();
    let before = s.snapshot();
    let env = ["NVIDIA_VISIBLE_DEVICES=0"];
    let script = format!("test -e /{LIB}/libcuda.so.1 && echo linked; true");
    let (mut ran, mut total, mut runc_escapes) = (0, 0, 0);
    let runc = runc_with_mkdirall_race();
    for round in 0..ROUNDS {
        let case = format!("S8 via {via:?}, round {round}");
        let pending = lab.stage(&Job::new(via, &env, &script), |rootfs, _| {
            fs::create_dir_all(rootfs.join(s.rel())).unwrap();
            plant(rootfs, LIB, &s, round % 4 == 1);
            plant(rootfs, "etc", &s, round % 4 == 2);
        });
        let rootfs = pending.rootfs();
        // Odd rounds also swap the library directory, where runc makes its mountpoints
        // (and mostly fails under the race); even rounds swap only /etc, which runc
        // leaves alone, so the CDI hook after runc's mounts is raced too.
        let mut pairs = vec![(rootfs.clone(), "etc")];
        if round % 2 == 1 {
            pairs.push((rootfs.join("usr/lib"), "x86_64-linux-gnu"));
        }
        let swapper = Swapper::start(pairs);
        let run = pending.launch();
        let swaps = swapper.stop();
        assert!(swaps > 0, "{case}: the race never ran");
        total += swaps;
        if let Some(version) = runc.as_ref().filter(|_| via != Via::Hook) {
            for name in take_runc_mountpoints(&s, &before, &run.spec()) {
                eprintln!(
                    "{case}: runc {version} (CVE-2024-45310) created an empty {name} on the host"
                );
                runc_escapes += 1;
            }
        }
        s.assert_untouched(&before, &case);
        no_host_mounts_under(&run.bundle, &case);
        let ok = run.ran(&case);
        if !ok {
            eprintln!("{case}: {}", run.stderr().lines().last().unwrap_or(""));
        }
        ran += usize::from(ok);
    }
    eprintln!(
        "S8 via {via:?}: {ran}/{ROUNDS} containers ran, {total} directory swaps, no escape \
         of ours, {runc_escapes} empty mountpoints from runc {}",
        runc.as_deref().unwrap_or("(not affected)")
    );
}

#[test]
fn s8_directory_swap_race_runtime() {
    race(Via::Runtime);
}

#[test]
fn s8_directory_swap_race_prestart_hook() {
    race(Via::Hook);
}

#[test]
fn s8_directory_swap_race_cdi_link_driver() {
    race(Via::Cdi);
}

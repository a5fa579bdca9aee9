//! `kill -9` of the runtime at random points of a `create` (8 GPUs, all requested):
//! afterwards `config.json` is always either the original bytes or exactly the fully
//! injected file, never a part of one, and the temp files a killed runtime leaves are
//! cleaned up by the next create of that bundle.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::kit::{Host, finish, stderr, temp_files};

const KILLS: usize = 200;

/// xorshift64*: enough randomness for kill delays, seeded per run and printed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n.max(1)
    }
}

#[test]
fn kill_9_during_create_never_leaves_a_partial_config_json() {
    let host = Host::new(8);
    // runc is `true`, which exits at once: the kill window is the runtime's own work.
    let runc = format!("runtimes = [\"{}\"]", host.fake_runc().display());
    host.write_config(
        &host
            .default_config()
            .replace(&runc, "runtimes = [\"/bin/true\"]"),
    );
    let bundle = host.bundle("b", &["NVIDIA_VISIBLE_DEVICES=all"]);
    let config = bundle.join("config.json");
    let original = fs::read(&config).unwrap();
    let args = ["create", "--bundle", bundle.to_str().unwrap(), "c"];

    // The fully injected file, and how long a whole create takes.
    let mut injected: Option<Vec<u8>> = None;
    let mut took = Vec::new();
    for run in 0..5 {
        fs::write(&config, &original).unwrap();
        let start = Instant::now();
        let out = host.runtime("reference", &args);
        took.push(start.elapsed());
        assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
        let now = fs::read(&config).unwrap();
        assert_ne!(now, original, "the create injected");
        if let Some(first) = &injected {
            assert!(
                *first == now,
                "run {run}: the same input gives the same file"
            );
        }
        injected = Some(now);
    }
    let injected = injected.unwrap();
    took.sort();
    let whole = took[took.len() / 2];

    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    let mut rng = Rng(seed);
    // One kill after `delay`: whether config.json was still the original, and whether the
    // runtime died between creating its temp file and renaming it.
    let mut kill_after = |i: usize, window: Duration| -> (bool, bool) {
        fs::write(&config, &original).unwrap();
        let mut child = host.command(&args).spawn().unwrap();
        let its_temp = format!(".config.json.nvshim-{}-", child.id());
        let delay = Duration::from_micros(rng.below(window.as_micros() as u64));
        std::thread::sleep(delay);
        // SIGKILL; a runtime that has already exec'd runc (or exited) is fine too.
        let _ = child.kill();
        let _ = finish("killed create", child);
        let now = fs::read(&config).unwrap();
        let mid_save = crate::kit::entries(&bundle)
            .iter()
            .any(|n| n.starts_with(&its_temp));
        if now == original {
            return (true, mid_save);
        }
        let parsed = serde_json::from_slice::<serde_json::Value>(&now).is_ok();
        assert!(
            now == injected,
            "kill {i} after {delay:?} (seed {seed:#x}, window {window:?}): config.json is \
             neither the original nor the injected file ({} bytes, parses: {parsed})",
            now.len()
        );
        (false, mid_save)
    };
    // Half the kills over the whole create, which tells how long the runtime takes to
    // rename the file (the share of kills that found the original); the other half over
    // 1.5 times that, so that a fast runtime is hit in its work as often as a slow one.
    let (mut kept, mut mid_save) = (0, 0);
    let mut window = whole;
    for i in 0..KILLS {
        if i == KILLS / 2 {
            let before_rename = whole * kept / (KILLS as u32 / 2);
            window = (before_rename * 3 / 2).max(Duration::from_micros(100));
        }
        let (k, m) = kill_after(i, window);
        kept += u32::from(k);
        mid_save += u32::from(m);
    }
    eprintln!(
        "{KILLS} kills (seed {seed:#x}) within {whole:?}, then {window:?}: {kept} found the \
         original, {} the injected file; {mid_save} came between the temp file and the rename",
        KILLS as u32 - kept
    );
    let in_bundle = |t: &Vec<PathBuf>| -> Vec<PathBuf> {
        t.iter()
            .filter(|p| p.parent() == Some(bundle.as_path()))
            .cloned()
            .collect()
    };
    // Each create removes what the killed ones before it left in the bundle; the rootfs
    // (the driver's links and linker cache, `src/rootfs`) has no such sweep.
    let left = temp_files(&bundle);
    eprintln!(
        "temp files after the kills: {} in the bundle, {} in the rootfs",
        in_bundle(&left).len(),
        left.len() - in_bundle(&left).len()
    );

    // The next create of the bundle cleans up after the killed ones.
    fs::write(&config, &original).unwrap();
    let out = host.runtime("after the kills", &args);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(
        fs::read(&config).unwrap() == injected,
        "a clean create again"
    );
    assert_eq!(
        in_bundle(&temp_files(&bundle)),
        Vec::<PathBuf>::new(),
        "stale config.json temp files removed"
    );
}

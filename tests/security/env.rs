//! S6, NVIDIAScape (CVE-2025-23266, `docs/security.md`): the image sets
//! `ENV LD_PRELOAD=/proc/self/cwd/poc.so` and ships `poc.so`. In NVIDIA's toolkit a
//! `createContainer` hook without an `env` of its own inherited that variable from
//! runc (which loads the container's env before it runs those hooks), its cwd was the
//! rootfs, and the dynamically linked hook loaded the image's code as root with the
//! host filesystem in reach.
//!
//! Here the payload is a real shared object whose constructor appends to a marker
//! file at an absolute path that exists only on the host (a sentinel directory that
//! the rootfs lacks). It sits at the rootfs's root, in the bundle directory, and in
//! the host directory itself, and `LD_PRELOAD`/`LD_LIBRARY_PATH` name all three ways
//! to it. After a GPU container through our runtime, our prestart hook and our CDI
//! spec's `nvshim hook link-driver` (a dynamically linked binary in this build), the
//! marker must not exist. Inside the container the preload may run (busybox is
//! static here, so it does not): the marker path does not exist there.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::process::Command;

use crate::harness::{Job, Lab, Sentinel, Via, build_poc, nvidia_nodes};

#[test]
fn s6_image_ld_preload_never_runs_in_our_processes() {
    let lab = Lab::build();
    let s = Sentinel::create();
    let marker = s.dir.join("pwned");
    let poc = build_poc(&s.dir, &marker);
    // The payload is live: a host program that loads it leaves the marker.
    let out = Command::new("/bin/true")
        .env("LD_PRELOAD", &poc)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let fired = fs::read_to_string(&marker).expect("the payload did not fire on the host");
    assert!(fired.contains("loaded into"), "{fired}");
    fs::remove_file(&marker).unwrap();
    let before = s.snapshot();

    let preload = format!("LD_PRELOAD=/proc/self/cwd/poc.so:{}", poc.display());
    let library_path = format!("LD_LIBRARY_PATH=/proc/self/cwd:{}", s.dir.display());
    let env = [
        "NVIDIA_VISIBLE_DEVICES=0",
        "NVIDIA_DRIVER_CAPABILITIES=all",
        preload.as_str(),
        library_path.as_str(),
        "LD_AUDIT=/proc/self/cwd/poc.so",
    ];
    for via in Via::ALL {
        let case = format!("S6 via {via:?}");
        let run = lab.run(&Job::new(via, &env, "ls /dev"), |rootfs, _| {
            for to in [
                rootfs.join("poc.so"),
                rootfs.parent().unwrap().join("poc.so"),
            ] {
                fs::copy(&poc, to).unwrap();
            }
        });
        assert!(
            !marker.exists(),
            "{case}: the image's LD_PRELOAD ran on the host: {}",
            fs::read_to_string(&marker).unwrap_or_default()
        );
        s.assert_untouched(&before, &case);
        let out = run.ok(&case);
        assert!(
            nvidia_nodes(&out).contains(&lab.gpu_node(0)),
            "{case}: no GPU: {out}"
        );
        let inside = run.rootfs().join(marker.strip_prefix("/").unwrap());
        assert!(!inside.exists(), "{case}: {} exists", inside.display());
        // runc runs createContainer hooks with the container's env loaded: every hook
        // in the final spec (the spec's link-driver, the runtime's params cover, the
        // test's prestart hook) carries an env of its own.
        let spec = run.spec();
        for (kind, hooks) in spec["hooks"].as_object().into_iter().flatten() {
            for hook in hooks.as_array().unwrap() {
                assert!(
                    hook["env"].as_array().is_some_and(|e| !e.is_empty()),
                    "{case}: a {kind} hook without its own env: {hook}"
                );
            }
        }
    }
}

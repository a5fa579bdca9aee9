//! Attack scenarios on the files we write into a rootfs (`docs/security.md`): the
//! driver's soname links and the `ld.so.cache` merge, written from the host side by
//! our runtime, inside the container's mount namespace by our prestart hook, and by
//! the CDI spec's `nvshim hook link-driver`:
//! - S3 (CVE-2024-0134, `create-symlinks`): the links' parent directory is a symlink
//!   to a host directory (absolute, `..`-climbing, or `/`), or a link name is already
//!   a symlink to a host file: no link is created on the host, the host file is
//!   untouched, and a container that runs has the links inside its rootfs;
//! - S7 (CVE-2025-23267, `update-ldcache`): `/etc/ld.so.cache`, `/etc/ld.so.conf(.d)`
//!   or `/etc` itself is a symlink to host files: their content, inode and mtime stay
//!   as they were, and a container that runs has a real cache of its own.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::Path;

use crate::harness::{
    Job, LIB, Lab, Sentinel, Via, climbing, move_behind_link, no_host_mounts_under,
    replace_with_link,
};

type Prepare = fn(&Path, &Sentinel);

/// Runs each layout through every path; `check` looks at a container that ran. A
/// layout marked `must_run` has a plain in-root meaning, so every path must run it;
/// the others may also fail cleanly.
fn layouts(
    lab: &Lab,
    id: &str,
    script: &str,
    cases: &[(&str, Prepare, bool)],
    check: fn(&str, &str),
) {
    let env = ["NVIDIA_VISIBLE_DEVICES=0"];
    for (name, prepare, must_run) in cases {
        for via in Via::ALL {
            let case = format!("{id} {name} via {via:?}");
            let s = Sentinel::create();
            fs::write(s.dir.join("ld.so.cache"), "HOST CACHE").unwrap();
            fs::write(s.dir.join("ld.so.conf"), "include /host/*.conf\n").unwrap();
            let host_root_links = ["/libcuda.so.1", "/libcuda.so", "/ld.so.cache"];
            for path in host_root_links {
                assert!(
                    fs::symlink_metadata(path).is_err(),
                    "{path} exists on the host"
                );
            }
            let before = s.snapshot();
            let run = lab.run(&Job::new(via, &env, script), |rootfs, _| {
                prepare(rootfs, &s)
            });
            s.assert_untouched(&before, &case);
            no_host_mounts_under(&run.bundle, &case);
            for path in host_root_links {
                assert!(
                    fs::symlink_metadata(path).is_err(),
                    "{case}: {path} was created on the host"
                );
            }
            let ok = run.ran(&case);
            let stderr = run.stderr();
            eprintln!(
                "{case}: {}",
                if ok {
                    "ran"
                } else {
                    stderr.lines().last().unwrap_or("")
                }
            );
            assert!(ok || !must_run, "{case}: failed: {stderr}");
            if ok {
                check(&case, &run.stdout());
            }
        }
    }
}

#[test]
fn s3_soname_links_never_land_outside_the_root() {
    let lab = Lab::build();
    let script = format!(
        "readlink /{LIB}/libcuda.so.1; test -e /{LIB}/libcuda.so.1 && echo resolves; \
         readlink /{LIB}/libnvidia-ml.so"
    );
    let cases: [(&str, Prepare, bool); 4] = [
        (
            "library dir -> host sentinel, the rootfs holds that path",
            |rootfs, s| move_behind_link(rootfs, LIB, &s.dir, &s.dir),
            true,
        ),
        (
            "library dir -> ../../..(host sentinel), the rootfs holds that path",
            |rootfs, s| move_behind_link(rootfs, LIB, &s.dir, &climbing(&s.dir)),
            true,
        ),
        (
            "library dir -> /",
            |rootfs, _| replace_with_link(rootfs, LIB, Path::new("/")),
            true,
        ),
        (
            "libcuda.so.1 and libnvidia-ml.so are links to a host file",
            |rootfs, s| {
                replace_with_link(
                    rootfs,
                    &format!("{LIB}/libcuda.so.1"),
                    &s.dir.join("secret"),
                );
                let up = climbing(&s.dir.join("secret"));
                replace_with_link(rootfs, &format!("{LIB}/libnvidia-ml.so"), &up);
            },
            true,
        ),
    ];
    layouts(&lab, "S3", &script, &cases, |case, out| {
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(
            lines,
            ["libcuda.so.550.54.15", "resolves", "libnvidia-ml.so.1"],
            "{case}"
        );
    });
}

#[test]
fn s7_linker_cache_links_never_write_host_files() {
    let lab = Lab::build();
    let script =
        "grep -c libcuda.so.1 /etc/ld.so.cache; test -L /etc/ld.so.cache && echo link; true";
    let cases: [(&str, Prepare, bool); 5] = [
        (
            "/etc/ld.so.cache -> a host file",
            |rootfs, s| replace_with_link(rootfs, "etc/ld.so.cache", &s.dir.join("ld.so.cache")),
            true,
        ),
        (
            "/etc/ld.so.cache -> ../../..(a host file)",
            |rootfs, s| {
                replace_with_link(
                    rootfs,
                    "etc/ld.so.cache",
                    &climbing(&s.dir.join("ld.so.cache")),
                )
            },
            true,
        ),
        (
            "/etc/ld.so.cache -> /proc/self/root + a host file",
            |rootfs, s| {
                let target = Path::new("/proc/self/root")
                    .join(s.rel())
                    .join("ld.so.cache");
                replace_with_link(rootfs, "etc/ld.so.cache", &target)
            },
            false,
        ),
        (
            "/etc/ld.so.conf.d -> host dir, /etc/ld.so.conf -> host file",
            |rootfs, s| {
                replace_with_link(rootfs, "etc/ld.so.conf.d", &s.dir);
                replace_with_link(rootfs, "etc/ld.so.conf", &s.dir.join("ld.so.conf"));
            },
            true,
        ),
        (
            "/etc -> host dir holding a cache, the rootfs holds that path",
            |rootfs, s| {
                // The host dir has its own ld.so.cache; so does the image's /etc, moved.
                move_behind_link(rootfs, "etc", &s.dir, &s.dir)
            },
            true,
        ),
    ];
    layouts(&lab, "S7", script, &cases, |case, out| {
        let count: u32 = out.lines().next().unwrap_or("").trim().parse().unwrap_or(0);
        assert!(
            count > 0,
            "{case}: the container's cache lacks libcuda.so.1: {out}"
        );
        assert!(
            !out.contains("link"),
            "{case}: /etc/ld.so.cache is still a link"
        );
    });
}

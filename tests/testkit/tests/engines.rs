// SPDX-License-Identifier: Apache-2.0
//! The glibc rootfs under real `runc`, and the private dockerd and containerd guards: each test
//! runs a container through the real engine and checks that dropping the guard leaves no mount and
//! no process behind. Needs root and runc, dockerd, docker, containerd, ctr and busybox installed;
//! a missing tool fails the test.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use nvshim_testkit::{
    Containerd, Dockerd, GlibcRootfs, TestkitError, glibc_rootfs, runc_bundle, tar_rootfs,
};
use tempfile::TempDir;

/// A dynamically linked host program (coreutils), run from the rootfs at the same path.
const DYNAMIC_PROGRAM: &str = "/usr/bin/id";

/// A container id no other test process uses.
fn unique_id(name: &str) -> String {
    format!("testkit-{}-{name}", std::process::id())
}

fn run_ok(cmd: &mut Command) -> String {
    let out: Output = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A rootfs in `dir/rootfs` with [`DYNAMIC_PROGRAM`] installed.
fn rootfs_with_program(dir: &Path) -> PathBuf {
    let rootfs = dir.join("rootfs");
    GlibcRootfs::new()
        .install(DYNAMIC_PROGRAM, DYNAMIC_PROGRAM)
        .build(&rootfs)
        .unwrap();
    rootfs
}

/// Mount points at or below `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|p| p.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Live processes whose command line mentions `dir`.
fn processes_mentioning(dir: &Path) -> Vec<String> {
    let needle = dir.to_string_lossy().into_owned();
    let mut found = Vec::new();
    for entry in fs::read_dir("/proc").unwrap().flatten() {
        if !entry
            .file_name()
            .to_string_lossy()
            .bytes()
            .all(|b| b.is_ascii_digit())
        {
            continue;
        }
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains(&needle) {
            found.push(format!(
                "{}: {cmdline}",
                entry.file_name().to_string_lossy()
            ));
        }
    }
    found
}

/// Whether `pid` is gone or a zombie.
fn is_dead(pid: u32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .unwrap_or_default()
            .trim()
            .starts_with('Z'),
    }
}

/// A wrapper "runtime" that records `$TESTKIT_MARKER` in `log` and execs runc: proves that the
/// environment given to the guard reaches the OCI runtime.
fn marker_runtime(dir: &Path, log: &Path) -> PathBuf {
    let path = dir.join("marker-runtime");
    let script = format!(
        "#!/bin/sh\necho \"$TESTKIT_MARKER\" >> {}\nexec runc \"$@\"\n",
        log.display()
    );
    fs::write(&path, script).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

#[test]
fn glibc_rootfs_runs_a_dynamic_host_program_under_runc() {
    let tmp = TempDir::new().unwrap();
    let rootfs = rootfs_with_program(tmp.path());
    for top in ["bin", "lib", "lib64"] {
        let host = fs::symlink_metadata(Path::new("/").join(top));
        let inside = fs::symlink_metadata(rootfs.join(top));
        if let Ok(host) = host {
            let host_is_link = host.file_type().is_symlink();
            if host_is_link || top != "lib64" {
                assert_eq!(
                    inside.unwrap().file_type().is_symlink(),
                    host_is_link,
                    "{top}"
                );
            }
        }
    }
    assert!(rootfs.join("etc/ld.so.cache").is_file());

    let bundle = runc_bundle(
        &tmp.path().join("bundle"),
        &rootfs,
        &[
            "/bin/sh",
            "-c",
            "/usr/bin/id -u -n; /sbin/ldconfig -p | grep libc.so.6; echo $TESTKIT_VAR",
        ],
        &["TESTKIT_VAR=from-env"],
    )
    .unwrap();
    let mut runc = Command::new("runc");
    runc.arg("--root")
        .arg(tmp.path().join("runc-state"))
        .arg("run")
        .arg("--bundle")
        .arg(&bundle)
        .arg(unique_id("runc"));
    let out = run_ok(&mut runc);
    let mut lines = out.lines();
    assert_eq!(lines.next(), Some("root"), "{out}");
    assert!(
        lines.next().unwrap_or_default().contains("libc.so.6"),
        "{out}"
    );
    assert_eq!(lines.next(), Some("from-env"), "{out}");
}

#[test]
fn glibc_rootfs_refuses_a_non_empty_dir() {
    let tmp = TempDir::new().unwrap();
    fs::write(tmp.path().join("stray"), "").unwrap();
    let err = glibc_rootfs(tmp.path(), &[]).unwrap_err();
    assert!(matches!(err, TestkitError::DirNotEmpty { .. }), "{err}");
}

#[test]
fn private_dockerd_runs_an_imported_rootfs_and_cleans_up() {
    let tmp = TempDir::new().unwrap();
    let rootfs = rootfs_with_program(tmp.path());
    let tar = tmp.path().join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    let engine_dir = tmp.path().join("docker");
    let marker_log = tmp.path().join("marker.log");
    let runtime = marker_runtime(tmp.path(), &marker_log);
    let config = serde_json::json!({ "runtimes": { "marker": { "path": runtime } } });

    let dockerd = Dockerd::start_with_env(
        &engine_dir,
        &config,
        &[("TESTKIT_MARKER", "seen-by-runtime")],
    )
    .unwrap();
    assert!(["overlay2", "vfs"].contains(&dockerd.storage_driver()));
    dockerd.import(&tar, "testkit-glibc").unwrap();
    let out = run_ok(dockerd.docker().args([
        "run",
        "--rm",
        "testkit-glibc",
        "/bin/busybox",
        "echo",
        "hi",
    ]));
    assert_eq!(out, "hi\n");
    let out = run_ok(dockerd.docker().args([
        "run",
        "--rm",
        "--runtime",
        "marker",
        "testkit-glibc",
        DYNAMIC_PROGRAM,
        "-u",
    ]));
    assert_eq!(out, "0\n");
    let marker = fs::read_to_string(&marker_log).unwrap();
    assert!(marker.contains("seen-by-runtime"), "{marker}");

    // A container still running at drop time must not keep anything alive.
    let id = run_ok(
        dockerd
            .docker()
            .args(["run", "-d", "testkit-glibc", "/bin/sleep", "600"]),
    );
    let pid = run_ok(
        dockerd
            .docker()
            .args(["inspect", "-f", "{{.State.Pid}}", id.trim()]),
    );
    let pid: u32 = pid.trim().parse().unwrap();
    assert!(!is_dead(pid));
    assert!(!mounts_under(&engine_dir).is_empty());
    drop(dockerd);

    assert!(is_dead(pid), "container process {pid} survived");
    assert_eq!(mounts_under(&engine_dir), Vec::<String>::new());
    assert_eq!(processes_mentioning(&engine_dir), Vec::<String>::new());
    tmp.close().unwrap();
}

#[test]
fn private_containerd_runs_a_rootfs_with_ctr_and_cleans_up() {
    let tmp = TempDir::new().unwrap();
    let rootfs = rootfs_with_program(tmp.path());
    let engine_dir = tmp.path().join("containerd");
    let marker_log = tmp.path().join("marker.log");
    let runtime = marker_runtime(tmp.path(), &marker_log);
    let containerd =
        Containerd::start_with_env(&engine_dir, &[("TESTKIT_MARKER", "seen-by-runtime")]).unwrap();

    let mut run = containerd.ctr_run();
    run.args(["--rm", "--rootfs", "--runc-binary"])
        .arg(&runtime)
        .args(["--env", "GREETING=hi"])
        .arg(&rootfs)
        .arg(unique_id("echo"))
        .args(["/bin/sh", "-c", "echo $GREETING; /usr/bin/id -u"]);
    assert_eq!(run_ok(&mut run), "hi\n0\n");
    let marker = fs::read_to_string(&marker_log).unwrap();
    assert!(marker.contains("seen-by-runtime"), "{marker}");

    // Leave a task running: drop must kill it and its shim.
    let mut detached = containerd.ctr_run();
    detached
        .args(["--detach", "--rootfs", "--pid-file"])
        .arg(tmp.path().join("task.pid"))
        .arg(&rootfs)
        .arg(unique_id("sleep"))
        .args(["/bin/sleep", "600"]);
    run_ok(&mut detached);
    let pid: u32 = fs::read_to_string(tmp.path().join("task.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(!is_dead(pid));
    drop(containerd);

    assert!(is_dead(pid), "task process {pid} survived");
    assert_eq!(mounts_under(&engine_dir), Vec::<String>::new());
    assert_eq!(processes_mentioning(&engine_dir), Vec::<String>::new());
    tmp.close().unwrap();
}

#[test]
fn dockerd_start_failure_quotes_the_log_and_leaves_nothing_running() {
    let tmp = TempDir::new().unwrap();
    let engine_dir = tmp.path().join("docker");
    let config = serde_json::json!({ "no-such-option": true });
    let err = Dockerd::start(&engine_dir, &config).unwrap_err();
    assert!(matches!(err, TestkitError::EngineStart { .. }), "{err}");
    assert!(err.to_string().contains("no-such-option"), "{err}");
    assert_eq!(processes_mentioning(&engine_dir), Vec::<String>::new());
    assert_eq!(mounts_under(&engine_dir), Vec::<String>::new());
    tmp.close().unwrap();
}

//! The hook's cgroup v2 device step against the real kernel: a cgroup2 directory with
//! a default-deny device program attached (as runc attaches one), then our grant, then
//! processes in that cgroup opening devices.
//!
//! Devices used (all exist on any Linux host): `/dev/null` 1:3 (the "existing rule"),
//! `/dev/zero` 1:5 (ours), `/dev/full` 1:7 and `/dev/urandom` 1:9 (others). Each probe
//! is a fresh `sh` that moves itself into the cgroups and `exec`s `head -c 0 <dev>`,
//! so the open happens under the cgroup's programs.
//!
//! Needs root and a cgroup2 mount (pure v2, or the unified hierarchy of a hybrid
//! host). Without cgroup2 the tests say so and pass, except under `CI=true`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::sleep;
use std::time::Duration;

use nvshim::hook::cgroup::{self, CharDevice, parse_mountinfo, program, v1, v2};

const NULL: CharDevice = CharDevice { major: 1, minor: 3 };
const ZERO: CharDevice = CharDevice { major: 1, minor: 5 };
const FULL: CharDevice = CharDevice { major: 1, minor: 7 };
const URANDOM: CharDevice = CharDevice { major: 1, minor: 9 };

static IDS: AtomicUsize = AtomicUsize::new(0);

/// A cgroup directory made for one test, removed (after its processes) on drop.
struct Dir(PathBuf);

impl Drop for Dir {
    fn drop(&mut self) {
        for _ in 0..50 {
            if fs::remove_dir(&self.0).is_ok() || !self.0.exists() {
                return;
            }
            sleep(Duration::from_millis(20));
        }
    }
}

/// The mount point of the cgroup2 hierarchy (showing its root), if any.
fn cgroup2() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    parse_mountinfo(&mountinfo)
        .into_iter()
        .find(|m| m.v2 && m.root == "/")
        .map(|m| m.mount_point)
}

/// The v1 devices hierarchy's mount point, on a v1 or hybrid host.
fn devices_v1() -> Option<PathBuf> {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    parse_mountinfo(&mountinfo)
        .into_iter()
        .find(|m| !m.v2 && m.root == "/" && m.options.iter().any(|o| o == "devices"))
        .map(|m| m.mount_point)
}

fn new_dir(under: &Path) -> Dir {
    let n = IDS.fetch_add(1, Ordering::Relaxed);
    let dir = under.join(format!("nvshim-hook-test-{}-{n}", std::process::id()));
    fs::create_dir(&dir).unwrap();
    Dir(dir)
}

/// A cgroup2 directory for this test, or `None` (with a message) when the host has no
/// cgroup2 mount.
fn setup(test: &str) -> Option<Dir> {
    assert!(
        nix::unistd::geteuid().is_root(),
        "{test}: needs root (bpf, cgroupfs)"
    );
    match cgroup2() {
        Some(root) => Some(new_dir(&root)),
        None if std::env::var("CI").as_deref() == Ok("true") => {
            panic!("{test}: cgroup2 is not mounted, and CI=true skips nothing")
        }
        None => {
            eprintln!("{test}: skipped: no cgroup2 filesystem is mounted on this host");
            None
        }
    }
}

/// Opens `dev` from a fresh process in `cgroups`; `Err` carries its stderr.
fn open_in(cgroups: &[&Path], dev: &str) -> Result<(), String> {
    let mut script = String::new();
    for i in 0..cgroups.len() {
        script.push_str(&format!("echo $$ > \"${}/cgroup.procs\" && ", i + 2));
    }
    script.push_str("exec head -c 0 \"$1\"");
    // Pipes, not /dev/null: the probe must not open a device before the one it tests.
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .arg(dev)
        .args(cgroups)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Which of null, zero, full, urandom a process in `cgroups` can open.
fn allowed(cgroups: &[&Path]) -> [bool; 4] {
    ["/dev/null", "/dev/zero", "/dev/full", "/dev/urandom"].map(|dev| match open_in(cgroups, dev) {
        Ok(()) => true,
        Err(e) => {
            assert!(
                e.contains("Operation not permitted"),
                "{dev}: denied for another reason: {e}"
            );
            false
        }
    })
}

#[test]
fn our_device_is_added_and_the_programs_rules_are_kept() {
    let Some(dir) = setup("our_device_is_added_and_the_programs_rules_are_kept") else {
        return;
    };
    let runc_like = program::allow_only(&[NULL]).unwrap();
    let old = v2::attach_program(&dir.0, &runc_like).unwrap();
    assert_eq!(
        allowed(&[&dir.0]),
        [true, false, false, false],
        "the deny-all program with /dev/null allowed"
    );

    let replaced = v2::grant(&dir.0, &[ZERO]).unwrap();
    assert_eq!(replaced.programs.len(), 1, "{replaced:?}");
    assert_eq!(replaced.programs[0].0, old);
    assert_eq!(
        allowed(&[&dir.0]),
        [true, true, false, false],
        "ours allowed, /dev/null kept, the rest still denied"
    );
    // The old program is gone, ours is attached in its place.
    let cg = v2::open_cgroup(&dir.0).unwrap();
    let (_, ids) = v2::query(std::os::fd::AsFd::as_fd(&cg)).unwrap();
    assert_eq!(ids, [replaced.programs[0].1]);

    // Granting again (a second GPU container in the same cgroup) stacks cleanly.
    v2::grant(&dir.0, &[FULL]).unwrap();
    assert_eq!(allowed(&[&dir.0]), [true, true, true, false]);
}

#[test]
fn every_attached_program_is_extended() {
    let Some(dir) = setup("every_attached_program_is_extended") else {
        return;
    };
    // Two programs with ALLOW_MULTI: an access must pass both.
    v2::attach_program(&dir.0, &program::allow_only(&[NULL, ZERO]).unwrap()).unwrap();
    v2::attach_program(&dir.0, &program::allow_only(&[NULL, FULL]).unwrap()).unwrap();
    assert_eq!(allowed(&[&dir.0]), [true, false, false, false]);

    let replaced = v2::grant(&dir.0, &[URANDOM]).unwrap();
    assert_eq!(replaced.programs.len(), 2, "{replaced:?}");
    assert_eq!(
        allowed(&[&dir.0]),
        [true, false, false, true],
        "ours through both; each program still denies what it denied"
    );
}

#[test]
fn a_cgroup_without_a_device_program_is_left_alone() {
    let Some(dir) = setup("a_cgroup_without_a_device_program_is_left_alone") else {
        return;
    };
    let replaced = v2::grant(&dir.0, &[ZERO]).unwrap();
    assert!(replaced.programs.is_empty(), "{replaced:?}");
    assert_eq!(allowed(&[&dir.0]), [true; 4], "v2 restricts nothing");
    let cg = v2::open_cgroup(&dir.0).unwrap();
    let (_, ids) = v2::query(std::os::fd::AsFd::as_fd(&cg)).unwrap();
    assert!(ids.is_empty(), "no program was attached: {ids:?}");
}

/// A stand-in for the container's init: sleeps in the given cgroups until killed.
struct Holder(Child);

impl Holder {
    fn start(cgroups: &[&Path]) -> Holder {
        let child = Command::new("sleep")
            .arg("60")
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        for cg in cgroups {
            fs::write(cg.join("cgroup.procs"), child.id().to_string()).unwrap();
        }
        Holder(child)
    }
    fn pid(&self) -> i32 {
        i32::try_from(self.0.id()).unwrap()
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn grant_by_pid_finds_the_containers_cgroups() {
    let Some(v2_dir) = setup("grant_by_pid_finds_the_containers_cgroups") else {
        return;
    };
    v2::attach_program(&v2_dir.0, &program::allow_only(&[NULL]).unwrap()).unwrap();
    // On a hybrid host the v1 devices controller applies too: set it up as runc does.
    let v1_dir = devices_v1().map(|root| new_dir(&root));
    if let Some(dir) = &v1_dir {
        fs::write(dir.0.join("devices.deny"), "a").unwrap();
        fs::write(dir.0.join("devices.allow"), v1::rule(NULL)).unwrap();
    }
    let mut cgroups: Vec<&Path> = vec![&v2_dir.0];
    cgroups.extend(v1_dir.as_ref().map(|d| d.0.as_path()));
    let holder = Holder::start(&cgroups);
    assert_eq!(allowed(&cgroups), [true, false, false, false]);

    let granted = cgroup::grant(holder.pid(), &[ZERO]).unwrap();
    assert_eq!(
        granted
            .v2
            .as_ref()
            .map(|(dir, r)| (dir.clone(), r.programs.len())),
        Some((v2_dir.0.clone(), 1)),
        "{granted:?}"
    );
    assert_eq!(
        granted.v1,
        v1_dir.as_ref().map(|d| d.0.clone()),
        "{granted:?}"
    );
    if let Some(dir) = &v1_dir {
        let list = fs::read_to_string(dir.0.join("devices.list")).unwrap();
        assert!(list.lines().any(|l| l == "c 1:5 rwm"), "{list}");
    }
    assert_eq!(allowed(&cgroups), [true, true, false, false]);
    drop(holder);
}

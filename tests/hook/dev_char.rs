//! `nvidia-ctk system create-dev-char-symlinks` against the problem it exists for: a
//! `systemctl daemon-reload` rebuilding a running GPU container's device cgroup.
//!
//! With the systemd cgroup driver, runc hands each device rule of the container to
//! systemd as a `DeviceAllow=` entry of the container's transient scope:
//! `/dev/char/<maj>:<min>` for a single character device, `char-<name>` for a whole
//! major. On a reload systemd re-applies the scope's device policy from those entries
//! (the unit file in `/run/systemd/transient` and its drop-ins) alone, and an entry
//! whose `/dev/char` path does not exist is dropped (runc 1.1.3–1.1.6 skip it when
//! writing the unit, systemd before v240 when applying it). The NVIDIA driver makes its
//! nodes without udev, so nothing creates those links: the GPU rules vanish.
//!
//! On the hook path (`docker run --gpus`: the hook makes the nodes and grants them in
//! the cgroup itself; the spec has no GPU rule) nothing of the GPU would reach systemd
//! at all; the hook therefore writes its grants as the scope's drop-in
//! (`hook::systemd_scope`), `/dev/char/<maj>:<min>` entries like runc's.
//!
//! This is an emulation: CI machines have no systemd as PID 1 (nor may a test touch
//! one). The containers run under plain runc with our prestart hook on the simulated
//! node, each in a cgroup named like docker's scope, with the scope's transient unit
//! file written as systemd writes it for runc (in a private `run/systemd`, the hook's
//! `[nvshim] systemd-root`). The "reload" reads the scope's `DeviceAllow=` entries the
//! way systemd does (unit file, then drop-ins in name order; an empty value resets),
//! keeps a `/dev/char` entry only where `<dev root>/dev/char/<maj>:<min>` exists, and
//! writes the result to the container's cgroup the way systemd does (v1: `devices.deny
//! a`, then one `devices.allow` per entry; v2: a device program allowing exactly them,
//! attached beside runc's, as systemd's own program is); then `openprobe` run in the
//! container (`runc exec`) opens the GPU node (`ENXIO` = past the cgroup, `EPERM` =
//! refused).
//!
//! Two containers, both on the hook path:
//! - `--gpus` alone: the GPU entries come from the hook's drop-in only;
//! - `--gpus` plus the GPU rules in `linux.resources.devices` (docker
//!   `--device-cgroup-rule`, what NVIDIA's issue 48 tells docker users to add, or the
//!   device plugin's `--pass-device-specs`): runc's unit has them too.
//!
//! Without links the reload drops the GPU from both; with the links
//! `create-dev-char-symlinks` makes, both keep it.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use nvshim::hook::cgroup::{self, CharDevice, program, v2};
use nvshim_testkit::{NVIDIA_MAJOR, NVIDIA_UVM_MAJOR, NodeSpec, runc_bundle};
use serde_json::{Value, json};

use crate::common::{Node, node};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The rules runc adds to every container (libcontainer's default allowed devices):
/// `(type, major, minor, access)`, `None` for a wildcard.
const RUNC_DEFAULTS: &[(char, Option<u32>, Option<u32>, &str)] = &[
    ('c', None, None, "m"),
    ('b', None, None, "m"),
    ('c', Some(1), Some(3), "rwm"),
    ('c', Some(1), Some(8), "rwm"),
    ('c', Some(1), Some(7), "rwm"),
    ('c', Some(5), Some(0), "rwm"),
    ('c', Some(1), Some(5), "rwm"),
    ('c', Some(1), Some(9), "rwm"),
    ('c', Some(136), None, "rwm"),
    ('c', Some(5), Some(2), "rwm"),
];

/// The nodes `NVIDIA_VISIBLE_DEVICES=1` gets: GPU 1's (minor `minor`), the control
/// node and the UVM nodes.
fn gpu_rules(minor: u32) -> [(u32, u32); 4] {
    [
        (NVIDIA_MAJOR, minor),
        (NVIDIA_MAJOR, 255),
        (NVIDIA_UVM_MAJOR, 0),
        (NVIDIA_UVM_MAJOR, 1),
    ]
}

/// A rule as runc hands it to systemd: `DeviceAllow=<path> <access>`.
fn entry((kind, major, minor, access): (char, Option<u32>, Option<u32>, &str)) -> String {
    let class = if kind == 'c' { "char" } else { "block" };
    match (major, minor) {
        (Some(ma), Some(mi)) => format!("/dev/{class}/{ma}:{mi} {access}"),
        (Some(ma), None) => format!("{class}-{ma} {access}"),
        _ => format!("{class}-* {access}"),
    }
}

/// The inverse of [`entry`], for entries from the unit and its drop-ins.
fn parse_entry(path: &str, access: &str) -> (char, Option<u32>, Option<u32>, String) {
    let num = |n: &str| (n != "*").then(|| n.parse::<u32>().unwrap());
    let access = access.to_owned();
    if let Some(rest) = path.strip_prefix("/dev/char/") {
        let (ma, mi) = rest.split_once(':').unwrap();
        return ('c', num(ma), num(mi), access);
    }
    let (kind, major) = match path.split_once('-').unwrap() {
        ("char", major) => ('c', major),
        ("block", major) => ('b', major),
        other => panic!("unexpected DeviceAllow entry {other:?}"),
    };
    (kind, num(major), None, access)
}

struct Setup {
    node: Node,
    dir: tempfile::TempDir,
    /// `<systemd-root>/run/systemd/transient`: the scopes' unit files and drop-ins.
    transient: PathBuf,
    rootfs: PathBuf,
    config: PathBuf,
    /// GPU 1's minor: its node is `/dev/nvidia<minor>`.
    minor: u32,
}

fn setup() -> Setup {
    let node = node(&NodeSpec::standard(2));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim
        .container_rootfs()
        .install(crate::prestart::probe(dir.path()), "/usr/bin/openprobe")
        .build(&rootfs)
        .unwrap();
    let d = node.sim.dir.display();
    let systemd_root = dir.path().join("systemd");
    let transient = systemd_root.join("run/systemd/transient");
    fs::create_dir_all(&transient).unwrap();
    let config = dir.path().join("config.toml");
    fs::write(
        &config,
        format!(
            "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\n\
             debug = \"{}\"\n\n[nvidia-container-runtime]\nlog-level = \"debug\"\n\n\
             [nvshim]\nproc-root = \"{d}\"\nsystemd-root = \"{}\"\n",
            dir.path().join("hook.log").display(),
            systemd_root.display()
        ),
    )
    .unwrap();
    let minor = node.sim.spec.gpus[1].minor;
    Setup {
        node,
        dir,
        transient,
        rootfs,
        config,
        minor,
    }
}

fn runc(s: &Setup) -> Command {
    let mut cmd = Command::new("runc");
    cmd.env_clear()
        .env("PATH", PATH)
        .arg("--root")
        .arg(s.dir.path().join("runc-root"))
        .stdin(Stdio::null());
    cmd
}

/// A running container (`sleep`) whose prestart hook gave it GPU 1; deleted on drop.
struct Container<'a> {
    s: &'a Setup,
    id: String,
    /// The cgroup's name, `docker-<id>.scope`, as with docker's systemd driver.
    scope: String,
    pid: i32,
}

impl Drop for Container<'_> {
    fn drop(&mut self) {
        let _ = runc(self.s)
            .args(["delete", "--force", &self.id])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Container<'_> {
    fn start<'a>(s: &'a Setup, id: &str, gpu_rules_in_spec: bool) -> Container<'a> {
        let bundle = s.dir.path().join(id);
        runc_bundle(
            &bundle,
            &s.rootfs,
            &["sleep", "600"],
            &["NVIDIA_VISIBLE_DEVICES=1"],
        )
        .unwrap();
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        spec["hooks"] = json!({"prestart": [{
            "path": crate::common::hook_bin(),
            "args": ["nvidia-container-runtime-hook", "prestart"],
            "env": [format!("PATH={PATH}"),
                    format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", s.config.display())],
        }]});
        let mut rules = RUNC_DEFAULTS.to_vec();
        if gpu_rules_in_spec {
            let spec_rules = spec["linux"]["resources"]["devices"]
                .as_array_mut()
                .unwrap();
            for (major, minor) in gpu_rules(s.minor) {
                spec_rules.push(json!({"allow": true, "type": "c", "major": major,
                                       "minor": minor, "access": "rwm"}));
                rules.push(('c', Some(major), Some(minor), "rwm"));
            }
        }
        let id = format!("nvshim-devchar-{}-{id}", std::process::id());
        let scope = format!("docker-{id}.scope");
        spec["linux"]["cgroupsPath"] = json!(format!("/{scope}"));
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        // systemd's transient unit for runc's scope, made before the container starts.
        let mut unit = String::from("[Scope]\nDelegate=yes\nDevicePolicy=strict\n");
        for rule in rules {
            unit += &format!("DeviceAllow={}\n", entry(rule));
        }
        fs::write(s.transient.join(&scope), unit).unwrap();
        // The container's process keeps runc's stdio: a file, not a pipe we would wait on.
        let log = s.dir.path().join(format!("{id}.log"));
        let created = runc(s)
            .args(["create", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .status()
            .unwrap();
        let mut container = Container {
            s,
            id,
            scope,
            pid: 0,
        };
        assert!(
            created.success(),
            "runc create: {}",
            fs::read_to_string(&log).unwrap_or_default()
        );
        let state = runc(s).args(["state", &container.id]).output().unwrap();
        let state: Value = serde_json::from_slice(&state.stdout).unwrap();
        container.pid = i32::try_from(state["pid"].as_i64().unwrap()).unwrap();
        let started = runc(s).args(["start", &container.id]).output().unwrap();
        assert!(
            started.status.success(),
            "runc start: {}",
            String::from_utf8_lossy(&started.stderr)
        );
        container
    }

    /// `openprobe /dev/nvidia<minor>` in the container: `ENXIO`, `EPERM`, ….
    fn open_gpu(&self) -> String {
        let node = format!("/dev/nvidia{}", self.s.minor);
        let out = runc(self.s)
            .args(["exec", &self.id, "openprobe", &node])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "runc exec: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        text.strip_prefix(&format!("{node} "))
            .unwrap_or(&text)
            .to_owned()
    }

    /// The scope's `DeviceAllow=` entries as systemd loads them: the unit file, then its
    /// drop-ins in name order; an empty value resets the list.
    fn device_allow(&self) -> Vec<(char, Option<u32>, Option<u32>, String)> {
        let mut files = vec![self.s.transient.join(&self.scope)];
        if let Ok(dir) = fs::read_dir(self.s.transient.join(format!("{}.d", self.scope))) {
            let mut drop_ins: Vec<PathBuf> = dir
                .map(|e| e.unwrap().path())
                .filter(|p| p.extension().is_some_and(|e| e == "conf"))
                .collect();
            drop_ins.sort();
            files.extend(drop_ins);
        }
        let mut entries = Vec::new();
        for file in files {
            for line in fs::read_to_string(&file).unwrap().lines() {
                let Some(value) = line.strip_prefix("DeviceAllow=") else {
                    continue;
                };
                if value.is_empty() {
                    entries.clear();
                    continue;
                }
                let (path, access) = value.split_once(' ').unwrap();
                entries.push(parse_entry(path, access));
            }
        }
        entries
    }

    /// systemd's re-application of the scope's device policy on `daemon-reload`.
    fn daemon_reload(&self) {
        let dev_char = self.s.node.sim.dir.join("dev/char");
        // What survives: `char-<name>`/wildcard entries always; `/dev/char/M:m` ones only
        // where the path resolves.
        let kept: Vec<_> = self
            .device_allow()
            .into_iter()
            .filter(|(kind, major, minor, _)| match (kind, major, minor) {
                ('c', Some(ma), Some(mi)) => dev_char.join(format!("{ma}:{mi}")).exists(),
                _ => true,
            })
            .collect();
        let proc_cgroup = fs::read_to_string(format!("/proc/{}/cgroup", self.pid)).unwrap();
        let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
        let (v1_dir, v2_dir) = cgroup::locate(&proc_cgroup, &mountinfo).unwrap();
        let mut applied = false;
        if let Some(dir) = v1_dir {
            fs::write(dir.join("devices.deny"), "a").unwrap();
            for (kind, major, minor, access) in &kept {
                let num = |n: &Option<u32>| n.map_or("*".to_owned(), |n| n.to_string());
                let rule = format!("{kind} {}:{} {access}", num(major), num(minor));
                fs::write(dir.join("devices.allow"), rule).unwrap();
            }
            applied = true;
        }
        if let Some(dir) = v2_dir {
            let cg = v2::open_cgroup(&dir).unwrap();
            let (_, ids) = v2::query(std::os::fd::AsFd::as_fd(&cg)).unwrap();
            // v2 restricts devices only where a program is attached (runc's, on a pure v2
            // host); systemd's own program joins it and must allow too.
            if !ids.is_empty() {
                let exact: Vec<CharDevice> = kept
                    .iter()
                    .filter_map(|(kind, major, minor, _)| match (kind, major, minor) {
                        ('c', Some(major), Some(minor)) => Some(CharDevice {
                            major: *major,
                            minor: *minor,
                        }),
                        _ => None,
                    })
                    .collect();
                v2::attach_program(&dir, &program::allow_only(&exact).unwrap()).unwrap();
                applied = true;
            }
        }
        assert!(
            applied,
            "no device cgroup to re-apply (v1 devices or a v2 program) for pid {}",
            self.pid
        );
    }
}

/// Runs our `nvidia-ctk` (a link named so to the `nvshim` binary).
fn nvidia_ctk(s: &Setup, args: &[&str]) -> String {
    let link = s.dir.path().join("nvidia-ctk");
    if !link.exists() {
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nvshim"), &link).unwrap();
    }
    let out = Command::new(&link)
        .env_clear()
        .env("PATH", PATH)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "nvidia-ctk {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn dev_char_links_keep_gpu_access_across_a_systemd_style_reload() {
    let s = setup();
    let sim = s.node.sim.dir.display().to_string();
    let dev_char = format!("{sim}/dev/char");

    let with_rules = Container::start(&s, "rules", true);
    let gpus_only = Container::start(&s, "gpus", false);
    let gpu = format!("DeviceAllow=/dev/char/{NVIDIA_MAJOR}:{} rwm", s.minor);
    for c in [&with_rules, &gpus_only] {
        assert_eq!(
            c.open_gpu(),
            "ENXIO",
            "{}: the hook's grant, before any reload; hook log:\n{}",
            c.id,
            fs::read_to_string(s.dir.path().join("hook.log")).unwrap_or_default()
        );
        // The hook told systemd what it granted: the scope's drop-in.
        let drop_in = s
            .transient
            .join(format!("{}.d", c.scope))
            .join(nvshim::hook::systemd_scope::DROP_IN);
        let text = fs::read_to_string(&drop_in).unwrap_or_default();
        assert!(
            text.starts_with("# nvidia-container-runtime-hook") && text.contains(&gpu),
            "{}: {}: {text:?}",
            c.id,
            drop_in.display()
        );
    }

    // No links yet: the reload drops the GPU entries, runc's and the hook's alike; the
    // kernel refuses the open.
    for c in [&with_rules, &gpus_only] {
        c.daemon_reload();
        assert_eq!(
            c.open_gpu(),
            "EPERM",
            "{}: reload without /dev/char links",
            c.id
        );
    }

    let printed = nvidia_ctk(
        &s,
        &[
            "system",
            "create-dev-char-symlinks",
            "--driver-root",
            &sim,
            "--dev-char-path",
            &dev_char,
        ],
    );
    assert!(
        printed.contains(&format!(
            "created link {dev_char}/{NVIDIA_MAJOR}:{m} -> ../nvidia{m}",
            m = s.minor
        )),
        "{printed}"
    );
    let link = fs::metadata(format!("{dev_char}/{NVIDIA_MAJOR}:{}", s.minor)).unwrap();
    assert!(std::os::unix::fs::FileTypeExt::is_char_device(
        &link.file_type()
    ));

    // With the links: runc's entries keep the GPU of the container with spec rules, the
    // hook's drop-in the GPU of `--gpus` alone.
    for c in [&with_rules, &gpus_only] {
        c.daemon_reload();
        assert_eq!(c.open_gpu(), "ENXIO", "{}: reload with the links", c.id);
    }
}

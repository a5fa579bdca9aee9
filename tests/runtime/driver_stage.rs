// SPDX-License-Identifier: Apache-2.0
//! The driver stage (`src/driver_stage/`) through real runc: a `compute,utility`
//! container gets the driver's files with one mount, at their usual paths, read-only,
//! nosuid, nodev, propagating nowhere, and `ld.so`'s cache names the same paths and
//! reaches the same files (device and inode) as with per-file mounts
//! (`[nvshim] driver-mounts = "per-file"`, which gives NVIDIA's layout back); a file the
//! image has at one of those paths keeps its own mount and its bytes; and the upgrade
//! soak: 1,000 driver upgrades while containers run, each followed by a new stage,
//! leave exactly one stage mounted and the running containers on their own files.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use crate::runc::{E2e, ok, setup};
use nix::mount::{MntFlags, umount2};
use nvshim::cdi::Mount;
use nvshim::driver_stage::{self, CONTAINER_DIR};
use serde_json::{Value, json};

const CAPS: &str = "NVIDIA_DRIVER_CAPABILITIES=compute,utility";
const ALL: &str = "NVIDIA_VISIBLE_DEVICES=all";
/// Each line: a path from the linker cache, where it leads, its device:inode.
const RESOLVE: &str = "ldconfig -p | sed -n 's/.* => //p' | sort -u | while read p; do \
                       echo \"$p $(readlink -f $p) $(stat -L -c %d:%i $p)\"; done; \
                       echo ---; for f in /usr/bin/nvidia-smi /usr/bin/nvidia-debugdump; do \
                       echo \"$f $(readlink $f) $(stat -L -c %d:%i $f)\"; done; \
                       for f in /lib/firmware/nvidia/*/*; do \
                       echo \"$f $(stat -L -c %d:%i $f)\"; done; \
                       echo \"/lib/firmware $(readlink /lib/firmware)\"; \
                       echo ---; cat /proc/self/mountinfo; echo ---; nvidia-smi -L";

/// `extra` appended to the e2e config's `[nvshim]` table.
fn configure(e2e: &E2e, extra: &str) {
    let path = e2e.dir.path().join("config.toml");
    let mut text = fs::read_to_string(&path).unwrap();
    assert!(text.contains("[nvshim]"), "{text}");
    assert!(
        text.trim_end()
            .lines()
            .last()
            .unwrap()
            .starts_with("proc-root"),
        "{text}"
    );
    text.push_str(extra);
    fs::write(&path, text).unwrap();
}

/// The mounts the runtime wrote into the bundle's spec.
fn spec_mounts(bundle: &Path) -> Vec<Value> {
    let spec: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    spec["mounts"].as_array().unwrap().clone()
}

struct MountLine {
    point: String,
    options: String,
    optional: String,
}

fn mountinfo(text: &str) -> Vec<MountLine> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = fields.iter().position(|f| *f == "-")?;
            Some(MountLine {
                point: fields.get(4)?.to_string(),
                options: fields.get(5)?.to_string(),
                optional: fields[6..dash].join(" "),
            })
        })
        .collect()
}

fn section(out: &str, n: usize) -> String {
    out.split("---\n").nth(n).unwrap_or("").to_string()
}

/// The library lines of [`RESOLVE`] for the driver's libraries, by cache path.
fn driver_libs(out: &str) -> BTreeMap<String, (String, String)> {
    section(out, 0)
        .lines()
        .filter(|l| l.contains("libnvidia") || l.contains("libcuda"))
        .map(|l| {
            let mut f = l.split(' ');
            let path = f.next().unwrap().to_string();
            (
                path,
                (f.next().unwrap_or("").into(), f.next().unwrap_or("").into()),
            )
        })
        .collect()
}

#[test]
fn one_mount_holds_the_driver_and_ld_so_reaches_the_same_files_as_per_file_mounts() {
    let e2e = setup();
    let staged = e2e.run_script(&[ALL, CAPS], RESOLVE);
    ok(&staged);
    let out = staged.stdout();
    assert!(out.contains("GPU 7"), "nvidia-smi -L inside:\n{out}");

    // The spec: one bind of the stage, no per-file bind of a library or binary.
    let mounts = spec_mounts(&staged.bundle);
    let stage: Vec<&Value> = mounts
        .iter()
        .filter(|m| m["destination"] == CONTAINER_DIR)
        .collect();
    assert_eq!(stage.len(), 1, "{mounts:#?}");
    assert_eq!(stage[0]["options"], json!(driver_stage::STAGE_OPTIONS));
    let lib_dir = e2e.node.sim.lib_dir();
    let per_file: Vec<&Value> = mounts
        .iter()
        .filter(|m| {
            m["source"].as_str().is_some_and(|s| {
                s.starts_with(lib_dir.to_str().unwrap()) || s.ends_with("bin/nvidia-smi")
            })
        })
        .collect();
    assert!(
        per_file.is_empty(),
        "per-file driver mounts left: {per_file:#?}"
    );

    // Inside: the binaries are links into the stage and reach the host's files.
    let smi = e2e.node.sim.driver_root.join("usr/bin/nvidia-smi");
    let host_id = |p: &Path| {
        let m = fs::metadata(p).unwrap();
        format!("{}:{}", m.dev(), m.ino())
    };
    let bins = section(&out, 1);
    let smi_line = bins
        .lines()
        .find(|l| l.starts_with("/usr/bin/nvidia-smi "))
        .unwrap();
    assert_eq!(
        smi_line,
        format!(
            "/usr/bin/nvidia-smi {CONTAINER_DIR}/nvidia-smi {}",
            host_id(&smi)
        ),
        "{bins}"
    );

    // The stage's mounts: its tmpfs and one per file, all read-only, nosuid, nodev,
    // none shared with anything.
    let lines = mountinfo(&section(&out, 2));
    let under: Vec<&MountLine> = lines
        .iter()
        .filter(|m| m.point == CONTAINER_DIR || m.point.starts_with(&format!("{CONTAINER_DIR}/")))
        .collect();
    let libs = driver_libs(&out);
    assert!(
        under.len() > libs.len(),
        "{} mounts for {} libraries",
        under.len(),
        libs.len()
    );
    for m in &under {
        for want in ["ro", "nosuid", "nodev"] {
            assert!(
                m.options.split(',').any(|o| o == want),
                "{} lacks {want}: {}",
                m.point,
                m.options
            );
        }
        assert!(
            !m.optional.contains("shared:"),
            "{} propagates: {}",
            m.point,
            m.optional
        );
    }
    assert!(
        under[0].options.split(',').any(|o| o == "noexec"),
        "{}",
        under[0].options
    );
    // Per-file mounts, NVIDIA's layout: the same cache paths, the same files.
    configure(&e2e, "driver-mounts = \"per-file\"\n");
    let plain = e2e.run_script(&[ALL, CAPS], RESOLVE);
    ok(&plain);
    let plain_out = plain.stdout();
    let mounts = spec_mounts(&plain.bundle);
    assert!(
        mounts.iter().all(|m| m["destination"] != CONTAINER_DIR),
        "{mounts:#?}"
    );
    let (a, b) = (driver_libs(&out), driver_libs(&plain_out));
    assert!(!a.is_empty());
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "cache paths"
    );
    for (path, (_, id)) in &a {
        assert_eq!(
            id, &b[path].1,
            "{path}: staged and per-file reach different files"
        );
    }
    assert!(plain_out.contains("GPU 7"), "{plain_out}");
    // Firmware: the image has no /lib/firmware, so the stage gives it as one link to
    // its tree; the same files as per-file mounts.
    let firmware = |out: &str| -> Vec<String> {
        section(out, 1)
            .lines()
            .filter(|l| l.starts_with("/lib/firmware/nvidia/"))
            .map(String::from)
            .collect()
    };
    assert!(!firmware(&out).is_empty(), "{out}");
    assert_eq!(firmware(&out), firmware(&plain_out), "firmware");
    assert!(
        section(&out, 1).contains(&format!("/lib/firmware {CONTAINER_DIR}/t/lib/firmware\n")),
        "{out}"
    );
    // Nothing else of the host's: the stage holds exactly the files that per-file mode
    // binds read-only from the driver root.
    let root = e2e.node.sim.driver_root.to_str().unwrap().to_string();
    let mut per_file: Vec<String> = mounts
        .iter()
        .filter(|m| m["source"].as_str().is_some_and(|s| s.starts_with(&root)))
        .filter(|m| m["options"] == json!(nvshim::edits::RO_OPTIONS))
        .map(|m| file_name(m["destination"].as_str().unwrap()))
        .collect();
    per_file.sort();
    let mut in_stage: Vec<String> = under[1..].iter().map(|m| file_name(&m.point)).collect();
    in_stage.sort();
    assert_eq!(in_stage, per_file);
}

fn file_name(path: &str) -> String {
    let name = Path::new(path).file_name().unwrap();
    name.to_str().unwrap().to_string()
}

#[test]
fn a_file_the_image_has_keeps_its_own_mount_and_its_bytes() {
    let e2e = setup();
    // The image ships its own nvidia-smi (a stub): a link would replace it for good.
    let theirs = e2e.rootfs.join("usr/bin/nvidia-smi");
    fs::write(&theirs, "#!/bin/sh\necho image\n").unwrap();
    let run = e2e.run_script(
        &[ALL, CAPS],
        "nvidia-smi -L; readlink /usr/bin/nvidia-debugdump",
    );
    ok(&run);
    assert!(run.stdout().contains("GPU 0"), "{}", run.stdout());
    assert!(
        run.stdout()
            .contains(&format!("{CONTAINER_DIR}/nvidia-debugdump")),
        "{}",
        run.stdout()
    );
    let mounts = spec_mounts(&run.bundle);
    assert_eq!(
        mounts
            .iter()
            .filter(|m| m["destination"] == "/usr/bin/nvidia-smi")
            .count(),
        1,
        "{mounts:#?}"
    );
    let rootfs = run.bundle.join("rootfs/usr/bin/nvidia-smi");
    assert_eq!(
        fs::read_to_string(rootfs).unwrap(),
        "#!/bin/sh\necho image\n"
    );
}

/// The stage root detached on drop, so the tempdir can go.
struct StageRoot(PathBuf);

impl Drop for StageRoot {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

/// Mount points under `dir`, from this process's mountinfo.
fn mounts_under(dir: &Path) -> Vec<String> {
    let text = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.to_str().unwrap();
    mountinfo(&text)
        .into_iter()
        .map(|m| m.point)
        .filter(|p| p == dir || p.starts_with(&format!("{dir}/")))
        .collect()
}

fn runc(e2e: &E2e, args: &[&str]) -> Output {
    Command::new("runc")
        .arg("--root")
        .arg(e2e.dir.path().join("runc-root"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const CYCLES: usize = 1_000;
const CONTAINER_EVERY: usize = 100;

#[test]
fn a_thousand_driver_upgrades_while_containers_run_leave_one_stage() {
    let e2e = setup();
    let stage_dir = e2e.dir.path().join("stage");
    let _guard = StageRoot(stage_dir.clone());
    configure(
        &e2e,
        &format!("driver-stage-dir = \"{}\"\n", stage_dir.display()),
    );
    let before_outside: Vec<String> = mounts_under(e2e.dir.path())
        .into_iter()
        .filter(|p| !p.starts_with(stage_dir.to_str().unwrap()))
        .collect();

    // The runtime's own file set, as per-file mounts would list it.
    let version = e2e.node.sim.library_version().to_string();
    let libcuda = e2e.node.sim.lib_dir().join(format!("libcuda.so.{version}"));
    let original = fs::read(&libcuda).unwrap();
    let marker = "tail -c 12 /usr/lib/x86_64-linux-gnu/libcuda.so.1";

    // Two containers started before the first upgrade, kept running throughout.
    let mut running = Vec::new();
    for n in 0..2 {
        let id = format!("nvshim-stage-{}-{n}", std::process::id());
        let created = e2e.create(&[ALL, CAPS], "sleep 600", &id);
        assert!(created.status.success(), "create {id}: {}", text(&created));
        let started = runc(&e2e, &["start", &id]);
        assert!(started.status.success(), "start {id}: {}", text(&started));
        running.push(id);
    }
    let first_bundle = e2e.dir.path().join(&running[0]);
    let files: Vec<Mount> = per_file_mounts(&e2e, &first_bundle);
    assert!(files.len() > 5, "{files:?}");

    let mut containers = 0;
    for cycle in 1..=CYCLES {
        // The upgrade: a new libcuda (a new inode), renamed over the old one.
        let tmp = libcuda.with_extension("new");
        let mut bytes = original.clone();
        bytes.extend_from_slice(format!("\ncycle{cycle:05}\n").as_bytes());
        fs::write(&tmp, &bytes).unwrap();
        fs::rename(&tmp, &libcuda).unwrap();
        if cycle % CONTAINER_EVERY == 0 {
            // A new container through the runtime sees this cycle's file...
            let run = e2e.run_script(&[ALL, CAPS], marker);
            ok(&run);
            assert!(
                run.stdout().contains(&format!("cycle{cycle:05}")),
                "cycle {cycle}: {}",
                run.stdout()
            );
            containers += 1;
            // ...and the running ones still the file they started with.
            for id in &running {
                let out = runc(&e2e, &["exec", id, "sh", "-c", marker]);
                assert!(out.status.success(), "exec in {id}: {}", text(&out));
                assert!(
                    !text(&out).contains("cycle"),
                    "{id} sees the upgrade: {}",
                    text(&out)
                );
            }
        } else {
            let stage = driver_stage::ensure(&stage_dir, &files).unwrap().unwrap();
            assert!(
                stage.built,
                "cycle {cycle}: the upgraded files need a new stage"
            );
        }
        let stages = fs::read_dir(&stage_dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().is_dir())
            .count();
        assert_eq!(stages, 1, "cycle {cycle}: stages left behind");
    }
    assert_eq!(containers, CYCLES / CONTAINER_EVERY);

    // Exactly one stage mounted: the root, the stage's tmpfs, one per file.
    let staged = files
        .iter()
        .map(|m| m.host_path.as_str())
        .collect::<std::collections::BTreeSet<_>>()
        .len();
    assert_eq!(
        mounts_under(&stage_dir).len(),
        2 + staged,
        "{:#?}",
        mounts_under(&stage_dir)
    );
    for id in &running {
        let _ = runc(&e2e, &["kill", id, "KILL"]);
        let out = runc(&e2e, &["delete", "--force", id]);
        assert!(out.status.success(), "delete {id}: {}", text(&out));
    }
    let after_outside: Vec<String> = mounts_under(e2e.dir.path())
        .into_iter()
        .filter(|p| !p.starts_with(stage_dir.to_str().unwrap()))
        .collect();
    assert_eq!(after_outside, before_outside, "mounts outside the stage");
    eprintln!(
        "driver_stage soak: {CYCLES} upgrades, {containers} containers, {} mounts under the stage root at the end",
        mounts_under(&stage_dir).len()
    );
}

/// The driver mounts a per-file create would give the bundle's container (its spec's
/// request, planned by `nvshim list --json`-equivalent: a per-file create of a copy).
fn per_file_mounts(e2e: &E2e, bundle: &Path) -> Vec<Mount> {
    let spec: Value =
        serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
    let links: Vec<(String, String)> = spec["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["destination"] == CONTAINER_DIR)
        .map(|m| (m["source"].as_str().unwrap().to_string(), String::new()))
        .collect();
    assert_eq!(links.len(), 1, "the create was staged");
    // The stage's record lists its host files.
    let record = PathBuf::from(format!("{}.json", links[0].0));
    let sources: Value = serde_json::from_slice(&fs::read(&record).unwrap()).unwrap();
    let root = e2e.node.sim.driver_root.to_str().unwrap().to_string();
    sources["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let host = f[0].as_str().unwrap().to_string();
            Mount {
                container_path: host.strip_prefix(&root).unwrap().to_string(),
                host_path: host,
                kind: Some("bind".into()),
                options: nvshim::edits::RO_OPTIONS
                    .iter()
                    .map(|s| s.to_string())
                    .collect(),
            }
        })
        .collect()
}

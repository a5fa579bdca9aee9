//! Attack scenarios on mounts (`docs/security.md`), each a real container through our
//! runtime, our prestart hook and our CDI spec, with a hostile rootfs:
//! - S1 (CVE-2024-0132, CVE-2025-23359): the image's CUDA compat libraries are
//!   symlinks to `/`, `/proc/self/root` and a host directory, and the config opts in
//!   to NVIDIA's "mount compat libs from the container": the container's mount table
//!   holds exactly what runc and we put there, every injected mount comes from the
//!   driver root, and no host file is readable inside;
//! - S2 (CVE-2024-0133): a parent of a mount target is a symlink to a host path
//!   (absolute, `..`-climbing, or through `/proc/self/root`): nothing is created or
//!   mounted on the host; the container runs with the files inside its rootfs, or the
//!   create fails cleanly;
//! - S10 (NVIDIA's e2e "firmware folder resolves outside the container root"):
//!   `/lib/firmware/nvidia` leads to `/` or a host directory: the same.
//!
//! The prestart hook's cases for the library directory itself are in
//! `tests/hook/security.rs`; here they run through the runtime and the CDI spec.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::harness::{
    Job, LIB, Lab, MountLine, Run, Sentinel, Via, climbing, mountinfo, move_behind_link,
    no_host_mounts_under, replace_with_link,
};
use nvshim::driver_stage::{self, CONTAINER_DIR};
use serde_json::Value;

const COMPAT: &str = "usr/local/cuda/compat";
/// Filesystems that may be mounted at their own root: runc's `/proc`, `/dev`, masks.
const PSEUDO_FS: [&str; 7] = [
    "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2",
];

/// The image's compat directory, every entry a way out of the root.
fn hostile_compat(rootfs: &Path, s: &Sentinel) {
    let compat = rootfs.join(COMPAT);
    std::fs::create_dir_all(&compat).unwrap();
    for (name, target) in [
        ("libcuda.so.1", Path::new("/").to_path_buf()),
        ("libcuda.so.999.1", Path::new("/../../../../").to_path_buf()),
        (
            "libnvidia-ml.so.1",
            Path::new("/proc/self/root/").to_path_buf(),
        ),
        ("libcudart.so.12", s.dir.clone()),
        ("libnvidia-ptxjitcompiler.so.1", climbing(&s.dir)),
    ] {
        std::os::unix::fs::symlink(target, compat.join(name)).unwrap();
    }
}

/// Mount points `spec` accounts for: the root, its mounts, and runc's masked and
/// read-only paths.
fn spec_points(spec: &Value) -> BTreeSet<String> {
    let mut points: BTreeSet<String> = ["/".to_string()].into();
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default()
    };
    points.extend(strings(&spec["linux"]["maskedPaths"]));
    points.extend(strings(&spec["linux"]["readonlyPaths"]));
    for m in spec["mounts"].as_array().unwrap() {
        points.insert(m["destination"].as_str().unwrap().to_string());
    }
    points
}

/// destination → source of the mounts the runtime added to `run`'s config.json.
fn added_mounts(run: &Run) -> BTreeMap<String, String> {
    let before = spec_points(&run.spec_before());
    run.spec()["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (
                m["destination"].as_str().unwrap().to_string(),
                m["source"].as_str().unwrap().to_string(),
            )
        })
        .filter(|(d, _)| !before.contains(d))
        .flat_map(|(d, s)| match d == CONTAINER_DIR {
            true => staged_files(&s),
            false => vec![(d, s)],
        })
        .collect()
}

/// `injected` with each staged file at its usual path: where the runtime's run linked
/// it (`links`: link target in the stage → link path), as per-file mounts place it.
fn unstaged(
    injected: &BTreeMap<String, String>,
    links: &BTreeMap<String, String>,
) -> BTreeMap<String, String> {
    injected
        .iter()
        .map(|(dest, source)| match links.get(dest) {
            Some(usual) => (usual.clone(), source.clone()),
            None => (dest.clone(), source.clone()),
        })
        .collect()
}

/// The rootfs's symlinks into the stage: target → the link's container path. A link
/// to the stage's tree (a directory the image lacked) stands for each file below it,
/// read from the tree in `stage` (the stage's host directory).
fn stage_links(rootfs: &Path, stage: Option<&Path>) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, stage: Option<&Path>, found: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            let kind = entry.file_type().unwrap();
            let inside = Path::new("/").join(path.strip_prefix(root).unwrap());
            if kind.is_symlink() {
                let target = std::fs::read_link(&path).unwrap();
                let tree = Path::new(CONTAINER_DIR).join(driver_stage::TREE_DIR);
                match (target.strip_prefix(&tree), stage) {
                    (Ok(below), Some(stage)) => {
                        let top = stage.join(driver_stage::TREE_DIR).join(below);
                        tree_files(&top, &top, &inside, found);
                    }
                    _ if target.starts_with(CONTAINER_DIR) => {
                        found.insert(target.display().to_string(), inside.display().to_string());
                    }
                    _ => {}
                }
            } else if kind.is_dir() {
                walk(root, &path, stage, found);
            }
        }
    }
    /// The tree's relative links under `dir` (the tree at container path `at`).
    fn tree_files(top: &Path, dir: &Path, at: &Path, found: &mut BTreeMap<String, String>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if entry.file_type().unwrap().is_dir() {
                tree_files(top, &path, at, found);
                continue;
            }
            let rel: PathBuf = std::fs::read_link(&path)
                .unwrap()
                .components()
                .filter(|c| *c != std::path::Component::ParentDir)
                .collect();
            let place = Path::new(CONTAINER_DIR).join(rel);
            let usual = at.join(path.strip_prefix(top).unwrap());
            found.insert(place.display().to_string(), usual.display().to_string());
        }
    }
    let mut found = BTreeMap::new();
    walk(rootfs, rootfs, stage, &mut found);
    found
}

/// The driver stage's one bind (`src/driver_stage/`) stands for a mount per file under
/// [`CONTAINER_DIR`]: each file's place there and its host source, from the stage's
/// record, so that each is checked as a per-file mount is.
fn staged_files(stage: &str) -> Vec<(String, String)> {
    let record: Value =
        serde_json::from_slice(&std::fs::read(format!("{stage}.json")).unwrap()).unwrap();
    let hosts: Vec<PathBuf> = record["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| PathBuf::from(f[0].as_str().unwrap()))
        .collect();
    let refs: Vec<&Path> = hosts.iter().map(PathBuf::as_path).collect();
    driver_stage::layout(&refs)
        .into_iter()
        .zip(&hosts)
        .map(|(rel, host)| {
            let place = Path::new(CONTAINER_DIR).join(rel);
            (place.display().to_string(), host.display().to_string())
        })
        .collect()
}

/// `path` with the rootfs's symlinks resolved inside the root, as runc resolves a
/// mount destination (no magic links in these layouts).
fn in_root(rootfs: &Path, path: &str) -> String {
    let mut real = PathBuf::from("/");
    let mut queue: Vec<String> = path.split('/').rev().map(String::from).collect();
    let mut links = 0;
    while let Some(part) = queue.pop() {
        match part.as_str() {
            "" | "." => {}
            ".." => {
                real.pop();
            }
            name => {
                let next = real.join(name);
                let host = rootfs.join(next.strip_prefix("/").unwrap());
                match std::fs::read_link(&host) {
                    Ok(target) if links < 40 => {
                        links += 1;
                        let target = target.to_string_lossy().into_owned();
                        if target.starts_with('/') {
                            real = PathBuf::from("/");
                        }
                        queue.extend(target.split('/').rev().map(String::from));
                    }
                    _ => real = next,
                }
            }
        }
    }
    real.display().to_string()
}

/// The container's mount table against the expected one: what the original spec
/// accounts for plus `injected`, each injected mount showing its driver-root source,
/// and no non-pseudo filesystem mounted at its own root (a host filesystem).
fn check_mount_table(
    case: &str,
    lines: &[MountLine],
    run: &Run,
    injected: &BTreeMap<String, String>,
) {
    // runc mounts at a destination's in-root meaning (`/lib` is a link to `usr/lib`).
    let rootfs = run.rootfs();
    let injected: BTreeMap<String, &String> = injected
        .iter()
        .map(|(d, s)| (in_root(&rootfs, d), s))
        .collect();
    let mut allowed: BTreeSet<String> = spec_points(&run.spec_before())
        .iter()
        .map(|p| in_root(&rootfs, p))
        .collect();
    allowed.extend(injected.keys().cloned());
    let points: BTreeSet<&str> = lines.iter().map(|l| l.point.as_str()).collect();
    for line in lines {
        // runc mounts each cgroup v1 hierarchy under the spec's /sys/fs/cgroup.
        let cgroup_v1 = line.fstype == "cgroup" && line.point.starts_with("/sys/fs/cgroup/");
        // The driver stage's own tmpfs, holding the staged files' mounts.
        let stage = line.fstype == "tmpfs"
            && line.point == CONTAINER_DIR
            && injected.keys().any(|d| d.starts_with(CONTAINER_DIR));
        assert!(
            allowed.contains(&line.point) || cgroup_v1 || stage,
            "{case}: unexpected mount in the container: {line:?}"
        );
        if let Some(source) = injected.get(&line.point) {
            assert!(
                line.root != "/" && source.ends_with(&line.root),
                "{case}: {} is mounted from {:?}, not from {source}",
                line.point,
                line.root
            );
        }
        assert!(
            line.root != "/" || PSEUDO_FS.contains(&line.fstype.as_str()),
            "{case}: a whole {} filesystem is mounted: {line:?}",
            line.fstype
        );
    }
    for dest in injected.keys() {
        assert!(points.contains(dest.as_str()), "{case}: {dest} not mounted");
    }
}

#[test]
fn s1_image_compat_links_never_become_mount_sources() {
    let lab = Lab::build();
    let s = Sentinel::create();
    let secret = s.dir.join("secret").display().to_string();
    let reads: Vec<String> = [
        String::new(),
        format!("/{COMPAT}/libcuda.so.1"),
        format!("/{COMPAT}/libcuda.so.999.1"),
        format!("/{COMPAT}/libnvidia-ml.so.1"),
        format!("/{COMPAT}/libnvidia-ptxjitcompiler.so.1"),
    ]
    .iter()
    .map(|prefix| format!("{prefix}{secret}"))
    .chain([format!("/{COMPAT}/libcudart.so.12/secret")])
    .collect();
    let script = format!(
        "cat /proc/self/mountinfo; echo ---; for p in {}; do cat $p 2>&1; done; echo ---; ls /dev",
        reads.join(" ")
    );
    let env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        "NVIDIA_DRIVER_CAPABILITIES=all",
        "CUDA_VERSION=12.4",
    ];
    // NVIDIA's opt-in to the pre-1.17.4 behaviour; we have no such code path.
    let tables = "[features]\nallow-cuda-compat-libs-from-container = true\n\n\
                  [nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = \"mount\"\n";
    let before = s.snapshot();
    let node_dir = lab.sim.dir.display().to_string();
    let mut injected = BTreeMap::new();
    let mut links = BTreeMap::new();
    for via in Via::ALL {
        let case = format!("S1 via {via:?}");
        let job = Job {
            tables,
            ..Job::new(via, &env, &script)
        };
        let run = lab.run(&job, |rootfs, _| hostile_compat(rootfs, &s));
        let out = run.ok(&case);
        if via == Via::Runtime {
            injected = added_mounts(&run);
            let stage = run.spec()["mounts"]
                .as_array()
                .unwrap()
                .iter()
                .find(|m| m["destination"] == CONTAINER_DIR)
                .map(|m| PathBuf::from(m["source"].as_str().unwrap()));
            links = stage_links(&run.rootfs(), stage.as_deref());
            assert!(
                injected
                    .keys()
                    .any(|d| d.ends_with("/libcuda.so.550.54.15")),
                "{case}: {injected:#?}"
            );
            for (dest, source) in &injected {
                assert!(
                    source.starts_with(&node_dir) && !dest.contains("compat"),
                    "{case}: injected {dest} from {source}, outside the driver root"
                );
            }
        } else if via == Via::Cdi {
            assert_eq!(added_mounts(&run), injected, "{case}: CDI mounts differ");
        }
        let parts: Vec<&str> = out.split("---\n").collect();
        // The prestart hook mounts each file at its usual path, not through the stage.
        let expected = match via {
            Via::Hook => unstaged(&injected, &links),
            _ => injected.clone(),
        };
        check_mount_table(&case, &mountinfo(parts[0]), &run, &expected);
        assert!(
            !out.contains(&s.token),
            "{case}: a host file is readable in the container:\n{}",
            parts[1]
        );
        assert!(
            parts[2].contains(&lab.gpu_node(1)),
            "{case}: no GPU: {}",
            parts[2]
        );
        s.assert_untouched(&before, &case);
        no_host_mounts_under(&run.bundle, &case);
    }
}

/// What every injected file must be in a container that ran.
const INJECTED: [&str; 5] = [
    "/usr/bin/nvidia-smi",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15",
    "/run/nvidia-persistenced/socket",
    "/tmp/nvidia-mps",
    "/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin",
];

type Prepare = fn(&Path, &Sentinel);

/// Entries called `name` under `dir`, not following symlinks.
fn named_under(dir: &Path, name: &std::ffi::OsStr) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let entry = entry.unwrap();
        let path = entry.path();
        if entry.file_name() == name {
            found.push(path.clone());
        }
        if entry.file_type().unwrap().is_dir() {
            found.extend(named_under(&path, name));
        }
    }
    found
}

/// Runs each hostile layout through `vias`: the host sentinel must stay as it was, no
/// host mount may name it or the bundle, and a container that ran sees every injected
/// file. Returns how many runs the layouts let through (the rest failed cleanly).
fn hostile_layouts(
    lab: &Lab,
    id: &str,
    cases: &[(&str, Prepare, &[Via])],
    host_paths: &[&Path],
) -> usize {
    let script = format!(
        "ls /dev; echo ---; for p in {}; do test -e $p && echo \"present $p\" || echo \"missing $p\"; done",
        INJECTED.join(" ")
    );
    let env = ["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=all"];
    let mut ran = 0;
    for (name, prepare, vias) in cases {
        for via in *vias {
            let case = format!("{id} {name} via {via:?}");
            let s = Sentinel::create();
            let before = s.snapshot();
            let run = lab.run(&Job::new(*via, &env, &script), |rootfs, _| {
                prepare(rootfs, &s)
            });
            s.assert_untouched(&before, &case);
            no_host_mounts_under(&run.bundle, &case);
            for path in host_paths {
                if path.exists() {
                    // Ours (the test checked it was not there): taken away before failing.
                    let _ = std::fs::remove_dir_all(path);
                    panic!("{case}: {} was created on the host", path.display());
                }
            }
            let mut left: Vec<String> = std::fs::read_dir(&run.bundle)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect();
            left.sort();
            assert_eq!(
                left,
                ["config.json", "rootfs"],
                "{case}: the bundle dir changed"
            );
            let ok = run.ran(&case);
            let why = run.stderr();
            let why = why.lines().last().unwrap_or("");
            eprintln!("{case}: {}", if ok { "ran" } else { why });
            if ok {
                ran += 1;
                let out = run.stdout();
                assert!(out.contains(&lab.gpu_node(1)), "{case}: no GPU: {out}");
                // A path the image routes through a magic link shows nothing at its
                // name once the container runs; its mountpoint must still be in the root.
                for line in out.lines() {
                    if let Some(path) = line.strip_prefix("missing ") {
                        let name = Path::new(path).file_name().unwrap();
                        assert!(
                            !named_under(&run.rootfs(), name).is_empty(),
                            "{case}: {path} is neither visible nor in the rootfs: {out}"
                        );
                    }
                }
            }
        }
    }
    ran
}

#[test]
fn s2_mount_target_parents_linked_to_the_host_stay_inside() {
    let lab = Lab::build();
    let all: &[Via] = &Via::ALL;
    let not_hook: &[Via] = &[Via::Runtime, Via::Cdi];
    let cases: [(&str, Prepare, &[Via]); 6] = [
        (
            "usr/bin -> ../../..(host sentinel), the rootfs holds that path",
            |rootfs, s| move_behind_link(rootfs, "usr/bin", &s.dir, &climbing(&s.dir)),
            all,
        ),
        (
            "run/nvidia-persistenced -> host sentinel, missing in the rootfs",
            |rootfs, s| replace_with_link(rootfs, "run/nvidia-persistenced", &s.dir),
            all,
        ),
        (
            "tmp/nvidia-mps (a directory target) -> host sentinel",
            |rootfs, s| replace_with_link(rootfs, "tmp/nvidia-mps", &s.dir),
            all,
        ),
        (
            "library dir -> /proc/self/root + host sentinel",
            |rootfs, s| {
                let target = Path::new("/proc/self/root").join(s.rel());
                replace_with_link(rootfs, LIB, &target)
            },
            all,
        ),
        (
            "library dir -> host sentinel, missing in the rootfs",
            |rootfs, s| replace_with_link(rootfs, LIB, &s.dir),
            not_hook,
        ),
        (
            "library dir -> ../../..(host sentinel), the rootfs holds that path",
            |rootfs, s| move_behind_link(rootfs, LIB, &s.dir, &climbing(&s.dir)),
            not_hook,
        ),
    ];
    let ran = hostile_layouts(&lab, "S2", &cases, &[]);
    // The layouts whose in-root meaning exists must run on every path.
    assert!(ran >= 5, "only {ran} runs succeeded");
}

#[test]
fn s10_firmware_dir_linked_outside_the_root_stays_inside() {
    let lab = Lab::build();
    let version_dir = Path::new("/").join(lab.sim.library_version());
    assert!(
        !version_dir.exists(),
        "{} exists on the host",
        version_dir.display()
    );
    let all: &[Via] = &Via::ALL;
    let cases: [(&str, Prepare, &[Via]); 5] = [
        (
            "lib/firmware/nvidia -> /",
            |rootfs, _| replace_with_link(rootfs, "usr/lib/firmware/nvidia", Path::new("/")),
            all,
        ),
        (
            "lib/firmware/nvidia -> host sentinel, missing in the rootfs",
            |rootfs, s| replace_with_link(rootfs, "usr/lib/firmware/nvidia", &s.dir),
            all,
        ),
        (
            "lib/firmware/nvidia -> ../../..(host sentinel), the rootfs holds that path",
            |rootfs, s| {
                std::fs::create_dir_all(rootfs.join("usr/lib/firmware/nvidia")).unwrap();
                move_behind_link(rootfs, "usr/lib/firmware/nvidia", &s.dir, &climbing(&s.dir))
            },
            all,
        ),
        (
            "lib/firmware -> host sentinel",
            |rootfs, s| replace_with_link(rootfs, "usr/lib/firmware", &s.dir),
            all,
        ),
        (
            "lib/firmware/nvidia/<version> -> /proc/self/cwd (a magic link)",
            |rootfs, _| {
                replace_with_link(
                    rootfs,
                    "usr/lib/firmware/nvidia/550.54.15",
                    Path::new("/proc/self/cwd"),
                )
            },
            all,
        ),
    ];
    let ran = hostile_layouts(&lab, "S10", &cases, &[&version_dir]);
    assert!(
        !version_dir.exists(),
        "firmware landed on the host: {}",
        version_dir.display()
    );
    assert!(ran >= 6, "only {ran} runs succeeded");
}

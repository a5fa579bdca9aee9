//! S9 (mount-propagation leaks; NVIDIA's e2e "should not leak mounts" and their
//! issue #697, `docs/security.md`): the host's mount table, as a multiset of mount
//! points, is the same before and after 50 GPU containers through our runtime and 20
//! through our prestart hook. The hook mounts inside the container's namespace and
//! makes each mount private; the runtime only writes `config.json` (every injected
//! mount `rprivate`) and runc mounts.
//!
//! systemd makes `/` shared, which is when leaks happen; this machine's `/` may be
//! private, so the test first makes its own directory (bundles included) a shared
//! mount. Every other container also gets what docker gives a container with a
//! `:rshared` volume: `rootfsPropagation: rshared` and the volume itself.
//!
//! Mounts of other processes running at the same time (other tests' docker,
//! containerd and podman under their own tempdirs or the engines' directories, network
//! namespace files, automounts) are not ours and are left out of the comparison;
//! everything else on the host counts.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;

use crate::harness::{Job, Lab, Via, mountinfo, nvidia_nodes};
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use serde_json::json;

/// `dir` bind-mounted onto itself and made `rshared` (as systemd makes `/`); the
/// mount is detached again on drop.
struct SharedMount(std::path::PathBuf);

impl SharedMount {
    fn new(dir: &Path) -> SharedMount {
        mount(
            Some(dir),
            dir,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .expect("bind-mount the test dir onto itself");
        let guard = SharedMount(dir.to_path_buf());
        mount(
            None::<&str>,
            dir,
            None::<&str>,
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
        .expect("make the test dir rshared");
        guard
    }
}

impl Drop for SharedMount {
    fn drop(&mut self) {
        let _ = umount2(&self.0, MntFlags::MNT_DETACH);
    }
}

/// Where engines keep their own mounts (network namespaces, image layers): never a place
/// our bundles or driver files are.
const ENGINE_DIRS: [&str; 6] = [
    "/run/netns",
    "/run/docker",
    "/run/containers",
    "/var/lib/docker",
    "/var/lib/containers",
    "/var/run/netns",
];

/// The host's mount points with how often each is mounted, leaving out what other
/// processes hold: another tempdir than `own`'s, the engines' directories, namespace
/// files and automounts.
fn host_mounts(own: &[&Path]) -> BTreeMap<String, usize> {
    let tmp = std::env::temp_dir().join(".tmp").display().to_string();
    let own: Vec<String> = own.iter().map(|p| p.display().to_string()).collect();
    let mut points = BTreeMap::new();
    for line in mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap()) {
        let foreign = (line.point.starts_with(&tmp)
            && !own.iter().any(|o| line.point.starts_with(o)))
            || ENGINE_DIRS.iter().any(|d| line.point.starts_with(d))
            || line.point.starts_with(&stage_root())
            || ["nsfs", "autofs", "binfmt_misc"].contains(&line.fstype.as_str());
        if foreign {
            continue;
        }
        *points.entry(line.point).or_insert(0) += 1;
    }
    points
}

/// The runtime's driver stages (`[nvshim] driver-stage-dir`, `src/driver_stage/`): kept
/// there on purpose, one per set of driver files and shared with the other tests'
/// nodes, so left out of the diff; [`stage_mounted_twice`] checks them instead.
fn stage_root() -> String {
    let root = nvshim::config::Config::default().nvshim.driver_stage_dir;
    format!("{}/", root.display())
}

/// Mount points under the stage root mounted more than once: a stage is built once
/// and then only bound into containers, so a second mount at a point is a leak.
fn stage_mounted_twice() -> Vec<String> {
    let mut points: BTreeMap<String, usize> = BTreeMap::new();
    for line in mountinfo(&fs::read_to_string("/proc/self/mountinfo").unwrap()) {
        if line.point.starts_with(&stage_root()) {
            *points.entry(line.point).or_insert(0) += 1;
        }
    }
    points
        .into_iter()
        .filter(|(_, n)| *n > 1)
        .map(|(point, n)| format!("{point}: mounted {n} times"))
        .collect()
}

fn diff(before: &BTreeMap<String, usize>, after: &BTreeMap<String, usize>) -> Vec<String> {
    let mut out = Vec::new();
    for (point, n) in after {
        let was = before.get(point).copied().unwrap_or(0);
        if *n != was {
            out.push(format!("{point}: {was} -> {n}"));
        }
    }
    for (point, was) in before {
        if !after.contains_key(point) {
            out.push(format!("{point}: {was} -> 0"));
        }
    }
    out
}

/// Runs `count` GPU containers through each path on a lab whose directory is a shared
/// mount; every odd one gets `rootfsPropagation: rshared` and an `rshared` volume at
/// `volume_at`. Returns the host mount table's change after the first container that
/// changed it (leaked mounts under the shared directory go when its guard detaches it).
fn containers_on_a_shared_host(runs: &[(Via, usize)], volume_at: &str) -> Vec<String> {
    let lab = Lab::build();
    let own = [lab.dir.path(), lab.sim.dir.as_path()];
    let _shared = SharedMount::new(lab.dir.path());
    // The volume is a shared mount of its own, as a hostPath on another filesystem is.
    let volume = lab.dir.path().join("volume");
    fs::create_dir(&volume).unwrap();
    let _volume = SharedMount::new(&volume);
    let before = host_mounts(&own);
    let env = [
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=all",
    ];
    for (via, count) in runs {
        for round in 0..*count {
            let case = format!("S9 via {via:?}, container {round}");
            let run = lab.run(&Job::new(*via, &env, "ls /dev"), |_, spec| {
                if round % 2 == 1 {
                    spec["linux"]["rootfsPropagation"] = json!("rshared");
                    spec["mounts"].as_array_mut().unwrap().push(json!({
                        "destination": volume_at,
                        "type": "bind",
                        "source": volume,
                        "options": ["rbind", "rshared"],
                    }));
                }
            });
            // Checked after every container, so a leak names the one that made it.
            let mut leaked = diff(&before, &host_mounts(&own));
            leaked.extend(stage_mounted_twice());
            if !leaked.is_empty() {
                return leaked.into_iter().map(|l| format!("{case}: {l}")).collect();
            }
            let nodes = nvidia_nodes(&run.ok(&case));
            for gpu in [0, 1] {
                assert!(nodes.contains(&lab.gpu_node(gpu)), "{case}: {nodes:?}");
            }
            fs::remove_dir_all(&run.bundle)
                .unwrap_or_else(|e| panic!("{case}: removing the bundle: {e}"));
        }
    }
    Vec::new()
}

#[test]
fn s9_no_mount_leaks_after_70_gpu_containers() {
    let leaked = containers_on_a_shared_host(&[(Via::Runtime, 50), (Via::Hook, 20)], "/mnt/volume");
    assert!(leaked.is_empty(), "mounts leaked to the host: {leaked:#?}");
}

/// A volume the user shares both ways (docker `:rshared`, Kubernetes
/// `mountPropagation: Bidirectional`) over a directory we inject into (`/tmp` holds
/// `/tmp/nvidia-mps`): the injected mount is made under a mount that is a peer of the
/// host's, so the kernel copies it to the host when it is made, whatever its own
/// `rprivate` says, through runc and through our hook alike. NVIDIA's toolkit behaves
/// the same; see `docs/security.md`.
#[test]
#[ignore = "S9b: known limitation — an injected mount under a user's rshared volume reaches the host; see docs/security.md"]
fn s9b_injected_mounts_under_a_shared_volume_stay_in_the_container() {
    let mut leaked = containers_on_a_shared_host(&[(Via::Runtime, 2)], "/tmp");
    leaked.extend(containers_on_a_shared_host(&[(Via::Hook, 2)], "/tmp"));
    assert!(leaked.is_empty(), "mounts leaked to the host: {leaked:#?}");
}

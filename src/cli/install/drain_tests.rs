// SPDX-License-Identifier: Apache-2.0
//! The undo and the containers that still run through the toolkit's runtime: fake shim
//! bundles on a temp host root hold the binaries (and only those naming the toolkit), the
//! undo keeps them past its bound and leaves a record a later undo or install can finish
//! from, and a bundle that goes during the wait lets the undo take them out.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use proptest::prelude::*;

use super::drain::{self, OPTIONS_FILE, RUNTIME_FILE};
use super::tests::{Host, TOOLKIT};
use super::*;

const TASKS: &str = "/run/containerd/io.containerd.runtime.v2.task";
const ID: &str = "3f2a9c0d5e4b";
const CONTAINERD: &str = "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n";

/// The toolkit's runtime as engines name it.
fn runtime() -> String {
    format!("{TOOLKIT}/{}", layout::RUNTIME_BINARY)
}

/// The shim's options as containerd writes them (Go's JSON of the runc `Options`).
fn options(binary: &str) -> String {
    format!("{{\"binary_name\":\"{binary}\",\"systemd_cgroup\":true}}")
}

/// A bundle of container `id` in namespace `k8s.io` whose options name `binary`; its
/// host path.
fn bundle(host: &Host, id: &str, binary: &str) -> String {
    let dir = format!("{TASKS}/k8s.io/{id}");
    host.write(&format!("{dir}/{OPTIONS_FILE}"), &options(binary));
    host.write(&format!("{dir}/{RUNTIME_FILE}"), binary);
    dir
}

/// The snapshot without the bundle `dir` (a host path) and what is under it.
fn without(mut snapshot: BTreeMap<PathBuf, String>, dir: &str) -> BTreeMap<PathBuf, String> {
    let rel = Path::new(dir.trim_start_matches('/'));
    snapshot.retain(|path, _| !path.starts_with(rel));
    snapshot
}

/// A host with containerd's config and one bundle naming `binary`, and the snapshot
/// before the install.
fn containerd_host(binary: &str) -> (Host, String, BTreeMap<PathBuf, String>) {
    let host = Host::new();
    host.write("/etc/containerd/config.toml", CONTAINERD);
    let dir = bundle(&host, ID, binary);
    let before = host.snapshot();
    install(&host.settings("containerd", &[])).unwrap();
    (host, dir, before)
}

#[test]
fn holders_are_the_bundles_whose_shim_runs_a_binary_in_the_toolkit() {
    let k3s = "/run/k3s/containerd/io.containerd.runtime.v2.task";
    let docker = "/run/docker/containerd/daemon/io.containerd.runtime.v2.task";
    let version = format!("{TOOLKIT}/versions/0123456789abcdef/nvidia-container-runtime");
    let beside = "/usr/local/nvidia/toolkit-old/nvidia-container-runtime".to_owned();
    let runtime = runtime();
    // (case, bundle under, options.json, runtime file, held)
    type Case<'a> = (&'a str, &'a str, Option<String>, Option<&'a str>, bool);
    let cases: Vec<Case> = vec![
        (
            "the stable name",
            TASKS,
            Some(options(&runtime)),
            None,
            true,
        ),
        (
            "a version's path",
            TASKS,
            Some(options(&version)),
            None,
            true,
        ),
        ("runc", TASKS, Some(options("/usr/bin/runc")), None, false),
        (
            "the shim's default (no binary_name)",
            TASKS,
            Some("{\"systemd_cgroup\":true}".to_owned()),
            Some(&runtime),
            false,
        ),
        (
            "a directory beside it",
            TASKS,
            Some(options(&beside)),
            None,
            false,
        ),
        (
            "an older shim: runtime only",
            TASKS,
            None,
            Some(&runtime),
            true,
        ),
        (
            "options.json not JSON",
            TASKS,
            Some("{\"bin".to_owned()),
            None,
            false,
        ),
        ("no options (being deleted)", TASKS, None, None, false),
        (
            "dockerd's own containerd",
            docker,
            Some(options(&runtime)),
            None,
            true,
        ),
        (
            "k3s, beside its socket",
            k3s,
            Some(options(&runtime)),
            None,
            true,
        ),
    ];
    let dirs = drain::task_dirs([Path::new("/run/k3s/containerd/containerd.sock")]);
    for (case, under, options_json, runtime_file, held) in cases {
        let host = Host::new();
        let dir = host.path(&format!("{under}/k8s.io/{ID}"));
        fs::create_dir_all(&dir).unwrap();
        if let Some(text) = options_json {
            fs::write(dir.join(OPTIONS_FILE), text).unwrap();
        }
        if let Some(text) = runtime_file {
            fs::write(dir.join(RUNTIME_FILE), text).unwrap();
        }
        let want: Vec<String> = if held { vec![ID.to_owned()] } else { vec![] };
        assert_eq!(
            drain::holders(host.root.path(), Path::new(TOOLKIT), &dirs),
            want,
            "{case}"
        );
    }
    assert_eq!(
        drain::task_dirs([Path::new("/var/run/docker.sock")]),
        drain::TASK_DIRS.map(PathBuf::from),
        "a socket that is not containerd's adds nothing"
    );
}

#[test]
fn an_undo_past_its_bound_keeps_the_binaries_for_a_container_that_runs_them() {
    // (case, what comes after the containers are gone)
    for (case, install_again) in [
        ("`nvshim uninstall` again", false),
        ("an install over what was left, then its undo", true),
    ] {
        let (host, dir, before) = containerd_host(&runtime());
        let lines = host.uninstall_within(Duration::ZERO);
        let note = lines.iter().find(|l| l.contains("left its binaries"));
        assert!(
            note.is_some_and(|n| n.contains("1 container") && n.contains(ID)),
            "{case}: {lines:?}"
        );
        assert_eq!(
            host.read(&format!("{TOOLKIT}/nvidia-container-runtime")),
            "nvidia-container-runtime v1\n",
            "{case}: the runtime stays"
        );
        assert_eq!(
            host.read("/etc/containerd/config.toml"),
            CONTAINERD,
            "{case}"
        );
        assert!(
            !host.path("/etc/containerd/conf.d/99-nvidia.toml").exists(),
            "{case}: the drop-in goes"
        );
        assert!(
            !host.path("/run/nvidia/validations/toolkit-ready").exists(),
            "{case}: the ready file goes"
        );
        let left = state::load(&state_file(&host.place())).unwrap().unwrap();
        assert_eq!(
            (left.owner.as_str(), left.files.len()),
            ("", 0),
            "{case}: a record of the binaries only"
        );

        if install_again {
            install(&host.settings("containerd", &[])).unwrap();
            let drop_in = host.read("/etc/containerd/conf.d/99-nvidia.toml");
            assert!(drop_in.contains(&runtime()), "{case}: {drop_in}");
        }
        fs::remove_dir_all(host.path(&dir)).unwrap();
        let lines = host.uninstall_within(Duration::ZERO);
        assert!(
            lines.iter().any(|l| l.starts_with("uninstalled from")),
            "{case}: {lines:?}"
        );
        assert_eq!(host.snapshot(), without(before, &dir), "{case}");
    }
}

#[test]
fn a_bundle_of_another_runtime_does_not_hold_the_binaries() {
    let (host, _, before) = containerd_host("/usr/bin/runc");
    let lines = host.uninstall_within(Duration::ZERO);
    assert!(
        !lines.iter().any(|l| l.contains("container(s)")),
        "no wait, nothing kept: {lines:?}"
    );
    assert_eq!(host.snapshot(), before);
}

/// Waits until the undo has put back its last file (config.toml), so that it waits for
/// the containers now, then a little more.
fn once_waiting(host: &Host) -> impl FnOnce() + Send + 'static {
    let config = host.path(&config_toml_path(Path::new(TOOLKIT)).display().to_string());
    move || {
        while config.exists() {
            std::thread::sleep(Duration::from_millis(10));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

#[test]
fn a_container_that_goes_during_the_wait_lets_the_undo_remove_the_binaries() {
    let (host, dir, before) = containerd_host(&runtime());
    let gone = host.path(&dir);
    let waiting = once_waiting(&host);
    let stopper = std::thread::spawn(move || {
        waiting();
        fs::remove_dir_all(gone).unwrap();
    });
    let lines = host.uninstall_within(Duration::from_secs(60));
    stopper.join().unwrap();
    assert!(
        !lines.iter().any(|l| l.contains("left its binaries")),
        "{lines:?}"
    );
    assert_eq!(host.snapshot(), without(before, &dir));
}

#[test]
fn an_install_during_the_wait_keeps_everything_it_did() {
    let (host, _, _) = containerd_host(&runtime());
    let settings = host.settings("containerd", &[]);
    let waiting = once_waiting(&host);
    let installer = std::thread::spawn(move || {
        waiting();
        install(&settings).unwrap().owner
    });
    let lines = host.uninstall_within(Duration::from_secs(60));
    let owner = installer.join().unwrap();
    assert!(lines.iter().any(|l| l.contains("took over")), "{lines:?}");
    let record = state::load(&state_file(&host.place())).unwrap().unwrap();
    assert_eq!(record.owner, owner, "the new install's record");
    let drop_in = host.read("/etc/containerd/conf.d/99-nvidia.toml");
    assert!(drop_in.contains(&runtime()), "{drop_in}");
    assert_eq!(
        host.read(&format!("{TOOLKIT}/nvidia-container-runtime")),
        "nvidia-container-runtime v1\n"
    );
}

proptest! {
    #[test]
    fn options_json_of_any_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let _ = drain::options_binary(&bytes);
    }

    #[test]
    fn the_binary_name_comes_back_from_containerds_json(name in "/[a-z0-9/._-]{1,40}", cgroup: bool) {
        let json = serde_json::json!({"binary_name": name, "systemd_cgroup": cgroup, "root": "/run/x"});
        prop_assert_eq!(drain::options_binary(json.to_string().as_bytes()), Some(name));
    }
}

//! The install guide's docker story in a Debian chroot, from the signed repository:
//! `apt-get install -y nvidia-docker2` pulls the toolkit packages and adds the `nvidia`
//! runtime to a daemon.json that has other keys; a dockerd started on that file (the
//! installed binaries first on its PATH, a simulated node) runs `docker run --gpus
//! '"device=0,1,2"'` with exactly those GPUs and `--runtime=nvidia` with the variable;
//! purge takes the runtime out again. Then NVIDIA's 1.13.0 packages (fakes built here
//! with dpkg-deb, their nvidia-docker2 owning daemon.json as NVIDIA's did) are upgraded
//! to ours, and purge after that upgrade still leaves daemon.json with its other keys.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::chroot::{Chroot, signed_repo};
use super::{
    BASE, DOCKER_SET, DOCKER2, TOOLKIT, TOOLS, VERSION, deb_version, fake_deb, have, ok, run,
};
use crate::common::{Node, node};
use nvshim_testkit::{Dockerd, NodeSpec, path_with_prefix, tar_rootfs};

const IMAGE: &str = "nvshim-packages:glibc";
const DAEMON_JSON: &str = "/etc/docker/daemon.json";
/// What NVIDIA's nvidia-docker2 shipped as its conffile /etc/docker/daemon.json.
const NVIDIA_DAEMON_JSON: &str =
    r#"{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}}"#;

/// NVIDIA's 1.13.0 set (nvidia-docker2 2.13.0), with the files where NVIDIA put them.
fn fake_nvidia_set(dir: &Path) -> Vec<PathBuf> {
    let script = "#!/bin/sh\necho fake NVIDIA\n";
    let v = "1.13.0-1";
    let base = [
        ("/usr/bin/nvidia-ctk", script),
        ("/usr/bin/nvidia-container-runtime", script),
        ("/etc/nvidia-container-runtime/config.toml", "# NVIDIA's\n"),
    ];
    let tools = [("/usr/bin/nvidia-container-cli", script)];
    let depends = format!("Depends: {BASE} (= {v}), {TOOLS} (>= {v}), {TOOLS} (<< 2.0.0)\n");
    let hooks_d = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json";
    let toolkit = [
        ("/usr/bin/nvidia-container-runtime-hook", script),
        (hooks_d, "{}"),
    ];
    let docker2 = [
        ("/usr/bin/nvidia-docker", script),
        (DAEMON_JSON, NVIDIA_DAEMON_JSON),
    ];
    let docker2_depends = format!("Depends: {TOOLKIT} (>= 1.13.0-1)\n");
    vec![
        fake_deb(dir, BASE, v, &base, ""),
        fake_deb(dir, TOOLS, v, &tools, ""),
        fake_deb(dir, TOOLKIT, v, &toolkit, &depends),
        fake_deb(dir, DOCKER2, "2.13.0-1", &docker2, &docker2_depends),
    ]
}

fn daemon_json(ch: &Chroot) -> Value {
    let text = ch.read(DAEMON_JSON);
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("daemon.json: {e}:\n{text}"))
}

/// `docker run` through `daemon` with the node's mock NVML; the `nvidia-smi -L` output
/// and how many GPUs it lists.
fn smi(daemon: &Dockerd, node: &Node, flags: &[&str]) -> (String, usize) {
    let mock = format!("{}:/etc/mock-nvml.json:ro", node.sim.mock_config.display());
    let mut docker = daemon.docker();
    docker.args(["run", "--rm", "-v", &mock]);
    docker.args(["-e", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"]);
    docker.args(["-e", "MOCK_NVML_DEV_ROOT=/dev"]);
    let out = ok(docker.args(flags).args([IMAGE, "nvidia-smi", "-L"]));
    let gpus = out.lines().filter(|l| l.starts_with("GPU ")).count();
    (out, gpus)
}

#[test]
fn nvidia_docker2_installs_runs_gpus_upgrades_from_nvidia_and_purges() {
    if !have(&["dockerd", "docker", "runc", "dpkg-deb"]) {
        return;
    }
    let fakes = tempfile::tempdir().unwrap();
    let repo = signed_repo(&fake_nvidia_set(fakes.path()));
    let Some(ch) = Chroot::new(repo.path()) else {
        return;
    };
    ch.apt(&["update", "--error-on=any"]);
    let ours = format!("ii{}", deb_version());
    // The admin's daemon.json, with keys of its own.
    let seeded = json!({"log-level": "warn", "max-concurrent-downloads": 2});
    fs::create_dir_all(ch.path("/etc/docker")).unwrap();
    fs::write(ch.path(DAEMON_JSON), seeded.to_string()).unwrap();

    let installed = ch.apt(&["install", DOCKER2]);
    for package in DOCKER_SET {
        assert_eq!(ch.status(package), ours, "{package}:\n{installed}");
    }
    assert!(installed.contains("pkill -SIGHUP dockerd"), "{installed}");
    let configured = daemon_json(&ch);
    let mut want = seeded.clone();
    want["runtimes"] = json!({"nvidia": {"args": [], "path": "nvidia-container-runtime"}});
    assert_eq!(
        configured, want,
        "daemon.json after apt-get install nvidia-docker2"
    );

    // "pkill -SIGHUP dockerd": a test dockerd on that daemon.json. The installed binaries
    // come first on its PATH (the runtime by its bare name, the hook for --gpus); the
    // runtime's config points at the node.
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::write(&config, node.sim.runtime_config("runc", None)).unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    for name in [
        "nvidia-container-runtime",
        "nvidia-container-runtime-hook",
        "nvidia-ctk",
        "nvshim",
        "nvidia-docker",
    ] {
        symlink(ch.path(&format!("/usr/bin/{name}")), bin.join(name)).unwrap();
    }
    let path = path_with_prefix(&bin);
    let env = [
        ("PATH", path.to_str().unwrap()),
        ("NVIDIA_CTK_CONFIG_FILE_PATH", config.to_str().unwrap()),
    ];
    let docker_dir = dir.path().join("docker");
    let daemon = Dockerd::start_with_env(&docker_dir, &configured, &env).unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let tar = dir.path().join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    daemon.import(&tar, IMAGE).unwrap();

    let gpus = &node.sim.spec.gpus;
    let (out, count) = smi(&daemon, &node, &["--gpus", r#""device=0,1,2""#]);
    assert_eq!(count, 3, "--gpus device=0,1,2:\n{out}");
    for gpu in &gpus[..3] {
        assert!(out.contains(&gpu.uuid), "lacks {}:\n{out}", gpu.uuid);
    }
    assert!(!out.contains(&gpus[3].uuid), "GPU 3 too:\n{out}");
    let variable = ["--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=1"];
    let (out, count) = smi(&daemon, &node, &variable);
    assert!(
        count == 1 && out.contains(&gpus[1].uuid),
        "only GPU 1:\n{out}"
    );

    // `nvidia-docker version`: ours first, then docker's (from that dockerd).
    let socket = format!("unix://{}", docker_dir.join("docker.sock").display());
    let mut wrapper = Command::new(bin.join("nvidia-docker"));
    wrapper
        .arg("version")
        .env("PATH", &path)
        .env("DOCKER_HOST", &socket);
    let version = run(&mut wrapper);
    drop(daemon);

    // Purge takes the runtime out again; the admin's keys stay.
    ch.apt(&["purge", DOCKER2]);
    assert_eq!(daemon_json(&ch), seeded, "daemon.json after purge");
    ch.apt(&["purge", BASE, TOOLKIT, TOOLS]);
    for package in DOCKER_SET {
        assert_eq!(ch.status(package), "", "{package} after purge");
    }

    // NVIDIA's set, its daemon.json conffile (the admin adds a key), then ours over it.
    fs::remove_file(ch.path(DAEMON_JSON)).unwrap();
    let nvidia = [
        "nvidia-docker2=2.13.0-1",
        "nvidia-container-toolkit=1.13.0-1",
        "nvidia-container-toolkit-base=1.13.0-1",
        "libnvidia-container-tools=1.13.0-1",
    ];
    ch.apt(&[&["install"][..], &nvidia[..]].concat());
    assert_eq!(ch.status(DOCKER2), "ii2.13.0-1");
    let mut edited: Value = serde_json::from_str(NVIDIA_DAEMON_JSON).unwrap();
    edited["log-level"] = json!("warn");
    fs::write(ch.path(DAEMON_JSON), edited.to_string()).unwrap();
    let upgraded = ch.apt(&["install", DOCKER2]);
    for package in DOCKER_SET {
        assert_eq!(ch.status(package), ours, "{package} upgraded:\n{upgraded}");
    }
    let fake = "fake NVIDIA";
    for name in [
        "nvidia-ctk",
        "nvidia-container-runtime",
        "nvidia-container-cli",
    ] {
        let bytes = fs::read(ch.path(&format!("/usr/bin/{name}"))).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains(fake),
            "{name} is NVIDIA's"
        );
    }
    assert_eq!(daemon_json(&ch), edited, "the upgrade changed daemon.json");
    // dpkg still lists daemon.json as an (obsolete) conffile of the package and
    // deletes it on purge: the postrm puts it back, without our runtime.
    ch.apt(&["purge", DOCKER2]);
    assert_eq!(
        daemon_json(&ch),
        json!({"log-level": "warn"}),
        "after purge"
    );
    // A daemon.json docker cannot read either: the install says so and how to finish,
    // and succeeds (dpkg is not left half-configured, failing every later apt run);
    // the file stays byte for byte, through purge too.
    let broken = "{\"log-level\": \"warn\",\n";
    fs::write(ch.path(DAEMON_JSON), broken).unwrap();
    let installed = ch.apt(&["install", DOCKER2]);
    assert_eq!(ch.status(DOCKER2), ours, "{installed}");
    assert!(
        installed.contains("not valid JSON") && installed.contains("nvshim configure docker"),
        "{installed}"
    );
    assert_eq!(
        ch.read(DAEMON_JSON),
        broken,
        "install changed a broken daemon.json"
    );
    ch.apt(&["purge", DOCKER2]);
    assert_eq!(
        ch.read(DAEMON_JSON),
        broken,
        "purge changed a broken daemon.json"
    );

    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&version.stdout),
        String::from_utf8_lossy(&version.stderr)
    );
    let first = said.lines().next().unwrap_or_default();
    assert!(
        version.status.success() && first.starts_with("NVIDIA Docker: ") && first.contains(VERSION),
        "nvidia-docker version ({}):\n{said}",
        version.status
    );
}

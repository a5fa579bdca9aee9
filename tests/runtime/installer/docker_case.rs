// SPDX-License-Identifier: Apache-2.0
//! docker: an installer daemon with `--restart-mode signal` against a running dockerd (its
//! socket as `--socket`): dockerd reloads daemon.json on SIGHUP without restarting, lists the
//! runtime, runs a GPU container through it by name; SIGTERM gives daemon.json back byte for
//! byte, takes the toolkit and the ready file away and signals dockerd again. (dockerd keeps
//! listing the runtime until it restarts: a reload leaves `runtimes` alone when the file has
//! no such key.)

use super::*;

const IMAGE: &str = "nvshim-installer:glibc";

/// `docker info`'s runtimes: name → path.
fn docker_runtimes(dockerd: &Dockerd) -> BTreeMap<String, String> {
    let out = run_ok(
        dockerd
            .docker()
            .args(["info", "--format", "{{json .Runtimes}}"]),
        "docker info",
    );
    let runtimes: serde_json::Value = serde_json::from_str(out.trim()).unwrap();
    runtimes
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, r)| (name.clone(), r["path"].as_str().unwrap_or("").to_owned()))
        .collect()
}

/// How often dockerd has reloaded its config file (SIGHUP), from its log.
fn reloads(dockerd: &Dockerd) -> usize {
    let log = fs::read_to_string(dockerd.log()).unwrap();
    log.matches("Reloaded configuration").count()
}

#[test]
fn dockerd_reloads_the_runtime_on_sighup_and_runs_a_gpu_container_by_name() {
    let host = Host::new();
    let tmp = host.tmp();
    let engine_dir = tmp.join("docker");
    let daemon_json = json!({
        "log-level": "info",
        "max-concurrent-downloads": 2,
        "log-opts": {"max-size": "10m", "max-file": "3"},
    });
    let env = host.engine_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let dockerd = Dockerd::start_with_env(&engine_dir, &daemon_json, &env).unwrap();
    let rootfs = host.rootfs("rootfs");
    let tar = tmp.join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    dockerd.import(&tar, IMAGE).unwrap();

    // The testkit wrote daemon.json (with its own keys added) in the engine's dir; what the
    // engine keeps beside it (data, exec root, logs) changes as it runs, so the check there is
    // the file itself and the names beside it.
    let config = engine_dir.join("daemon.json");
    let original = fs::read(&config).unwrap();
    let names = nvshim_testkit::dir_names;
    let names_before = names(&engine_dir);
    let pid = fs::read_to_string(engine_dir.join("docker.pid")).unwrap();
    let host_before = tree(&host.root());
    let runc_before = docker_runtimes(&dockerd);
    assert!(!runc_before.contains_key("nvidia"), "{runc_before:?}");

    let source = source_dir(&tmp.join("build"), b"");
    let mut flags = host.flags("docker", &config, &source);
    let socket = engine_dir.join("docker.sock");
    flags.extend(["--restart-mode", "signal", "--socket", s(&socket)].map(str::to_owned));
    let mut daemon = Daemon::spawn(&flags, tmp.join("install.log"));
    wait_until("the installer's ready file", || {
        daemon.assert_running("install");
        host.ready_file().exists()
    });
    let runtime = host.installed_runtime();
    // The installer writes the ready file once dockerd, signalled, lists the runtime.
    assert!(
        reloads(&dockerd) >= 1,
        "dockerd reloaded daemon.json after SIGHUP"
    );
    let runtimes = docker_runtimes(&dockerd);
    assert_eq!(
        runtimes.get("nvidia").map(String::as_str),
        Some(s(&runtime)),
        "docker info when the ready file appeared: {runtimes:?}"
    );
    let reloads_installed = reloads(&dockerd);
    let pid_now = fs::read_to_string(engine_dir.join("docker.pid")).unwrap();
    assert_eq!(pid_now, pid, "dockerd was restarted, not signalled");

    let mock = format!("{}:/etc/mock-nvml.json:ro", host.mock_mount());
    let out = dockerd
        .docker()
        .args(["run", "--rm", "--runtime", "nvidia", "-v", &mock])
        .args(["-e", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
        .args(["-e", "MOCK_NVML_DEV_ROOT=/dev"])
        .args(["-e", "NVIDIA_VISIBLE_DEVICES=0,2"])
        .args([IMAGE, "sh", "-c", GPU_SCRIPT])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "docker run --runtime nvidia: {}",
        text(&out)
    );
    let printed = String::from_utf8_lossy(&out.stdout);
    assert_gpus_0_and_2(&host, &printed, "docker run --runtime nvidia");

    daemon.terminate("SIGTERM to the installer");
    assert!(
        fs::read(&config).unwrap() == original,
        "daemon.json after SIGTERM:\n{}\nbefore:\n{}",
        String::from_utf8_lossy(&fs::read(&config).unwrap()),
        String::from_utf8_lossy(&original)
    );
    assert_eq!(names(&engine_dir), names_before, "files beside daemon.json");
    let changes = tree_changes(&host_before, &tree(&host.root()));
    assert!(
        changes.is_empty(),
        "SIGTERM left changes on the host:\n{changes}"
    );
    // dockerd reloads `runtimes` on SIGHUP only when the file sets the key, so the original
    // file (without it) leaves the runtime listed until dockerd restarts; what shows that the
    // undo signalled it is one more reload in its log.
    wait_until("dockerd reloads daemon.json after the undo", || {
        reloads(&dockerd) > reloads_installed
    });
    let pid_now = fs::read_to_string(engine_dir.join("docker.pid")).unwrap();
    assert_eq!(pid_now, pid, "dockerd was restarted by the undo");
}

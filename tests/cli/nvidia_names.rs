//! NVIDIA's older command names through the real binaries: `nvidia-container-cli`
//! (`info`, `list`, `--version`) and `nvidia-docker` as links to `nvshim`, the runtime's
//! `--version`, the hook's `-help`, and `nvshim info`/`list`/`doctor` finding the node's
//! roots in config.toml when no flag names them. No engine: `docker` and `runc` are
//! scripts that record what they were given.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{Node, hook_bin, node, runtime_bin, stderr, stdout};
use nvshim_testkit::NodeSpec;

const VERSION: &str = env!("CARGO_PKG_VERSION");

/// A tempdir with `nvshim` linked under NVIDIA's names, and the node's config.toml.
struct Names {
    node: Node,
    dir: tempfile::TempDir,
}

impl Names {
    fn new(gpus: usize) -> Names {
        Names::on(NodeSpec::standard(gpus))
    }

    fn on(spec: NodeSpec) -> Names {
        let node = node(&spec);
        let dir = tempfile::tempdir().unwrap();
        for name in ["nvidia-container-cli", "nvidia-docker", "nvshim"] {
            std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nvshim"), dir.path().join(name))
                .unwrap();
        }
        fs::write(
            dir.path().join("config.toml"),
            node.sim.runtime_config("runc", None),
        )
        .unwrap();
        Names { node, dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs one of the links with the mock's env, the config file, and `env`.
    fn run(&self, name: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
        let mut cmd = Command::new(self.path(name));
        cmd.env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", self.path("config.toml"))
            .envs(self.node.sim.env())
            .envs(env.iter().copied())
            .args(args);
        cmd.output().unwrap()
    }

    fn ok(&self, name: &str, args: &[&str]) -> String {
        let out = self.run(name, args, &[]);
        assert!(
            out.status.success(),
            "{name} {args:?}: {}{}",
            stdout(&out),
            stderr(&out)
        );
        stdout(&out)
    }
}

fn script(path: &Path, body: &str) {
    fs::write(path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

#[test]
fn container_cli_info_has_nvidias_fields_and_layout() {
    // GPU 1 a Tesla: the mock answers nvmlDeviceGetBrand with 2 for it, 14 (NVIDIA,
    // which libnvidia-container has no word for) for the A100.
    let mut spec = NodeSpec::standard(2);
    spec.gpus[1].name = "Tesla V100-SXM2-16GB".into();
    let n = Names::on(spec);
    let text = n.ok("nvidia-container-cli", &["info"]);
    let mut want = String::from("NVRM version:   550.54.15\nCUDA version:   12.4\n");
    let mut gpus = n.node.sim.spec.gpus.clone();
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    for (index, gpu) in gpus.iter().enumerate() {
        let brand = if gpu.name.starts_with("Tesla") {
            "Tesla"
        } else {
            "Unknown"
        };
        want.push_str(&format!(
            "\nDevice Index:   {index}\nDevice Minor:   {}\nModel:          {}\n\
             Brand:          {brand}\nGPU UUID:       {}\nBus Location:   0000{}\n\
             Architecture:   8.0\n",
            gpu.minor, gpu.name, gpu.uuid, gpu.bus_id
        ));
    }
    assert_eq!(text, want);

    let csv = n.ok("nvidia-container-cli", &["--load-kmods", "info", "--csv"]);
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[..4],
        [
            "NVRM version,CUDA version",
            "550.54.15,12.4",
            "",
            "Device Index,Device Minor,Model,Brand,GPU UUID,Bus Location,Architecture"
        ],
        "{csv}"
    );
    assert_eq!(
        lines[4],
        format!(
            "0,{},{},Unknown,{},0000{},8.0",
            gpus[0].minor, gpus[0].name, gpus[0].uuid, gpus[0].bus_id
        )
    );
    assert_eq!(lines.len(), 6, "{csv}");
}

#[test]
fn container_cli_list_prints_absolute_paths_from_discovery() {
    let n = Names::new(2);
    let driver = n.node.sim.driver_root.display().to_string();
    let version = n.node.sim.library_version().to_owned();
    let all = n.ok("nvidia-container-cli", &["list"]);
    let lines: Vec<&str> = all.lines().collect();
    assert!(lines.iter().all(|l| l.starts_with('/')), "{all}");
    for want in [
        "/dev/nvidiactl".to_owned(),
        "/dev/nvidia0".to_owned(),
        "/dev/nvidia1".to_owned(),
        format!("{driver}/usr/bin/nvidia-smi"),
        format!("{driver}/usr/lib/x86_64-linux-gnu/libcuda.so.{version}"),
        format!("{driver}/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.{version}"),
    ] {
        assert!(lines.contains(&want.as_str()), "{want} not in\n{all}");
    }
    // NVIDIA's order: devices, binaries, libraries.
    let at = |p: &str| lines.iter().position(|l| l.ends_with(p)).unwrap();
    assert!(at("/dev/nvidiactl") < at("/nvidia-smi") && at("/nvidia-smi") < at(".so.550.54.15"));

    let libs = n.ok("nvidia-container-cli", &["list", "--libraries"]);
    assert!(
        !libs.is_empty()
            && libs
                .lines()
                .all(|l| l.starts_with(&driver) && l.contains(".so.")),
        "{libs}"
    );
    // Index 1 is the GPU with minor 0 on this node (see `NodeSpec::standard`).
    let one = n.ok("nvidia-container-cli", &["list", "--device=1"]);
    assert!(
        one.contains("/dev/nvidia0\n") && !one.contains("/dev/nvidia1\n"),
        "{one}"
    );
    assert!(
        !one.contains(".so."),
        "--device alone lists no libraries:\n{one}"
    );
    // The MIG monitor capability after the device nodes: its proc file, then its node.
    let monitor = n.ok(
        "nvidia-container-cli",
        &["list", "--device=1", "--mig-monitor=all"],
    );
    assert!(
        monitor.ends_with(
            "/dev/nvidia0\n/proc/driver/nvidia/capabilities/mig/monitor\n\
             /dev/nvidia-caps/nvidia-cap2\n"
        ),
        "{monitor}"
    );
}

#[test]
fn container_cli_version_and_what_it_does_not_do() {
    let n = Names::new(1);
    let text = n.ok("nvidia-container-cli", &["--version"]);
    assert!(
        text.starts_with(&format!("cli-version: {VERSION}\nlib-version: {VERSION}\n")),
        "{text}"
    );
    for (case, args, want) in [
        (
            "configure",
            &["configure", "--pid=1", "/rootfs"][..],
            "configure is not part of nvshim",
        ),
        (
            "bad device",
            &["list", "--device=7"][..],
            "device error: unknown GPU",
        ),
        (
            "unknown option",
            &["--frobnicate", "info"][..],
            "--frobnicate",
        ),
    ] {
        let out = n.run("nvidia-container-cli", args, &[]);
        assert_eq!(out.status.code(), Some(1), "{case}");
        assert!(stderr(&out).contains(want), "{case}: {}", stderr(&out));
    }
}

#[test]
fn nvidia_docker_rewrites_argv_and_passes_the_exit_code() {
    let n = Names::new(1);
    let bin = n.path("bin");
    fs::create_dir(&bin).unwrap();
    let argv = n.path("argv");
    script(
        &bin.join("docker"),
        &format!(
            "printf '%s\\n' \"$@\" > {}\necho docker-here\nexit 3",
            argv.display()
        ),
    );
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let out = n.run(
        "nvidia-docker",
        &["run", "--rm", "img", "nvidia-smi"],
        &[("PATH", &path), ("NV_GPU", "0 1")],
    );
    assert_eq!(out.status.code(), Some(3), "{}", stderr(&out));
    assert_eq!(
        fs::read_to_string(&argv).unwrap(),
        "run\n--runtime=nvidia\n-e\nNVIDIA_VISIBLE_DEVICES=0,1\n--rm\nimg\nnvidia-smi\n"
    );

    let out = n.run("nvidia-docker", &["version"], &[("PATH", &path)]);
    assert_eq!(
        stdout(&out),
        format!("NVIDIA Docker: {VERSION}\ndocker-here\n"),
        "{}",
        stderr(&out)
    );
    assert_eq!(fs::read_to_string(&argv).unwrap(), "version\n");

    let elsewhere = n.path("other-docker");
    script(
        &elsewhere,
        &format!("printf '%s\\n' \"$@\" > {}", argv.display()),
    );
    let out = n.run(
        "nvidia-docker",
        &["ps"],
        &[("NV_DOCKER", &elsewhere.display().to_string())],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(fs::read_to_string(&argv).unwrap(), "ps\n");

    let out = n.run("nvidia-docker", &["ps"], &[("PATH", "/nonexistent")]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("cannot run docker: not found"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn runtime_version_is_ours_then_runcs_and_the_hook_has_help() {
    let n = Names::new(1);
    let runc = n.path("fake-runc");
    script(&runc, "echo \"runc version 9.9.9 args: $*\"");
    fs::write(
        n.path("runtime.toml"),
        format!(
            "[nvidia-container-runtime]\nruntimes = [\"{}\"]\n",
            runc.display()
        ),
    )
    .unwrap();
    let out = Command::new(runtime_bin())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", n.path("runtime.toml"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let text = stdout(&out);
    assert!(
        text.starts_with(&format!("NVIDIA Container Runtime version {VERSION}\n")),
        "{text}"
    );
    assert!(
        text.ends_with("\n\nrunc version 9.9.9 args: --version\n"),
        "{text}"
    );

    for flag in ["-h", "--help"] {
        let out = Command::new(hook_bin())
            .arg(flag)
            .env_clear()
            .output()
            .unwrap();
        assert!(out.status.success(), "{flag}: {}", stderr(&out));
        assert!(
            stderr(&out).contains("usage: nvidia-container-runtime-hook"),
            "{flag}"
        );
    }
}

#[test]
fn nvshim_reads_the_roots_from_config_toml_without_flags() {
    let n = Names::new(2);
    let info = n.ok("nvshim", &["info", "--backend", "procfs"]);
    assert!(info.contains("GPUs:           2"), "{info}");
    let list = n.ok("nvshim", &["list", "--devices", "1"]);
    let driver = n.node.sim.driver_root.display().to_string();
    assert!(list.contains(&format!("from {driver}/")), "{list}");

    let p = |name: &str| n.path(name).display().to_string();
    let out = n.run(
        "nvshim",
        &[
            "doctor",
            "--docker-config",
            &p("daemon.json"),
            "--containerd-config",
            &p("containerd.toml"),
            "--crio-config-dir",
            &p("crio"),
            "--cdi-spec-dir",
            &p("cdi"),
        ],
        &[],
    );
    let text = stdout(&out);
    assert!(
        text.contains("2 GPU(s)") && !text.contains("[FAIL] device nodes"),
        "{text}"
    );

    // A flag still wins over the file.
    let out = n.run(
        "nvshim",
        &["info", "--backend", "procfs", "--proc-root", "/nonexistent"],
        &[],
    );
    assert!(!out.status.success(), "{}", stdout(&out));
    // A broken file is an error naming it, not a silent `/`.
    fs::write(n.path("config.toml"), "[nvidia-container-cli\n").unwrap();
    let out = n.run("nvshim", &["info"], &[]);
    assert_eq!(out.status.code(), Some(1));
    assert!(stderr(&out).contains("config.toml"), "{}", stderr(&out));
}

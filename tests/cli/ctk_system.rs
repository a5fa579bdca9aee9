// SPDX-License-Identifier: Apache-2.0
//! `nvidia-ctk system`, `config` and `info` through the real binary, started under
//! that name (a link to `nvshim`), on a simulated node.

use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{node, stderr, stdout};
use nvshim_testkit::{NVIDIA_CAPS_MAJOR, NVIDIA_MAJOR, NVIDIA_UVM_MAJOR, NodeSpec};

/// `nvidia-ctk` as packages install it: a link to the one binary.
fn ctk_link(dir: &Path) -> PathBuf {
    let link = dir.join("nvidia-ctk");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_nvshim"), &link).unwrap();
    link
}

fn ctk(link: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(link);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn ok(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        stdout(out),
        stderr(out)
    );
    stdout(out)
}

fn failed(out: &Output, what: &str) -> String {
    assert_eq!(out.status.code(), Some(1), "{what}: {}", stdout(out));
    stderr(out)
}

#[test]
fn ctk_system_create_all_makes_nodes_and_links_idempotently() {
    let node = node(&NodeSpec::standard(2));
    let sim = node.sim.dir.clone();
    fs::write(
        sim.join("proc/devices"),
        format!(
            "Character devices:\n  1 mem\n{NVIDIA_MAJOR} nvidia-frontend\n\
             {NVIDIA_UVM_MAJOR} nvidia-uvm\n{NVIDIA_CAPS_MAJOR} nvidia-caps\n"
        ),
    )
    .unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let link = ctk_link(tmp.path());
    // A driver root whose /dev has nothing yet: --create-device-nodes makes the
    // control nodes, --create-all links every node the driver can have.
    let root = tmp.path().join("root");
    let root_s = root.display().to_string();
    let sim_s = sim.display().to_string();
    let dev_char = format!("{root_s}/dev/char");
    let args = [
        "system",
        "create-dev-char-symlinks",
        "--create-all",
        "--create-device-nodes",
        "--driver-root",
        &root_s,
        "--proc-root",
        &sim_s,
        "--dev-char-path",
        &dev_char,
    ];

    let mut dry = args.to_vec();
    dry.push("--dry-run");
    let printed = ok(&ctk(&link, &dry, &[]), "dry run");
    assert!(
        printed.contains(&format!(
            "would create link {dev_char}/{NVIDIA_MAJOR}:255 -> ../nvidiactl"
        )),
        "{printed}"
    );
    assert!(!root.exists(), "a dry run creates nothing");

    let printed = ok(&ctk(&link, &args, &[]), "create-all");
    let ctl = fs::symlink_metadata(root.join("dev/nvidiactl")).unwrap();
    assert!(ctl.file_type().is_char_device());
    assert_eq!(
        ctl.rdev(),
        nix::sys::stat::makedev(NVIDIA_MAJOR.into(), 255)
    );
    let gpu1 = node.sim.spec.gpus[1].minor;
    for (name, target) in [
        (format!("{NVIDIA_MAJOR}:255"), "../nvidiactl".to_owned()),
        (
            format!("{NVIDIA_MAJOR}:254"),
            "../nvidia-modeset".to_owned(),
        ),
        (
            format!("{NVIDIA_UVM_MAJOR}:1"),
            "../nvidia-uvm-tools".to_owned(),
        ),
        (format!("{NVIDIA_MAJOR}:{gpu1}"), format!("../nvidia{gpu1}")),
        (
            format!("{NVIDIA_CAPS_MAJOR}:1"),
            "../nvidia-caps/nvidia-cap1".to_owned(),
        ),
    ] {
        assert_eq!(
            fs::read_link(root.join("dev/char").join(&name)).unwrap(),
            PathBuf::from(&target),
            "{name}\n{printed}"
        );
    }
    // The control links resolve to the nodes just made.
    assert_eq!(
        fs::metadata(root.join(format!("dev/char/{NVIDIA_MAJOR}:255")))
            .unwrap()
            .rdev(),
        ctl.rdev()
    );

    let again = ok(&ctk(&link, &args, &[]), "second run");
    assert!(
        again.lines().all(|l| l.starts_with("unchanged ")),
        "idempotent:\n{again}"
    );

    let driver = node.sim.driver_root.display().to_string();
    let libs = ok(
        &ctk(
            &link,
            &["system", "print-ldcache", "--driver-root", &driver],
            &[],
        ),
        "print-ldcache",
    );
    assert!(
        libs.contains("64-bit libraries found")
            && libs
                .lines()
                .any(|l| l == "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        "{libs}"
    );

    // Without --create-all the existing nodes of the simulated node are linked.
    let existing = ok(
        &ctk(
            &link,
            &[
                "system",
                "create-dev-char-symlinks",
                "--driver-root",
                &sim_s,
                "--dry-run",
            ],
            &[("DEV_CHAR_PATH", &format!("{sim_s}/dev/char"))],
        ),
        "existing",
    );
    assert!(
        existing.contains(&format!(
            "{sim_s}/dev/char/{NVIDIA_MAJOR}:{gpu1} -> ../nvidia{gpu1}"
        )),
        "DEV_CHAR_PATH as NVIDIA's reads it:\n{existing}"
    );
}

#[test]
fn ctk_system_load_kernel_modules_reports_modprobes_failure() {
    let tmp = tempfile::tempdir().unwrap();
    let link = ctk_link(tmp.path());
    // A stand-in modprobe: this host has no NVIDIA module, and the test must not ask
    // the real one to load anything.
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    fs::write(
        bin.join("modprobe"),
        "#!/bin/sh\necho \"modprobe: FATAL: Module $1 not found in directory /lib/modules/x\" >&2\nexit 1\n",
    )
    .unwrap();
    fs::set_permissions(
        bin.join("modprobe"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let path = format!("{}:/usr/bin:/bin", bin.display());
    let root = tmp.path().display().to_string();
    let base = [
        "system",
        "create-device-nodes",
        "--control-devices",
        "--driver-root",
        &root,
    ];
    let mut load = base.to_vec();
    load.push("--load-kernel-modules");
    let err = failed(&ctk(&link, &load, &[("PATH", &path)]), "modprobe fails");
    assert!(
        err.contains("cannot load kernel module nvidia") && err.contains("Module nvidia not found"),
        "{err}"
    );
    load.push("--dry-run");
    load.extend(["--proc-root", "/nonexistent"]);
    let out = ctk(&link, &load, &[("PATH", &path)]);
    let err = failed(&out, "dry run, no /proc/devices");
    assert!(err.contains("/nonexistent/proc/devices"), "{err}");
    assert!(
        stdout(&out).contains("would run modprobe nvidia-uvm"),
        "{}",
        stdout(&out)
    );
}

#[test]
fn ctk_config_set_in_place_default_and_info() {
    let node = node(&NodeSpec::standard(2));
    let tmp = tempfile::tempdir().unwrap();
    let link = ctk_link(tmp.path());
    let file = tmp.path().join("config.toml");
    let file_s = file.display().to_string();
    fs::write(
        &file,
        format!(
            "# mine\n[nvidia-container-cli]\nno-cgroups = false # why\n\n[nvshim]\nproc-root = \"{}\"\n",
            node.sim.dir.display()
        ),
    )
    .unwrap();

    let printed = ok(
        &ctk(
            &link,
            &[
                "config",
                "--config-file",
                &file_s,
                "--set",
                "nvidia-container-cli.no-cgroups",
            ],
            &[],
        ),
        "config to stdout",
    );
    assert!(printed.contains("no-cgroups = true # why"), "{printed}");
    assert!(
        fs::read_to_string(&file)
            .unwrap()
            .contains("no-cgroups = false")
    );

    let env = [("NVIDIA_CTK_CONFIG_FILE_PATH", file_s.as_str())];
    ok(
        &ctk(
            &link,
            &[
                "config",
                "-i",
                "--set",
                "nvidia-container-runtime.runtimes=crun,runc",
            ],
            &env,
        ),
        "in place",
    );
    let text = fs::read_to_string(&file).unwrap();
    assert!(
        text.starts_with("# mine\n") && text.contains("runtimes = [\"crun\", \"runc\"]"),
        "{text}"
    );

    let err = failed(
        &ctk(
            &link,
            &["config", "-i", "--set", "nvidia-container-cli.nope=1"],
            &env,
        ),
        "unknown key",
    );
    assert!(
        err.contains("unknown key") && err.contains("no-cgroups (boolean)"),
        "{err}"
    );
    assert_eq!(
        fs::read_to_string(&file).unwrap(),
        text,
        "nothing written on error"
    );
    failed(
        &ctk(&link, &["config", "-i", "-o", "/tmp/x"], &env),
        "-i with -o",
    );

    let default = ok(&ctk(&link, &["config", "default"], &[]), "config default");
    let shipped =
        fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("packaging/config.toml"))
            .unwrap();
    assert_eq!(default, shipped);
    let out = tmp.path().join("sub/default.toml");
    ok(
        &ctk(
            &link,
            &[
                "config",
                "generate-default",
                "--output",
                &out.display().to_string(),
            ],
            &[],
        ),
        "generate-default --output",
    );
    assert_eq!(fs::read_to_string(&out).unwrap(), shipped);

    let info = ok(&ctk(&link, &["--config", &file_s, "info"], &[]), "info");
    for want in [
        format!("config file: {file_s} (in use)"),
        format!("driver version: {}", node.sim.spec.driver_version),
        "GPUs: 2".to_owned(),
    ] {
        assert!(info.contains(&want), "{info} lacks {want}");
    }
}

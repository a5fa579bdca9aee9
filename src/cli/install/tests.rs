// SPDX-License-Identifier: Apache-2.0
//! The installer on temp host roots: each engine's files after install and after the
//! undo (byte for byte, no `.bak`), an edit made since, idempotence, an upgrade and the
//! ownership it takes, the flags' errors. The engine's PID and the daemon's SIGTERM:
//! `signal_tests`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use clap::Parser;
use tempfile::TempDir;

use super::args::{InstallArgs, RestartMode, Settings};
use super::*;
use crate::cli::{Cli, Command};

pub(super) const TOOLKIT: &str = "/usr/local/nvidia/toolkit";

pub(super) struct Host {
    pub(super) root: TempDir,
    pub(super) source: TempDir,
}

impl Host {
    pub(super) fn new() -> Host {
        let host = Host {
            root: tempfile::tempdir().unwrap(),
            source: tempfile::tempdir().unwrap(),
        };
        host.binaries("v1");
        host
    }

    /// Fake binaries whose bytes say `version`.
    fn binaries(&self, version: &str) {
        for name in layout::COPIED {
            fs::write(self.source.path().join(name), format!("{name} {version}\n")).unwrap();
        }
    }

    pub(super) fn path(&self, host_path: &str) -> PathBuf {
        self.root.path().join(host_path.trim_start_matches('/'))
    }

    pub(super) fn write(&self, host_path: &str, text: &str) {
        let p = self.path(host_path);
        fs::create_dir_all(p.parent().unwrap()).unwrap();
        fs::write(p, text).unwrap();
    }

    pub(super) fn read(&self, host_path: &str) -> String {
        fs::read_to_string(self.path(host_path)).unwrap()
    }

    /// Every file and link under the root with its content (a link's target).
    pub(super) fn snapshot(&self) -> BTreeMap<PathBuf, String> {
        fn walk(dir: &Path, base: &Path, out: &mut BTreeMap<PathBuf, String>) {
            for entry in fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                let rel = path.strip_prefix(base).unwrap().to_path_buf();
                let meta = fs::symlink_metadata(&path).unwrap();
                if meta.is_symlink() {
                    out.insert(
                        rel,
                        format!("-> {}", fs::read_link(&path).unwrap().display()),
                    );
                } else if meta.is_dir() {
                    out.insert(rel, "dir".to_owned());
                    walk(&path, base, out);
                } else {
                    out.insert(rel, fs::read_to_string(&path).unwrap_or_default());
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(self.root.path(), self.root.path(), &mut out);
        out
    }

    pub(super) fn settings(&self, engine: &str, extra: &[&str]) -> Settings {
        self.settings_env(engine, extra, &[])
    }

    pub(super) fn settings_env(
        &self,
        engine: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Settings {
        let root = self.root.path().display().to_string();
        let source = self.source.path().display().to_string();
        let mut argv = vec![
            "nvshim",
            "install",
            "--host-root",
            &root,
            "--source-dir",
            &source,
            "--restart-mode",
            "none",
            "--no-daemon",
        ];
        if !engine.is_empty() {
            argv.extend(["--runtime", engine]);
        }
        argv.extend(extra);
        resolve(&argv, env).unwrap()
    }

    pub(super) fn place(&self) -> Place {
        Place {
            host_root: self.root.path().to_path_buf(),
            toolkit_dir: PathBuf::from(TOOLKIT),
        }
    }

    pub(super) fn uninstall(&self) -> Vec<String> {
        self.uninstall_within(DRAIN_BOUND)
    }

    /// `nvshim uninstall`, waiting at most `bound` for containers that use the runtime.
    pub(super) fn uninstall_within(&self, bound: std::time::Duration) -> Vec<String> {
        // No processes: a CRI-O monitor of this machine (a live cluster's) holds nothing here.
        let no_processes = self.root.path().join(".no-proc");
        let overrides = RestartOverride {
            proc: Some(no_processes),
            ..RestartOverride::default()
        };
        uninstall(&self.place(), None, &overrides, bound)
            .unwrap()
            .unwrap()
    }
}

pub(super) fn parse(argv: &[&str]) -> (crate::cli::HostArgs, InstallArgs) {
    let cli = Cli::try_parse_from(argv).unwrap();
    match cli.command {
        Command::Install(args) => (cli.host, args),
        other => panic!("not install: {other:?}"),
    }
}

pub(super) fn resolve(argv: &[&str], env: &[(&str, &str)]) -> Result<Settings, InstallError> {
    let (host, args) = parse(argv);
    let table: BTreeMap<String, String> = env
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    let lookup = move |name: &str| table.get(name).cloned();
    args.resolve(
        &lookup,
        host.driver_root.as_ref(),
        host.dev_root.as_ref(),
        Path::new("/opt/nvshim/bin"),
    )
}

fn no_backups(host: &Host) {
    for (path, _) in host.snapshot() {
        assert!(
            !path.to_string_lossy().ends_with(".bak"),
            "backup left: {}",
            path.display()
        );
    }
}

#[test]
fn docker_install_writes_the_toolkit_and_daemon_json_and_the_undo_restores_every_byte() {
    let host = Host::new();
    let original = "{\n  \"log-level\": \"warn\",\n  \"runtimes\": {}\n}\n";
    host.write("/etc/docker/daemon.json", original);
    let before = host.snapshot();

    let done = install(&host.settings("docker", &["--driver-root", "/run/nvidia/driver"])).unwrap();
    let daemon: serde_json::Value =
        serde_json::from_str(&host.read("/etc/docker/daemon.json")).unwrap();
    assert_eq!(
        daemon["runtimes"]["nvidia"]["path"],
        "/usr/local/nvidia/toolkit/nvidia-container-runtime"
    );
    assert_eq!(daemon["log-level"], "warn");
    // Every name is a link through `current`, and reads the version's bytes.
    for name in layout::stable_names() {
        let link = host.path(&format!("{TOOLKIT}/{name}"));
        assert_eq!(
            fs::read_link(&link).unwrap(),
            Path::new("current").join(name),
            "{name}"
        );
    }
    assert_eq!(
        host.read(&format!("{TOOLKIT}/nvidia-container-runtime")),
        "nvidia-container-runtime v1\n"
    );
    assert_eq!(
        host.read(&format!("{TOOLKIT}/nvidia-ctk")),
        "nvshim v1\n",
        "nvidia-ctk is nvshim"
    );
    // config.toml: the driver root and the toolkit's hook, and the versions see it
    // beside themselves.
    let toml_path = format!("{TOOLKIT}/.config/nvidia-container-runtime/config.toml");
    let (config, unknown) =
        crate::config::parse(&host.read(&toml_path), Path::new("config.toml")).unwrap();
    assert!(unknown.is_empty(), "{unknown:?}");
    assert_eq!(config.driver_root(), Path::new("/run/nvidia/driver"));
    assert_eq!(
        config.nvidia_container_runtime_hook.path,
        Path::new(TOOLKIT).join("nvidia-container-runtime-hook")
    );
    let current = fs::read_link(host.path(&format!("{TOOLKIT}/current"))).unwrap();
    let beside = crate::config::beside(Some(
        host.path(TOOLKIT).join(&current).join("nvshim").as_os_str(),
    ))
    .unwrap();
    assert_eq!(fs::read_to_string(beside).unwrap(), host.read(&toml_path));
    assert_eq!(host.read("/run/nvidia/validations/toolkit-ready"), "");
    assert!(!done.owner.is_empty());

    let lines = host.uninstall();
    assert!(lines.iter().any(|l| l.contains("uninstalled")), "{lines:?}");
    assert_eq!(host.snapshot(), before, "the host root after the undo");
}

#[test]
fn containerd_drop_in_imports_the_host_path_and_the_undo_removes_both() {
    let host = Host::new();
    let original = "version = 2\n\n# ours\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\n  default_runtime_name = \"runc\"\n";
    host.write("/etc/containerd/config.toml", original);
    let before = host.snapshot();

    install(&host.settings("containerd", &["--set-as-default"])).unwrap();
    let top = host.read("/etc/containerd/config.toml");
    assert!(
        top.contains("\"/etc/containerd/conf.d/*.toml\""),
        "the import names the host path: {top}"
    );
    assert!(
        !top.contains(&host.root.path().display().to_string()),
        "{top}"
    );
    let drop_in = host.read("/etc/containerd/conf.d/99-nvidia.toml");
    assert!(
        drop_in.contains("BinaryName = \"/usr/local/nvidia/toolkit/nvidia-container-runtime\""),
        "{drop_in}"
    );
    assert!(
        drop_in.contains("default_runtime_name = \"nvidia\""),
        "{drop_in}"
    );
    assert!(
        !drop_in.contains(&host.root.path().display().to_string()),
        "the drop-in names host paths only: {drop_in}"
    );
    no_backups(&host);

    host.uninstall();
    assert_eq!(host.snapshot(), before, "the host root after the undo");
}

#[test]
fn containerd_without_a_config_creates_one_and_the_undo_leaves_nothing() {
    let host = Host::new();
    let before = host.snapshot();
    install(&host.settings("containerd", &["--drop-in-config", ""])).unwrap();
    let top = host.read("/etc/containerd/config.toml");
    assert!(top.contains("nvidia"), "edited in place: {top}");
    assert!(!host.path("/etc/containerd/conf.d").exists());
    host.uninstall();
    assert_eq!(host.snapshot(), before);
}

#[test]
fn crio_writes_its_drop_in_and_the_undo_removes_it() {
    let host = Host::new();
    host.write(
        "/etc/crio/crio.conf",
        "[crio.runtime]\ndefault_runtime = \"crun\"\n",
    );
    let before = host.snapshot();
    install(&host.settings("crio", &[])).unwrap();
    let drop_in = host.read("/etc/crio/crio.conf.d/99-nvidia.toml");
    assert!(
        drop_in.contains("runtime_path = \"/usr/local/nvidia/toolkit/nvidia-container-runtime\""),
        "{drop_in}"
    );
    no_backups(&host);
    host.uninstall();
    assert_eq!(host.snapshot(), before);
}

#[test]
fn an_engine_config_edited_since_is_undone_by_the_transform_and_says_so() {
    let host = Host::new();
    host.write("/etc/docker/daemon.json", "{\"debug\": true}\n");
    install(&host.settings("docker", &[])).unwrap();
    let edited = host
        .read("/etc/docker/daemon.json")
        .replace("\"debug\": true", "\"debug\": false");
    host.write("/etc/docker/daemon.json", &edited);

    let lines = host.uninstall();
    assert!(
        lines.iter().any(|l| l.contains("edited since")),
        "{lines:?}"
    );
    let daemon: serde_json::Value =
        serde_json::from_str(&host.read("/etc/docker/daemon.json")).unwrap();
    assert_eq!(daemon["debug"], false, "the edit stays");
    assert!(
        daemon
            .get("runtimes")
            .is_none_or(|r| r.get("nvidia").is_none()),
        "{daemon}"
    );
    no_backups(&host);
    assert!(!host.path(TOOLKIT).exists());
}

#[test]
fn a_second_install_of_the_same_binaries_changes_nothing_but_the_owner() {
    let host = Host::new();
    host.write("/etc/docker/daemon.json", "{}\n");
    let settings = host.settings("docker", &[]);
    let first = install(&settings).unwrap();
    let after_first = host.snapshot();
    let second = install(&settings).unwrap();
    assert!(
        second.lines.iter().any(|l| l.contains("already in place")),
        "{:?}",
        second.lines
    );
    assert_ne!(first.owner, second.owner);
    let mut after_second = host.snapshot();
    let state = PathBuf::from(TOOLKIT.trim_start_matches('/')).join(state::STATE_FILE);
    after_second.insert(state.clone(), after_first[&state].clone());
    assert_eq!(
        after_second, after_first,
        "only the state file's owner changed"
    );
}

#[test]
fn an_upgrade_switches_current_keeps_the_previous_version_and_takes_ownership() {
    let host = Host::new();
    host.write("/etc/docker/daemon.json", "{}\n");
    let before = host.snapshot();
    let old = install(&host.settings("docker", &[])).unwrap();
    let v1 = fs::read_link(host.path(&format!("{TOOLKIT}/current"))).unwrap();

    host.binaries("v2");
    let new = install(&host.settings("docker", &[])).unwrap();
    assert_eq!(
        host.read(&format!("{TOOLKIT}/nvidia-container-runtime")),
        "nvidia-container-runtime v2\n"
    );
    assert!(
        host.path(TOOLKIT).join(&v1).is_dir(),
        "the previous version stays"
    );

    // The old daemon's SIGTERM: another install owns the record, nothing changes.
    let snapshot = host.snapshot();
    let outcome = uninstall(
        &host.place(),
        Some(&old.owner),
        &RestartOverride::default(),
        DRAIN_BOUND,
    )
    .unwrap();
    assert!(outcome.is_none());
    assert_eq!(host.snapshot(), snapshot);

    // A third version: the first one goes.
    host.binaries("v3");
    install(&host.settings("docker", &[])).unwrap();
    assert!(
        !host.path(TOOLKIT).join(&v1).exists(),
        "older versions are deleted"
    );
    let versions = fs::read_dir(host.path(&format!("{TOOLKIT}/versions")))
        .unwrap()
        .count();
    assert_eq!(versions, 2, "current and previous");

    // The owner's undo still restores the original daemon.json, not v1's.
    let _ = new;
    host.uninstall();
    assert_eq!(host.snapshot(), before);
}

#[test]
fn files_in_the_way_of_the_toolkit_names_come_back_after_the_undo() {
    let host = Host::new();
    host.write("/etc/docker/daemon.json", "{}\n");
    host.write(
        &format!("{TOOLKIT}/nvidia-container-runtime"),
        "#!/bin/sh\nNVIDIA's wrapper\n",
    );
    host.write(
        &format!("{TOOLKIT}/.config/nvidia-container-runtime/config.toml"),
        "[nvidia-container-cli]\nroot = \"/\"\n",
    );
    let before = host.snapshot();
    install(&host.settings("docker", &[])).unwrap();
    assert_eq!(
        host.read(&format!("{TOOLKIT}/nvidia-container-runtime")),
        "nvidia-container-runtime v1\n"
    );
    host.uninstall();
    assert_eq!(host.snapshot(), before);
}

#[test]
fn uninstall_without_an_install_says_there_is_nothing_to_undo() {
    let host = Host::new();
    let lines = host.uninstall();
    assert!(lines[0].contains("nothing to undo"), "{lines:?}");
}

#[test]
fn another_engine_over_an_existing_install_is_refused() {
    let host = Host::new();
    host.write("/etc/docker/daemon.json", "{}\n");
    install(&host.settings("docker", &[])).unwrap();
    let err = install(&host.settings("containerd", &[])).unwrap_err();
    assert!(err.to_string().contains("nvshim uninstall"), "{err}");
}

#[test]
fn flags_and_variables_resolve_with_nvidia_names_and_bad_values_are_named() {
    let host = Host::new();
    let s = host.settings_env(
        "",
        &[],
        &[
            ("RUNTIME", "containerd"),
            ("CONTAINERD_CONFIG", "/etc/k3s/config.toml"),
            ("CONTAINERD_SOCKET", "/run/k3s/containerd.sock"),
            ("CONTAINERD_RUNTIME_CLASS", "nvidia-experimental"),
            ("CONTAINERD_SET_AS_DEFAULT", "true"),
            ("DRIVER_ROOT", "/run/nvidia/driver"),
        ],
    );
    assert_eq!(s.engine, EngineKind::Containerd);
    assert_eq!(s.config, Path::new("/etc/k3s/config.toml"));
    assert_eq!(s.socket, Path::new("/run/k3s/containerd.sock"));
    assert_eq!(s.runtime_name, "nvidia-experimental");
    assert!(s.set_as_default);
    assert_eq!(s.driver_root, Path::new("/run/nvidia/driver"));
    assert_eq!(
        s.drop_in.as_deref(),
        Some(Path::new("/etc/containerd/conf.d/99-nvidia.toml"))
    );
    // A flag wins over a variable; the first variable over the next.
    let s = host.settings_env(
        "docker",
        &["--config", "/srv/daemon.json"],
        &[
            ("RUNTIME", "crio"),
            ("RUNTIME_CONFIG", "/x"),
            ("DOCKER_CONFIG", "/y"),
        ],
    );
    assert_eq!(s.engine, EngineKind::Docker);
    assert_eq!(s.config, Path::new("/srv/daemon.json"));
    // An empty drop-in variable edits the config in place.
    let s = host.settings_env("containerd", &[], &[("RUNTIME_DROP_IN_CONFIG", "")]);
    assert_eq!(s.drop_in, None);
    assert_eq!(s.restart, RestartMode::None);
    // CRI-O restarts through systemd unless told otherwise.
    let root = host.root.path().display().to_string();
    let s = resolve(
        &[
            "nvshim",
            "install",
            "--host-root",
            &root,
            "--runtime",
            "crio",
        ],
        &[],
    )
    .unwrap();
    assert_eq!(s.restart, RestartMode::Systemd);
    assert!(s.daemon);

    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (
            "unknown engine variable",
            &[],
            &[("RUNTIME", "podman")],
            "\"podman\"",
        ),
        ("no engine", &[], &[], "--runtime"),
        (
            "signal for CRI-O",
            &["--runtime", "crio", "--restart-mode", "signal"],
            &[],
            "systemd or none",
        ),
        (
            "relative config",
            &["--runtime", "docker", "--config", "daemon.json"],
            &[],
            "not an absolute path",
        ),
        (
            "bad boolean variable",
            &["--runtime", "docker"],
            &[("NO_DAEMON", "maybe")],
            "NO_DAEMON \"maybe\"",
        ),
        (
            "bad restart variable",
            &["--runtime", "docker"],
            &[("RUNTIME_RESTART_MODE", "reboot")],
            "signal, systemd, none",
        ),
        (
            "docker drop-in",
            &[
                "--runtime",
                "docker",
                "--drop-in-config",
                "/etc/docker/x.json",
            ],
            &[],
            "nothing for docker",
        ),
        (
            "runtime name with a slash",
            &["--runtime", "docker", "--runtime-name", "a/b"],
            &[],
            "\"a/b\"",
        ),
        (
            "missing host root",
            &["--runtime", "docker", "--host-root", "/nonexistent/host"],
            &[],
            "not a directory",
        ),
    ];
    for (case, flags, env, want) in cases {
        let mut argv = vec!["nvshim", "install"];
        if !flags.contains(&"--host-root") {
            argv.extend(["--host-root", &root]);
        }
        argv.extend(*flags);
        let err = resolve(&argv, env).expect_err(case).to_string();
        assert!(err.contains(want), "{case}: {err}");
    }
    // clap names the valid set for a flag value.
    let err = Cli::try_parse_from(["nvshim", "install", "--restart-mode", "reboot"]).unwrap_err();
    assert!(err.to_string().contains("signal"), "{err}");
}

#[test]
fn a_missing_source_binary_is_named() {
    let host = Host::new();
    fs::remove_file(host.source.path().join("nvidia-container-runtime-hook")).unwrap();
    let err = install(&host.settings("docker", &[]))
        .unwrap_err()
        .to_string();
    assert!(err.contains("nvidia-container-runtime-hook"), "{err}");
    assert!(!host.path(TOOLKIT).exists(), "nothing written");
}

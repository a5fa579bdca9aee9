// SPDX-License-Identifier: Apache-2.0
//! The installer DaemonSets' command lines — the Helm chart's in each of its value sets,
//! every Kustomize overlay's (called from `kustomize.rs`, which renders them) — through
//! `nvshim install`'s own flag parsing and resolution: what the toolkit image's entrypoint
//! (`nvshim install`) makes of them, so a flag or variable the binary does not take, or a
//! value it refuses, fails here and not on a node. The chart's value sets render the
//! installer both with its two `--accept-nvidia-visible-devices-*` flags (the default) and
//! without them (`installer.acceptEnvvarWhenUnprivileged=true`), and each resolves to the
//! config.toml keys it means.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use clap::Parser;
use nvshim::cli::configure::EngineKind;
use nvshim::cli::install::{RestartMode, Settings};
use nvshim::cli::{Cli, Command};
use serde_json::Value;

use super::merged_values;
use super::render::{CASES, env, find, pod, render, strings};

/// Where the DaemonSets mount the host's `/`; the installer checks it is a directory,
/// so a temp dir stands in for it here.
const HOST_ROOT: &str = "/host";

/// The container's `args` after `nvshim install`, its `env` values (entries taken from
/// the downward API have none and are left out), resolved as the binary does.
pub(crate) fn resolve(container: &Value) -> Result<Settings, String> {
    let host = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut argv = vec!["nvshim".to_owned(), "install".to_owned()];
    for arg in strings(&container["args"]) {
        argv.push(match arg.strip_prefix("--host-root=") {
            Some(HOST_ROOT) => format!("--host-root={}", host.path().display()),
            _ => arg.to_owned(),
        });
    }
    let cli = Cli::try_parse_from(&argv).map_err(|e| format!("{argv:?}: {e}"))?;
    let Command::Install(args) = &cli.command else {
        return Err(format!("{argv:?} is not `nvshim install`"));
    };
    let env = env(container);
    // clap reads these two from the environment for the global flags.
    let from_env = |flag: &Option<PathBuf>, name: &str| {
        flag.clone()
            .or_else(|| env.get(name).filter(|v| !v.is_empty()).map(PathBuf::from))
    };
    let driver_root = from_env(&cli.host.driver_root, "NVIDIA_DRIVER_ROOT");
    let dev_root = from_env(&cli.host.dev_root, "NVIDIA_DEV_ROOT");
    args.resolve(
        &|name| env.get(name).cloned(),
        driver_root.as_ref(),
        dev_root.as_ref(),
        Path::new("/usr/bin"),
    )
    .map_err(|e| format!("{argv:?} with {env:?}: {e}"))
    .and_then(|mut settings| {
        if settings.place.host_root != host.path() {
            return Err(format!(
                "{argv:?}: the host's / is not --host-root={HOST_ROOT}"
            ));
        }
        settings.place.host_root = HOST_ROOT.into();
        Ok(settings)
    })
}

/// The case's values over values.yaml's (as the renderer coalesces them) that the
/// installer's command line carries.
fn expected(values: &str) -> BTreeMap<&'static str, String> {
    let merged = merged_values(values);
    let installer = &merged["installer"];
    let text = |v: &Value| v.as_str().unwrap_or_default().to_owned();
    BTreeMap::from([
        ("runtime", text(&installer["runtime"])),
        ("toolkitDir", text(&installer["toolkitDir"])),
        // null in values.yaml: the host's own driver.
        (
            "driverRoot",
            merged["nvidiaDriverRoot"]
                .as_str()
                .unwrap_or("/")
                .to_owned(),
        ),
        // false: image env is not an allocation (the toolkit keys' non-default values).
        (
            "acceptEnvvarWhenUnprivileged",
            installer["acceptEnvvarWhenUnprivileged"].to_string(),
        ),
    ])
}

#[test]
fn helm_installer_command_lines_parse_and_resolve_with_nvshim_install() {
    let mut checked = 0;
    let mut modes = BTreeSet::new();
    for (case, values) in CASES {
        let docs = render(values).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let Some(installer) = find(&docs, "DaemonSet", "nvshim-toolkit") else {
            continue;
        };
        let container = &pod(installer)["containers"][0];
        let settings = resolve(container).unwrap_or_else(|e| panic!("case {case}: {e}"));
        let want = expected(values);
        let engine = match want["runtime"].as_str() {
            "docker" => EngineKind::Docker,
            "crio" => EngineKind::Crio,
            _ => EngineKind::Containerd,
        };
        assert_eq!(settings.engine, engine, "case {case}");
        assert_eq!(
            settings.place.toolkit_dir,
            PathBuf::from(&want["toolkitDir"]),
            "case {case}"
        );
        assert_eq!(
            settings.driver_root,
            PathBuf::from(&want["driverRoot"]),
            "case {case}"
        );
        assert_eq!(
            settings.place.host_root,
            PathBuf::from("/host"),
            "case {case}"
        );
        assert_eq!(
            settings.ready_file,
            PathBuf::from("/run/nvidia/validations/toolkit-ready"),
            "case {case}"
        );
        assert!(
            settings.daemon,
            "case {case}: the DaemonSet's installer must stay to undo"
        );
        if engine == EngineKind::Crio {
            assert_eq!(settings.restart, RestartMode::Systemd, "case {case}");
        }
        // config.toml's two keys: NVIDIA's defaults (env var yes, volume mounts no) when
        // the values opt out, else the reverse.
        let accept_envvar = match want["acceptEnvvarWhenUnprivileged"].as_str() {
            "true" => true,
            "false" => false,
            other => panic!("case {case}: installer.acceptEnvvarWhenUnprivileged {other}"),
        };
        assert_eq!(
            (
                settings.accept_envvar_unprivileged,
                settings.accept_volume_mounts
            ),
            (accept_envvar, !accept_envvar),
            "case {case}"
        );
        modes.insert(accept_envvar);
        checked += 1;
    }
    assert!(
        checked >= 2,
        "only {checked} value sets render the installer"
    );
    assert_eq!(
        modes,
        BTreeSet::from([false, true]),
        "the value sets render the installer both with and without the two flags"
    );

    // The check fails on a flag `nvshim install` does not take.
    let bogus = serde_json::json!({"args": ["--host-root=/host", "--runtime=containerd", "--toolkit-root=/x"]});
    let err = resolve(&bogus).unwrap_err();
    assert!(err.contains("--toolkit-root"), "{err}");
}

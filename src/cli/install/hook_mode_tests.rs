// SPDX-License-Identifier: Apache-2.0
//! `--config-mode hook` (CRI-O): the OCI hook file instead of CRI-O's config, where NVIDIA's
//! installer puts it, its flags and variables, CRI-O restarted (it reads hooks.d when it starts)
//! on install and undo, and an undo that leaves the host as it was.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::tests::{Host, resolve};
use super::*;

const HOOK_FILE: &str = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json";

#[test]
fn crio_hook_mode_writes_the_hook_file_not_the_config_and_the_undo_removes_it() {
    let host = Host::new();
    host.write(
        "/etc/crio/crio.conf",
        "[crio.runtime]\ndefault_runtime = \"crun\"\n",
    );
    let before = host.snapshot();
    let done = install(&host.settings("crio", &["--config-mode", "hook"])).unwrap();
    let hook: serde_json::Value = serde_json::from_str(&host.read(HOOK_FILE)).unwrap();
    assert_eq!(
        hook["hook"]["path"], "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook",
        "{hook}"
    );
    assert_eq!(hook["stages"], serde_json::json!(["prestart"]));
    assert!(
        !host.path("/etc/crio/crio.conf.d/99-nvidia.toml").exists(),
        "hook mode registers no runtime"
    );
    assert_eq!(
        host.read("/etc/crio/crio.conf"),
        "[crio.runtime]\ndefault_runtime = \"crun\"\n"
    );
    // The settings say --restart-mode none: the hook's restart is left to the user.
    assert!(
        done.lines
            .iter()
            .any(|l| l.contains("reads the new config when it restarts")),
        "{:?}",
        done.lines
    );
    // Again: nothing to change.
    let again = install(&host.settings("crio", &["--config-mode", "hook"])).unwrap();
    assert!(
        again.lines.iter().any(|l| l.contains("is in place")),
        "{:?}",
        again.lines
    );
    // Removing the hook restarts CRI-O too (here: --restart-mode none says so).
    let undone = host.uninstall();
    assert!(
        undone
            .iter()
            .any(|l| l.contains("reads the new config when it restarts")),
        "{undone:?}"
    );
    assert_eq!(host.snapshot(), before);
}

#[test]
fn the_hooks_dir_and_file_name_come_from_flags_or_nvidia_s_variables() {
    let host = Host::new();
    let s = host.settings_env(
        "crio",
        &[],
        &[
            ("CRIO_CONFIG_MODE", "hook"),
            ("CRIO_HOOKS_DIR", "/etc/containers/oci/hooks.d"),
            ("CRIO_HOOK_FILENAME", "nvidia.json"),
        ],
    );
    assert_eq!(
        s.oci_hook.as_deref(),
        Some(std::path::Path::new(
            "/etc/containers/oci/hooks.d/nvidia.json"
        ))
    );
    let s = host.settings_env(
        "crio",
        &[
            "--config-mode",
            "hook",
            "--hooks-dir",
            "/run/hooks",
            "--hook-filename",
            "a.json",
        ],
        &[("CRIO_HOOKS_DIR", "/etc/containers/oci/hooks.d")],
    );
    assert_eq!(
        s.oci_hook.as_deref(),
        Some(std::path::Path::new("/run/hooks/a.json"))
    );
    // config (the default) registers the runtime as before.
    assert_eq!(
        host.settings("crio", &["--config-mode", "config"]).oci_hook,
        None
    );
    assert_eq!(host.settings("crio", &[]).oci_hook, None);
}

#[test]
fn bad_hook_settings_are_named_with_what_is_valid() {
    let host = Host::new();
    let root = host.root.path().display().to_string();
    let base = ["nvshim", "install", "--host-root", &root, "--no-daemon"];
    for (case, extra, env, want) in [
        (
            "unknown mode",
            vec!["--runtime", "crio", "--config-mode", "hooks"],
            vec![],
            "--config-mode \"hooks\" is not valid (valid: config, hook)",
        ),
        (
            "unknown mode by variable",
            vec!["--runtime", "crio"],
            vec![("CRIO_CONFIG_MODE", "file")],
            "CRIO_CONFIG_MODE \"file\" is not valid (valid: config, hook)",
        ),
        (
            "hook mode for containerd",
            vec!["--runtime", "containerd", "--config-mode", "hook"],
            vec![],
            "the hook mode is CRI-O's",
        ),
        (
            "a path as file name",
            vec![
                "--runtime",
                "crio",
                "--config-mode",
                "hook",
                "--hook-filename",
                "../x.json",
            ],
            vec![],
            "--hook-filename \"../x.json\"",
        ),
        (
            "a relative hooks dir",
            vec![
                "--runtime",
                "crio",
                "--config-mode",
                "hook",
                "--hooks-dir",
                "hooks.d",
            ],
            vec![],
            "--hooks-dir \"hooks.d\" is not an absolute path",
        ),
    ] {
        let mut argv = base.to_vec();
        argv.extend(extra);
        let err = resolve(&argv, &env).expect_err(case).to_string();
        assert!(err.contains(want), "{case}: {err}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The two `accept-nvidia-visible-devices-*` settings: NVIDIA's installer flags and
//! variables resolve flag > variable > config.toml's default, a bad value is named with
//! the valid set, and the installed config.toml holds them where the runtime reads them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;

use super::args::{DEFAULT_TOOLKIT_DIR, ENV_ACCEPT_ENVVAR_UNPRIVILEGED, ENV_ACCEPT_VOLUME_MOUNTS};
use super::layout::RUNTIME_BINARY;
use super::tests::{Host, resolve};
use super::*;
use crate::request::{KEY_ACCEPT_ENVVAR_UNPRIVILEGED, KEY_ACCEPT_VOLUME_MOUNTS};

const ENVVAR: &str = ENV_ACCEPT_ENVVAR_UNPRIVILEGED[0];
const VOLUMES: &str = ENV_ACCEPT_VOLUME_MOUNTS[0];

/// NVIDIA's installer names its flags after the keys they set.
fn flag(key: &str, value: Option<&str>) -> String {
    match value {
        Some(v) => format!("--{key}={v}"),
        None => format!("--{key}"),
    }
}

#[test]
fn flags_win_over_variables_which_win_over_the_config_defaults() {
    let host = Host::new();
    let envvar = |v| flag(KEY_ACCEPT_ENVVAR_UNPRIVILEGED, v);
    let volumes = |v| flag(KEY_ACCEPT_VOLUME_MOUNTS, v);
    // (case, flags, variables, envvar-when-unprivileged, as-volume-mounts)
    type Case<'a> = (&'a str, Vec<String>, &'a [(&'a str, &'a str)], bool, bool);
    let cases: Vec<Case> = vec![
        ("unset: config.toml's defaults", vec![], &[], true, false),
        (
            "variables",
            vec![],
            &[(ENVVAR, "false"), (VOLUMES, "true")],
            false,
            true,
        ),
        (
            "variables in other spellings",
            vec![],
            &[(ENVVAR, "No"), (VOLUMES, "1")],
            false,
            true,
        ),
        (
            "an empty variable is unset",
            vec![],
            &[(ENVVAR, ""), (VOLUMES, "")],
            true,
            false,
        ),
        (
            "flags with values",
            vec![envvar(Some("false")), volumes(Some("true"))],
            &[],
            false,
            true,
        ),
        ("a bare flag is true", vec![volumes(None)], &[], true, true),
        (
            "a flag wins over its variable",
            vec![envvar(Some("true")), volumes(Some("false"))],
            &[(ENVVAR, "false"), (VOLUMES, "true")],
            true,
            false,
        ),
    ];
    for (case, flags, env, want_envvar, want_volumes) in cases {
        let flags: Vec<&str> = flags.iter().map(String::as_str).collect();
        let s = host.settings_env("docker", &flags, env);
        assert_eq!(
            (s.accept_envvar_unprivileged, s.accept_volume_mounts),
            (want_envvar, want_volumes),
            "{case}"
        );
    }
}

#[test]
fn a_bad_value_is_named_with_the_valid_set() {
    let host = Host::new();
    let root = host.root.path().display().to_string();
    let bad_flag = flag(KEY_ACCEPT_ENVVAR_UNPRIVILEGED, Some("sometimes"));
    type Case<'a> = (&'a str, Option<&'a str>, &'a [(&'a str, &'a str)], String);
    let cases: &[Case] = &[
        (
            "bad variable",
            None,
            &[(VOLUMES, "maybe")],
            format!("{VOLUMES} \"maybe\""),
        ),
        (
            "bad flag, over a good variable",
            Some(&bad_flag),
            &[(ENVVAR, "false")],
            format!("--{KEY_ACCEPT_ENVVAR_UNPRIVILEGED} \"sometimes\""),
        ),
    ];
    for (case, given, env, want) in cases {
        let mut argv = vec!["nvshim", "install", "--host-root", &root];
        argv.extend(["--runtime", "docker"]);
        argv.extend(*given);
        let err = resolve(&argv, env).expect_err(case).to_string();
        assert!(err.contains(want.as_str()), "{case}: {err}");
        assert!(err.contains("true, false, 1, 0, yes, no"), "{case}: {err}");
    }
}

#[test]
fn the_installed_config_toml_holds_both_keys_for_the_runtime() {
    // (case, flags, variables, envvar-when-unprivileged, as-volume-mounts)
    type Case<'a> = (&'a str, &'a [&'a str], &'a [(&'a str, &'a str)], bool, bool);
    let volumes = flag(KEY_ACCEPT_VOLUME_MOUNTS, None);
    let cases: &[Case] = &[
        ("defaults", &[], &[], true, false),
        (
            "the device plugin's volume-mounts strategy",
            &[&volumes],
            &[(ENVVAR, "false")],
            false,
            true,
        ),
    ];
    for (case, flags, env, want_envvar, want_volumes) in cases {
        let host = Host::new();
        host.write("/etc/docker/daemon.json", "{}\n");
        let settings = host.settings_env("docker", flags, env);
        install(&settings).unwrap();

        let toolkit = host.path(DEFAULT_TOOLKIT_DIR);
        let toml_path = config_toml_path(Path::new(DEFAULT_TOOLKIT_DIR));
        let text = host.read(&toml_path.display().to_string());
        for (key, want) in [
            (KEY_ACCEPT_ENVVAR_UNPRIVILEGED, want_envvar),
            (KEY_ACCEPT_VOLUME_MOUNTS, want_volumes),
        ] {
            assert!(
                text.lines().any(|l| l == format!("{key} = {want}")),
                "{case}: {key} = {want} in\n{text}"
            );
        }
        // The runtime, started by the path the engine knows, finds the file beside
        // itself and turns it into its request policy.
        let argv0 = toolkit.join(RUNTIME_BINARY);
        let loaded = crate::config::load_installed(|_| None, Some(argv0.as_os_str())).unwrap();
        assert!(loaded.from_file, "{case}: {}", loaded.path.display());
        assert!(
            loaded.unknown_keys.is_empty(),
            "{case}: {:?}",
            loaded.unknown_keys
        );
        let policy = crate::container::policy(&loaded.config).unwrap();
        assert_eq!(
            (
                policy.accept_envvar_when_unprivileged,
                policy.accept_volume_mounts
            ),
            (*want_envvar, *want_volumes),
            "{case}"
        );
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Table tests for MPS settings across the layers: `--mps-root` > `MPS_ROOT` >
//! `flags.mpsRoot`, and the checks that need the resolved MIG strategy and root. The
//! file's own MPS keys and errors are in `file_tests.rs`.

use std::path::Path;

use super::tests::{FILE, assert_error, settings};
use super::*;

/// Case name, flags, env, config file, expected MPS root.
type LayerRootCase = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
    &'static str,
);
/// Case name, flags, env, config file, fragments of the error.
type LayerErrorCase = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    &'static str,
    Vec<String>,
);

#[test]
fn mps_root_and_the_checks_that_need_every_layer() {
    const MPS: &str = "flags: {mpsRoot: /file-mps}\nsharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 4}]}\n";
    const MPS_NO_ROOT: &str =
        "# no root\nsharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 4}]}\n";
    let roots: [LayerRootCase; 4] = [
        ("file", &[], &[], MPS, "/file-mps"),
        (
            "env beats file",
            &[],
            &[("MPS_ROOT", "/env-mps")],
            MPS,
            "/env-mps",
        ),
        (
            "flag beats env",
            &["--mps-root=/flag-mps"],
            &[("MPS_ROOT", "/env-mps")],
            MPS,
            "/flag-mps",
        ),
        (
            "flag fills the file's gap",
            &["--mps-root", "/flag-mps"],
            &[],
            MPS_NO_ROOT,
            "/flag-mps",
        ),
    ];
    for (case, args, env, yaml, want) in roots {
        let got = settings(args, env, Some(yaml)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got.mps_root.as_deref(), Some(Path::new(want)), "{case}");
        assert_eq!(
            got.sharing.map(|s| s.strategy),
            Some(SharingStrategy::Mps),
            "{case}"
        );
    }
    let at = format!("{FILE}:3: ");
    let errors: [LayerErrorCase; 4] = [
        (
            "mixed from the flag",
            &["--mig-strategy=mixed"],
            &[],
            MPS,
            vec![
                at.clone(),
                "sharing.mps cannot be used with mig-strategy=mixed".into(),
            ],
        ),
        (
            "mixed from the env",
            &[],
            &[("MIG_STRATEGY", "mixed")],
            MPS,
            vec![at.clone(), "mig-strategy=mixed".into()],
        ),
        (
            "no root anywhere",
            &[],
            &[],
            MPS_NO_ROOT,
            vec![at.clone(), "needs an MPS root".into()],
        ),
        (
            "relative flag",
            &["--mps-root=mps"],
            &[],
            MPS,
            vec!["--mps-root: \"mps\" is not an absolute path".into()],
        ),
    ];
    for (case, args, env, yaml, want) in errors {
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        assert_error(case, settings(args, env, Some(yaml)), &want);
    }
}

#[test]
fn the_daemon_subcommand_takes_the_flags_before_or_after_it() {
    use super::tests::argv;
    let cases: [(&str, &[&str]); 3] = [
        (
            "before",
            &["--mps-root=/m", "--config-file", "/c", "mps-control-daemon"],
        ),
        (
            "after",
            &["mps-control-daemon", "--mps-root", "/m", "--config-file=/c"],
        ),
        (
            "around",
            &["--config-file=/c", "mps-control-daemon", "--mps-root=/m"],
        ),
    ];
    for (case, args) in cases {
        let parsed = argv(args).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(
            parsed.command,
            Some(PluginCommand::MpsControlDaemon),
            "{case}"
        );
        assert_eq!(parsed.mps_root.as_deref(), Some(Path::new("/m")), "{case}");
        assert_eq!(
            parsed.config_file.as_deref(),
            Some(Path::new("/c")),
            "{case}"
        );
    }
    assert_eq!(
        argv(&[]).unwrap().command,
        None,
        "no subcommand: the plugin"
    );
    let err = argv(&["mps-daemon"]).unwrap_err().to_string();
    assert!(err.contains("mps-daemon"), "{err}");
}

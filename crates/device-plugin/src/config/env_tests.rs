// SPDX-License-Identifier: Apache-2.0
//! Table tests for the env side: each env var, its errors, Go's boolean spellings, the
//! health-check lists and the log level.

use std::collections::BTreeSet;
use std::net::SocketAddr;

use super::tests::{argv, assert_error, env_of, settings, with};
use super::*;

use DeviceListStrategy::{CdiAnnotations, CdiCri};

type Pairs = &'static [(&'static str, &'static str)];
/// Case name, env, expected settings.
type EnvCase = (&'static str, Vec<(&'static str, &'static str)>, Settings);
/// Case name, env, fragments the error message must contain.
type ErrorCase = (&'static str, Pairs, &'static [&'static str]);
/// Case name, env, expected checks.
type HealthCase = (
    &'static str,
    Vec<(&'static str, &'static str)>,
    HealthChecks,
);

#[test]
fn env_vars() {
    let addr: SocketAddr = "[::1]:9090".parse().expect("addr");
    let cases: Vec<EnvCase> = vec![
        (
            "MIG_STRATEGY",
            vec![("MIG_STRATEGY", "mixed")],
            with(|s| s.mig_strategy = MigStrategy::Mixed),
        ),
        (
            "FAIL_ON_INIT_ERROR",
            vec![("FAIL_ON_INIT_ERROR", "false")],
            with(|s| s.fail_on_init_error = false),
        ),
        (
            "NVIDIA_DRIVER_ROOT",
            vec![("NVIDIA_DRIVER_ROOT", "/run/nvidia/driver")],
            with(|s| {
                s.driver_root = "/run/nvidia/driver".into();
                s.dev_root = "/run/nvidia/driver".into();
            }),
        ),
        (
            "NVIDIA_DEV_ROOT",
            vec![("NVIDIA_DRIVER_ROOT", "/drv"), ("NVIDIA_DEV_ROOT", "/")],
            with(|s| s.driver_root = "/drv".into()),
        ),
        (
            "empty NVIDIA_DRIVER_ROOT is unset",
            vec![("NVIDIA_DRIVER_ROOT", "")],
            Settings::default(),
        ),
        (
            "PASS_DEVICE_SPECS",
            vec![("PASS_DEVICE_SPECS", "TRUE")],
            with(|s| s.pass_device_specs = true),
        ),
        (
            "DEVICE_LIST_STRATEGY",
            vec![("DEVICE_LIST_STRATEGY", " cdi-cri , cdi-annotations,cdi-cri")],
            with(|s| s.device_list_strategies = vec![CdiCri, CdiAnnotations]),
        ),
        (
            "DEVICE_ID_STRATEGY",
            vec![("DEVICE_ID_STRATEGY", "index")],
            with(|s| s.device_id_strategy = DeviceIdStrategy::Index),
        ),
        (
            "CDI_ANNOTATION_PREFIX",
            vec![("CDI_ANNOTATION_PREFIX", "a.b/")],
            with(|s| s.cdi_annotation_prefix = "a.b/".into()),
        ),
        (
            "KUBELET_SOCKET",
            vec![("KUBELET_SOCKET", "/var/lib/k/kubelet.sock")],
            with(|s| {
                s.kubelet_socket = Some("/var/lib/k/kubelet.sock".into());
                s.socket_dir = "/var/lib/k".into();
            }),
        ),
        (
            "KUBELET_SOCKET empty",
            vec![("KUBELET_SOCKET", "")],
            with(|s| s.kubelet_socket = None),
        ),
        (
            "NVSHIM_SOCKET_DIR",
            vec![("KUBELET_SOCKET", ""), ("NVSHIM_SOCKET_DIR", "/tmp/p")],
            with(|s| {
                s.kubelet_socket = None;
                s.socket_dir = "/tmp/p".into();
            }),
        ),
        (
            "NVSHIM_HEALTH_ADDR",
            vec![("NVSHIM_HEALTH_ADDR", "[::1]:9090")],
            with(|s| s.health_addr = Some(addr)),
        ),
        (
            "empty NVSHIM_HEALTH_ADDR is unset",
            vec![("NVSHIM_HEALTH_ADDR", "")],
            Settings::default(),
        ),
        (
            "NVSHIM_METRICS_ADDR",
            vec![("NVSHIM_METRICS_ADDR", ":9400")],
            with(|s| s.metrics_addr = Some("0.0.0.0:9400".parse().unwrap())),
        ),
        (
            "empty NVSHIM_METRICS_ADDR is unset",
            vec![("NVSHIM_METRICS_ADDR", "")],
            Settings::default(),
        ),
        (
            "NVSHIM_POD_RESOURCES_SOCKET",
            vec![("NVSHIM_POD_RESOURCES_SOCKET", "/p.sock")],
            with(|s| s.pod_resources_socket = Some("/p.sock".into())),
        ),
        (
            "empty NVSHIM_POD_RESOURCES_SOCKET turns pod labels off",
            vec![("NVSHIM_POD_RESOURCES_SOCKET", "")],
            with(|s| s.pod_resources_socket = None),
        ),
        (
            "NVSHIM_NVML_LIB",
            vec![("NVSHIM_NVML_LIB", "/l.so")],
            with(|s| s.nvml_library = Some("/l.so".into())),
        ),
        (
            "features off are fine",
            vec![
                ("GDRCOPY_ENABLED", "false"),
                ("GDS_ENABLED", "0"),
                ("MOFED_ENABLED", "False"),
                ("IMEX_CHANNEL_IDS", ""),
                ("DEVICE_DISCOVERY_STRATEGY", "auto"),
            ],
            Settings::default(),
        ),
        (
            "MPS_ROOT without sharing.mps",
            vec![("MPS_ROOT", "/run/nvidia/mps")],
            with(|s| s.mps_root = Some("/run/nvidia/mps".into())),
        ),
        (
            "empty MPS_ROOT is unset",
            vec![("MPS_ROOT", "")],
            Settings::default(),
        ),
        (
            "discovery nvml",
            vec![("DEVICE_DISCOVERY_STRATEGY", "nvml")],
            Settings::default(),
        ),
    ];
    for (case, env, want) in cases {
        let got = settings(&[], &env, None).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn env_errors() {
    let cases: [ErrorCase; 14] = [
        (
            "relative MPS_ROOT",
            &[("MPS_ROOT", "run/mps")],
            &["MPS_ROOT: \"run/mps\" is not an absolute path"],
        ),
        (
            "bool",
            &[("FAIL_ON_INIT_ERROR", "yes")],
            &["FAIL_ON_INIT_ERROR", "\"yes\"", BOOL_SPELLINGS],
        ),
        (
            "empty bool",
            &[("PASS_DEVICE_SPECS", "")],
            &["PASS_DEVICE_SPECS", "\"\" is not a boolean"],
        ),
        (
            "mig",
            &[("MIG_STRATEGY", "MIXED")],
            &["MIG_STRATEGY: unknown MIG strategy \"MIXED\" (valid: none, single, mixed)"],
        ),
        (
            "strategy",
            &[("DEVICE_LIST_STRATEGY", "envvar,nope")],
            &["DEVICE_LIST_STRATEGY", "\"nope\"", "cdi-cri"],
        ),
        (
            "empty strategy",
            &[("DEVICE_LIST_STRATEGY", " ")],
            &["DEVICE_LIST_STRATEGY: empty device list strategy"],
        ),
        (
            "trailing comma",
            &[("DEVICE_LIST_STRATEGY", "envvar,")],
            &["DEVICE_LIST_STRATEGY", "\"\""],
        ),
        (
            "id strategy",
            &[("DEVICE_ID_STRATEGY", "serial")],
            &["DEVICE_ID_STRATEGY", "\"serial\"", "uuid, index"],
        ),
        (
            "addr",
            &[("NVSHIM_HEALTH_ADDR", ":8080")],
            &["NVSHIM_HEALTH_ADDR", "\":8080\"", "IP:PORT"],
        ),
        (
            "metrics addr",
            &[("NVSHIM_METRICS_ADDR", "9400")],
            &["NVSHIM_METRICS_ADDR", "\"9400\"", ":PORT"],
        ),
        (
            "gdrcopy bad bool",
            &[("GDRCOPY_ENABLED", "enabled")],
            &["GDRCOPY_ENABLED", "\"enabled\" is not a boolean"],
        ),
        (
            "mofed bad bool",
            &[("MOFED_ENABLED", "on")],
            &["MOFED_ENABLED", "\"on\" is not a boolean"],
        ),
        (
            "imex channel 1",
            &[("IMEX_CHANNEL_IDS", "1")],
            &["IMEX_CHANNEL_IDS", "\"1\"", "no channel, or 0"],
        ),
        (
            "tegra",
            &[("DEVICE_DISCOVERY_STRATEGY", "tegra")],
            &["DEVICE_DISCOVERY_STRATEGY", "\"tegra\"", "auto, nvml"],
        ),
    ];
    for (case, env, want) in cases {
        assert_error(case, settings(&[], env, None), want);
    }
}

#[test]
fn env_is_checked_even_when_a_flag_wins() {
    let got = settings(&["--mig-strategy=none"], &[("MIG_STRATEGY", "bogus")], None);
    assert_error("overridden env", got, &["MIG_STRATEGY", "bogus"]);
}

#[test]
fn bool_spellings() {
    let cases = [
        ("1", Some(true)),
        ("t", Some(true)),
        ("T", Some(true)),
        ("TRUE", Some(true)),
        ("true", Some(true)),
        ("True", Some(true)),
        ("0", Some(false)),
        ("f", Some(false)),
        ("F", Some(false)),
        ("FALSE", Some(false)),
        ("false", Some(false)),
        ("False", Some(false)),
        ("tRUE", None),
        ("yes", None),
        ("on", None),
        (" true", None),
        ("", None),
        ("2", None),
    ];
    for (spelling, want) in cases {
        assert_eq!(parse_bool(spelling).ok(), want, "parse_bool({spelling:?})");
        let env = settings(&[], &[("FAIL_ON_INIT_ERROR", spelling)], None);
        assert_eq!(
            env.ok().map(|s| s.fail_on_init_error),
            want,
            "FAIL_ON_INIT_ERROR={spelling:?}"
        );
        let flag = format!("--pass-device-specs={spelling}");
        assert_eq!(
            argv(&[&flag]).ok().and_then(|a| a.pass_device_specs),
            want,
            "{flag}"
        );
    }
}

#[test]
fn health_check_env() {
    let ignored = |extra: &[u64]| -> BTreeSet<u64> {
        DEFAULT_IGNORED_XIDS.iter().chain(extra).copied().collect()
    };
    let cases: Vec<HealthCase> = vec![
        ("unset", vec![], HealthChecks::default()),
        (
            "disable all",
            vec![("DP_DISABLE_HEALTHCHECKS", "all")],
            HealthChecks {
                disable_all: true,
                ..HealthChecks::default()
            },
        ),
        (
            "disable xids",
            vec![("DP_DISABLE_HEALTHCHECKS", "xids")],
            HealthChecks {
                disable_all: true,
                ..HealthChecks::default()
            },
        ),
        (
            "disable list",
            vec![("DP_DISABLE_HEALTHCHECKS", " 48, 79 ,,")],
            HealthChecks {
                ignored: ignored(&[48, 79]),
                ..HealthChecks::default()
            },
        ),
        (
            "disable all in a list",
            vec![("DP_DISABLE_HEALTHCHECKS", "48,all")],
            HealthChecks {
                disable_all: true,
                ignored: ignored(&[48]),
                ..HealthChecks::default()
            },
        ),
        (
            "disable empty",
            vec![("DP_DISABLE_HEALTHCHECKS", "")],
            HealthChecks::default(),
        ),
        (
            "enable all",
            vec![("DP_ENABLE_HEALTHCHECKS", "all")],
            HealthChecks {
                enable_all: true,
                ..HealthChecks::default()
            },
        ),
        (
            "enable list beats disable all",
            vec![
                ("DP_DISABLE_HEALTHCHECKS", "all"),
                ("DP_ENABLE_HEALTHCHECKS", "13, 31"),
            ],
            HealthChecks {
                disable_all: true,
                enabled: [13, 31].into(),
                ..HealthChecks::default()
            },
        ),
    ];
    for (case, env, want) in cases {
        let got = health_checks(&env_of(&env)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
        let via_settings = settings(&[], &env, None).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(via_settings.health_checks, want, "{case} (settings)");
    }
    let enabled = health_checks(&env_of(&[
        ("DP_DISABLE_HEALTHCHECKS", "all"),
        ("DP_ENABLE_HEALTHCHECKS", "13"),
    ]))
    .expect("checks");
    assert!(
        enabled.is_fatal(13) && !enabled.is_fatal(79),
        "enable list overrides disable=all"
    );
}

#[test]
fn health_check_env_errors() {
    let cases: [ErrorCase; 5] = [
        (
            "word",
            &[("DP_DISABLE_HEALTHCHECKS", "48,gpu")],
            &["DP_DISABLE_HEALTHCHECKS", "\"gpu\"", "all, xids"],
        ),
        (
            "negative",
            &[("DP_DISABLE_HEALTHCHECKS", "-1")],
            &["DP_DISABLE_HEALTHCHECKS", "\"-1\""],
        ),
        (
            "plus",
            &[("DP_ENABLE_HEALTHCHECKS", "+13")],
            &["DP_ENABLE_HEALTHCHECKS", "\"+13\""],
        ),
        (
            "xids is not for enable",
            &[("DP_ENABLE_HEALTHCHECKS", "xids")],
            &["DP_ENABLE_HEALTHCHECKS", "\"xids\""],
        ),
        (
            "overflow",
            &[("DP_ENABLE_HEALTHCHECKS", "99999999999999999999")],
            &["\"99999999999999999999\""],
        ),
    ];
    for (case, env, want) in cases {
        assert_error(case, settings(&[], env, None), want);
    }
}

#[test]
fn log_level_flag_then_env() {
    let cases = [
        (
            "flag",
            vec!["--log-level=debug"],
            vec![("NVSHIM_LOG_LEVEL", "warn")],
            Some("debug"),
        ),
        (
            "env",
            vec![],
            vec![("NVSHIM_LOG_LEVEL", "warn")],
            Some("warn"),
        ),
        ("empty env", vec![], vec![("NVSHIM_LOG_LEVEL", "")], None),
        ("none", vec![], vec![], None),
    ];
    for (case, args, env, want) in cases {
        let args = argv(&args).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(args.log_level(&env_of(&env)).as_deref(), want, "{case}");
    }
}

/// The CDI spec's settings: NVIDIA's container driver root under its two env names, its
/// flag alias and its config key, in the usual precedence; our spec dir and hook path.
#[test]
fn cdi_spec_settings() {
    type Case = (
        &'static str,
        &'static [&'static str],
        Pairs,
        Option<&'static str>,
        Settings,
    );
    let file = "flags: {plugin: {containerDriverRoot: /from-file}}";
    let cases: [Case; 9] = [
        ("defaults", &[], &[], None, Settings::default()),
        (
            "file",
            &[],
            &[],
            Some(file),
            with(|s| {
                s.container_driver_root = Some("/from-file".into());
                s.config_file = Some(super::tests::FILE.into());
            }),
        ),
        (
            "CONTAINER_DRIVER_ROOT over the file",
            &[],
            &[("CONTAINER_DRIVER_ROOT", "/env")],
            Some(file),
            with(|s| {
                s.container_driver_root = Some("/env".into());
                s.config_file = Some(super::tests::FILE.into());
            }),
        ),
        (
            "DRIVER_ROOT_CTR_PATH before CONTAINER_DRIVER_ROOT",
            &[],
            &[
                ("CONTAINER_DRIVER_ROOT", "/second"),
                ("DRIVER_ROOT_CTR_PATH", "/first"),
            ],
            None,
            with(|s| s.container_driver_root = Some("/first".into())),
        ),
        (
            "empty env is unset",
            &[],
            &[("CONTAINER_DRIVER_ROOT", "")],
            None,
            Settings::default(),
        ),
        (
            "flag alias over env",
            &["--driver-root-ctr-path=/flag"],
            &[("CONTAINER_DRIVER_ROOT", "/env")],
            None,
            with(|s| s.container_driver_root = Some("/flag".into())),
        ),
        (
            "--cdi-spec-dir over NVSHIM_CDI_SPEC_DIR",
            &["--cdi-spec-dir", "/flag/cdi"],
            &[("NVSHIM_CDI_SPEC_DIR", "/env/cdi")],
            None,
            with(|s| s.cdi_spec_dir = "/flag/cdi".into()),
        ),
        (
            "NVSHIM_CDI_SPEC_DIR",
            &[],
            &[("NVSHIM_CDI_SPEC_DIR", "/env/cdi")],
            None,
            with(|s| s.cdi_spec_dir = "/env/cdi".into()),
        ),
        (
            "NVSHIM_CDI_HOOK_PATH",
            &[],
            &[("NVSHIM_CDI_HOOK_PATH", "/opt/nvshim/bin/nvshim")],
            None,
            with(|s| s.cdi_hook_path = "/opt/nvshim/bin/nvshim".into()),
        ),
    ];
    for (case, args, env, yaml, want) in cases {
        let got = settings(args, env, yaml).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
    assert_error(
        "relative hook path",
        settings(&["--cdi-hook-path=bin/hook"], &[], None),
        &["\"bin/hook\"", "must be absolute"],
    );
}

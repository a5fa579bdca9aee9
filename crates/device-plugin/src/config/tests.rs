// SPDX-License-Identifier: Apache-2.0
//! Table tests: the command line, precedence and `resolve` with a real file, plus the
//! helpers the other test files share. Env vars are in `env_tests.rs`, the config
//! file's keys and errors in `file_tests.rs`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Parser;

use super::resolve::merge;
use super::*;

pub(super) const FILE: &str = "/etc/nvidia-device-plugin/config.yaml";

pub(super) fn argv(args: &[&str]) -> Result<PluginArgs, clap::Error> {
    PluginArgs::try_parse_from(std::iter::once("nvidia-device-plugin").chain(args.iter().copied()))
}

pub(super) fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let pairs: Vec<(String, String)> = pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
    }
}

/// Settings from a command line, an env and config file content (parsed as if read
/// from [`FILE`]; `None` for no file).
pub(super) fn settings(
    args: &[&str],
    env: &[(&str, &str)],
    yaml: Option<&str>,
) -> Result<Settings, PluginConfigError> {
    let args = argv(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    let (file, path) = match yaml {
        Some(yaml) => (
            parse_file(yaml.as_bytes(), Path::new(FILE))?,
            Some(FILE.into()),
        ),
        None => (FileSettings::default(), None),
    };
    merge(&args, &env_of(env), &file, path)
}

/// `Settings::default()` with a change, as a table's expected value.
pub(super) fn with(change: impl FnOnce(&mut Settings)) -> Settings {
    let mut settings = Settings::default();
    change(&mut settings);
    settings
}

pub(super) fn from_file(change: impl FnOnce(&mut Settings)) -> Settings {
    with(|s| {
        s.config_file = Some(FILE.into());
        change(s);
    })
}

pub(super) fn assert_error(case: &str, got: Result<Settings, PluginConfigError>, want: &[&str]) {
    let message = match got {
        Ok(settings) => panic!("{case}: want an error, got {settings:?}"),
        Err(e) => e.to_string(),
    };
    for fragment in want {
        assert!(
            message.contains(fragment),
            "{case}: {message:?} should contain {fragment:?}"
        );
    }
}

use DeviceListStrategy::{CdiAnnotations, CdiCri, Envvar, VolumeMounts};

#[test]
fn defaults_match_nvidias() {
    let got = settings(&[], &[], None).expect("defaults");
    assert_eq!(got, Settings::default());
    assert_eq!(got.mig_strategy, MigStrategy::None);
    assert!(got.fail_on_init_error);
    assert_eq!(got.driver_root, Path::new("/"));
    assert_eq!(got.dev_root, Path::new("/"));
    assert_eq!(got.device_list_strategies, [Envvar]);
    assert_eq!(got.cdi_annotation_prefix, "cdi.k8s.io/");
    assert_eq!(
        got.kubelet_socket.as_deref(),
        Some(Path::new(KUBELET_SOCKET))
    );
    assert_eq!(got.socket_dir, Path::new(DEVICE_PLUGIN_DIR));
    assert_eq!(got.health_checks.ignored, DEFAULT_IGNORED_XIDS.into());
}

#[test]
fn command_line() {
    let addr: SocketAddr = "0.0.0.0:8080".parse().expect("addr");
    let cases: Vec<(&str, Vec<&str>, Settings)> = vec![
        (
            "mig =",
            vec!["--mig-strategy=mixed"],
            with(|s| s.mig_strategy = MigStrategy::Mixed),
        ),
        (
            "mig space",
            vec!["--mig-strategy", "single"],
            with(|s| s.mig_strategy = MigStrategy::Single),
        ),
        (
            "fail bare",
            vec!["--fail-on-init-error"],
            with(|s| s.fail_on_init_error = true),
        ),
        (
            "fail =false",
            vec!["--fail-on-init-error=false"],
            with(|s| s.fail_on_init_error = false),
        ),
        (
            "fail =F",
            vec!["--fail-on-init-error=F"],
            with(|s| s.fail_on_init_error = false),
        ),
        (
            "fail =0",
            vec!["--fail-on-init-error=0"],
            with(|s| s.fail_on_init_error = false),
        ),
        (
            "driver root",
            vec!["--nvidia-driver-root", "/run/nvidia/driver"],
            with(|s| {
                s.driver_root = "/run/nvidia/driver".into();
                s.dev_root = "/run/nvidia/driver".into();
            }),
        ),
        (
            "driver root alias",
            vec!["--driver-root=/drv"],
            with(|s| {
                s.driver_root = "/drv".into();
                s.dev_root = "/drv".into();
            }),
        ),
        (
            "dev root",
            vec!["--driver-root=/drv", "--dev-root=/"],
            with(|s| s.driver_root = "/drv".into()),
        ),
        (
            "dev root alias",
            vec!["--nvidia-dev-root", "/d"],
            with(|s| s.dev_root = "/d".into()),
        ),
        (
            "empty driver root is unset",
            vec!["--driver-root="],
            Settings::default(),
        ),
        (
            "pass bare",
            vec!["--pass-device-specs"],
            with(|s| s.pass_device_specs = true),
        ),
        (
            "pass =true",
            vec!["--pass-device-specs=true"],
            with(|s| s.pass_device_specs = true),
        ),
        (
            "pass =f",
            vec!["--pass-device-specs=f"],
            with(|s| s.pass_device_specs = false),
        ),
        (
            "strategies repeated",
            vec![
                "--device-list-strategy",
                "cdi-cri",
                "--device-list-strategy=envvar",
            ],
            with(|s| s.device_list_strategies = vec![CdiCri, Envvar]),
        ),
        (
            "strategies comma",
            vec!["--device-list-strategy=volume-mounts,cdi-annotations"],
            with(|s| s.device_list_strategies = vec![VolumeMounts, CdiAnnotations]),
        ),
        (
            "strategies both, spaces, repeats dropped",
            vec![
                "--device-list-strategy=cdi-cri, envvar",
                "--device-list-strategy",
                "cdi-cri,volume-mounts",
            ],
            with(|s| s.device_list_strategies = vec![CdiCri, Envvar, VolumeMounts]),
        ),
        (
            "id strategy",
            vec!["--device-id-strategy=index"],
            with(|s| s.device_id_strategy = DeviceIdStrategy::Index),
        ),
        (
            "cdi prefix",
            vec!["--cdi-annotation-prefix", "x.io/"],
            with(|s| s.cdi_annotation_prefix = "x.io/".into()),
        ),
        (
            "kubelet socket",
            vec!["--kubelet-socket=/k/kubelet.sock"],
            with(|s| {
                s.kubelet_socket = Some("/k/kubelet.sock".into());
                s.socket_dir = "/k".into();
            }),
        ),
        (
            "kubelet socket empty",
            vec!["--kubelet-socket="],
            with(|s| s.kubelet_socket = None),
        ),
        (
            "kubelet socket empty, space",
            vec!["--kubelet-socket", ""],
            with(|s| s.kubelet_socket = None),
        ),
        (
            "relative kubelet socket",
            vec!["--kubelet-socket=kubelet.sock"],
            with(|s| {
                s.kubelet_socket = Some("kubelet.sock".into());
                s.socket_dir = ".".into();
            }),
        ),
        (
            "socket dir beats kubelet's",
            vec!["--kubelet-socket=/k/kubelet.sock", "--socket-dir=/s"],
            with(|s| {
                s.kubelet_socket = Some("/k/kubelet.sock".into());
                s.socket_dir = "/s".into();
            }),
        ),
        (
            "health addr",
            vec!["--health-addr", "0.0.0.0:8080"],
            with(|s| s.health_addr = Some(addr)),
        ),
        (
            "metrics addr, all interfaces",
            vec!["--metrics-addr", ":9400"],
            with(|s| s.metrics_addr = Some("0.0.0.0:9400".parse().unwrap())),
        ),
        (
            "metrics addr, loopback",
            vec!["--metrics-addr=127.0.0.1:9400"],
            with(|s| s.metrics_addr = Some("127.0.0.1:9400".parse().unwrap())),
        ),
        (
            "our metric names",
            vec!["--metrics-names", "NVSHIM"],
            with(|s| s.metrics_names = MetricsNames::Nvshim),
        ),
        (
            "a collectors file",
            vec!["--metrics-collectors=/etc/dcgm-exporter/default-counters.csv"],
            with(|s| {
                s.metrics_collectors = Some("/etc/dcgm-exporter/default-counters.csv".into());
            }),
        ),
        (
            "pod resources socket",
            vec!["--pod-resources-socket=/p/kubelet.sock"],
            with(|s| s.pod_resources_socket = Some("/p/kubelet.sock".into())),
        ),
        (
            "no pod resources socket",
            vec!["--pod-resources-socket="],
            with(|s| s.pod_resources_socket = None),
        ),
        (
            "nvml lib",
            vec!["--nvml-lib=/x/libnvidia-ml.so.1"],
            with(|s| s.nvml_library = Some("/x/libnvidia-ml.so.1".into())),
        ),
        (
            "log level is not a setting",
            vec!["--log-level=debug"],
            Settings::default(),
        ),
    ];
    for (case, args, want) in cases {
        let got = settings(&args, &[], None).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn command_line_fields_are_unset_by_default() {
    assert_eq!(argv(&[]).expect("no args"), PluginArgs::default());
    let args = argv(&[
        "--log-level=debug",
        "--config-file=/c.yaml",
        "--kubelet-socket=",
    ])
    .expect("args");
    assert_eq!(args.log_level.as_deref(), Some("debug"));
    assert_eq!(args.config_file, Some(PathBuf::from("/c.yaml")));
    assert_eq!(args.kubelet_socket, Some(PathBuf::new()));
}

#[test]
fn command_line_errors() {
    let cases: [(&str, &[&str], &[&str]); 11] = [
        (
            "go bools need =",
            &["--fail-on-init-error", "false"],
            &["false"],
        ),
        (
            "bad bool",
            &["--pass-device-specs=yes"],
            &["\"yes\" is not a boolean", BOOL_SPELLINGS],
        ),
        (
            "bad mig",
            &["--mig-strategy=all"],
            &["unknown MIG strategy \"all\"", "none, single, mixed"],
        ),
        (
            "mig is case-sensitive",
            &["--mig-strategy=Mixed"],
            &["\"Mixed\""],
        ),
        (
            "bad strategy",
            &["--device-list-strategy=envvar,cdi"],
            &["\"cdi\"", "envvar, volume-mounts, cdi-annotations, cdi-cri"],
        ),
        (
            "bad id strategy",
            &["--device-id-strategy=name"],
            &["\"name\"", "uuid, index"],
        ),
        ("bad addr", &["--health-addr=localhost"], &["localhost"]),
        (
            "bad metrics addr",
            &["--metrics-addr=localhost:9400"],
            &["\"localhost:9400\"", "IP:PORT or :PORT"],
        ),
        (
            "bad metrics port",
            &["--metrics-addr=:http"],
            &["\":http\"", "IP:PORT or :PORT"],
        ),
        (
            "bad metric names",
            &["--metrics-names=prometheus"],
            &["\"prometheus\"", "dcgm, nvshim"],
        ),
        (
            "unknown flag",
            &["--mps-dir=/run/nvidia/mps"],
            &["--mps-dir"],
        ),
    ];
    for (case, args, want) in cases {
        let message = match argv(args) {
            Ok(parsed) => panic!("{case}: want an error, got {parsed:?}"),
            Err(e) => e.to_string(),
        };
        for fragment in want {
            assert!(
                message.contains(fragment),
                "{case}: {message:?} should contain {fragment:?}"
            );
        }
    }
}

/// Case name, flags, env, config file, expected settings.
type LayerCase = (
    &'static str,
    &'static [&'static str],
    &'static [(&'static str, &'static str)],
    Option<&'static str>,
    Settings,
);

const LAYERED_FILE: &str = "
flags:
  migStrategy: single
  failOnInitError: false
  nvidiaDriverRoot: /file-driver
  plugin:
    deviceListStrategy: [volume-mounts]
    deviceIDStrategy: index
    cdiAnnotationPrefix: file.io/
    passDeviceSpecs: true
";

#[test]
fn precedence_flag_env_file_default() {
    let all_env: &[(&str, &str)] = &[
        ("MIG_STRATEGY", "mixed"),
        ("FAIL_ON_INIT_ERROR", "true"),
        ("NVIDIA_DRIVER_ROOT", "/env-driver"),
        ("DEVICE_LIST_STRATEGY", "cdi-annotations"),
        ("DEVICE_ID_STRATEGY", "uuid"),
        ("CDI_ANNOTATION_PREFIX", "env.io/"),
        ("PASS_DEVICE_SPECS", "false"),
    ];
    let all_flags: &[&str] = &[
        "--mig-strategy=none",
        "--fail-on-init-error=f",
        "--driver-root=/flag-driver",
        "--device-list-strategy=cdi-cri",
        "--device-id-strategy=index",
        "--cdi-annotation-prefix=flag.io/",
        "--pass-device-specs",
    ];
    let cases: [LayerCase; 5] = [
        ("default", &[], &[], None, Settings::default()),
        (
            "file beats default",
            &[],
            &[],
            Some(LAYERED_FILE),
            from_file(|s| {
                s.mig_strategy = MigStrategy::Single;
                s.fail_on_init_error = false;
                s.driver_root = "/file-driver".into();
                s.dev_root = "/file-driver".into();
                s.device_list_strategies = vec![VolumeMounts];
                s.device_id_strategy = DeviceIdStrategy::Index;
                s.cdi_annotation_prefix = "file.io/".into();
                s.pass_device_specs = true;
            }),
        ),
        (
            "env beats file",
            &[],
            all_env,
            Some(LAYERED_FILE),
            from_file(|s| {
                s.mig_strategy = MigStrategy::Mixed;
                s.fail_on_init_error = true;
                s.driver_root = "/env-driver".into();
                s.dev_root = "/env-driver".into();
                s.device_list_strategies = vec![CdiAnnotations];
                s.device_id_strategy = DeviceIdStrategy::Uuid;
                s.cdi_annotation_prefix = "env.io/".into();
                s.pass_device_specs = false;
            }),
        ),
        (
            "flag beats env",
            all_flags,
            all_env,
            Some(LAYERED_FILE),
            from_file(|s| {
                s.mig_strategy = MigStrategy::None;
                s.fail_on_init_error = false;
                s.driver_root = "/flag-driver".into();
                s.dev_root = "/flag-driver".into();
                s.device_list_strategies = vec![CdiCri];
                s.device_id_strategy = DeviceIdStrategy::Index;
                s.cdi_annotation_prefix = "flag.io/".into();
                s.pass_device_specs = true;
            }),
        ),
        (
            "flag beats file without env",
            &["--mig-strategy=mixed", "--device-list-strategy=envvar"],
            &[],
            Some(LAYERED_FILE),
            from_file(|s| {
                s.mig_strategy = MigStrategy::Mixed;
                s.fail_on_init_error = false;
                s.driver_root = "/file-driver".into();
                s.dev_root = "/file-driver".into();
                s.device_list_strategies = vec![Envvar];
                s.device_id_strategy = DeviceIdStrategy::Index;
                s.cdi_annotation_prefix = "file.io/".into();
                s.pass_device_specs = true;
            }),
        ),
    ];
    for (case, args, env, yaml, want) in cases {
        let got = settings(args, env, yaml).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn dev_root_falls_back_to_the_resolved_driver_root() {
    let yaml = "flags: {nvidiaDriverRoot: /file-driver, nvidiaDevRoot: /file-dev}";
    let got = settings(&["--driver-root=/flag-driver"], &[], Some(yaml)).expect("settings");
    assert_eq!(
        (got.driver_root.as_path(), got.dev_root.as_path()),
        (Path::new("/flag-driver"), Path::new("/file-dev"))
    );
    let got = settings(
        &[],
        &[("NVIDIA_DRIVER_ROOT", "/env")],
        Some("flags: {nvidiaDriverRoot: /f}"),
    )
    .expect("settings");
    assert_eq!(
        got.dev_root,
        Path::new("/env"),
        "dev root follows the winning driver root"
    );
}

#[test]
fn resolve_reads_the_named_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    let flag_file = dir.path().join("flag.yaml");
    let env_file = dir.path().join("env.yaml");
    std::fs::write(&flag_file, "version: v1\nflags: {migStrategy: mixed}\n").expect("write");
    std::fs::write(&env_file, "flags: {migStrategy: single}\n").expect("write");
    let flag = format!("--config-file={}", flag_file.display());
    let env_value = env_file.to_string_lossy().into_owned();

    let cases = [
        (
            "flag",
            vec![flag.as_str()],
            vec![],
            Some(&flag_file),
            MigStrategy::Mixed,
        ),
        (
            "env",
            vec![],
            vec![("CONFIG_FILE", env_value.as_str())],
            Some(&env_file),
            MigStrategy::Single,
        ),
        (
            "flag beats env",
            vec![flag.as_str()],
            vec![("CONFIG_FILE", env_value.as_str())],
            Some(&flag_file),
            MigStrategy::Mixed,
        ),
        (
            "empty env is no file",
            vec![],
            vec![("CONFIG_FILE", "")],
            None,
            MigStrategy::None,
        ),
    ];
    for (case, args, env, file, mig) in cases {
        let args = argv(&args).unwrap_or_else(|e| panic!("{case}: {e}"));
        let got = resolve(&args, &env_of(&env)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got.config_file.as_ref(), file, "{case}");
        assert_eq!(got.mig_strategy, mig, "{case}");
    }

    let missing = dir.path().join("missing.yaml");
    let args = argv(&[&format!("--config-file={}", missing.display())]).expect("args");
    let message = resolve(&args, &env_of(&[]))
        .expect_err("missing file")
        .to_string();
    assert!(
        message.contains("cannot read device plugin config file")
            && message.contains("missing.yaml"),
        "{message}"
    );

    std::fs::write(&flag_file, "flags: {migStrategy: all}\n").expect("write");
    let args = argv(&[&flag]).expect("args");
    let message = resolve(&args, &env_of(&[]))
        .expect_err("bad file")
        .to_string();
    assert!(
        message.contains(&format!("{}:1", flag_file.display())),
        "{message}"
    );
}

#[test]
fn strategy_names_round_trip() {
    for strategy in DeviceListStrategy::ALL {
        assert_eq!(
            strategy.to_string().parse::<DeviceListStrategy>().ok(),
            Some(strategy)
        );
    }
    for mig in [MigStrategy::None, MigStrategy::Single, MigStrategy::Mixed] {
        assert_eq!(mig.to_string().parse::<MigStrategy>().ok(), Some(mig));
    }
    for id in [DeviceIdStrategy::Uuid, DeviceIdStrategy::Index] {
        assert_eq!(id.to_string().parse::<DeviceIdStrategy>().ok(), Some(id));
    }
}

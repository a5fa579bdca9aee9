// SPDX-License-Identifier: Apache-2.0
//! gpu-feature-discovery's flags on `nvshim labels`: every name of GFD v0.20 parses
//! ([`GFD_FLAGS`] is the spec, taken from `cmd/gpu-feature-discovery/main.go` and
//! `internal/flags`), the `GFD_*` env vars and `flags.gfd.*` keys are read with flag >
//! env > file > default, and what nvshim lacks fails by name.

use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Parser;

use super::gfd::{DEFAULT_SLEEP_INTERVAL, Output, Resolved, resolve};
use super::{DEFAULT_OUTPUT, LabelsArgs, MACHINE_TYPE_FILE};
use crate::cli::{Cli, Command};
use crate::k8s_config::{FileSettings, MigStrategy, parse_file};

/// Every flag of gpu-feature-discovery v0.17–v0.20 (urfave/cli's `--help`/`--version`
/// aside), aliases included, with a value (`None`: a boolean switch, given bare and as
/// `=false`, as urfave/cli takes it).
const GFD_FLAGS: &[(&str, Option<&str>)] = &[
    ("mig-strategy", Some("none")),
    ("fail-on-init-error", None),
    ("oneshot", None),
    ("no-timestamp", None),
    ("sleep-interval", Some("60s")),
    ("output-file", Some("-")),
    ("output", Some("-")),
    ("o", Some("-")),
    ("machine-type-file", Some("/sys/class/dmi/id/product_name")),
    ("config-file", Some("/etc/gfd/config.yaml")),
    ("use-node-feature-api", None),
    ("device-discovery-strategy", Some("auto")),
    ("driver-root-ctr-path", Some("/driver-root")),
    ("container-driver-root", Some("/driver-root")),
    ("kubeconfig", Some("/root/.kube/config")),
    ("kube-api-qps", Some("5")),
    ("kube-api-burst", Some("10")),
    ("namespace", Some("default")),
    ("node-name", Some("node-1")),
    ("pod-name", Some("gfd-abcde")),
];

fn parse(args: &[&str]) -> Result<LabelsArgs, clap::Error> {
    let cli = Cli::try_parse_from(["nvshim", "labels"].iter().chain(args))?;
    match cli.command {
        Command::Labels(args) => Ok(args),
        other => panic!("not labels: {other:?}"),
    }
}

fn env_of(pairs: &[(&'static str, &'static str)]) -> impl Fn(&str) -> Option<String> {
    let pairs = pairs.to_vec();
    move |name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    }
}

fn resolved(
    args: &[&str],
    env: &[(&'static str, &'static str)],
    yaml: Option<&str>,
) -> Result<Resolved, String> {
    let args = parse(args).map_err(|e| e.to_string())?;
    let file = match yaml {
        Some(yaml) => {
            parse_file(yaml.as_bytes(), Path::new("c.yaml")).map_err(|e| e.to_string())?
        }
        None => FileSettings::default(),
    };
    resolve(&args, &env_of(env), &file).map_err(|e| e.to_string())
}

fn default() -> Resolved {
    Resolved {
        output: Output::File(DEFAULT_OUTPUT.into()),
        interval: None,
        fail_on_init_error: true,
        mig_strategy: MigStrategy::None,
        sharing: None,
        machine_type_file: MACHINE_TYPE_FILE.into(),
        nvml_only: false,
        driver_root: None,
        timestamp: true,
    }
}

fn with(change: impl FnOnce(&mut Resolved)) -> Resolved {
    let mut r = default();
    change(&mut r);
    r
}

#[test]
fn gfd_flags_all_parse() {
    for &(flag, value) in GFD_FLAGS {
        let dashes = if flag.len() == 1 { "-" } else { "--" };
        let mut forms = vec![
            vec![format!("{dashes}{flag}")],
            vec![format!("{dashes}{flag}=false")],
        ];
        if let Some(value) = value {
            forms = vec![vec![format!("{dashes}{flag}"), value.to_owned()]];
            if dashes == "--" {
                forms.push(vec![format!("--{flag}={value}")]);
            }
        }
        for form in forms {
            let args: Vec<&str> = form.iter().map(String::as_str).collect();
            parse(&args).unwrap_or_else(|e| panic!("{args:?}: GFD's flag is rejected: {e}"));
        }
    }
    // Our older names still work.
    for args in [
        &["--output", "-"][..],
        &["--interval", "5m"],
        &["--config", "c.yaml"],
    ] {
        parse(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
}

#[test]
fn gfd_flags_env_and_file_resolve() {
    let every = |d: Duration| with(|r| r.interval = Some(d));
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        Option<&'static str>,
        Resolved,
    );
    let cases: Vec<Case> = vec![
        ("nothing: once", &[], &[], None, default()),
        ("--oneshot", &["--oneshot"], &[], None, default()),
        (
            "--oneshot wins over an interval",
            &["--oneshot", "--sleep-interval=5s"],
            &[],
            None,
            default(),
        ),
        (
            "--sleep-interval loops",
            &["--sleep-interval", "5s"],
            &[],
            None,
            every(Duration::from_secs(5)),
        ),
        (
            "--oneshot=false loops every 60s, as GFD",
            &["--oneshot=false"],
            &[],
            None,
            every(DEFAULT_SLEEP_INTERVAL),
        ),
        (
            "GFD_SLEEP_INTERVAL",
            &[],
            &[("GFD_SLEEP_INTERVAL", "2m")],
            None,
            every(Duration::from_secs(120)),
        ),
        (
            "GFD_ONESHOT=true beats GFD_SLEEP_INTERVAL",
            &[],
            &[("GFD_ONESHOT", "true"), ("GFD_SLEEP_INTERVAL", "2m")],
            None,
            default(),
        ),
        (
            "--oneshot=false beats GFD_ONESHOT",
            &["--oneshot=false"],
            &[("GFD_ONESHOT", "1")],
            None,
            every(DEFAULT_SLEEP_INTERVAL),
        ),
        (
            "-o -",
            &["-o", "-"],
            &[],
            None,
            with(|r| r.output = Output::Stdout),
        ),
        (
            "empty output is stdout, as GFD",
            &["--output-file="],
            &[],
            None,
            with(|r| r.output = Output::Stdout),
        ),
        (
            "GFD_OUTPUT_FILE",
            &[],
            &[("GFD_OUTPUT_FILE", "/f/gfd")],
            None,
            with(|r| r.output = Output::File("/f/gfd".into())),
        ),
        (
            "GFD_MIG_STRATEGY before MIG_STRATEGY",
            &[],
            &[("MIG_STRATEGY", "single"), ("GFD_MIG_STRATEGY", "mixed")],
            None,
            with(|r| r.mig_strategy = MigStrategy::Mixed),
        ),
        (
            "MIG_STRATEGY",
            &[],
            &[("MIG_STRATEGY", "single")],
            None,
            with(|r| r.mig_strategy = MigStrategy::Single),
        ),
        (
            "the flag beats MIG_STRATEGY",
            &["--mig-strategy=none"],
            &[("MIG_STRATEGY", "mixed")],
            None,
            default(),
        ),
        (
            "FAIL_ON_INIT_ERROR",
            &[],
            &[("FAIL_ON_INIT_ERROR", "false")],
            None,
            with(|r| r.fail_on_init_error = false),
        ),
        (
            "GFD_FAIL_ON_INIT_ERROR",
            &[],
            &[("GFD_FAIL_ON_INIT_ERROR", "F")],
            None,
            with(|r| r.fail_on_init_error = false),
        ),
        (
            "GFD_MACHINE_TYPE_FILE",
            &[],
            &[("GFD_MACHINE_TYPE_FILE", "/m")],
            None,
            with(|r| r.machine_type_file = "/m".into()),
        ),
        (
            "--no-timestamp",
            &["--no-timestamp"],
            &[("GFD_NO_TIMESTAMP", "false")],
            None,
            with(|r| r.timestamp = false),
        ),
        (
            "GFD_NO_TIMESTAMP",
            &[],
            &[("GFD_NO_TIMESTAMP", "true")],
            None,
            with(|r| r.timestamp = false),
        ),
        (
            "--no-timestamp=false over the file",
            &["--no-timestamp=false"],
            &[],
            Some("flags: {gfd: {noTimestamp: true}}"),
            default(),
        ),
        (
            "flags.gfd.noTimestamp",
            &[],
            &[],
            Some("flags: {gfd: {noTimestamp: true}}"),
            with(|r| r.timestamp = false),
        ),
        (
            "--use-node-feature-api=false",
            &["--use-node-feature-api=false"],
            &[("USE_NODE_FEATURE_API", "true")],
            None,
            default(),
        ),
        (
            "--use-node-feature-api with --node-name and --namespace",
            &[
                "--use-node-feature-api",
                "--node-name=n1",
                "--namespace=gpus",
            ],
            &[("NODE_NAME", "other")],
            None,
            with(|r| {
                r.output = Output::NodeFeature {
                    node: "n1".into(),
                    namespace: Some("gpus".into()),
                }
            }),
        ),
        (
            "USE_NODE_FEATURE_API with NODE_NAME, no namespace",
            &[],
            &[("USE_NODE_FEATURE_API", "true"), ("NODE_NAME", "n2")],
            None,
            with(|r| {
                r.output = Output::NodeFeature {
                    node: "n2".into(),
                    namespace: None,
                }
            }),
        ),
        (
            "nvml discovery",
            &["--device-discovery-strategy=nvml"],
            &[],
            None,
            with(|r| r.nvml_only = true),
        ),
        (
            "DEVICE_DISCOVERY_STRATEGY",
            &[],
            &[("DEVICE_DISCOVERY_STRATEGY", "nvml")],
            None,
            with(|r| r.nvml_only = true),
        ),
        (
            "--driver-root-ctr-path",
            &["--driver-root-ctr-path=/driver-root"],
            &[],
            None,
            with(|r| r.driver_root = Some("/driver-root".into())),
        ),
        (
            "CONTAINER_DRIVER_ROOT",
            &[],
            &[("CONTAINER_DRIVER_ROOT", "/d")],
            None,
            with(|r| r.driver_root = Some("/d".into())),
        ),
        (
            "the client flags have no effect",
            &[
                "--kubeconfig=/k",
                "--namespace=x",
                "--node-name=n",
                "--pod-name=p",
                "--kube-api-qps=1.5",
                "--kube-api-burst=3",
            ],
            &[("NODE_NAME", "n")],
            None,
            default(),
        ),
        (
            "flags.gfd keys",
            &[],
            &[],
            Some(
                "flags:\n  migStrategy: mixed\n  gfd:\n    sleepInterval: 30s\n    outputFile: /o\n    machineTypeFile: /m\n",
            ),
            with(|r| {
                r.interval = Some(Duration::from_secs(30));
                r.output = Output::File("/o".into());
                r.machine_type_file = "/m".into();
                r.mig_strategy = MigStrategy::Mixed;
            }),
        ),
        (
            "env beats flags.gfd, flags beat env",
            &["--mig-strategy=single"],
            &[("GFD_SLEEP_INTERVAL", "1m"), ("MIG_STRATEGY", "none")],
            Some("flags: {migStrategy: mixed, gfd: {sleepInterval: 30s, oneshot: false}}"),
            with(|r| {
                r.interval = Some(Duration::from_secs(60));
                r.mig_strategy = MigStrategy::Single;
            }),
        ),
        (
            "flags.gfd.oneshot",
            &[],
            &[],
            Some("flags: {gfd: {oneshot: true, sleepInterval: 30s}}"),
            default(),
        ),
        (
            "flags.gfd.sleepInterval in nanoseconds, as Go's JSON takes it",
            &[],
            &[],
            Some("flags: {gfd: {sleepInterval: 90000000000}}"),
            every(Duration::from_secs(90)),
        ),
    ];
    for (case, args, env, yaml, want) in cases {
        let got = resolved(args, env, yaml).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn gfd_flags_nvshim_lacks_fail_by_name() {
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        Option<&'static str>,
        &'static [&'static str],
    );
    let cases: &[Case] = &[
        (
            "NodeFeature API without a node name",
            &["--use-node-feature-api"],
            &[],
            None,
            &["--node-name", "NODE_NAME"],
        ),
        (
            "GFD_USE_NODE_FEATURE_API without a node name",
            &[],
            &[("GFD_USE_NODE_FEATURE_API", "true")],
            None,
            &["--node-name"],
        ),
        (
            "flags.useNodeFeatureAPI without a node name",
            &[],
            &[],
            Some("flags: {useNodeFeatureAPI: true}"),
            &["--node-name"],
        ),
        (
            "NodeFeature API with a kubeconfig",
            &["--use-node-feature-api", "--node-name=n"],
            &[("KUBECONFIG", "/root/.kube/config")],
            None,
            &["--kubeconfig /root/.kube/config", "in-cluster"],
        ),
        (
            "tegra",
            &["--device-discovery-strategy=tegra"],
            &[],
            None,
            &["\"tegra\"", "not supported by nvshim yet"],
        ),
        (
            "vfio",
            &[],
            &[("DEVICE_DISCOVERY_STRATEGY", "vfio")],
            None,
            &["\"vfio\"", "not supported by nvshim yet"],
        ),
        (
            "unknown discovery",
            &["--device-discovery-strategy=gpu"],
            &[],
            None,
            &["unknown device discovery strategy \"gpu\""],
        ),
        (
            "bad GFD_ONESHOT",
            &[],
            &[("GFD_ONESHOT", "yes")],
            None,
            &["GFD_ONESHOT", "\"yes\" is not a boolean"],
        ),
        (
            "bad GFD_SLEEP_INTERVAL",
            &[],
            &[("GFD_SLEEP_INTERVAL", "5x")],
            None,
            &["GFD_SLEEP_INTERVAL", "\"5x\""],
        ),
        (
            "bad GFD_MIG_STRATEGY",
            &[],
            &[("GFD_MIG_STRATEGY", "half")],
            None,
            &["GFD_MIG_STRATEGY", "\"half\""],
        ),
        (
            "bad flags.gfd.sleepInterval",
            &[],
            &[],
            Some("flags: {gfd: {sleepInterval: soon}}"),
            &["flags.gfd.sleepInterval", "\"soon\""],
        ),
        (
            "bad --oneshot value",
            &["--oneshot=maybe"],
            &[],
            None,
            &["maybe"],
        ),
    ];
    for (case, args, env, yaml, want) in cases {
        let message = match resolved(args, env, *yaml) {
            Ok(got) => panic!("{case}: want an error, got {got:?}"),
            Err(e) => e,
        };
        for fragment in *want {
            assert!(
                message.contains(fragment),
                "{case}: {message:?} should contain {fragment:?}"
            );
        }
    }
}

#[test]
fn gfd_config_file_from_flag_or_env() {
    let args = parse(&[]).expect("no flags");
    let env = env_of(&[("CONFIG_FILE", "/b"), ("GFD_CONFIG_FILE", "/a")]);
    assert_eq!(
        super::gfd::config_file(&args, &env),
        Some(PathBuf::from("/a"))
    );
    let args = parse(&["--config-file", "/flag"]).expect("flag");
    assert_eq!(
        super::gfd::config_file(&args, &env),
        Some(PathBuf::from("/flag"))
    );
}

/// Under the `gpu-feature-discovery` name: GFD's file and GFD's loop by default; its
/// flags, variables and file keys still win.
#[test]
fn gfd_defaults_under_gfds_name() {
    let gfd_args = |extra: &[&str]| {
        let mut args = LabelsArgs {
            gfd_defaults: true,
            ..LabelsArgs::default()
        };
        if extra == ["--oneshot"] {
            args.oneshot = Some(true);
        }
        args
    };
    let every_minute = Resolved {
        output: Output::File(super::feature_discovery::GFD_OUTPUT.into()),
        interval: Some(DEFAULT_SLEEP_INTERVAL),
        ..default()
    };
    let file = FileSettings::default();
    let cases = [
        ("no flags", gfd_args(&[]), vec![], every_minute.clone()),
        (
            "--oneshot",
            gfd_args(&["--oneshot"]),
            vec![],
            Resolved {
                interval: None,
                ..every_minute.clone()
            },
        ),
        (
            "GFD_ONESHOT",
            gfd_args(&[]),
            vec![("GFD_ONESHOT", "true")],
            Resolved {
                interval: None,
                ..every_minute.clone()
            },
        ),
        (
            "GFD_OUTPUT_FILE",
            gfd_args(&[]),
            vec![("GFD_OUTPUT_FILE", "/x")],
            Resolved {
                output: Output::File("/x".into()),
                ..every_minute.clone()
            },
        ),
    ];
    for (case, args, env, want) in cases {
        let got = resolve(&args, &env_of(&env), &file).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

// SPDX-License-Identifier: Apache-2.0
//! NVIDIA's plugin flags (v0.17 to v0.20) against ours: every name parses, each env var
//! is read, NVIDIA's defaults given explicitly change nothing, the extras (GDS, MOFED,
//! GDRCopy, IMEX) resolve, and the features nvshim does not have yet fail with a
//! message naming them. [`NVIDIA_FLAGS`] is the spec:
//! it was taken from `cmd/nvidia-device-plugin/main.go` of those releases.

use std::path::Path;

use super::tests::{argv, assert_error, settings, with};
use super::*;

/// Every flag of NVIDIA's `nvidia-device-plugin` v0.17–v0.20 (urfave/cli's own
/// `--help`/`--version` aside), aliases included, with a value that NVIDIA's default
/// means (`None`: a list whose default is empty). Booleans are in [`BOOLS`]: urfave/cli
/// takes them bare or as `--flag=VALUE`, never `--flag VALUE`. Given explicitly, each
/// value must leave our settings at
/// their defaults: the only difference allowed is `--container-driver-root`, whose
/// default we resolve on the node (see `DEFAULT_SPELLED_OUT`).
const NVIDIA_FLAGS: &[(&str, Option<&str>)] = &[
    ("mig-strategy", Some("none")),
    ("fail-on-init-error", Some("true")),
    ("driver-root", Some("/")),
    ("nvidia-driver-root", Some("/")),
    ("dev-root", Some("/")),
    ("nvidia-dev-root", Some("/")),
    ("pass-device-specs", Some("false")),
    ("device-list-strategy", Some("envvar")),
    ("device-id-strategy", Some("uuid")),
    ("gdrcopy-enabled", Some("false")),
    ("gds-enabled", Some("false")),
    ("mofed-enabled", Some("false")),
    (
        "kubelet-socket",
        Some("/var/lib/kubelet/device-plugins/kubelet.sock"),
    ),
    ("cdi-annotation-prefix", Some("cdi.k8s.io/")),
    ("nvidia-cdi-hook-path", Some("/usr/bin/nvidia-ctk")),
    ("nvidia-ctk-path", Some("/usr/bin/nvidia-ctk")),
    ("driver-root-ctr-path", Some("/driver-root")),
    ("container-driver-root", Some("/driver-root")),
    ("mps-root", Some("")),
    ("shared-devices-allocation-policy", Some("distributed")),
    ("device-discovery-strategy", Some("auto")),
    ("imex-required", Some("false")),
    // An empty IntSlice / StringSlice is NVIDIA's default: these take a value each time.
    ("imex-channel-ids", None),
    ("cdi-feature-flags", None),
    ("cdi-disable-hooks", None),
    ("config-file", Some("")),
];

/// NVIDIA's boolean flags.
const BOOLS: &[&str] = &[
    "fail-on-init-error",
    "pass-device-specs",
    "gdrcopy-enabled",
    "gds-enabled",
    "mofed-enabled",
    "imex-required",
];

/// NVIDIA's defaults for the flags whose default nvshim decides later: the container
/// driver root is `/driver-root` when that exists, so spelling it out sets it.
fn spelled_out(flag: &str) -> Settings {
    match flag {
        "driver-root-ctr-path" | "container-driver-root" => {
            with(|s| s.container_driver_root = Some("/driver-root".into()))
        }
        _ => Settings::default(),
    }
}

#[test]
fn flags_of_nvidias_plugin_all_parse() {
    for &(flag, value) in NVIDIA_FLAGS {
        let forms: Vec<Vec<String>> = match value {
            Some(value) if BOOLS.contains(&flag) => {
                vec![vec![format!("--{flag}={value}")], vec![format!("--{flag}")]]
            }
            Some(value) => vec![
                vec![format!("--{flag}={value}")],
                vec![format!("--{flag}"), value.to_owned()],
            ],
            None => vec![vec![format!("--{flag}"), "0".to_owned()]],
        };
        for form in forms {
            let args: Vec<&str> = form.iter().map(String::as_str).collect();
            if let Err(e) = argv(&args) {
                panic!("{args:?}: NVIDIA's flag is rejected: {e}");
            }
        }
    }
    // The lists: repeatable and comma-separated, as urfave/cli's slices.
    for args in [
        &["--imex-channel-ids=0,1", "--imex-channel-ids", "2"][..],
        &["--cdi-feature-flags=a,b", "--cdi-feature-flags", "c"],
        &["--cdi-disable-hooks=all", "--cdi-disable-hooks", "x,y"],
        &[
            "--device-list-strategy=envvar,cdi-cri",
            "--device-list-strategy",
            "cdi-annotations",
        ],
    ] {
        argv(args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    }
    // urfave/cli's builtins: -h and -v.
    for args in [["-h"], ["--help"], ["-v"], ["--version"], ["-V"]] {
        let e = argv(&args).expect_err("help and version exit");
        assert!(
            matches!(
                e.kind(),
                clap::error::ErrorKind::DisplayHelp | clap::error::ErrorKind::DisplayVersion
            ),
            "{args:?}: {e}"
        );
    }
}

#[test]
fn flags_with_nvidias_default_values_change_nothing() {
    for &(flag, value) in NVIDIA_FLAGS {
        let Some(value) = value else { continue };
        let arg = format!("--{flag}={value}");
        let got = settings(&[&arg], &[], None).unwrap_or_else(|e| panic!("{arg}: {e}"));
        assert_eq!(got, spelled_out(flag), "{arg}");
    }
}

#[test]
fn flags_nvshim_does_not_support_yet_fail_naming_the_feature() {
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        &'static [&'static str],
    );
    let cases: &[Case] = &[
        (
            "imex channel with only CDI strategies",
            &["--imex-channel-ids=0", "--device-list-strategy=cdi-cri"],
            &[],
            &[
                "--imex-channel-ids with only cdi-* device list strategies=\"0\"",
                "IMEX channels as CDI devices",
                "envvar or volume-mounts",
            ],
        ),
        (
            "imex channels NVIDIA refuses too",
            &["--imex-channel-ids=1,2"],
            &[],
            &["--imex-channel-ids", "\"1,2\"", "no channel, or 0"],
        ),
        (
            "tegra",
            &["--device-discovery-strategy=tegra"],
            &[],
            &[
                "--device-discovery-strategy",
                "\"tegra\"",
                "not supported by nvshim yet",
            ],
        ),
        (
            "unknown discovery",
            &["--device-discovery-strategy", "gpu"],
            &[],
            &["unknown device discovery strategy \"gpu\"", "auto, nvml"],
        ),
        (
            "cdi feature flags",
            &["--cdi-feature-flags=disable-multiple-csv-devices"],
            &[],
            &["--cdi-feature-flags", "CDI feature flags yet"],
        ),
        (
            "packed",
            &["--shared-devices-allocation-policy=packed"],
            &[],
            &[
                "--shared-devices-allocation-policy=\"packed\"",
                "packed allocation policy yet",
            ],
        ),
        (
            "bad policy",
            &["--shared-devices-allocation-policy=spread"],
            &[],
            &["\"spread\"", "distributed, packed"],
        ),
        (
            "a hook nvshim's spec keeps",
            &["--cdi-disable-hooks=update-ldcache"],
            &[],
            &[
                "--cdi-disable-hooks=\"update-ldcache\"",
                "hooks other than disable-device-node-modification (or all) yet",
            ],
        ),
        (
            "GDS_ENABLED not a boolean",
            &[],
            &[("GDS_ENABLED", "yes")],
            &["GDS_ENABLED", "\"yes\" is not a boolean"],
        ),
        (
            "IMEX_CHANNEL_IDS NVIDIA refuses too",
            &[],
            &[("IMEX_CHANNEL_IDS", "0,1")],
            &["IMEX_CHANNEL_IDS", "\"0,1\"", "no channel, or 0"],
        ),
        (
            "IMEX_CHANNEL_IDS not a number",
            &[],
            &[("IMEX_CHANNEL_IDS", "zero")],
            &["IMEX_CHANNEL_IDS", "\"zero\"", "integers"],
        ),
        (
            "CDI_FEATURE_FLAGS",
            &[],
            &[("CDI_FEATURE_FLAGS", "a, b")],
            &["CDI_FEATURE_FLAGS=\"a,b\"", "yet"],
        ),
        (
            "SHARED_DEVICES_ALLOCATION_POLICY",
            &[],
            &[("SHARED_DEVICES_ALLOCATION_POLICY", "packed")],
            &[
                "SHARED_DEVICES_ALLOCATION_POLICY",
                "packed allocation policy",
            ],
        ),
        (
            "CDI_DISABLE_HOOKS",
            &[],
            &[("CDI_DISABLE_HOOKS", "enable-cuda-compat")],
            &["CDI_DISABLE_HOOKS=\"enable-cuda-compat\"", "yet"],
        ),
        (
            "IMEX_REQUIRED not a boolean",
            &[],
            &[("IMEX_REQUIRED", "yes")],
            &["IMEX_REQUIRED", "\"yes\" is not a boolean"],
        ),
        // Unsupported is a start-up error whatever --fail-on-init-error says, as NVIDIA's
        // flag validation is.
        (
            "with --fail-on-init-error=false",
            &["--fail-on-init-error=false", "--cdi-feature-flags=x"],
            &[],
            &["CDI feature flags"],
        ),
    ];
    for (case, args, env, want) in cases {
        assert_error(case, settings(args, env, None), want);
    }
}

#[test]
fn flags_beat_their_env_vars_and_env_vars_work() {
    let hook = |path: &str| with(|s| s.cdi_hook_path = path.into());
    /// Case name, flags, env, expected settings.
    type Case = (
        &'static str,
        Vec<&'static str>,
        Vec<(&'static str, &'static str)>,
        Settings,
    );
    let cases: Vec<Case> = vec![
        (
            "--gds-enabled=false beats GDS_ENABLED",
            vec!["--gds-enabled=false"],
            vec![("GDS_ENABLED", "true")],
            Settings::default(),
        ),
        (
            "an empty IMEX list",
            vec![],
            vec![("IMEX_CHANNEL_IDS", " ")],
            Settings::default(),
        ),
        (
            "IMEX_REQUIRED",
            vec![],
            vec![("IMEX_REQUIRED", "true")],
            with(|s| s.imex.required = true),
        ),
        (
            "--imex-required beats IMEX_REQUIRED",
            vec!["--imex-required"],
            vec![("IMEX_REQUIRED", "false")],
            with(|s| s.imex.required = true),
        ),
        (
            "--imex-channel-ids=0 beats an empty IMEX_CHANNEL_IDS",
            vec!["--imex-channel-ids=0"],
            vec![("IMEX_CHANNEL_IDS", "")],
            with(|s| s.imex.channel_ids = vec![0]),
        ),
        (
            "IMEX_CHANNEL_IDS=0",
            vec![],
            vec![("IMEX_CHANNEL_IDS", "0")],
            with(|s| s.imex.channel_ids = vec![0]),
        ),
        (
            "--gds-enabled, MOFED_ENABLED, GDRCOPY_ENABLED",
            vec!["--gds-enabled"],
            vec![("MOFED_ENABLED", "1"), ("GDRCOPY_ENABLED", "T")],
            with(|s| {
                s.device_classes = DeviceClasses {
                    gdrcopy: true,
                    gds: true,
                    mofed: true,
                }
            }),
        ),
        (
            "--device-discovery-strategy=nvml beats DEVICE_DISCOVERY_STRATEGY",
            vec!["--device-discovery-strategy=nvml"],
            vec![("DEVICE_DISCOVERY_STRATEGY", "tegra")],
            Settings::default(),
        ),
        (
            "NVIDIA_CDI_HOOK_PATH",
            vec![],
            vec![("NVIDIA_CDI_HOOK_PATH", "/usr/local/bin/nvidia-cdi-hook")],
            hook("/usr/local/bin/nvidia-cdi-hook"),
        ),
        (
            "NVIDIA_CTK_PATH",
            vec![],
            vec![("NVIDIA_CTK_PATH", "/opt/bin/nvidia-ctk")],
            hook("/opt/bin/nvidia-ctk"),
        ),
        (
            "NVIDIA_CDI_HOOK_PATH before NVIDIA_CTK_PATH before NVSHIM_CDI_HOOK_PATH",
            vec![],
            vec![
                ("NVSHIM_CDI_HOOK_PATH", "/c"),
                ("NVIDIA_CTK_PATH", "/b"),
                ("NVIDIA_CDI_HOOK_PATH", "/a"),
            ],
            hook("/a"),
        ),
        (
            "--nvidia-ctk-path beats the env",
            vec!["--nvidia-ctk-path=/flag/nvidia-ctk"],
            vec![("NVIDIA_CDI_HOOK_PATH", "/a")],
            hook("/flag/nvidia-ctk"),
        ),
        (
            "--cdi-hook-path, our older name",
            vec!["--cdi-hook-path", "/usr/bin/nvshim"],
            vec![],
            hook("/usr/bin/nvshim"),
        ),
        (
            "--cdi-disable-hooks",
            vec!["--cdi-disable-hooks=disable-device-node-modification"],
            vec![],
            with(|s| s.cdi_disable_hooks = vec!["disable-device-node-modification".into()]),
        ),
        (
            "CDI_DISABLE_HOOKS",
            vec![],
            vec![("CDI_DISABLE_HOOKS", "all")],
            with(|s| s.cdi_disable_hooks = vec!["all".into()]),
        ),
        (
            "SHARED_DEVICES_ALLOCATION_POLICY=distributed",
            vec![],
            vec![("SHARED_DEVICES_ALLOCATION_POLICY", "distributed")],
            Settings::default(),
        ),
    ];
    for (case, args, env, want) in cases {
        let got = settings(&args, &env, None).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn flags_config_file_hook_path_and_default() {
    // NVIDIA's default, which our packages install as a name of nvshim.
    assert_eq!(
        Settings::default().cdi_hook_path,
        Path::new("/usr/bin/nvidia-ctk")
    );
    let yaml = "flags: {plugin: {nvidiaCTKPath: /opt/nvidia/nvidia-ctk}}";
    let got = settings(&[], &[], Some(yaml)).expect("nvidiaCTKPath");
    assert_eq!(got.cdi_hook_path, Path::new("/opt/nvidia/nvidia-ctk"));
    let got = settings(&[], &[("NVIDIA_CTK_PATH", "/env/nvidia-ctk")], Some(yaml))
        .expect("env beats file");
    assert_eq!(got.cdi_hook_path, Path::new("/env/nvidia-ctk"));
}

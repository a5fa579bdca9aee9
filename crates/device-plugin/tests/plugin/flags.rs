// SPDX-License-Identifier: Apache-2.0
//! NVIDIA's plugin flags against the binary: given at NVIDIA's defaults, every one of
//! them gets the plugin past its settings (to the NVML it cannot load here), and so do
//! `--gds-enabled` and a missing IMEX channel that is not required; switched on, each
//! feature nvshim does not have yet stops it at start with exit 1 and a message naming
//! the feature, even with `--fail-on-init-error=false`, as does a required IMEX channel
//! the node lacks. The parse-level tables
//! are in `config::flags_tests`; this checks the binary wires them up. No kubelet, no
//! GPU: every run ends before serving.

use std::process::{Command, Output};

const NO_NVML: &str = "/nonexistent/libnvidia-ml.so.1";

fn plugin(args: &[&str], env: &[(&str, &str)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_nvidia-device-plugin"))
        .env_clear()
        .envs(env.iter().copied())
        .args(["--kubelet-socket=", "--nvml-lib", NO_NVML])
        .args(args)
        .output()
        .expect("run nvidia-device-plugin")
}

#[test]
fn flags_of_nvidias_plugin_reach_the_driver() {
    let args = [
        "--mig-strategy=none",
        "--fail-on-init-error=true",
        "--driver-root=/",
        "--dev-root=/",
        "--pass-device-specs=false",
        "--device-list-strategy=envvar",
        "--device-id-strategy=uuid",
        "--gdrcopy-enabled=false",
        "--gds-enabled",
        "--mofed-enabled=false",
        "--imex-channel-ids=0",
        "--cdi-annotation-prefix=cdi.k8s.io/",
        "--nvidia-cdi-hook-path=/usr/bin/nvidia-ctk",
        "--device-discovery-strategy=auto",
        "--shared-devices-allocation-policy=distributed",
        "--imex-required=false",
        "--cdi-disable-hooks=disable-device-node-modification",
    ];
    let env = [
        ("MIG_STRATEGY", "none"),
        ("GDS_ENABLED", "false"),
        ("MOFED_ENABLED", "false"),
        ("GDRCOPY_ENABLED", "false"),
        ("IMEX_CHANNEL_IDS", ""),
        ("IMEX_REQUIRED", "false"),
        ("CDI_FEATURE_FLAGS", ""),
        ("DEVICE_DISCOVERY_STRATEGY", "nvml"),
        ("NVIDIA_CTK_PATH", "/usr/bin/nvidia-ctk"),
    ];
    let out = plugin(&args, &env);
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{log}");
    assert!(log.contains("cannot load NVML"), "past the settings: {log}");
}

#[test]
fn flags_nvshim_does_not_support_yet_stop_the_plugin_at_start() {
    type Case = (
        &'static str,
        &'static [&'static str],
        &'static [(&'static str, &'static str)],
        &'static str,
    );
    let cases: &[Case] = &[
        (
            "--imex-required with a channel the node lacks",
            &[
                "--imex-channel-ids=0",
                "--imex-required",
                "--dev-root=/nonexistent",
            ],
            &[],
            "requested IMEX channel /dev/nvidia-caps-imex-channels/channel0 does not exist",
        ),
        (
            "tegra",
            &["--device-discovery-strategy", "tegra"],
            &[],
            "\"tegra\" is not supported by nvshim yet",
        ),
        (
            "--cdi-feature-flags",
            &["--cdi-feature-flags=x"],
            &[],
            "CDI feature flags yet",
        ),
        (
            "packed",
            &["--shared-devices-allocation-policy=packed"],
            &[],
            "packed allocation policy yet",
        ),
        (
            "CDI_FEATURE_FLAGS",
            &[],
            &[("CDI_FEATURE_FLAGS", "x")],
            "CDI_FEATURE_FLAGS=\"x\": nvshim does not support NVIDIA's CDI feature flags yet",
        ),
        (
            "--fail-on-init-error=false",
            &["--fail-on-init-error=false", "--cdi-feature-flags=x"],
            &[],
            "CDI feature flags yet",
        ),
        (
            "mps-control-daemon",
            &["mps-control-daemon", "--cdi-feature-flags=x"],
            &[],
            "CDI feature flags yet",
        ),
    ];
    for (case, args, env, want) in cases {
        let out = plugin(args, env);
        let log = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{case}: {log}");
        assert!(
            log.contains("nvidia-device-plugin: error: ") && log.contains(want),
            "{case}: {log:?} should say {want:?}"
        );
    }
}

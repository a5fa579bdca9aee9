use proptest::prelude::*;

use super::*;
use crate::request::{ContainerInputs, DeviceList, RequestPolicy, build as build_request};

const ROOT: &str = "/var/run/nvidia-container-devices";

fn policy() -> ClassPolicy {
    ClassPolicy {
        accept_envvar_when_unprivileged: true,
        accept_volume_mounts: false,
        ignore_imex_channel_requests: false,
        create_imex_channels: true,
    }
}

fn classes_of(
    env: &[(&str, &str)],
    mounts: &[&str],
    privileged: bool,
    policy: ClassPolicy,
) -> Result<DeviceClasses, RequestError> {
    let mounts: Vec<InputMount> = mounts
        .iter()
        .map(|d| InputMount {
            destination: format!("{ROOT}/{d}"),
            source: Some("/dev/null".into()),
        })
        .collect();
    build(
        |key| env.iter().rev().find(|(k, _)| *k == key).map(|(_, v)| *v),
        &mounts,
        privileged,
        policy,
    )
}

#[test]
fn channel_ids_parse_or_name_the_problem() {
    let cases: [(&str, &str, Result<u32, &str>); 11] = [
        ("zero", "0", Ok(0)),
        ("plain", "2", Ok(2)),
        ("prefixed", "channel7", Ok(7)),
        ("largest", "1048575", Ok(1_048_575)),
        ("one past the largest", "1048576", Err("out of range")),
        ("huge", "99999999999999999999999", Err("out of range")),
        ("negative", "-1", Err("not a channel number")),
        ("prefix alone", "channel", Err("not a channel number")),
        ("hex", "0x1", Err("not a channel number")),
        ("sign", "+1", Err("not a channel number")),
        ("inner space", "1 2", Err("not a channel number")),
    ];
    for (name, id, want) in cases {
        assert_eq!(parse_imex_channel(id), want, "case {name}: {id:?}");
    }
}

#[test]
fn the_variable_follows_nvidias_rules() {
    type Case<'a> = (&'a str, &'a str, bool, ClassPolicy, Vec<u32>, bool);
    let unprivileged_strict = ClassPolicy {
        accept_envvar_when_unprivileged: false,
        ..policy()
    };
    let ignore = ClassPolicy {
        ignore_imex_channel_requests: true,
        ..policy()
    };
    let cases: Vec<Case<'_>> = vec![
        (
            "two channels, sorted and once",
            "2,0, 2",
            false,
            policy(),
            vec![0, 2],
            false,
        ),
        (
            "prefixed",
            "channel1,channel3",
            false,
            policy(),
            vec![1, 3],
            false,
        ),
        ("all is ignored", "all", false, policy(), vec![], false),
        (
            "all anywhere is ignored",
            "0,all",
            false,
            policy(),
            vec![],
            false,
        ),
        ("void anywhere", "1,void", false, policy(), vec![], false),
        ("none", "none", false, policy(), vec![], false),
        ("empty", "", false, policy(), vec![], false),
        ("only commas", " , ,", false, policy(), vec![], false),
        (
            "unprivileged, strict: dropped",
            "0",
            false,
            unprivileged_strict,
            vec![],
            true,
        ),
        (
            "privileged, strict: kept",
            "0",
            true,
            unprivileged_strict,
            vec![0],
            false,
        ),
        (
            "ignore-imex-channel-requests",
            "0",
            true,
            ignore,
            vec![],
            false,
        ),
    ];
    for (name, value, privileged, policy, want, dropped) in cases {
        let got = classes_of(&[("NVIDIA_IMEX_CHANNELS", value)], &[], privileged, policy)
            .unwrap_or_else(|e| panic!("case {name}: {e}"));
        assert_eq!(got.imex_channels, want, "case {name}");
        assert_eq!(got.ignored_imex.is_some(), dropped, "case {name}");
    }
}

#[test]
fn a_bad_channel_names_the_value_and_the_valid_range() {
    let cases = [
        (
            "not a number",
            "0,abc",
            "\"abc\"",
            "NVIDIA_IMEX_CHANNELS \"0,abc\"",
        ),
        ("too large", "1048576", "\"1048576\"", "out of range"),
        ("negative", "-3", "\"-3\"", "not a channel number"),
    ];
    for (name, value, element, context) in cases {
        let err = classes_of(&[("NVIDIA_IMEX_CHANNELS", value)], &[], false, policy())
            .expect_err(name)
            .to_string();
        for part in [element, context, "0-1048575"] {
            assert!(err.contains(part), "case {name}: {err:?} lacks {part:?}");
        }
    }
    // The unparsed value of a dropped request cannot fail the container.
    let strict = ClassPolicy {
        accept_envvar_when_unprivileged: false,
        ..policy()
    };
    assert!(classes_of(&[("NVIDIA_IMEX_CHANNELS", "junk")], &[], false, strict).is_ok());
}

#[test]
fn volume_mounts_win_when_accepted() {
    let mounts_on = ClassPolicy {
        accept_volume_mounts: true,
        ..policy()
    };
    let env = [("NVIDIA_IMEX_CHANNELS", "5")];
    let cases: [(&str, &[&str], ClassPolicy, Vec<u32>); 5] = [
        (
            "mounts win",
            &["imex/1", "imex/channel4", "0"],
            mounts_on,
            vec![1, 4],
        ),
        ("no imex mount: the variable", &["0"], mounts_on, vec![5]),
        ("mounts not accepted", &["imex/1"], policy(), vec![5]),
        (
            "ignored entirely",
            &["imex/1"],
            ClassPolicy {
                ignore_imex_channel_requests: true,
                ..mounts_on
            },
            vec![],
        ),
        (
            "same mount twice",
            &["imex/1", "imex/1"],
            mounts_on,
            vec![1],
        ),
    ];
    for (name, mounts, policy, want) in cases {
        let got = classes_of(&env, mounts, false, policy).unwrap();
        assert_eq!(got.imex_channels, want, "case {name}");
    }
    let err = classes_of(&env, &["imex/x"], false, mounts_on)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("volume mount") && err.contains("imex/x"),
        "{err}"
    );
}

#[test]
fn gates_act_only_for_enabled() {
    let cases = [
        ("enabled", "enabled", true, false),
        ("other case", "Enabled", false, true),
        ("true", "true", false, true),
        ("empty", "", false, false),
    ];
    for (name, value, on, noted) in cases {
        for var in [ENV_GDS, ENV_MOFED, ENV_GDRCOPY, ENV_NVSWITCH] {
            let got = classes_of(&[(var, value)], &[], false, policy()).unwrap();
            let flag = match var {
                ENV_GDS => got.gds,
                ENV_MOFED => got.mofed,
                ENV_GDRCOPY => got.gdrcopy,
                _ => got.nvswitch,
            };
            assert_eq!(flag, on, "case {name} for {var}");
            assert_eq!(
                got.ignored_gates.len(),
                usize::from(noted),
                "case {name} for {var}"
            );
            assert_eq!(got.is_empty(), !on, "case {name} for {var}");
        }
    }
}

#[test]
fn only_a_gpu_container_asks() {
    let env = |devices: &str| ContainerInputs {
        env: vec![
            format!("NVIDIA_VISIBLE_DEVICES={devices}"),
            "NVIDIA_IMEX_CHANNELS=0".into(),
            "NVIDIA_GDS=enabled".into(),
        ],
        ..ContainerInputs::default()
    };
    let cases = [
        ("void", true),
        ("", true),
        ("none", false),
        ("all", false),
        ("0", false),
    ];
    for (devices, empty) in cases {
        let request = build_request(&env(devices), &RequestPolicy::default()).unwrap();
        assert_eq!(request.classes.is_empty(), empty, "case {devices:?}");
        if !empty {
            assert_ne!(request.devices, DeviceList::Void);
            assert_eq!(request.classes.imex_channels, [0], "case {devices:?}");
        }
    }
}

proptest! {
    /// Any string either parses to a channel below 2^20 that prints back to the same
    /// number, or is refused; never a panic.
    #[test]
    fn channel_parser_total(id in "\\PC{0,24}") {
        if let Ok(n) = parse_imex_channel(&id) {
            prop_assert!(n < IMEX_CHANNEL_LIMIT);
            let digits = id.strip_prefix("channel").unwrap_or(&id);
            prop_assert_eq!(digits.parse::<u64>().ok(), Some(u64::from(n)));
        }
    }

    #[test]
    fn every_valid_channel_round_trips(n in 0u32..IMEX_CHANNEL_LIMIT, prefixed in any::<bool>()) {
        let id = if prefixed { format!("channel{n}") } else { n.to_string() };
        prop_assert_eq!(parse_imex_channel(&id), Ok(n));
    }
}

#[test]
fn class_cdi_names_map_to_classes() {
    let cases: [(&str, &str, Option<bool>); 8] = [
        ("nvidia.com/gds", "all", Some(true)),
        ("runtime.nvidia.com/mofed", "all", Some(true)),
        ("nvidia.com/imex-channel", "channel3", Some(true)),
        ("nvidia.com/gdrcopy", "0", Some(false)),
        ("nvidia.com/imex-channel", "all", Some(false)),
        ("nvidia.com/gpu", "0", None),
        ("example.com/gds", "all", None),
        ("k8s.device-plugin.nvidia.com/gds", "all", None),
    ];
    for (kind, name, want) in cases {
        let mut classes = DeviceClasses::default();
        let got = add_cdi_name(&mut classes, kind, name).map(|r| r.is_ok());
        assert_eq!(got, want, "case {kind}={name}");
        if want == Some(true) {
            assert!(!classes.is_empty(), "case {kind}={name}");
        }
    }
}

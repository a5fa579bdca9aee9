// SPDX-License-Identifier: Apache-2.0
//! Property tests: the config file parser and the env readers never panic, whatever
//! they are fed; a generated valid config resolves to the settings it describes.

use std::path::Path;

use proptest::prelude::*;

use super::resolve::merge;
use super::tests::{FILE, env_of};
use super::*;

/// Names of every env var `resolve` reads.
const ENV_NAMES: [&str; 30] = [
    ENV_MIG_STRATEGY,
    ENV_FAIL_ON_INIT_ERROR,
    ENV_NVIDIA_DRIVER_ROOT,
    ENV_NVIDIA_DEV_ROOT,
    ENV_PASS_DEVICE_SPECS,
    ENV_DEVICE_LIST_STRATEGY,
    ENV_DEVICE_ID_STRATEGY,
    ENV_CDI_ANNOTATION_PREFIX,
    ENV_KUBELET_SOCKET,
    ENV_CONFIG_FILE,
    ENV_SOCKET_DIR,
    ENV_HEALTH_ADDR,
    ENV_METRICS_ADDR,
    ENV_POD_RESOURCES_SOCKET,
    ENV_NVML_LIB,
    ENV_LOG_LEVEL,
    ENV_DISABLE_HEALTHCHECKS,
    ENV_ENABLE_HEALTHCHECKS,
    ENV_GDRCOPY_ENABLED,
    ENV_GDS_ENABLED,
    ENV_MOFED_ENABLED,
    ENV_IMEX_CHANNEL_IDS,
    ENV_DEVICE_DISCOVERY_STRATEGY,
    ENV_IMEX_REQUIRED,
    ENV_CDI_FEATURE_FLAGS,
    ENV_CDI_DISABLE_HOOKS,
    ENV_SHARED_DEVICES_ALLOCATION_POLICY,
    ENV_NVIDIA_CDI_HOOK_PATH,
    ENV_NVIDIA_CTK_PATH,
    ENV_CDI_HOOK_PATH,
];

/// YAML-ish text: the parser's interesting characters, key names and values it knows,
/// in any order.
fn yamlish() -> impl Strategy<Value = String> {
    let token = prop_oneof![
        Just("version: v1\n".to_owned()),
        Just("flags:\n".to_owned()),
        Just("  plugin:\n".to_owned()),
        Just("sharing: {timeSlicing: {resources: [".to_owned()),
        Just("{name: nvidia.com/gpu, replicas: 2}".to_owned()),
        Just("deviceListStrategy: [envvar, ".to_owned()),
        Just("migStrategy: ".to_owned()),
        Just("&a ".to_owned()),
        Just("*a".to_owned()),
        Just("<<: ".to_owned()),
        Just("!!binary ".to_owned()),
        Just("---\n".to_owned()),
        "[ \n\t:{}\\[\\],'\"#&*!|>%@`-]{1,3}",
        "[a-zA-Z0-9._/]{1,8}",
    ];
    prop::collection::vec(token, 0..40).prop_map(|tokens| tokens.concat())
}

fn arb_mig() -> impl Strategy<Value = MigStrategy> {
    prop_oneof![
        Just(MigStrategy::None),
        Just(MigStrategy::Single),
        Just(MigStrategy::Mixed),
    ]
}

fn arb_id() -> impl Strategy<Value = DeviceIdStrategy> {
    prop_oneof![Just(DeviceIdStrategy::Uuid), Just(DeviceIdStrategy::Index)]
}

fn arb_strategies() -> impl Strategy<Value = Vec<DeviceListStrategy>> {
    prop::collection::vec(prop::sample::select(DeviceListStrategy::ALL.to_vec()), 1..6)
}

fn arb_sharing() -> impl Strategy<Value = Option<Sharing>> {
    let resource = (
        prop_oneof![
            Just(GPU_RESOURCE.to_owned()),
            "[1-7]g\\.[0-9]{1,3}gb(\\.me)?".prop_map(|p| format!("nvidia.com/mig-{p}")),
        ],
        2u32..,
    )
        .prop_map(|(name, replicas)| SharedResource { name, replicas });
    let resources = prop::collection::vec(resource, 1..4).prop_map(|mut resources| {
        // Names must be unique; keep the first of each.
        let mut seen = Vec::new();
        resources.retain(|r| {
            let fresh = !seen.contains(&r.name);
            seen.push(r.name.clone());
            fresh
        });
        resources
    });
    let strategy = prop_oneof![
        Just(SharingStrategy::TimeSlicing),
        Just(SharingStrategy::Mps)
    ];
    prop::option::of(
        (strategy, any::<bool>(), any::<bool>(), resources).prop_map(
            |(strategy, rename_by_default, fail_requests_greater_than_one, mut resources)| {
                if strategy == SharingStrategy::Mps {
                    // MPS shares whole GPUs only.
                    let replicas = resources[0].replicas;
                    resources = vec![SharedResource {
                        name: GPU_RESOURCE.to_owned(),
                        replicas,
                    }];
                }
                Sharing {
                    strategy,
                    rename_by_default,
                    fail_requests_greater_than_one,
                    resources,
                }
            },
        ),
    )
}

/// A config file for the given settings, in block or flow style.
fn render(s: &Settings, flow_strategies: bool) -> String {
    let strategies: Vec<&str> = s
        .device_list_strategies
        .iter()
        .map(|d| d.as_str())
        .collect();
    let strategies = if flow_strategies {
        format!("[{}]", strategies.join(", "))
    } else {
        strategies
            .iter()
            .map(|d| format!("\n    - {d}"))
            .collect::<String>()
    };
    let mut yaml = format!(
        "version: v1\nflags:\n  migStrategy: {}\n  failOnInitError: {}\n  nvidiaDriverRoot: {}\n  nvidiaDevRoot: {}\n  plugin:\n    passDeviceSpecs: {}\n    deviceListStrategy: {strategies}\n    deviceIDStrategy: {}\n    cdiAnnotationPrefix: {}\n",
        s.mig_strategy,
        s.fail_on_init_error,
        s.driver_root.display(),
        s.dev_root.display(),
        s.pass_device_specs,
        s.device_id_strategy,
        s.cdi_annotation_prefix,
    );
    if let Some(root) = &s.mps_root {
        yaml.push_str(&format!("  mpsRoot: {}\n", root.display()));
    }
    if let Some(ts) = &s.sharing {
        let kind = ts.strategy.key().trim_start_matches("sharing.");
        yaml.push_str(&format!(
            "sharing:\n  {kind}:\n    renameByDefault: {}\n    failRequestsGreaterThanOne: {}\n    resources:\n",
            ts.rename_by_default, ts.fail_requests_greater_than_one
        ));
        for r in &ts.resources {
            yaml.push_str(&format!(
                "    - name: {}\n      replicas: {}\n      devices: all\n",
                r.name, r.replicas
            ));
        }
    }
    yaml
}

proptest! {
    #[test]
    fn any_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = parse_file(&bytes, Path::new(FILE));
    }

    #[test]
    fn any_text_never_panics(text in "\\PC{0,256}") {
        let _ = parse_file(text.as_bytes(), Path::new(FILE));
    }

    #[test]
    fn any_yamlish_text_never_panics(text in yamlish()) {
        let _ = parse_file(text.as_bytes(), Path::new(FILE));
    }

    #[test]
    fn any_env_value_never_panics(
        values in prop::collection::vec(
            prop_oneof!["\\PC{0,24}", "[0-9a-z, :.\\[\\]-]{0,24}"],
            ENV_NAMES.len(),
        ),
    ) {
        let pairs: Vec<(&str, &str)> = ENV_NAMES
            .iter()
            .copied()
            .zip(values.iter().map(String::as_str))
            .filter(|(name, _)| *name != ENV_CONFIG_FILE)
            .collect();
        let args = PluginArgs::default();
        let env = env_of(&pairs);
        let _ = merge(&args, &env, &FileSettings::default(), None);
        let _ = health_checks(&env);
        let _ = args.log_level(&env);
    }

    #[test]
    fn one_env_value_is_accepted_or_named(name in prop::sample::select(ENV_NAMES.to_vec()), value in "\\PC{0,24}") {
        prop_assume!(name != ENV_CONFIG_FILE);
        if let Err(e) = merge(&PluginArgs::default(), &env_of(&[(name, &value)]), &FileSettings::default(), None) {
            prop_assert!(e.to_string().contains(name), "{name}={value:?}: {e}");
        }
    }

    #[test]
    fn generated_config_resolves_to_what_it_says(
        mig in arb_mig(),
        fail in any::<bool>(),
        pass in any::<bool>(),
        strategies in arb_strategies(),
        flow in any::<bool>(),
        id in arb_id(),
        driver_root in "/[a-z]{1,8}(/[a-z0-9]{1,8}){0,2}",
        dev_root in "/[a-z]{1,8}",
        prefix in "[a-z]{1,8}\\.io/",
        sharing in arb_sharing(),
    ) {
        // MPS needs a root and whole GPUs.
        let mps = sharing.as_ref().is_some_and(|s| s.strategy == SharingStrategy::Mps);
        let mut want = Settings {
            mig_strategy: if mps && mig == MigStrategy::Mixed { MigStrategy::None } else { mig },
            mps_root: mps.then(|| "/run/nvidia/mps".into()),
            fail_on_init_error: fail,
            driver_root: driver_root.into(),
            dev_root: dev_root.into(),
            pass_device_specs: pass,
            device_list_strategies: strategies,
            device_id_strategy: id,
            cdi_annotation_prefix: prefix,
            sharing,
            config_file: Some(FILE.into()),
            ..Settings::default()
        };
        let yaml = render(&want, flow);
        let file = parse_file(yaml.as_bytes(), Path::new(FILE))
            .map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        let got = merge(&PluginArgs::default(), &env_of(&[]), &file, Some(FILE.into()))
            .map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
        // Repeated strategies collapse to their first mention.
        let mut unique = Vec::new();
        for s in &want.device_list_strategies {
            if !unique.contains(s) {
                unique.push(*s);
            }
        }
        want.device_list_strategies = unique;
        prop_assert_eq!(got, want, "{}", yaml);
    }
}

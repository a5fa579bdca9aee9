// SPDX-License-Identifier: Apache-2.0
//! The rendered plugin container's environment through the plugin's own resolution
//! (`config::resolve`, what the binary runs at start): every variable the chart sets is
//! one the plugin reads, each value set resolves, and the settings are the values given
//! (the config file from the chart's ConfigMap, read from a temp dir).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use nvshim_device_plugin::config::{
    self, DeviceIdStrategy, DeviceListStrategy, MigStrategy, PluginArgs, Settings,
};

use super::render::{CASES, case, env, find, object, pod, render};

/// The variables the plugin's container may get: the plugin's own (its constants) and
/// the ones the NVIDIA runtime reads (the driver and GPUs it injects into this pod).
const KNOWN: [&str; 17] = [
    config::ENV_MIG_STRATEGY,
    config::ENV_FAIL_ON_INIT_ERROR,
    config::ENV_DEVICE_LIST_STRATEGY,
    config::ENV_DEVICE_ID_STRATEGY,
    config::ENV_PASS_DEVICE_SPECS,
    config::ENV_NVIDIA_DRIVER_ROOT,
    config::ENV_NVIDIA_DEV_ROOT,
    config::ENV_GDRCOPY_ENABLED,
    config::ENV_GDS_ENABLED,
    config::ENV_MOFED_ENABLED,
    config::ENV_DEVICE_DISCOVERY_STRATEGY,
    config::ENV_NVIDIA_CDI_HOOK_PATH,
    config::ENV_CONFIG_FILE,
    config::ENV_HEALTH_ADDR,
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_MONITOR_DEVICES",
];

/// The plugin's settings from the rendered DaemonSet of `values`, with the config file
/// (if any) taken from the rendered ConfigMap into `dir`.
fn resolve(values: &str, dir: &Path) -> Settings {
    let docs = render(values).unwrap();
    let container = &pod(object(&docs, "DaemonSet", "nvshim-device-plugin"))["containers"][0];
    let mut variables: BTreeMap<String, String> = env(container);
    for name in variables.keys() {
        assert!(
            KNOWN.contains(&name.as_str()),
            "{name}: not a variable the plugin reads"
        );
    }
    if let Some(file) = variables.get_mut(config::ENV_CONFIG_FILE) {
        let key = file.strip_prefix("/config/").unwrap().to_owned();
        let map = find(&docs, "ConfigMap", "nvshim-config").expect("the config ConfigMap");
        let path: PathBuf = dir.join(&key);
        fs::write(&path, map["data"][&key].as_str().unwrap()).unwrap();
        *file = path.display().to_string();
    }
    let lookup = |name: &str| variables.get(name).cloned();
    config::resolve(&PluginArgs::default(), &lookup).unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn helm_plugin_environment_resolves_to_the_values_given() {
    let dir = tempfile::tempdir().unwrap();
    // Every value set resolves.
    for (name, values) in CASES {
        let settings = resolve(values, dir.path());
        let health: SocketAddr = "0.0.0.0:8089".parse().unwrap();
        assert_eq!(settings.health_addr, Some(health), "case {name}");
    }

    let defaults = resolve(case("defaults"), dir.path());
    assert_eq!(defaults.mig_strategy, MigStrategy::None);
    assert!(defaults.fail_on_init_error);
    assert_eq!(
        defaults.cdi_hook_path,
        Path::new("/usr/local/nvidia/toolkit/nvidia-cdi-hook")
    );

    let mig = resolve(case("labels, exporter and MIG"), dir.path());
    assert_eq!(mig.mig_strategy, MigStrategy::Single);
    assert!(!mig.fail_on_init_error);
    assert_eq!(
        mig.device_list_strategies,
        [
            DeviceListStrategy::CdiAnnotations,
            DeviceListStrategy::Envvar
        ]
    );
    assert_eq!(mig.device_id_strategy, DeviceIdStrategy::Index);

    let crio = resolve(case("CRI-O with a driver container"), dir.path());
    assert_eq!(crio.driver_root, Path::new("/run/nvidia/driver"));
    assert_eq!(
        crio.cdi_hook_path,
        Path::new("/opt/nvidia/toolkit/nvidia-cdi-hook")
    );

    // The config file chosen from the ConfigMap is the one the plugin reads.
    let mixed = resolve(case("a config map of two configs"), dir.path());
    assert_eq!(mixed.mig_strategy, MigStrategy::Mixed);
    assert_eq!(mixed.config_file, Some(dir.path().join("mig-mixed")));
    let named = resolve(case("two configs, the one named default"), dir.path());
    assert_eq!(named.config_file, Some(dir.path().join("default")));

    // compatWithCPUManager and the feature switches reach the plugin as NVIDIA's do.
    let extras = resolve(
        "compatWithCPUManager: true\ngdsEnabled: true\nnvidiaDevRoot: /run/nvidia/dev\n",
        dir.path(),
    );
    assert!(extras.pass_device_specs);
    assert_eq!(extras.dev_root, Path::new("/run/nvidia/dev"));
}

// SPDX-License-Identifier: Apache-2.0
//! The rendered containers' environments through the binaries' own resolution (what
//! each runs at start: the plugin's `config::resolve`, `nvshim labels`' and `nvshim
//! exporter`'s): every variable the chart sets is one the binary reads, each value set
//! resolves, and the settings are the values given (a config file from the chart's
//! ConfigMap, read from a temp dir).

use std::collections::BTreeMap;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nvshim::cli::exporter::{ExporterArgs, Settings as ExporterSettings};
use nvshim::cli::labels::{LabelsArgs, Output, Resolved as LabelSettings, gfd};
use nvshim_device_plugin::config::{
    self, DeviceIdStrategy, DeviceListStrategy, MigStrategy, PluginArgs, Settings, SharingStrategy,
};
use serde_json::Value;

use super::render::{CASES, case, env, find, object, pod, render};

/// The plugin's variables (its constants).
const KNOWN: [&str; 15] = [
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
    config::ENV_MPS_ROOT,
];

/// What the NVIDIA runtime reads (the driver and GPUs it injects), and the node's name.
const RUNTIME_AND_NODE: [&str; 4] = [
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "NVIDIA_MIG_MONITOR_DEVICES",
    "NODE_NAME",
];

/// A DaemonSet's container environment from the rendered `docs`, each name checked
/// against `known`, a config file under `/config/` replaced by the rendered ConfigMap's
/// copy in `dir`.
fn environment(
    docs: &[Value],
    daemonset: &str,
    known: &[&str],
    dir: &Path,
) -> BTreeMap<String, String> {
    let container = &pod(object(docs, "DaemonSet", daemonset))["containers"][0];
    let mut variables = env(container);
    for (name, value) in variables.iter_mut() {
        assert!(
            known.contains(&name.as_str()) || RUNTIME_AND_NODE.contains(&name.as_str()),
            "{daemonset}: {name} is not a variable it reads"
        );
        if let Some(key) = value.strip_prefix("/config/") {
            let map = find(docs, "ConfigMap", "nvshim-config").expect("the config ConfigMap");
            let path: PathBuf = dir.join(key);
            fs::write(&path, map["data"][key].as_str().unwrap()).unwrap();
            *value = path.display().to_string();
        }
    }
    variables
}

/// The plugin's settings from the rendered DaemonSet of `values`.
fn resolve(values: &str, dir: &Path) -> Settings {
    let docs = render(values).unwrap();
    let variables = environment(&docs, "nvshim-device-plugin", &KNOWN, dir);
    let lookup = |name: &str| variables.get(name).cloned();
    config::resolve(&PluginArgs::default(), &lookup).unwrap_or_else(|e| panic!("{e}"))
}

/// `nvshim labels`' settings from the rendered labels DaemonSet of `values`.
fn resolve_labels(values: &str, dir: &Path) -> LabelSettings {
    use gfd::env as names;
    let known = [
        names::OUTPUT_FILE,
        names::SLEEP_INTERVAL,
        names::NO_TIMESTAMP,
        names::MIG_STRATEGY[0],
        names::FAIL_ON_INIT_ERROR[0],
        names::CONFIG_FILE[0],
        names::DEVICE_DISCOVERY_STRATEGY,
        names::DRIVER_ROOT_CTR_PATH[0],
        // nvshim's global --driver-root, and its log filter.
        config::ENV_NVIDIA_DRIVER_ROOT,
        "RUST_LOG",
    ];
    let docs = render(values).unwrap();
    let variables = environment(&docs, "nvshim-labels", &known, dir);
    let lookup = |name: &str| variables.get(name).cloned();
    let args = LabelsArgs::default();
    let file = gfd::config_file(&args, &lookup)
        .map(|path| nvshim::k8s_config::load_file(&path).unwrap())
        .unwrap_or_default();
    gfd::resolve(&args, &lookup, &file).unwrap_or_else(|e| panic!("{e}"))
}

/// `nvshim exporter`'s settings from the rendered exporter DaemonSet of `values`.
fn resolve_exporter(values: &str, dir: &Path) -> ExporterSettings {
    // dcgm-exporter's names (docs/cli.md; the exporter's constants are private).
    let known = [
        "DCGM_EXPORTER_LISTEN",
        "DCGM_EXPORTER_KUBERNETES",
        "DCGM_EXPORTER_COLLECTORS",
    ];
    let docs = render(values).unwrap();
    let variables = environment(&docs, "nvshim-exporter", &known, dir);
    let lookup = |name: &str| variables.get(name).cloned();
    ExporterSettings::resolve(&ExporterArgs::default(), &lookup).unwrap_or_else(|e| panic!("{e}"))
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
    // Image env is not an allocation: the plugin answers with volume mounts.
    assert_eq!(
        defaults.device_list_strategies,
        [DeviceListStrategy::VolumeMounts]
    );
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
            DeviceListStrategy::VolumeMounts
        ]
    );
    assert_eq!(mig.device_id_strategy, DeviceIdStrategy::Index);
    // Where the env var counts, envvar is the plugin's to use, and its default.
    let envvar = resolve(case("NVIDIA's toolkit defaults, envvar"), dir.path());
    assert_eq!(
        envvar.device_list_strategies,
        [
            DeviceListStrategy::CdiAnnotations,
            DeviceListStrategy::Envvar
        ]
    );
    let no_installer = resolve(case("custom placement, no installer"), dir.path());
    assert_eq!(
        no_installer.device_list_strategies,
        [DeviceListStrategy::Envvar]
    );

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

    // MPS: the plugin and the control daemon read the same config and MPS root (the
    // daemon's settings resolve as the plugin's do: same binary, same code).
    let mps = resolve(case("MPS sharing"), dir.path());
    assert_eq!(mps.mps_root, Some(PathBuf::from("/run/nvidia/mps")));
    assert_eq!(
        mps.sharing.as_ref().map(|s| s.strategy),
        Some(SharingStrategy::Mps)
    );
    let docs = render(case("MPS sharing")).unwrap();
    let daemon = environment(&docs, "nvshim-mps-control-daemon", &KNOWN, dir.path());
    let lookup = |name: &str| daemon.get(name).cloned();
    let settings = config::resolve(&PluginArgs::default(), &lookup).unwrap();
    assert_eq!(settings.mps_root, mps.mps_root);
    assert_eq!(settings.sharing, mps.sharing);

    // compatWithCPUManager and the feature switches reach the plugin as NVIDIA's do.
    let extras = resolve(
        "compatWithCPUManager: true\ngdsEnabled: true\nnvidiaDevRoot: /run/nvidia/dev\n",
        dir.path(),
    );
    assert!(extras.pass_device_specs);
    assert_eq!(extras.dev_root, Path::new("/run/nvidia/dev"));
}

#[test]
fn helm_labels_and_exporter_environments_resolve_to_the_values_given() {
    let dir = tempfile::tempdir().unwrap();
    let mig = case("labels, exporter and MIG");
    let labels = resolve_labels(mig, dir.path());
    assert_eq!(
        labels.output,
        Output::File("/etc/kubernetes/node-feature-discovery/features.d/nvshim".into())
    );
    assert_eq!(labels.interval, Some(Duration::from_secs(30)));
    assert_eq!(labels.mig_strategy, MigStrategy::Single);
    assert!(!labels.fail_on_init_error);
    assert!(!labels.timestamp);
    // The default interval loops as GFD does; the config file is the plugin's.
    let from_config = resolve_labels(case("a config map of two configs"), dir.path());
    assert_eq!(from_config.interval, Some(Duration::from_secs(60)));
    assert_eq!(from_config.mig_strategy, MigStrategy::Mixed);
    let driver_container = resolve_labels(
        "gfd: {enabled: true}\nnvidiaDriverRoot: /run/nvidia/driver\n",
        dir.path(),
    );
    assert_eq!(
        driver_container.driver_root,
        Some(PathBuf::from("/driver-root"))
    );

    let exporter = resolve_exporter(mig, dir.path());
    assert_eq!(exporter.address, ":9500");
    assert!(exporter.kubernetes);
    assert_eq!(
        exporter.collectors,
        Some(PathBuf::from("/etc/nvshim-exporter/collectors.csv"))
    );
    let defaults = resolve_exporter("exporter: {enabled: true}", dir.path());
    assert_eq!(defaults.address, ":9400");
    assert_eq!(defaults.collectors, None);
}

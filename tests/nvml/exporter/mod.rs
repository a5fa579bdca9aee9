// SPDX-License-Identifier: Apache-2.0
//! `nvshim::exporter` against the mock NVML on a simulated 3-GPU node: GPU 0 in MIG mode
//! (GPU instances 1 `1g.10gb` and 2 `2g.20gb`), GPU 1 with every exporter reading, GPU 2
//! with none and no power sensor. The output is read back with the strict parser at the
//! bottom (not the exporter's own code), which checks every line.
//!
//! As in `nvlink`, the mock reads its config at `nvmlInit`, so each test builds its node
//! and re-runs this binary, filtered to itself, as a child with the node's env.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use crate::exposition::{Family, parse_exposition};
use nvshim::exporter::{ContainerDevices, Counters, Exporter, Holders};
use nvshim::nvml::Nvml;
use nvshim_testkit::{
    Artifacts, MockConfig, MockEcc, MockGpm, MockMigTelemetry, MockRemappedRows, MockRetiredPages,
    MockTelemetry, MockXidEvent, NodeSpec, SimNode,
};
use wants::default_set_wants;

mod wants;

type Error = Box<dyn std::error::Error>;
pub(crate) type TestResult = Result<(), Error>;

const CHILD_ENV: &str = "NVSHIM_NVML_EXPORTER_TEST";
const NVML_ENV: &str = "NVSHIM_NVML_EXPORTER_NVML";
/// Set in a child to its node's mock config file.
const CONFIG_ENV: &str = "NVSHIM_NVML_EXPORTER_CONFIG";
const HOST: &str = "node-a";
pub(crate) const MIB: u64 = 1024 * 1024;
pub(crate) const GIB: u64 = 1024 * MIB;

/// GPU 1's readings: every one the exporter serves.
fn full_telemetry() -> MockTelemetry {
    MockTelemetry {
        memory_reserved_bytes: Some(512 * MIB),
        memory_clock_mhz: Some(1593),
        total_energy_millijoules: Some(123_456_789),
        encoder_utilization_percent: Some(7),
        decoder_utilization_percent: Some(9),
        pcie_replay_count: Some(3),
        pcie_tx_kilobytes_per_second: Some(1000),
        pcie_rx_kilobytes_per_second: Some(2000),
        memory_temperature_celsius: Some(41),
        nvlink_bandwidth_total: Some(4096),
        ecc: Some(MockEcc {
            volatile_corrected: 1,
            volatile_uncorrected: 2,
            aggregate_corrected: 3,
            aggregate_uncorrected: 4,
        }),
        retired_pages: Some(MockRetiredPages {
            single_bit: 5,
            double_bit: 6,
            pending: true,
        }),
        remapped_rows: Some(MockRemappedRows {
            correctable: 7,
            uncorrectable: 8,
            pending: false,
            failed: true,
        }),
        clocks_event_reasons: Some(4),
        gpm: Some(MockGpm {
            graphics_util_percent: 25.0,
            any_tensor_util_percent: 12.5,
            dram_bw_util_percent: 50.0,
        }),
    }
}

fn configure(mut config: MockConfig) -> Result<MockConfig, Error> {
    let gpu1_uuid = config.gpus[1].uuid.clone();
    let gpu0 = &mut config.gpus[0];
    // GPM on the GPU (as on any Hopper) is what lets its GPU instances have GPM too.
    gpu0.telemetry = Some(MockTelemetry {
        gpm: Some(MockGpm {
            graphics_util_percent: 40.0,
            any_tensor_util_percent: 0.0,
            dram_bw_util_percent: 60.0,
        }),
        ..MockTelemetry::default()
    });
    gpu0.mig_devices[0].telemetry = Some(MockMigTelemetry {
        memory_used_bytes: GIB,
        memory_reserved_bytes: Some(0),
        gpm: Some(MockGpm {
            graphics_util_percent: 10.0,
            any_tensor_util_percent: 20.0,
            dram_bw_util_percent: 30.0,
        }),
    });
    let gpu1 = &mut config.gpus[1];
    gpu1.memory_used_bytes = 2 * GIB;
    gpu1.utilization_gpu_percent = Some(30);
    gpu1.utilization_memory_percent = Some(20);
    gpu1.power_milliwatts = Some(123_456);
    gpu1.telemetry = Some(full_telemetry());
    config.gpus[2].power_milliwatts = None;
    config.xid_events.push(MockXidEvent {
        gpu_uuid: gpu1_uuid,
        xid: 79,
        delay_ms: 0,
    });
    Ok(config)
}

fn in_child(test: &str, checks: impl FnOnce(Arc<Nvml>) -> TestResult) -> TestResult {
    in_child_of(module_path!(), test, checks)
}

/// Runs `checks` in a child process of this binary on this module's simulated node; `test`
/// is the calling test, a function of `module` (its `module_path!()`).
pub(crate) fn in_child_of(
    module: &str,
    test: &str,
    checks: impl FnOnce(Arc<Nvml>) -> TestResult,
) -> TestResult {
    let test = crate::test_path(module, test);
    let test = test.as_str();
    if std::env::var(CHILD_ENV).as_deref() == Ok(test) {
        let nvml = Nvml::load(Path::new(&std::env::var(NVML_ENV)?))?;
        return checks(Arc::new(nvml));
    }
    run_child(test)
}

/// The parent's half of [`in_child`]: builds the node and runs the child on it.
fn run_child(test: &str) -> TestResult {
    let dir = tempfile::tempdir()?;
    let sim = SimNode::build(
        &NodeSpec::with_mig(3),
        &dir.path().join("node"),
        &Artifacts::locate()?,
    )?;
    let events = sim.dir.join("xid-events");
    configure(MockConfig::new(&sim.spec, &sim.dev_root, &events))?.write(&sim.mock_config)?;
    let mut env = crate::child_env_on(&sim, test, CHILD_ENV, NVML_ENV);
    env.push((
        CONFIG_ENV.to_owned(),
        sim.mock_config.clone().into_os_string(),
    ));
    crate::run_test_in_child(test, env)
}

/// The labels a series of GPU `index` (or its GPU instance `(profile, id)`) must have, in
/// order, before any pod labels.
fn base_labels(
    nvml: &Nvml,
    index: u32,
    instance: Option<(&str, u32)>,
    driver: bool,
) -> Result<Vec<(String, String)>, Error> {
    let device = nvml.device_by_index(index)?;
    let mut labels = vec![
        ("gpu".to_string(), index.to_string()),
        ("UUID".into(), device.uuid()?),
        ("pci_bus_id".into(), device.pci_info()?.bus_id),
        ("device".into(), format!("nvidia{}", device.minor_number()?)),
        ("modelName".into(), device.name()?),
    ];
    if let Some((profile, id)) = instance {
        labels.push(("GPU_I_PROFILE".into(), profile.into()));
        labels.push(("GPU_I_ID".into(), id.to_string()));
    }
    labels.push(("Hostname".into(), HOST.into()));
    if driver {
        labels.push(("DCGM_FI_DRIVER_VERSION".into(), nvml.driver_version()?));
    }
    Ok(labels)
}

pub(crate) fn render(
    exporter: &Exporter,
    holders: &Holders,
) -> Result<BTreeMap<String, Family>, Error> {
    let mut text = String::new();
    exporter.render(holders, &mut text);
    parse_exposition(&text).map_err(|e| format!("{e}\n--- output\n{text}").into())
}

#[test]
fn every_default_counter_has_its_type_labels_and_value() -> TestResult {
    in_child(
        "every_default_counter_has_its_type_labels_and_value",
        |nvml| {
            let exporter = Exporter::new(Arc::clone(&nvml), Counters::default_set(), HOST.into())?;
            // Twice: the second scrape's GPM values come from the first scrape's samples.
            for scrape in 1..=2 {
                let families = render(&exporter, &Holders::default())?;
                for (name, kind, gpu, instance, want) in default_set_wants() {
                    let case = format!("scrape {scrape}, {name} of GPU {gpu} {instance:?}");
                    let labels = base_labels(&nvml, gpu, instance, true)?;
                    let got = families
                        .get(name)
                        .and_then(|f| f.samples.iter().find(|s| s.labels == labels));
                    assert_eq!(got.map(|s| s.value), want, "case {case}");
                    if want.is_some() {
                        assert_eq!(families[name].kind, kind, "case {case}");
                    }
                }
                // Every series has exactly the base labels of its GPU or instance.
                for (name, family) in &families {
                    for sample in &family.samples {
                        let gpu: u32 = sample.labels[0].1.parse()?;
                        let instance = sample
                            .labels
                            .iter()
                            .find(|(k, _)| k == "GPU_I_ID")
                            .map(|(_, id)| id.parse::<u32>())
                            .transpose()?;
                        let profile = match instance {
                            Some(1) => Some(("1g.10gb", 1)),
                            Some(id) => Some(("2g.20gb", id)),
                            None => None,
                        };
                        let want = base_labels(&nvml, gpu, profile, true)?;
                        assert_eq!(sample.labels, want, "case labels of {name}");
                    }
                }
            }
            Ok(())
        },
    )
}

#[test]
fn holders_label_their_gpus_and_instances() -> TestResult {
    in_child("holders_label_their_gpus_and_instances", |nvml| {
        let exporter = Exporter::new(Arc::clone(&nvml), Counters::default_set(), HOST.into())?;
        let gpu1 = nvml.device_by_index(1)?.uuid()?;
        let gi2 = nvml.device_by_index(0)?.mig_device_by_index(1)?.uuid()?;
        let held = |pod: &str, resource: &str, ids: &[&str]| ContainerDevices {
            pod: pod.into(),
            namespace: "ns".into(),
            container: "main".into(),
            resource: resource.into(),
            device_ids: ids.iter().map(|id| id.to_string()).collect(),
        };
        let containers = [
            held("a", "nvidia.com/gpu", &[gpu1.as_str()]),
            held("b", "nvidia.com/gpu", &[gpu1.as_str()]),
            held("shared", "nvidia.com/gpu.shared", &["2::3"]),
            held("mig", "nvidia.com/mig-2g.20gb", &[gi2.as_str()]),
            held("by-index", "nvidia.com/mig-1g.10gb", &["0:0"]),
            held("other", "example.com/gpu", &["2"]),
            held("stranger", "nvidia.com/gpu", &["GPU-not-here", "9"]),
        ];
        let holders = Holders::from_containers(&exporter, &containers);
        let families = render(&exporter, &holders)?;
        let pods = |name: &str,
                    gpu: u32,
                    instance: Option<(&str, u32)>|
         -> Result<Vec<Vec<(String, String)>>, Error> {
            let base = base_labels(&nvml, gpu, instance, true)?;
            Ok(families[name]
                .samples
                .iter()
                .filter(|s| {
                    s.labels.starts_with(&base) && s.labels.get(..base.len()) == Some(&base[..])
                })
                .filter(|s| instance.is_some() || !s.labels.iter().any(|(k, _)| k == "GPU_I_ID"))
                .map(|s| s.labels[base.len()..].to_vec())
                .collect())
        };
        let pod = |name: &str, vgpu: Option<&str>| {
            let mut labels = vec![
                ("container".to_string(), "main".to_string()),
                ("namespace".into(), "ns".into()),
                ("pod".into(), name.into()),
            ];
            if let Some(vgpu) = vgpu {
                labels.push(("vgpu".into(), vgpu.into()));
            }
            labels
        };
        let cases = [
            (
                "two holders",
                "DCGM_FI_DEV_GPU_TEMP",
                1,
                None,
                vec![pod("a", None), pod("b", None)],
            ),
            (
                "shared",
                "DCGM_FI_DEV_GPU_TEMP",
                2,
                None,
                vec![pod("shared", Some("3"))],
            ),
            (
                "MIG by UUID",
                "DCGM_FI_DEV_FB_USED",
                0,
                Some(("2g.20gb", 2)),
                vec![pod("mig", None)],
            ),
            (
                "MIG by index",
                "DCGM_FI_DEV_FB_USED",
                0,
                Some(("1g.10gb", 1)),
                vec![pod("by-index", None)],
            ),
            ("unheld", "DCGM_FI_DEV_GPU_TEMP", 0, None, vec![vec![]]),
        ];
        for (case, name, gpu, instance, want) in cases {
            assert_eq!(pods(name, gpu, instance)?, want, "case {case}");
        }
        Ok(())
    })
}

#[test]
fn a_collectors_subset_is_all_that_is_exported() -> TestResult {
    in_child("a_collectors_subset_is_all_that_is_exported", |nvml| {
        let csv = "# two fields\nDCGM_FI_DEV_GPU_TEMP, gauge, Die temperature.\n\
                   DCGM_FI_DEV_FB_USED , counter , Used \"memory\" \\ MiB.\n";
        let counters = Counters::parse(csv, "subset.csv")?;
        let exporter = Exporter::new(Arc::clone(&nvml), counters, HOST.into())?;
        let families = render(&exporter, &Holders::default())?;
        let names: Vec<&str> = families.keys().map(String::as_str).collect();
        assert_eq!(names, ["DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_GPU_TEMP"]);
        let used = &families["DCGM_FI_DEV_FB_USED"];
        assert_eq!(used.kind, "counter");
        assert_eq!(used.help, "Used \"memory\" \\\\ MiB.");
        // Three GPUs and two GPU instances; no driver version label (not in the set).
        assert_eq!(used.samples.len(), 5);
        let labels = base_labels(&nvml, 1, None, false)?;
        assert!(
            used.samples.iter().any(|s| s.labels == labels),
            "{:?}",
            used.samples
        );
        Ok(())
    })
}

#[test]
fn each_scrape_reads_the_gpus_again() -> TestResult {
    in_child("each_scrape_reads_the_gpus_again", |nvml| {
        let csv = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION, counter, e\n";
        let exporter = Exporter::new(
            Arc::clone(&nvml),
            Counters::parse(csv, "e.csv")?,
            HOST.into(),
        )?;
        let labels = base_labels(&nvml, 1, None, false)?;
        let energy = |families: &BTreeMap<String, Family>| {
            families["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"]
                .samples
                .iter()
                .find(|s| s.labels == labels)
                .map(|s| s.value)
        };
        assert_eq!(
            energy(&render(&exporter, &Holders::default())?),
            Some(123_456_789.0)
        );
        // The mock re-reads its readings when the config file changes.
        let path = std::env::var(CONFIG_ENV)?;
        let mut config: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        config["gpus"][1]["telemetry"]["total_energy_millijoules"] = 9_876_543_210_u64.into();
        std::fs::write(&path, serde_json::to_string(&config)?)?;
        assert_eq!(
            energy(&render(&exporter, &Holders::default())?),
            Some(9_876_543_210.0)
        );
        Ok(())
    })
}

#[test]
fn a_gpu_lost_before_the_start_is_left_out() -> TestResult {
    in_child("a_gpu_lost_before_the_start_is_left_out", |nvml| {
        let lost = nvml.device_by_index(2)?.uuid()?;
        let config: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(std::env::var(CONFIG_ENV)?)?)?;
        let events = config["event_file"].as_str().ok_or("no event_file")?;
        std::fs::write(events, format!("{lost} gone\n"))?;
        let csv = "DCGM_FI_DEV_GPU_TEMP, gauge, t\n";
        let exporter = Exporter::new(
            Arc::clone(&nvml),
            Counters::parse(csv, "t.csv")?,
            HOST.into(),
        )?;
        let families = render(&exporter, &Holders::default())?;
        let gpus: Vec<&str> = families["DCGM_FI_DEV_GPU_TEMP"]
            .samples
            .iter()
            .map(|s| s.labels[0].1.as_str())
            .collect();
        assert_eq!(gpus, ["0", "1"]);
        Ok(())
    })
}

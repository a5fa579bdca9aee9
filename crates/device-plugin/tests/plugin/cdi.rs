// SPDX-License-Identifier: Apache-2.0
//! The CDI spec the device plugin writes for the `cdi-*` strategies
//! (`nvshim_device_plugin::cdi_spec`):
//!
//! - built for a simulated node, it equals what `nvshim cdi generate` writes for the
//!   same devices and names (one generator), under either id strategy, with replicas
//!   folded into their GPU, and with host paths when the plugin sees the driver
//!   elsewhere; it follows the official CDI schema;
//! - the real binary, against the fake kubelet, writes it by rename before it
//!   registers, with exactly the names `Allocate` returns, rewrites it on SIGHUP when
//!   the devices' names change (and not when they do not), and removes it on SIGTERM
//!   (`binary`);
//! - podman resolves the name `Allocate` returned from the plugin's spec in
//!   `/var/run/cdi`, and the container gets exactly that GPU (`podman`).

// A test crate's root resolves modules beside it, so the path names its folder.
mod binary;
mod podman;

use std::collections::BTreeSet;
use std::path::Path;
use std::time::Duration;

use crate::common::cdi_schema::schema;
use crate::common::{Node, node, nvshim};
use nvshim::inventory::{self, Backend, Inventory, Source};
use nvshim_device_plugin::cdi_spec::{self, DriverView};
use nvshim_device_plugin::config::{DeviceIdStrategy, DeviceListStrategy, MigStrategy, Settings};
use nvshim_device_plugin::resources;
use nvshim_testkit::NodeSpec;
use serde_json::Value;

const KIND: &str = "k8s.device-plugin.nvidia.com/gpu";
const HOOK: &str = "/usr/bin/nvidia-container-runtime-hook";
const GPU_SOCKET: &str = "nvidia-gpu.sock";
/// A limit for start-up, rebuilds and exit on a busy machine, not a measurement.
const GENEROUS: Duration = Duration::from_secs(20);

// 1. The spec for a simulated node.

fn settings(node: &Node, ids: DeviceIdStrategy) -> Settings {
    Settings {
        driver_root: node.sim.driver_root.clone(),
        dev_root: node.sim.dir.clone(),
        device_list_strategies: vec![DeviceListStrategy::CdiCri],
        device_id_strategy: ids,
        cdi_hook_path: HOOK.into(),
        ..Settings::default()
    }
}

/// The GPUs of the node `view` reads, as the procfs backend lists them (NVML's indices and UUIDs).
fn inventory(view: &DriverView) -> Inventory {
    let source = Source {
        backend: Backend::Procfs,
        nvml_library: None,
    };
    inventory::load(&view.seen, &source).unwrap()
}

/// The plugin's view of `node`: read in place, `/proc` the node's.
fn view(node: &Node, s: &Settings) -> DriverView {
    let mut view = DriverView::with_seen_driver(s, node.sim.driver_root.clone());
    view.seen.proc = node.sim.dir.clone();
    view
}

/// The spec the plugin builds with `s` for the node `view` reads.
fn plugin_spec(s: &Settings, view: &DriverView) -> Value {
    let inventory = inventory(view);
    let advertised = resources::build(&inventory, s, Path::new("/nonexistent")).unwrap();
    let spec = cdi_spec::build(s, view, &inventory, &advertised)
        .unwrap()
        .expect("a spec for a cdi-* strategy");
    serde_json::to_value(&spec).unwrap()
}

/// What `nvshim cdi generate` writes for the plugin's kind, names and hook.
fn generated(node: &Node, names: &str) -> Value {
    let args = [
        "cdi",
        "generate",
        "--format=json",
        "--vendor=k8s.device-plugin.nvidia.com",
        "--class=gpu",
        "--no-all-device",
        "--nvidia-cdi-hook-path",
        HOOK,
        "--device-name-strategy",
        names,
    ];
    serde_json::from_str(&crate::common::ok(
        nvshim(node, &args),
        "nvshim cdi generate",
    ))
    .unwrap()
}

fn names(spec: &Value) -> Vec<String> {
    spec["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn the_spec_is_the_generators_for_the_advertised_names() {
    let node = node(&NodeSpec::standard(4));
    let uuids: Vec<String> = node.sim.spec.gpus.iter().map(|g| g.uuid.clone()).collect();
    let cases = [
        ("uuid", DeviceIdStrategy::Uuid, None, "uuid", uuids.clone()),
        (
            "index",
            DeviceIdStrategy::Index,
            None,
            "index",
            vec!["0".into(), "1".into(), "2".into(), "3".into()],
        ),
        // `GPU-…::0` and `GPU-…::1` are one device of the spec, named by the GPU.
        (
            "uuid, 2 replicas",
            DeviceIdStrategy::Uuid,
            Some(2),
            "uuid",
            uuids,
        ),
    ];
    let schema = schema("the_spec_is_the_generators_for_the_advertised_names");
    for (case, ids, replicas, strategy, want) in cases {
        let mut s = settings(&node, ids);
        s.sharing = replicas.map(|replicas| nvshim_device_plugin::config::Sharing {
            strategy: nvshim_device_plugin::config::SharingStrategy::TimeSlicing,
            rename_by_default: false,
            fail_requests_greater_than_one: false,
            resources: vec![nvshim_device_plugin::config::SharedResource {
                name: "nvidia.com/gpu".into(),
                replicas,
            }],
        });
        let got = plugin_spec(&s, &view(&node, &s));
        assert_eq!(got["kind"], KIND, "{case}");
        assert_eq!(names(&got), want, "{case}: one device per GPU");
        assert_eq!(
            got,
            generated(&node, strategy),
            "{case}: the generator's spec"
        );
        let nodes: Vec<&str> = got["devices"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| {
                // Its `/dev/nvidia<minor>`; the rest are its DRM nodes (`/dev/dri/…`).
                let nodes = d["containerEdits"]["deviceNodes"].as_array().unwrap();
                let nvidia: Vec<&str> = nodes
                    .iter()
                    .filter_map(|n| n["path"].as_str())
                    .filter(|p| !p.starts_with("/dev/dri/"))
                    .collect();
                assert_eq!(nvidia.len(), 1, "{case}: {nodes:?}");
                nvidia[0]
            })
            .collect();
        let minors: Vec<String> = node
            .sim
            .spec
            .gpus
            .iter()
            .map(|g| format!("/dev/nvidia{}", g.minor))
            .collect();
        assert_eq!(nodes, minors, "{case}: each device's own node");
        if let Some(schema) = &schema {
            let errors = schema.errors(&got);
            assert!(
                errors.is_empty(),
                "{case}: not valid CDI:\n{}",
                errors.join("\n")
            );
        }
    }
}

#[test]
fn mig_devices_are_named_as_allocate_names_them() {
    let node = node(&NodeSpec::with_mig(4));
    // NVML's view (procfs knows no MIG devices), through `nvshim info`.
    let info = crate::common::ok(
        nvshim(&node, &["info", "--json", "--backend", "nvml"]),
        "nvshim info",
    );
    let inventory: Inventory = serde_json::from_str(&info).unwrap();
    let schema = schema("mig_devices_are_named_as_allocate_names_them");
    assert_eq!(inventory.gpus[0].mig_devices.len(), 2, "{info}");
    let migs = &node.sim.spec.gpus[0].mig_devices;
    let uuids = &node.sim.spec.gpus;
    let cases = [
        (
            "mixed, index",
            MigStrategy::Mixed,
            DeviceIdStrategy::Index,
            "index",
            vec!["0:0", "0:1", "1", "2", "3"]
                .into_iter()
                .map(String::from)
                .collect::<Vec<_>>(),
        ),
        (
            "mixed, uuid",
            MigStrategy::Mixed,
            DeviceIdStrategy::Uuid,
            "uuid",
            vec![
                migs[0].uuid.clone(),
                migs[1].uuid.clone(),
                uuids[1].uuid.clone(),
                uuids[2].uuid.clone(),
                uuids[3].uuid.clone(),
            ],
        ),
        (
            "none: whole GPUs only",
            MigStrategy::None,
            DeviceIdStrategy::Index,
            "index",
            vec!["0", "1", "2", "3"]
                .into_iter()
                .map(String::from)
                .collect(),
        ),
    ];
    for (case, mig, ids, strategy, want) in cases {
        let mut s = settings(&node, ids);
        s.mig_strategy = mig;
        let view = view(&node, &s);
        let advertised = resources::build(&inventory, &s, Path::new("/nonexistent")).unwrap();
        let runtime_ids: BTreeSet<&str> = advertised
            .iter()
            .flat_map(|r| &r.devices)
            .map(|d| d.runtime_id.as_str())
            .collect();
        let spec = cdi_spec::build(&s, &view, &inventory, &advertised)
            .unwrap()
            .unwrap();
        let got = serde_json::to_value(&spec).unwrap();
        let mut got_names = names(&got);
        got_names.sort();
        let mut want = want;
        want.sort();
        assert_eq!(got_names, want, "{case}");
        assert_eq!(
            got_names
                .iter()
                .map(String::as_str)
                .collect::<BTreeSet<_>>(),
            runtime_ids,
            "{case}: the names Allocate hands out"
        );
        if let Some(schema) = &schema {
            let errors = schema.errors(&got);
            assert!(
                errors.is_empty(),
                "{case}: not valid CDI:\n{}",
                errors.join("\n")
            );
        }
        // Each device as `nvshim cdi generate` has it (which has every GPU and MIG
        // device; the plugin's spec has what is advertised).
        let all = generated(&node, strategy);
        assert_eq!(got["containerEdits"], all["containerEdits"], "{case}");
        for device in got["devices"].as_array().unwrap() {
            let same = all["devices"]
                .as_array()
                .unwrap()
                .iter()
                .find(|d| d["name"] == device["name"]);
            assert_eq!(Some(device), same, "{case}: device {}", device["name"]);
        }
    }
}

/// Every host path in a spec: mount sources and device nodes (`hostPath`, else `path`).
fn host_paths(spec: &Value) -> (Vec<String>, Vec<String>) {
    let devices = spec["devices"].as_array().unwrap().iter();
    let edits: Vec<&Value> = std::iter::once(&spec["containerEdits"])
        .chain(devices.map(|d| &d["containerEdits"]))
        .collect();
    let list = |key: &str| -> Vec<&Value> {
        edits
            .iter()
            .filter_map(|e| e[key].as_array())
            .flatten()
            .collect()
    };
    let mounts = list("mounts")
        .iter()
        .map(|m| m["hostPath"].as_str().unwrap().to_string())
        .collect();
    let nodes = list("deviceNodes")
        .iter()
        .map(|n| {
            n.get("hostPath")
                .unwrap_or(&n["path"])
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    (mounts, nodes)
}

#[test]
fn the_spec_names_host_paths_when_the_driver_is_seen_elsewhere() {
    let node = node(&NodeSpec::standard(2));
    let s = settings(&node, DeviceIdStrategy::Uuid);
    let in_place = plugin_spec(&s, &view(&node, &s));
    // The plugin reads the node where it is, the host has it under /host/….
    let mut moved = view(&node, &s);
    moved.host_driver = "/host/driver".into();
    moved.host_dev = "/host/devroot".into();
    let got = plugin_spec(&s, &moved);

    let (mounts, nodes) = host_paths(&got);
    let (want_mounts, want_nodes) = host_paths(&in_place);
    assert!(!mounts.is_empty() && !nodes.is_empty(), "{got:#}");
    let strip = |paths: &[String], seen: &Path| -> Vec<String> {
        paths
            .iter()
            .map(|p| {
                Path::new(p)
                    .strip_prefix(seen)
                    .unwrap_or_else(|_| panic!("{p} is not under {}", seen.display()))
                    .display()
                    .to_string()
            })
            .collect()
    };
    assert_eq!(
        strip(&mounts, Path::new("/host/driver")),
        strip(&want_mounts, &node.sim.driver_root),
        "mount sources under the host's driver root"
    );
    assert_eq!(
        strip(&nodes, Path::new("/host/devroot")),
        strip(&want_nodes, &node.sim.dir),
        "device nodes under the host's dev root"
    );
    let text = got.to_string();
    assert!(
        !text.contains(node.sim.dir.to_str().unwrap()),
        "no path as the plugin sees it: {got:#}"
    );
}

/// The golden spec: [`GOLDEN_NODE`] with index names, read in place and named under
/// `/host` (so no temp path is in it). `NVSHIM_UPDATE_GOLDEN=1` rewrites the file.
const GOLDEN: &str = "tests/fixtures/plugin-cdi/standard-2-index.json";
const GOLDEN_NODE: usize = 2;

#[test]
fn the_spec_matches_the_golden_file() {
    let node = node(&NodeSpec::standard(GOLDEN_NODE));
    let s = settings(&node, DeviceIdStrategy::Index);
    let mut moved = view(&node, &s);
    moved.host_driver = "/host/driver".into();
    moved.host_dev = "/host".into();
    let got = plugin_spec(&s, &moved);
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(GOLDEN);
    let text = format!("{}\n", serde_json::to_string_pretty(&got).unwrap());
    if std::env::var("NVSHIM_UPDATE_GOLDEN").as_deref() == Ok("1") {
        std::fs::write(&path, &text).unwrap();
    }
    let want: Value = serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(
        got, want,
        "the spec differs from {GOLDEN} (NVSHIM_UPDATE_GOLDEN=1 rewrites it):\n{text}"
    );
}

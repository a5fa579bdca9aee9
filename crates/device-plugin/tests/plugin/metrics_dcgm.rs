// SPDX-License-Identifier: Apache-2.0
//! The device plugin's `/metrics` with its default names, dcgm-exporter's: a real plugin
//! process on a simulated node with the mock NVML and a tonic pod-resources server
//! playing kubelet, scraped over HTTP and read with the `prometheus-parse` text-format
//! parser (not our encoder). The families themselves are `nvshim::exporter`'s, tested
//! field by field in `tests/nvml/exporter.rs`; here: the format, the labels of a held, a
//! shared and a free GPU, and the plugin's own counters beside them.

use std::collections::BTreeSet;
use std::fs;

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;

use crate::common::node;
use crate::metrics::{Lister, Running, dump, get, launch_with_names, number, parse, pod};
use nvshim_device_plugin::metrics::pods::api::ListPodResourcesResponse;
use nvshim_device_plugin::metrics::pods::api::pod_resources_lister_server::PodResourcesListerServer;
use nvshim_testkit::NodeSpec;
use prometheus_parse::Scrape;

const CLASSIC: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Every series of a GPU's families has these, in this order (dcgm-exporter's).
const GPU_LABELS: [&str; 7] = [
    "gpu",
    "UUID",
    "pci_bus_id",
    "device",
    "modelName",
    "Hostname",
    "DCGM_FI_DRIVER_VERSION",
];

/// A container expected to hold a GPU: pod, namespace, container, `vgpu` label.
type Held<'a> = (&'a str, &'a str, &'a str, Option<&'a str>);

async fn scrape(run: &Running) -> (String, Scrape) {
    let (status, headers, body) = get(run.addr(), "/metrics").await;
    assert_eq!(status, 200, "{headers}\n{body}\n{}", run.plugin.log());
    assert!(
        headers
            .to_ascii_lowercase()
            .contains(&format!("content-type: {CLASSIC}")),
        "{headers}"
    );
    assert!(!body.contains("# EOF"), "0.0.4 has no EOF marker:\n{body}");
    let scrape = parse(&body);
    (body, scrape)
}

/// The label sets (as sorted `key=value` lists) of `metric`'s series.
fn series(scrape: &Scrape, metric: &str) -> Vec<Vec<(String, String)>> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric == metric)
        .map(|s| {
            let mut labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            labels
        })
        .collect()
}

#[tokio::test]
async fn dcgm_names_are_the_default_with_pod_and_shared_gpu_labels() {
    let node = node(&NodeSpec::standard(3));
    let sim = &node.sim;
    let run = launch_with_names(sim, &[], true).await;
    let lister = Lister::default();
    let listener = UnixListener::bind(Running::pod_resources(run.dir.path())).unwrap();
    let _server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(PodResourcesListerServer::new(lister.clone()))
            .serve_with_incoming(UnixListenerStream::new(listener)),
    );
    let uuid = |i: usize| sim.spec.gpus[i].uuid.clone();
    let (shared1, shared2) = (format!("{}::1", uuid(2)), format!("{}::2", uuid(2)));
    *lister.0.lock().unwrap() = ListPodResourcesResponse {
        pod_resources: vec![
            pod("p1", "ns", "c", "nvidia.com/gpu", &[&uuid(1)]),
            pod("p2", "team", "a", "nvidia.com/gpu", &[&shared1]),
            pod("p3", "team", "b", "nvidia.com/gpu", &[&shared2]),
        ],
    };
    // Kubelet's socket is looked for at each scrape; wait for the labels to show.
    let mut tries = 0;
    let (body, scrape) = loop {
        let (body, scrape) = scrape(&run).await;
        if body.contains("pod=\"p3\"") || tries == 200 {
            break (body, scrape);
        }
        tries += 1;
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(body.contains("# TYPE DCGM_FI_DEV_GPU_TEMP gauge"), "{body}");
    assert!(
        body.contains("# TYPE DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION counter")
            || !body.contains("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"),
        "{body}"
    );

    let temps = series(&scrape, "DCGM_FI_DEV_GPU_TEMP");
    let hostname = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let label = |set: &[(String, String)], key: &str| {
        set.iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("no {key} in {set:?}"))
    };
    // (case, GPU, pod labels wanted)
    let cases: [(&str, usize, &[Held]); 3] = [
        ("free", 0, &[]),
        ("held", 1, &[("p1", "ns", "c", None)]),
        (
            "shared",
            2,
            &[
                ("p2", "team", "a", Some("1")),
                ("p3", "team", "b", Some("2")),
            ],
        ),
    ];
    for (case, gpu, holders) in cases {
        let of_gpu: Vec<&Vec<(String, String)>> = temps
            .iter()
            .filter(|set| label(set, "gpu") == gpu.to_string())
            .collect();
        assert_eq!(
            of_gpu.len(),
            holders.len().max(1),
            "case {case}:\n{}",
            dump(&scrape)
        );
        for set in &of_gpu {
            assert_eq!(label(set, "UUID"), uuid(gpu), "case {case}");
            assert_eq!(label(set, "Hostname"), hostname.trim(), "case {case}");
            assert!(label(set, "device").starts_with("nvidia"), "case {case}");
            let keys: BTreeSet<&str> = set.iter().map(|(k, _)| k.as_str()).collect();
            for key in GPU_LABELS {
                assert!(keys.contains(key), "case {case}: no {key} in {set:?}");
            }
            assert_eq!(
                keys.contains("pod"),
                !holders.is_empty(),
                "case {case}: {set:?}"
            );
        }
        for (pod, namespace, container, vgpu) in holders.iter().copied() {
            let found = of_gpu.iter().any(|set| {
                label(set, "pod") == pod
                    && label(set, "namespace") == namespace
                    && label(set, "container") == container
                    && set
                        .iter()
                        .find(|(k, _)| k == "vgpu")
                        .map(|(_, v)| v.as_str())
                        == vgpu
            });
            assert!(
                found,
                "case {case}: no series for {pod}:\n{}",
                dump(&scrape)
            );
        }
    }

    // The plugin's own families come along, in the same format.
    assert!(
        body.contains("# TYPE nvshim_plugin_registrations_total counter"),
        "{body}"
    );
    let registrations = scrape
        .samples
        .iter()
        .filter(|s| s.metric == "nvshim_plugin_registrations_total")
        .filter_map(number)
        .sum::<f64>();
    assert!(registrations >= 1.0, "{body}");
    assert!(
        !body.contains("nvshim_gpu_"),
        "our GPU names are off:\n{body}"
    );
}

/// One series: metric, sorted labels, value.
type Series = (String, Vec<(String, String)>, String);

/// The DCGM families' series of a scrape.
fn dcgm_series(scrape: &Scrape) -> BTreeSet<Series> {
    scrape
        .samples
        .iter()
        .filter(|s| s.metric.starts_with("DCGM_"))
        .map(|s| {
            let mut labels: Vec<(String, String)> = s
                .labels
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            labels.sort();
            (s.metric.clone(), labels, format!("{:?}", number(s)))
        })
        .collect()
}

/// `nvshim exporter` (dcgm-exporter's command line) and the plugin's `/metrics` on the
/// same node serve the same DCGM series; SIGTERM stops the exporter cleanly.
#[tokio::test]
async fn nvshim_exporter_serves_the_plugins_gpu_series() {
    use crate::common::plugin_proc::{PluginProc, nvml_lib};
    use nix::sys::signal::Signal;

    let node = node(&NodeSpec::standard(3));
    let sim = &node.sim;
    let run = launch_with_names(sim, &[], true).await;
    let nvshim = crate::metrics::plugin_bin().with_file_name("nvshim");
    let path = |p: &std::path::Path| p.display().to_string();
    let argv: Vec<String> = [
        "--debug",
        "--driver-root",
        &path(&sim.driver_root),
        "--nvml-lib",
        &path(&nvml_lib(sim)),
        "exporter",
        "-a",
        "127.0.0.1:0",
        "-c",
        "0",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut exporter = PluginProc::spawn(&nvshim, &argv, &sim.env());
    assert!(
        exporter
            .wait_log("serving metrics", std::time::Duration::from_secs(20))
            .await,
        "{}",
        exporter.log()
    );
    let log = exporter.log();
    let line = log.lines().find(|l| l.contains("serving metrics")).unwrap();
    let addr: std::net::SocketAddr = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("addr="))
        .unwrap_or_else(|| panic!("no addr= in {line:?}"))
        .parse()
        .unwrap();
    let (status, headers, body) = get(addr, "/metrics").await;
    assert_eq!(status, 200, "{headers}\n{body}\n{}", exporter.log());
    assert!(
        headers
            .to_ascii_lowercase()
            .contains(&format!("content-type: {CLASSIC}")),
        "{headers}"
    );
    let ours = dcgm_series(&parse(&body));
    let (_, plugins) = scrape(&run).await;
    let plugins = dcgm_series(&plugins);
    assert!(ours.len() >= 3 * 10, "{body}");
    assert_eq!(ours, plugins, "exporter:\n{body}");

    exporter.signal(Signal::SIGTERM);
    let status = exporter.exit(std::time::Duration::from_secs(10)).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "{status:?}\n{}",
        exporter.log()
    );
}

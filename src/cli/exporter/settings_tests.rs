// SPDX-License-Identifier: Apache-2.0
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;

use clap::Parser;

use super::*;

#[derive(Debug, Parser)]
struct Cli {
    #[command(flatten)]
    args: ExporterArgs,
}

/// Environment variables as (name, value) pairs.
type Vars<'a> = Vec<(&'a str, &'a str)>;

fn resolve(argv: &[&str], vars: &[(&str, &str)]) -> Result<Settings, String> {
    let cli = Cli::try_parse_from(std::iter::once("exporter").chain(argv.iter().copied()))
        .map_err(|e| e.to_string())?;
    let vars: HashMap<String, String> = vars
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    Settings::resolve(&cli.args, &|name| vars.get(name).cloned())
}

fn defaults() -> Settings {
    Settings {
        collectors: None,
        address: ":9400".into(),
        collect_interval: Duration::from_secs(30),
        kubernetes: false,
        gpu_id_type: GpuIdType::Uid,
        pod_resources_socket: "/var/lib/kubelet/pod-resources/kubelet.sock".into(),
        resource_names: Vec::new(),
        no_hostname: false,
    }
}

#[test]
fn dcgm_exporters_flags_and_variables() {
    let with = |f: fn(&mut Settings)| {
        let mut s = defaults();
        f(&mut s);
        s
    };
    // (case, argv, env, settings wanted)
    let cases: Vec<(&str, Vec<&str>, Vars, Settings)> = vec![
        ("defaults", vec![], vec![], defaults()),
        (
            "short flags",
            vec![
                "-f",
                "/c.csv",
                "-a",
                "127.0.0.1:9500",
                "-c",
                "1000",
                "-k",
                "-n",
            ],
            vec![],
            with(|s| {
                s.collectors = Some("/c.csv".into());
                s.address = "127.0.0.1:9500".into();
                s.collect_interval = Duration::from_secs(1);
                s.kubernetes = true;
                s.no_hostname = true;
            }),
        ),
        (
            "variables",
            vec![],
            vec![
                ("DCGM_EXPORTER_COLLECTORS", "/e.csv"),
                ("DCGM_EXPORTER_LISTEN", ":9401"),
                ("DCGM_EXPORTER_INTERVAL", "5000"),
                ("DCGM_EXPORTER_KUBERNETES", "true"),
                ("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "device-name"),
                ("DCGM_POD_RESOURCES_KUBELET_SOCKET", "/k.sock"),
                ("NVIDIA_RESOURCE_NAMES", "nvidia.com/a100, example.com/gpu"),
                ("DCGM_EXPORTER_NO_HOSTNAME", "1"),
                ("KUBERNETES_VIRTUAL_GPUS", "true"),
            ],
            with(|s| {
                s.collectors = Some("/e.csv".into());
                s.address = ":9401".into();
                s.collect_interval = Duration::from_secs(5);
                s.kubernetes = true;
                s.gpu_id_type = GpuIdType::DeviceName;
                s.pod_resources_socket = "/k.sock".into();
                s.resource_names = vec!["nvidia.com/a100".into(), "example.com/gpu".into()];
                s.no_hostname = true;
            }),
        ),
        (
            "a flag wins over its variable",
            vec!["--address=:9402", "--collect-interval=10"],
            vec![
                ("DCGM_EXPORTER_LISTEN", ":9401"),
                ("DCGM_EXPORTER_INTERVAL", "5"),
            ],
            with(|s| {
                s.address = ":9402".into();
                s.collect_interval = Duration::from_millis(10);
            }),
        ),
        (
            "a false variable",
            vec![],
            vec![("DCGM_EXPORTER_KUBERNETES", "false")],
            defaults(),
        ),
    ];
    for (case, argv, env, want) in cases {
        assert_eq!(resolve(&argv, &env).unwrap(), want, "case {case}");
    }
}

#[test]
fn bad_values_are_named_with_what_is_valid() {
    // (case, argv, env, what the error says)
    let cases: [(&str, &[&str], Vars, &[&str]); 4] = [
        (
            "interval",
            &[],
            vec![("DCGM_EXPORTER_INTERVAL", "30s")],
            &["DCGM_EXPORTER_INTERVAL", "\"30s\"", "milliseconds"],
        ),
        (
            "boolean",
            &[],
            vec![("DCGM_EXPORTER_KUBERNETES", "yes")],
            &["DCGM_EXPORTER_KUBERNETES", "\"yes\"", "true, false"],
        ),
        (
            "id type",
            &[],
            vec![("DCGM_EXPORTER_KUBERNETES_GPU_ID_TYPE", "index")],
            &["\"index\"", "uid, device-name"],
        ),
        (
            "web config",
            &["--web-config-file=/w.yml"],
            vec![],
            &["/w.yml", "not supported"],
        ),
    ];
    for (case, argv, env, says) in cases {
        let error = resolve(argv, &env).unwrap_err();
        for part in says {
            assert!(error.contains(part), "case {case}: {error}");
        }
    }
}

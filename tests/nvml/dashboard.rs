// SPDX-License-Identifier: Apache-2.0
//! The Grafana dashboard we ship (`deployments/grafana/dcgm-exporter-dashboard.json`: the
//! panels and PromQL of NVIDIA's dcgm-exporter dashboard, grafana.com 12239) against what
//! `nvshim::exporter` serves on the simulated node of `exporter` (a MIG GPU with two GPU
//! instances, GPM readings): every metric a query names has series, and every label a
//! selector matches on, a legend prints or a template variable lists is on them.
//!
//! The one exception is grouping by `uuid` (lower case) in two of NVIDIA's queries:
//! dcgm-exporter labels the UUID `UUID` and has no `uuid` either, and grouping by a
//! label no series has is a no-op in PromQL, so those panels draw the same on both.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use crate::exporter::{in_child_of, render};
use crate::exposition::Family;
use crate::promql::{self, Refs};
use nvshim::exporter::{Counters, Exporter, Holders};

const DASHBOARD: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/deployments/grafana/dcgm-exporter-dashboard.json"
);
/// NVIDIA's dashboard's panels, in order.
const PANELS: [&str; 8] = [
    "GPU Temperature",
    "GPU Avg. Temp",
    "GPU Power Usage",
    "GPU Power Total",
    "GPU SM Clocks",
    "GPU Utilization",
    "Tensor Core Utilization",
    "GPU Framebuffer Mem Used",
];
/// Labels NVIDIA's queries group by that dcgm-exporter does not export either.
const ABSENT_ON_DCGM_EXPORTER_TOO: [&str; 1] = ["uuid"];

/// One thing the dashboard asks for: where, the query's references, and the labels it
/// prints (legend) or lists (template variable).
struct Use {
    place: String,
    refs: Refs,
    shown: Vec<String>,
}

fn uses(dashboard: &Value) -> Result<Vec<Use>, String> {
    let mut uses = Vec::new();
    for panel in dashboard["panels"].as_array().ok_or("no panels")? {
        let title = panel["title"].as_str().unwrap_or_default();
        for target in panel["targets"]
            .as_array()
            .ok_or("a panel without targets")?
        {
            let expr = target["expr"].as_str().ok_or("a target without expr")?;
            uses.push(Use {
                place: format!("panel {title:?}"),
                refs: promql::references(expr)?,
                shown: promql::legend_labels(target["legendFormat"].as_str().unwrap_or("")),
            });
        }
    }
    for variable in dashboard["templating"]["list"]
        .as_array()
        .ok_or("no templating")?
    {
        if variable["type"] != "query" {
            continue;
        }
        let query = variable["query"]["query"]
            .as_str()
            .or_else(|| variable["query"].as_str())
            .ok_or("a query variable without a query")?;
        let (refs, label) = promql::label_values(query)?;
        uses.push(Use {
            place: format!("variable {}", variable["name"]),
            refs,
            shown: vec![label],
        });
    }
    Ok(uses)
}

/// The label names of `family`'s series.
fn label_names(family: &Family) -> BTreeSet<&str> {
    family
        .samples
        .iter()
        .flat_map(|s| s.labels.iter().map(|(k, _)| k.as_str()))
        .collect()
}

/// What `uses` ask of `families` that is not there.
fn missing(uses: &[Use], families: &BTreeMap<String, Family>) -> Vec<String> {
    let mut problems = Vec::new();
    for use_ in uses {
        let mut labels_here = BTreeSet::new();
        for (metric, matched) in &use_.refs.metrics {
            let Some(family) = families.get(metric).filter(|f| !f.samples.is_empty()) else {
                problems.push(format!("{}: no series of {metric}", use_.place));
                continue;
            };
            let names = label_names(family);
            for label in matched {
                if !names.contains(label.as_str()) {
                    problems.push(format!("{}: {metric} has no label {label}", use_.place));
                }
            }
            labels_here.extend(names);
        }
        let grouped = use_
            .refs
            .grouping
            .iter()
            .filter(|l| !ABSENT_ON_DCGM_EXPORTER_TOO.contains(&l.as_str()));
        for label in grouped.chain(&use_.shown) {
            if !labels_here.contains(label.as_str()) {
                problems.push(format!(
                    "{}: no series it reads has label {label}",
                    use_.place
                ));
            }
        }
    }
    problems
}

fn dashboard() -> Result<Value, String> {
    let text = std::fs::read_to_string(DASHBOARD).map_err(|e| format!("{DASHBOARD}: {e}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{DASHBOARD}: {e}"))
}

#[test]
fn the_dashboards_queries_all_resolve_on_the_simulated_node() -> crate::exporter::TestResult {
    in_child_of(
        module_path!(),
        "the_dashboards_queries_all_resolve_on_the_simulated_node",
        |nvml| {
            let dashboard = dashboard()?;
            let titles: Vec<&str> = dashboard["panels"]
                .as_array()
                .ok_or("no panels")?
                .iter()
                .filter_map(|p| p["title"].as_str())
                .collect();
            assert_eq!(titles, PANELS, "the panels of NVIDIA's dashboard");
            let uses = uses(&dashboard)?;
            let exporter = Exporter::new(nvml, Counters::default_set(), "node-a".into())?;
            // GPM readings need two samples: the first render takes the second.
            render(&exporter, &Holders::default())?;
            let families = render(&exporter, &Holders::default())?;
            let problems = missing(&uses, &families);
            assert!(problems.is_empty(), "{}", problems.join("\n"));
            // The check can fail: without the PROF fields, two panels go blank.
            let mut without = families;
            without.remove("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE");
            let problems = missing(&uses, &without);
            assert!(!problems.is_empty());
            for problem in problems {
                assert!(
                    problem.starts_with("panel \"Tensor Core Utilization\""),
                    "{problem}"
                );
            }
            Ok(())
        },
    )
}

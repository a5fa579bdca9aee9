// SPDX-License-Identifier: Apache-2.0
//! The plugin's own families in the classic Prometheus text format (0.0.4), so they can
//! be served beside the dcgm-exporter-compatible GPU families, whose counter names
//! (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`, ...) have no `_total` and so cannot be
//! OpenMetrics.
//!
//! `prometheus_client` only writes OpenMetrics; the two formats differ, for what the
//! plugin registers (counters, a histogram, no exemplars or created timestamps), in
//! three ways that this rewrite undoes: a counter's `# HELP`/`# TYPE` name its family
//! without `_total` (0.0.4 names them as the samples are named), `# UNIT` lines exist,
//! and the text ends with `# EOF`.

/// `openmetrics` (as `prometheus_client` encodes a registry, `# EOF` included or not)
/// in the 0.0.4 text format, appended to `out`.
pub(super) fn append_as_classic(openmetrics: &str, out: &mut String) {
    let mut lines = openmetrics.lines().peekable();
    while let Some(line) = lines.next() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let family = rest.split(' ').next().unwrap_or_default();
            let counter = lines
                .peek()
                .is_some_and(|next| *next == format!("# TYPE {family} counter"));
            if counter {
                out.push_str("# HELP ");
                out.push_str(family);
                out.push_str("_total");
                out.push_str(&rest[family.len()..]);
                out.push('\n');
                lines.next();
                out.push_str("# TYPE ");
                out.push_str(family);
                out.push_str("_total counter\n");
                continue;
            }
        }
        if let Some(family) = line
            .strip_prefix("# TYPE ")
            .and_then(|rest| rest.strip_suffix(" counter"))
        {
            out.push_str("# TYPE ");
            out.push_str(family);
            out.push_str("_total counter\n");
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_take_their_sample_names_and_openmetrics_only_lines_go() {
        let openmetrics = "\
# HELP nvshim_plugin_allocations Container allocations.
# TYPE nvshim_plugin_allocations counter
nvshim_plugin_allocations_total{resource=\"nvidia.com/gpu\",result=\"success\"} 2
# HELP nvshim_plugin_allocate_duration_seconds Time per Allocate.
# TYPE nvshim_plugin_allocate_duration_seconds histogram
# UNIT nvshim_plugin_allocate_duration_seconds seconds
nvshim_plugin_allocate_duration_seconds_sum{resource=\"nvidia.com/gpu\"} 0.1
nvshim_plugin_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 2
# TYPE nvshim_bare counter
nvshim_bare_total 1
# EOF
";
        let mut out = String::new();
        append_as_classic(openmetrics, &mut out);
        assert_eq!(
            out,
            "\
# HELP nvshim_plugin_allocations_total Container allocations.
# TYPE nvshim_plugin_allocations_total counter
nvshim_plugin_allocations_total{resource=\"nvidia.com/gpu\",result=\"success\"} 2
# HELP nvshim_plugin_allocate_duration_seconds Time per Allocate.
# TYPE nvshim_plugin_allocate_duration_seconds histogram
nvshim_plugin_allocate_duration_seconds_sum{resource=\"nvidia.com/gpu\"} 0.1
nvshim_plugin_allocate_duration_seconds_count{resource=\"nvidia.com/gpu\"} 2
# TYPE nvshim_bare_total counter
nvshim_bare_total 1
"
        );
    }
}

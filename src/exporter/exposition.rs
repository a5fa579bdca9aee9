// SPDX-License-Identifier: Apache-2.0
//! The Prometheus text exposition format, version 0.0.4: `# HELP` and `# TYPE` lines, then
//! one `name{label="value",...} number` line per series. Not OpenMetrics: DCGM's counters
//! (`DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`) have no `_total` suffix, which OpenMetrics
//! requires, and there is no `# EOF`.

use std::fmt::Write as _;

/// The `Content-Type` of [`super::Exporter::render`]'s output.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Writes a family's `# HELP` and `# TYPE` lines.
pub(super) fn write_header(out: &mut String, name: &str, help: &str, kind: &str) {
    out.push_str("# HELP ");
    out.push_str(name);
    out.push(' ');
    for c in help.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out.push_str("\n# TYPE ");
    out.push_str(name);
    out.push(' ');
    out.push_str(kind);
    out.push('\n');
}

/// Writes one sample line. A value that is not finite is left out (no reading).
pub(super) fn write_sample(out: &mut String, name: &str, labels: &[(&str, &str)], value: f64) {
    if !value.is_finite() {
        return;
    }
    out.push_str(name);
    if !labels.is_empty() {
        out.push('{');
        for (at, (label, text)) in labels.iter().enumerate() {
            if at > 0 {
                out.push(',');
            }
            out.push_str(label);
            out.push_str("=\"");
            escape_label_value(out, text);
            out.push('"');
        }
        out.push('}');
    }
    out.push(' ');
    write_value(out, value);
    out.push('\n');
}

/// A label value with `\`, `"` and newlines escaped.
fn escape_label_value(out: &mut String, text: &str) {
    for c in text.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

/// Integers without a fraction (`1410`), other numbers in Rust's shortest round-trip form.
fn write_value(out: &mut String, value: f64) {
    // 2^53: every integer below it is exact in an f64.
    if value.fract() == 0.0 && value.abs() < 9_007_199_254_740_992.0 {
        let _ = write!(out, "{}", value as i64);
    } else {
        let _ = write!(out, "{value}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_escape_labels_and_format_numbers() {
        let mut out = String::new();
        write_header(&mut out, "m", "a \\ b\nc", "gauge");
        write_sample(&mut out, "m", &[("a", "x\"y\\z\nw"), ("b", "")], 1410.0);
        write_sample(&mut out, "m", &[], 0.25);
        write_sample(&mut out, "m", &[], f64::NAN);
        write_sample(&mut out, "m", &[], -3.0);
        assert_eq!(
            out,
            "# HELP m a \\\\ b\\nc\n# TYPE m gauge\nm{a=\"x\\\"y\\\\z\\nw\",b=\"\"} 1410\nm 0.25\nm -3\n"
        );
    }
}

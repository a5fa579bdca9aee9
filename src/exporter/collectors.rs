// SPDX-License-Identifier: Apache-2.0
//! The metrics set ([`Counters`]) and its file format, dcgm-exporter's `--collectors` CSV:
//! one `FIELD, type, help` line per metric, `#` comments and blank lines skipped, blanks
//! around each value ignored, the type `gauge`, `counter` or `label`. The default set is
//! `default-counters.csv`, compiled in.

use std::fmt;
use std::path::Path;

use super::catalogue::{self, Field, MetricKind};

/// The default set, in the CSV format.
pub const DEFAULT_COUNTERS_CSV: &str = include_str!("default-counters.csv");

/// One metric of the set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counter {
    pub field: Field,
    /// The DCGM name as the file spelled it (the metric's name in the output).
    pub name: String,
    pub kind: MetricKind,
    pub help: String,
}

/// The metrics to export, in file order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counters {
    pub counters: Vec<Counter>,
    /// DCGM fields the file names that we do not serve (no NVML source): `(line, name)`.
    /// Left out with a warning, so that dcgm-exporter's own files (its
    /// `dcp-metrics-included.csv`, say) work unchanged.
    pub skipped: Vec<(usize, String)>,
}

/// Whether `name` has the form of a DCGM field (`DCGM_FI_…`, or dcgm-exporter's own
/// `DCGM_EXP_…`): upper-case letters, digits and underscores.
fn is_dcgm_name(name: &str) -> bool {
    (name.starts_with("DCGM_FI_") || name.starts_with("DCGM_EXP_"))
        && name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
}

/// Why a collectors file cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CollectorsError {
    #[error("cannot read the collectors file {path}: {source}")]
    Read {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{origin}:{line}: {problem}")]
    Line {
        origin: String,
        line: usize,
        problem: LineProblem,
    },
}

/// What is wrong with one line of a collectors file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LineProblem {
    /// Fewer than three comma-separated values.
    TooFewValues(String),
    /// A field the exporter cannot serve.
    UnknownField(String),
    /// A type other than gauge, counter, label.
    BadType { field: String, kind: String },
    /// `label` for a numeric field, or `gauge`/`counter` for a label field.
    WrongType { field: String, kind: MetricKind },
    /// The field is listed twice.
    Duplicate { field: String, first_line: usize },
}

impl fmt::Display for LineProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LineProblem::TooFewValues(line) => write!(
                f,
                "{line:?} is not `FIELD, type, help` (three comma-separated values)"
            ),
            LineProblem::UnknownField(field) => {
                let known: Vec<&str> = catalogue::CATALOGUE.iter().map(|i| i.name()).collect();
                write!(
                    f,
                    "{field:?} is not a DCGM field name (DCGM_FI_… in upper case); supported fields: {}",
                    known.join(", ")
                )
            }
            LineProblem::BadType { field, kind } => write!(
                f,
                "field {field} has type {kind:?}; valid types are gauge, counter, label"
            ),
            LineProblem::WrongType { field, kind } => match kind {
                MetricKind::Label => write!(
                    f,
                    "field {field} is a number and cannot be a label; use gauge or counter"
                ),
                _ => write!(
                    f,
                    "field {field} is text and can only be exported as type label, not {}",
                    kind.as_str()
                ),
            },
            LineProblem::Duplicate { field, first_line } => write!(
                f,
                "field {field} is already listed on line {first_line}; list each field once"
            ),
        }
    }
}

impl Counters {
    /// The compiled-in default set (`src/exporter/default-counters.csv`).
    pub fn default_set() -> Counters {
        match Counters::parse(DEFAULT_COUNTERS_CSV, "default-counters.csv") {
            Ok(counters) => counters,
            // A unit test parses the default file, so this cannot happen in a release.
            Err(error) => {
                tracing::error!(%error, "the built-in metrics set does not parse");
                Counters {
                    counters: Vec::new(),
                    skipped: Vec::new(),
                }
            }
        }
    }

    /// Reads a collectors file.
    pub fn load(path: &Path) -> Result<Counters, CollectorsError> {
        let text = std::fs::read_to_string(path).map_err(|source| CollectorsError::Read {
            path: path.display().to_string(),
            source,
        })?;
        Counters::parse(&text, &path.display().to_string())
    }

    /// Parses a collectors file's `text`; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Counters, CollectorsError> {
        let mut counters: Vec<Counter> = Vec::new();
        let mut lines_of: Vec<usize> = Vec::new();
        let mut skipped = Vec::new();
        for (at, raw) in text.lines().enumerate() {
            let line = at + 1;
            let error = |problem| CollectorsError::Line {
                origin: origin.to_string(),
                line,
                problem,
            };
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with('#') {
                continue;
            }
            let mut values = trimmed.splitn(3, ',').map(str::trim);
            let (Some(name), Some(kind), Some(help)) =
                (values.next(), values.next(), values.next())
            else {
                return Err(error(LineProblem::TooFewValues(trimmed.to_string())));
            };
            let Some(info) = catalogue::lookup(name) else {
                if is_dcgm_name(name) {
                    tracing::warn!(
                        file = origin,
                        line,
                        field = name,
                        "a DCGM field nvshim does not serve (no NVML source); left out"
                    );
                    skipped.push((line, name.to_string()));
                    continue;
                }
                return Err(error(LineProblem::UnknownField(name.to_string())));
            };
            let Some(kind) = MetricKind::parse(kind) else {
                return Err(error(LineProblem::BadType {
                    field: name.to_string(),
                    kind: kind.to_string(),
                }));
            };
            if (kind == MetricKind::Label) != (info.kind == MetricKind::Label) {
                return Err(error(LineProblem::WrongType {
                    field: name.to_string(),
                    kind,
                }));
            }
            if let Some(at) = counters.iter().position(|c| c.field == info.field) {
                return Err(error(LineProblem::Duplicate {
                    field: name.to_string(),
                    first_line: lines_of.get(at).copied().unwrap_or(0),
                }));
            }
            counters.push(Counter {
                field: info.field,
                name: name.to_string(),
                kind,
                help: help.to_string(),
            });
            lines_of.push(line);
        }
        Ok(Counters { counters, skipped })
    }

    /// The set in the CSV format (what [`Counters::parse`] reads back to the same set).
    pub fn to_csv(&self) -> String {
        self.counters
            .iter()
            .map(|c| format!("{}, {}, {}\n", c.name, c.kind.as_str(), c.help))
            .collect()
    }

    /// Whether `field` is in the set.
    pub fn contains(&self, field: Field) -> bool {
        self.counters.iter().any(|c| c.field == field)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_default_set_parses_and_has_every_field() {
        let counters = Counters::parse(DEFAULT_COUNTERS_CSV, "default").unwrap();
        assert_eq!(counters, Counters::default_set());
        for info in catalogue::CATALOGUE {
            assert!(counters.contains(info.field), "{} missing", info.name());
            let counter = counters
                .counters
                .iter()
                .find(|c| c.field == info.field)
                .unwrap();
            assert_eq!(counter.kind, info.kind, "{}", info.name());
        }
    }

    #[test]
    fn lines_are_read_as_dcgm_exporter_reads_them() {
        let text = "# comment,,\n\n  DCGM_FI_DEV_DEC_UTIL ,  gauge ,  Decoder, in %.  \n\
                    DCGM_FI_DEV_CLOCKS_EVENT_REASONS, counter, x\n";
        let counters = Counters::parse(text, "f.csv").unwrap();
        assert_eq!(
            counters.counters,
            vec![
                Counter {
                    field: Field::DecUtil,
                    name: "DCGM_FI_DEV_DEC_UTIL".into(),
                    kind: MetricKind::Gauge,
                    help: "Decoder, in %.".into(),
                },
                Counter {
                    field: Field::ClockThrottleReasons,
                    name: "DCGM_FI_DEV_CLOCKS_EVENT_REASONS".into(),
                    kind: MetricKind::Counter,
                    help: "x".into(),
                },
            ]
        );
    }

    #[test]
    fn errors_name_the_file_line_value_and_what_is_valid() {
        let cases = [
            (
                "not a field name",
                "\ndcgm_fi_dev_gpu_temp, gauge, x\n",
                &[
                    "f.csv:2:",
                    "\"dcgm_fi_dev_gpu_temp\"",
                    "DCGM_FI_DEV_SM_CLOCK",
                ][..],
            ),
            (
                "bad type",
                "DCGM_FI_DEV_GPU_TEMP, histogram, x\n",
                &["f.csv:1:", "\"histogram\"", "gauge, counter, label"],
            ),
            (
                "too few",
                "# c\nDCGM_FI_DEV_GPU_TEMP, gauge\n",
                &["f.csv:2:", "three comma-separated"],
            ),
            (
                "label for a number",
                "DCGM_FI_DEV_GPU_TEMP, label, x\n",
                &["f.csv:1:", "use gauge or counter"],
            ),
            (
                "number for a label",
                "DCGM_FI_DRIVER_VERSION, gauge, x\n",
                &["f.csv:1:", "only be exported as type label"],
            ),
            (
                "duplicate",
                "DCGM_FI_DEV_GPU_TEMP, gauge, x\nDCGM_FI_DEV_GPU_TEMP, gauge, y\n",
                &["f.csv:2:", "already listed on line 1"],
            ),
        ];
        for (case, text, wants) in cases {
            let message = Counters::parse(text, "f.csv").unwrap_err().to_string();
            for want in wants {
                assert!(message.contains(want), "case {case}: {message}");
            }
        }
    }

    #[test]
    fn a_file_that_cannot_be_read_is_named() {
        let path = Path::new("/nonexistent/nvshim/collectors.csv");
        let message = Counters::load(path).unwrap_err().to_string();
        assert!(
            message.contains("/nonexistent/nvshim/collectors.csv"),
            "{message}"
        );
    }

    fn counter_strategy() -> impl Strategy<Value = Counter> {
        (
            0..catalogue::CATALOGUE.len(),
            any::<bool>(),
            "[a-zA-Z0-9 ().,%]{0,30}",
        )
            .prop_map(|(at, counter, help)| {
                let info = &catalogue::CATALOGUE[at];
                let kind = match info.kind {
                    MetricKind::Label => MetricKind::Label,
                    _ if counter => MetricKind::Counter,
                    _ => MetricKind::Gauge,
                };
                Counter {
                    field: info.field,
                    name: info.name().to_string(),
                    kind,
                    help: help.trim().to_string(),
                }
            })
    }

    proptest! {
        #[test]
        fn parse_never_panics(text in "\\PC*") {
            let _ = Counters::parse(&text, "fuzz");
        }

        #[test]
        fn generated_files_round_trip(counters in proptest::collection::vec(counter_strategy(), 0..12)) {
            let mut unique: Vec<Counter> = Vec::new();
            for counter in counters {
                if !unique.iter().any(|c| c.field == counter.field) {
                    unique.push(counter);
                }
            }
            let set = Counters {
                counters: unique,
                skipped: Vec::new(),
            };
            let parsed = Counters::parse(&set.to_csv(), "generated");
            prop_assert_eq!(parsed.ok(), Some(set));
        }
    }

    #[test]
    fn dcgm_fields_we_do_not_serve_are_left_out_not_refused() {
        let text = "DCGM_FI_DEV_GPU_TEMP, gauge, t\n\
                    DCGM_FI_DEV_VGPU_LICENSE_STATUS, gauge, vGPU License status\n\
                    DCGM_FI_PROF_SM_ACTIVE, gauge, x\n\
                    DCGM_EXP_XID_ERRORS_COUNT, gauge, x\n";
        let counters = Counters::parse(text, "dcp-metrics-included.csv").unwrap();
        assert_eq!(counters.counters.len(), 1);
        assert_eq!(
            counters.skipped,
            [
                (2, "DCGM_FI_DEV_VGPU_LICENSE_STATUS".to_string()),
                (3, "DCGM_FI_PROF_SM_ACTIVE".to_string()),
                (4, "DCGM_EXP_XID_ERRORS_COUNT".to_string()),
            ]
        );
    }
}

//! `nvidia-ctk cdi generate --mode csv`'s flags: which CSV files, which `sym` entries
//! to leave out.

use std::path::PathBuf;

use super::{CdiError, GenerateArgs};
use crate::config;
use crate::discover::csv::{CsvFiles, CsvSource, Pattern};

/// `--csv.file` (default: the base files of `modes.csv.mount-spec-path`, as NVIDIA's
/// default list is) and `--csv.ignore-pattern`.
pub(super) fn source(a: &GenerateArgs, config: &config::Config) -> Result<CsvSource, CdiError> {
    let files: Vec<PathBuf> = a
        .csv_file
        .iter()
        .filter(|f| !f.is_empty())
        .map(PathBuf::from)
        .collect();
    let files = if files.is_empty() {
        CsvFiles::Dir {
            path: config
                .nvidia_container_runtime
                .modes
                .csv
                .mount_spec_path
                .clone(),
            all: false,
        }
    } else {
        CsvFiles::Listed(files)
    };
    let ignore = a
        .csv_ignore_pattern
        .iter()
        .filter(|p| !p.is_empty())
        .map(|p| {
            Pattern::new(p).map_err(|source| CdiError::IgnorePattern {
                pattern: p.clone(),
                source,
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(CsvSource { files, ignore })
}

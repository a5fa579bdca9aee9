//! Whether a container is planned in csv mode (Jetson / Tegra), and from which files.
//!
//! `mode = "csv"` always is; `mode = "auto"` is on a Tegra host, as NVIDIA's `auto`
//! resolves to `csv` when go-nvlib sees Tegra files and no NVML — unless every
//! requested device is a fully qualified CDI name, which NVIDIA's `auto` sends to its
//! `cdi` mode first. The Tegra check ([`csv::is_tegra`]) runs only for a GPU request
//! in `auto` mode, and on a dGPU host costs one `stat` of `/proc/driver/nvidia/gpus`.

use crate::config::{Config, Mode};
use crate::discover::csv::{self, CsvFiles, CsvSource};
use crate::request::{DeviceId, DeviceList, Request};
use crate::roots::Roots;

/// The CSV files `request` is planned from, or `None` for the other modes.
pub fn source(config: &Config, request: &Request, roots: &Roots) -> Option<CsvSource> {
    let chosen = match config.nvidia_container_runtime.mode {
        Mode::Csv => true,
        Mode::Auto => !only_cdi_names(&request.devices) && csv::is_tegra(roots),
        Mode::Legacy | Mode::Cdi | Mode::JitCdi => false,
    };
    if !chosen {
        return None;
    }
    tracing::debug!(mode = %config.nvidia_container_runtime.mode, "csv mode (Tegra): devices and files from the CSV mount specs");
    Some(CsvSource {
        files: CsvFiles::Dir {
            path: config
                .nvidia_container_runtime
                .modes
                .csv
                .mount_spec_path
                .clone(),
            all: request.csv_mounts_all,
        },
        ignore: Vec::new(),
    })
}

fn only_cdi_names(devices: &DeviceList) -> bool {
    matches!(devices, DeviceList::Ids(ids) if !ids.is_empty()
        && ids.iter().all(|id| matches!(id, DeviceId::Cdi { kind, .. } if !kind.is_empty())))
}

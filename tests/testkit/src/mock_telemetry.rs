// SPDX-License-Identifier: Apache-2.0
//! The metrics exporter's readings in the mock NVML's config: a GPU's `telemetry` and a MIG
//! device's, with the mock's field names (`tests/mock-nvml/src/telemetry.rs`). `None`
//! fields are left out of the file, so the mock answers `NOT_SUPPORTED` for them.

use serde::Serialize;

/// A GPU's exporter readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockTelemetry {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_reserved_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_clock_mhz: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub total_energy_millijoules: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub encoder_utilization_percent: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub decoder_utilization_percent: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_replay_count: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_tx_kilobytes_per_second: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pcie_rx_kilobytes_per_second: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_temperature_celsius: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nvlink_bandwidth_total: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ecc: Option<MockEcc>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retired_pages: Option<MockRetiredPages>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remapped_rows: Option<MockRemappedRows>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub clocks_event_reasons: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpm: Option<MockGpm>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockEcc {
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockRetiredPages {
    pub single_bit: u32,
    pub double_bit: u32,
    pub pending: bool,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockRemappedRows {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failed: bool,
}

/// What `nvmlGpmMetricsGet` answers, percent.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockGpm {
    pub graphics_util_percent: f64,
    pub any_tensor_util_percent: f64,
    pub dram_bw_util_percent: f64,
}

/// A MIG device's readings.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct MockMigTelemetry {
    pub memory_used_bytes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_reserved_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub gpm: Option<MockGpm>,
}

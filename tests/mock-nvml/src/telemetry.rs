// SPDX-License-Identifier: Apache-2.0
//! The metrics exporter's readings: a GPU's `telemetry` (and a MIG device's) in the config,
//! and what each NVML call answers from it. A GPU without `telemetry`, or with a reading
//! left out of it, answers `NVML_ERROR_NOT_SUPPORTED` for that reading, as a board without
//! the counter does. Re-read with the other readings when the config file changes.

use serde::Deserialize;

use crate::state::{Dev, Node, Ret, code};

/// `NVML_ERROR_ARGUMENT_VERSION_MISMATCH`: a versioned struct of the wrong version.
pub const ARGUMENT_VERSION_MISMATCH: Ret = 25;
/// `nvmlMemory_v2`: the struct's size (40) with version 2 in the top byte.
pub const MEMORY_V2_VERSION: u32 = 40 | (2 << 24);
/// `NVML_FI_DEV_MEMORY_TEMP`.
pub const FIELD_MEMORY_TEMP: u32 = 82;
/// `NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL`.
pub const FIELD_NVLINK_BANDWIDTH_C0_TOTAL: u32 = 66;
/// `NVML_GPM_METRIC_GRAPHICS_UTIL`, `_ANY_TENSOR_UTIL`, `_DRAM_BW_UTIL`.
pub const GPM_GRAPHICS_UTIL: u32 = 1;
pub const GPM_ANY_TENSOR_UTIL: u32 = 5;
pub const GPM_DRAM_BW_UTIL: u32 = 10;

/// A GPU's exporter readings; every one optional (absent: `NOT_SUPPORTED`).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TelemetryConfig {
    /// `nvmlDeviceGetMemoryInfo_v2` `.reserved`, bytes; absent: the `_v2` call is
    /// `NOT_SUPPORTED` (the original call still answers).
    pub memory_reserved_bytes: Option<u64>,
    /// `nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)`, MHz.
    pub memory_clock_mhz: Option<u32>,
    /// `nvmlDeviceGetTotalEnergyConsumption`, mJ.
    pub total_energy_millijoules: Option<u64>,
    pub encoder_utilization_percent: Option<u32>,
    pub decoder_utilization_percent: Option<u32>,
    pub pcie_replay_count: Option<u32>,
    /// `nvmlDeviceGetPcieThroughput`, KB/s.
    pub pcie_tx_kilobytes_per_second: Option<u32>,
    pub pcie_rx_kilobytes_per_second: Option<u32>,
    /// Field value `NVML_FI_DEV_MEMORY_TEMP`, °C.
    pub memory_temperature_celsius: Option<u32>,
    /// Field value `NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL`.
    pub nvlink_bandwidth_total: Option<u64>,
    pub ecc: Option<EccConfig>,
    pub retired_pages: Option<RetiredPagesConfig>,
    pub remapped_rows: Option<RemappedRowsConfig>,
    /// `nvmlDeviceGetCurrentClocksEventReasons` (and `...ThrottleReasons`).
    pub clocks_event_reasons: Option<u64>,
    /// GPM: present means `nvmlGpmQueryDeviceSupport` says yes.
    pub gpm: Option<GpmConfig>,
}

/// `nvmlDeviceGetTotalEccErrors`, per error type and counter type.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct EccConfig {
    pub volatile_corrected: u64,
    pub volatile_uncorrected: u64,
    pub aggregate_corrected: u64,
    pub aggregate_uncorrected: u64,
}

/// `nvmlDeviceGetRetiredPages` counts and `...PendingStatus`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RetiredPagesConfig {
    pub single_bit: u32,
    pub double_bit: u32,
    pub pending: bool,
}

/// `nvmlDeviceGetRemappedRows`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemappedRowsConfig {
    pub correctable: u32,
    pub uncorrectable: u32,
    pub pending: bool,
    pub failed: bool,
}

/// What `nvmlGpmMetricsGet` computes between any two samples, in percent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GpmConfig {
    pub graphics_util_percent: f64,
    pub any_tensor_util_percent: f64,
    pub dram_bw_util_percent: f64,
}

/// A MIG device's readings: its memory use and its GPU instance's GPM.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MigTelemetryConfig {
    pub memory_used_bytes: u64,
    /// `nvmlDeviceGetMemoryInfo_v2` `.reserved`; absent: `_v2` is `NOT_SUPPORTED`.
    pub memory_reserved_bytes: Option<u64>,
    /// GPM of the MIG device's GPU instance (`nvmlGpmMigSampleGet`).
    pub gpm: Option<GpmConfig>,
}

fn supported<T: Copy>(value: Option<T>) -> Result<T, Ret> {
    value.ok_or(code::NOT_SUPPORTED)
}

impl Node {
    /// A whole GPU's telemetry; MIG devices and GPUs without it have none.
    fn telemetry(&self, dev: Dev) -> Result<&TelemetryConfig, Ret> {
        match dev {
            Dev::Gpu(_) => self
                .gpu(dev)
                .config
                .telemetry
                .as_ref()
                .ok_or(code::NOT_SUPPORTED),
            Dev::Mig(..) => Err(code::NOT_SUPPORTED),
        }
    }

    fn mig_telemetry(&self, gpu: usize, mig: usize) -> Option<&MigTelemetryConfig> {
        self.mig(gpu, mig)?.telemetry.as_ref()
    }

    /// A MIG device's memory used (0 without telemetry).
    pub fn mig_memory_used(&self, gpu: usize, mig: usize) -> u64 {
        self.mig_telemetry(gpu, mig)
            .map_or(0, |t| t.memory_used_bytes)
    }

    /// `nvmlDeviceGetMemoryInfo_v2`: `(total, reserved, free, used)`, free being what
    /// neither processes nor the driver use.
    pub fn memory_v2(&self, dev: Dev) -> Result<(u64, u64, u64, u64), Ret> {
        let reserved = match dev {
            Dev::Gpu(_) => self.telemetry(dev)?.memory_reserved_bytes,
            Dev::Mig(g, m) => self
                .mig_telemetry(g, m)
                .and_then(|t| t.memory_reserved_bytes),
        };
        let reserved = supported(reserved)?;
        let (total, _, used) = self.memory(dev);
        let free = total.saturating_sub(used).saturating_sub(reserved);
        Ok((total, reserved, free, used))
    }

    pub fn memory_clock(&self, dev: Dev) -> Result<u32, Ret> {
        supported(self.telemetry(dev)?.memory_clock_mhz)
    }

    pub fn total_energy(&self, dev: Dev) -> Result<u64, Ret> {
        supported(self.telemetry(dev)?.total_energy_millijoules)
    }

    /// Encoder (`decoder` false) or decoder utilisation, percent.
    pub fn codec_utilization(&self, dev: Dev, decoder: bool) -> Result<u32, Ret> {
        let t = self.telemetry(dev)?;
        supported(if decoder {
            t.decoder_utilization_percent
        } else {
            t.encoder_utilization_percent
        })
    }

    pub fn pcie_replay(&self, dev: Dev) -> Result<u32, Ret> {
        supported(self.telemetry(dev)?.pcie_replay_count)
    }

    /// `nvmlDeviceGetPcieThroughput`: counter 0 TX, 1 RX, others `INVALID_ARGUMENT`.
    pub fn pcie_throughput(&self, dev: Dev, counter: u32) -> Result<u32, Ret> {
        let t = self.telemetry(dev)?;
        match counter {
            0 => supported(t.pcie_tx_kilobytes_per_second),
            1 => supported(t.pcie_rx_kilobytes_per_second),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    /// One field value: `(nvmlValueType_t, bits)`; `NVML_VALUE_TYPE_UNSIGNED_INT` (1) for
    /// the temperature, `_UNSIGNED_LONG_LONG` (3) for the NVLink counter.
    pub fn field_value(&self, dev: Dev, field: u32) -> Result<(u32, u64), Ret> {
        let t = self.telemetry(dev)?;
        match field {
            FIELD_MEMORY_TEMP => supported(t.memory_temperature_celsius).map(|v| (1, u64::from(v))),
            FIELD_NVLINK_BANDWIDTH_C0_TOTAL => supported(t.nvlink_bandwidth_total).map(|v| (3, v)),
            _ => Err(code::NOT_SUPPORTED),
        }
    }

    /// `nvmlDeviceGetTotalEccErrors(errorType, counterType)`.
    pub fn ecc_total(&self, dev: Dev, error_type: u32, counter_type: u32) -> Result<u64, Ret> {
        let ecc = supported(self.telemetry(dev)?.ecc.as_ref())?;
        match (error_type, counter_type) {
            (0, 0) => Ok(ecc.volatile_corrected),
            (1, 0) => Ok(ecc.volatile_uncorrected),
            (0, 1) => Ok(ecc.aggregate_corrected),
            (1, 1) => Ok(ecc.aggregate_uncorrected),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    /// `nvmlDeviceGetRetiredPages`' count for `cause` (0 single-bit, 1 double-bit).
    pub fn retired_pages(&self, dev: Dev, cause: u32) -> Result<u32, Ret> {
        let pages = supported(self.telemetry(dev)?.retired_pages.as_ref())?;
        match cause {
            0 => Ok(pages.single_bit),
            1 => Ok(pages.double_bit),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    pub fn retired_pending(&self, dev: Dev) -> Result<bool, Ret> {
        Ok(supported(self.telemetry(dev)?.retired_pages.as_ref())?.pending)
    }

    pub fn remapped_rows(&self, dev: Dev) -> Result<RemappedRowsConfig, Ret> {
        supported(self.telemetry(dev)?.remapped_rows.as_ref()).cloned()
    }

    pub fn clocks_event_reasons(&self, dev: Dev) -> Result<u64, Ret> {
        supported(self.telemetry(dev)?.clocks_event_reasons)
    }

    /// GPM of a GPU (`instance` None) or of its GPU instance `instance`: `NOT_SUPPORTED`
    /// without a `gpm` reading, `INVALID_ARGUMENT` for a GPU instance the GPU lacks.
    pub fn gpm(&self, dev: Dev, instance: Option<u32>) -> Result<&GpmConfig, Ret> {
        let Some(id) = instance else {
            return supported(self.telemetry(dev)?.gpm.as_ref());
        };
        let Dev::Gpu(g) = dev else {
            return Err(code::INVALID_ARGUMENT);
        };
        let migs = self.gpus[g].mig_devices();
        let mig = migs
            .iter()
            .find(|m| m.gpu_instance_id == id)
            .ok_or(code::INVALID_ARGUMENT)?;
        supported(mig.telemetry.as_ref().and_then(|t| t.gpm.as_ref()))
    }
}

impl GpmConfig {
    /// A metric's value, `NOT_SUPPORTED` for metrics the mock does not model.
    pub fn metric(&self, id: u32) -> Result<f64, Ret> {
        match id {
            GPM_GRAPHICS_UTIL => Ok(self.graphics_util_percent),
            GPM_ANY_TENSOR_UTIL => Ok(self.any_tensor_util_percent),
            GPM_DRAM_BW_UTIL => Ok(self.dram_bw_util_percent),
            _ => Err(code::NOT_SUPPORTED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    const GPU: &str = r#"{"name":"NVIDIA H100","uuid":"GPU-0","bus_id":"0:7:0.0","minor":0,"memory_total_bytes":1000,"memory_used_bytes":100,"compute_capability":[9,0],"mig_mode":true"#;

    fn node(dir: &std::path::Path, gpu_tail: &str) -> Result<Node, Box<dyn std::error::Error>> {
        std::fs::write(dir.join("nvidia0"), "")?;
        let text = format!(
            r#"{{"driver_version":"1","cuda_driver_version":12040,"gpus":[{GPU}{gpu_tail}}}]}}"#
        );
        let config: Config = serde_json::from_str(&text)?;
        Ok(Node::new(config, dir)?)
    }

    #[test]
    fn readings_come_from_telemetry_and_absent_ones_are_not_supported()
    -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let gpu = Dev::Gpu(0);
        let ns = Some(code::NOT_SUPPORTED);
        let bare = node(dir.path(), "")?;
        assert_eq!(bare.total_energy(gpu).err(), ns, "case no telemetry");
        assert_eq!(bare.memory_v2(gpu).err(), ns, "case no telemetry v2");
        assert_eq!(bare.gpm(gpu, None).err(), ns, "case no GPM");

        let full = node(
            dir.path(),
            r#","telemetry":{"memory_reserved_bytes":50,"total_energy_millijoules":9,
               "ecc":{"volatile_uncorrected":2},"gpm":{"graphics_util_percent":40.0}},
               "mig_devices":[{"gpu_instance_id":3,"compute_instance_id":0,"uuid":"MIG-0",
               "memory_total_bytes":400,"profile":"1g.10gb",
               "telemetry":{"memory_used_bytes":30,"gpm":{"dram_bw_util_percent":5.0}}}]"#,
        )?;
        let metric = |instance, id| full.gpm(gpu, instance).and_then(|g| g.metric(id));
        type Reading = Result<f64, Ret>;
        let cases: [(&str, Reading, Reading); 8] = [
            ("energy", full.total_energy(gpu).map(|v| v as f64), Ok(9.0)),
            ("ECC", full.ecc_total(gpu, 1, 0).map(|v| v as f64), Ok(2.0)),
            (
                "bad ECC type",
                full.ecc_total(gpu, 2, 0).map(|v| v as f64),
                Err(code::INVALID_ARGUMENT),
            ),
            (
                "absent reading",
                full.pcie_replay(gpu).map(f64::from),
                Err(code::NOT_SUPPORTED),
            ),
            ("GPU GPM", metric(None, GPM_GRAPHICS_UTIL), Ok(40.0)),
            ("GI GPM", metric(Some(3), GPM_DRAM_BW_UTIL), Ok(5.0)),
            (
                "unknown metric",
                metric(Some(3), 99),
                Err(code::NOT_SUPPORTED),
            ),
            (
                "no such GI",
                metric(Some(4), GPM_DRAM_BW_UTIL),
                Err(code::INVALID_ARGUMENT),
            ),
        ];
        for (case, got, want) in cases {
            assert_eq!(got, want, "case {case}");
        }
        assert_eq!(
            full.memory_v2(gpu),
            Ok((1000, 50, 850, 100)),
            "case memory v2"
        );
        let mig = Dev::Mig(0, 0);
        assert_eq!(full.memory(mig), (400, 370, 30), "case MIG memory");
        assert_eq!(full.memory_v2(mig).err(), ns, "case MIG without reserved");
        assert_eq!(
            full.total_energy(mig).err(),
            ns,
            "case MIG device-wide reading"
        );
        Ok(())
    }
}

// SPDX-License-Identifier: Apache-2.0
//! Every DCGM field the exporter can serve: its name (and the other names DCGM has given
//! it), the Prometheus type it has by default, its unit, the NVML call behind it and whether
//! MIG GPU instances have it too. `docs/exporter.md` is the same table in prose.

/// A Prometheus metric type, as dcgm-exporter's CSV spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MetricKind {
    Gauge,
    Counter,
    /// Not a series: the field's value becomes a label on every other series.
    Label,
}

impl MetricKind {
    /// The CSV (and `# TYPE`) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Gauge => "gauge",
            MetricKind::Counter => "counter",
            MetricKind::Label => "label",
        }
    }

    /// The kind a CSV type names, if any.
    pub fn parse(text: &str) -> Option<MetricKind> {
        match text {
            "gauge" => Some(MetricKind::Gauge),
            "counter" => Some(MetricKind::Counter),
            "label" => Some(MetricKind::Label),
            _ => None,
        }
    }
}

/// A DCGM field the exporter serves. Variants are in [`CATALOGUE`] order, so `field as
/// usize` is the field's place there (a test holds the two to it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Field {
    SmClock,
    MemClock,
    ClockThrottleReasons,
    MemoryTemp,
    GpuTemp,
    PowerUsage,
    TotalEnergyConsumption,
    PcieTxThroughput,
    PcieRxThroughput,
    PcieReplayCounter,
    GpuUtil,
    MemCopyUtil,
    EncUtil,
    DecUtil,
    XidErrors,
    FbFree,
    FbUsed,
    FbReserved,
    EccSbeVolTotal,
    EccDbeVolTotal,
    EccSbeAggTotal,
    EccDbeAggTotal,
    RetiredSbe,
    RetiredDbe,
    RetiredPending,
    UncorrectableRemappedRows,
    CorrectableRemappedRows,
    RowRemapFailure,
    NvlinkBandwidthTotal,
    ProfGrEngineActive,
    ProfPipeTensorActive,
    ProfDramActive,
    DriverVersion,
}

/// What the catalogue knows of a [`Field`].
#[derive(Debug, Clone, Copy)]
pub struct FieldInfo {
    pub field: Field,
    /// DCGM's name; the first of `names` is the one this project writes.
    pub names: &'static [&'static str],
    /// The type dcgm-exporter's default CSV gives it.
    pub kind: MetricKind,
    pub unit: &'static str,
    /// Where the value comes from.
    pub source: &'static str,
    /// Whether MIG GPU instances get their own series of it.
    pub per_instance: bool,
}

impl FieldInfo {
    pub fn name(&self) -> &'static str {
        self.names.first().copied().unwrap_or("")
    }
}

macro_rules! catalogue {
    ($($field:ident [$($name:literal),+] $kind:ident $unit:literal $source:literal $inst:literal;)*) => {
        /// Every field, in the order of `default-counters.csv`.
        pub const CATALOGUE: &[FieldInfo] = &[$(FieldInfo {
            field: Field::$field,
            names: &[$($name),+],
            kind: MetricKind::$kind,
            unit: $unit,
            source: $source,
            per_instance: $inst,
        },)*];
    };
}

catalogue! {
    SmClock ["DCGM_FI_DEV_SM_CLOCK"] Gauge "MHz" "nvmlDeviceGetClockInfo(NVML_CLOCK_SM)" false;
    MemClock ["DCGM_FI_DEV_MEM_CLOCK"] Gauge "MHz" "nvmlDeviceGetClockInfo(NVML_CLOCK_MEM)" false;
    ClockThrottleReasons ["DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "DCGM_FI_DEV_CLOCKS_EVENT_REASONS"] Gauge "bit mask" "nvmlDeviceGetCurrentClocksEventReasons (or ...ThrottleReasons)" false;
    MemoryTemp ["DCGM_FI_DEV_MEMORY_TEMP"] Gauge "°C" "nvmlDeviceGetFieldValues(NVML_FI_DEV_MEMORY_TEMP)" false;
    GpuTemp ["DCGM_FI_DEV_GPU_TEMP"] Gauge "°C" "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU)" false;
    PowerUsage ["DCGM_FI_DEV_POWER_USAGE"] Gauge "W" "nvmlDeviceGetPowerUsage / 1000" false;
    TotalEnergyConsumption ["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"] Counter "mJ" "nvmlDeviceGetTotalEnergyConsumption" false;
    PcieTxThroughput ["DCGM_FI_DEV_PCIE_TX_THROUGHPUT"] Counter "KB/s" "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX_BYTES)" false;
    PcieRxThroughput ["DCGM_FI_DEV_PCIE_RX_THROUGHPUT"] Counter "KB/s" "nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_RX_BYTES)" false;
    PcieReplayCounter ["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"] Counter "count" "nvmlDeviceGetPcieReplayCounter" false;
    GpuUtil ["DCGM_FI_DEV_GPU_UTIL"] Gauge "%" "nvmlDeviceGetUtilizationRates .gpu" false;
    MemCopyUtil ["DCGM_FI_DEV_MEM_COPY_UTIL"] Gauge "%" "nvmlDeviceGetUtilizationRates .memory" false;
    EncUtil ["DCGM_FI_DEV_ENC_UTIL"] Gauge "%" "nvmlDeviceGetEncoderUtilization" false;
    DecUtil ["DCGM_FI_DEV_DEC_UTIL"] Gauge "%" "nvmlDeviceGetDecoderUtilization" false;
    XidErrors ["DCGM_FI_DEV_XID_ERRORS"] Gauge "XID" "nvmlEventTypeXidCriticalError events (nvmlEventSetWait_v2)" false;
    FbFree ["DCGM_FI_DEV_FB_FREE"] Gauge "MiB" "nvmlDeviceGetMemoryInfo_v2 .free (or nvmlDeviceGetMemoryInfo)" true;
    FbUsed ["DCGM_FI_DEV_FB_USED"] Gauge "MiB" "nvmlDeviceGetMemoryInfo_v2 .used (or nvmlDeviceGetMemoryInfo)" true;
    FbReserved ["DCGM_FI_DEV_FB_RESERVED"] Gauge "MiB" "nvmlDeviceGetMemoryInfo_v2 .reserved" true;
    EccSbeVolTotal ["DCGM_FI_DEV_ECC_SBE_VOL_TOTAL"] Counter "count" "nvmlDeviceGetTotalEccErrors(CORRECTED, VOLATILE)" false;
    EccDbeVolTotal ["DCGM_FI_DEV_ECC_DBE_VOL_TOTAL"] Counter "count" "nvmlDeviceGetTotalEccErrors(UNCORRECTED, VOLATILE)" false;
    EccSbeAggTotal ["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"] Counter "count" "nvmlDeviceGetTotalEccErrors(CORRECTED, AGGREGATE)" false;
    EccDbeAggTotal ["DCGM_FI_DEV_ECC_DBE_AGG_TOTAL"] Counter "count" "nvmlDeviceGetTotalEccErrors(UNCORRECTED, AGGREGATE)" false;
    RetiredSbe ["DCGM_FI_DEV_RETIRED_SBE"] Counter "pages" "nvmlDeviceGetRetiredPages(MULTIPLE_SINGLE_BIT_ECC_ERRORS)" false;
    RetiredDbe ["DCGM_FI_DEV_RETIRED_DBE"] Counter "pages" "nvmlDeviceGetRetiredPages(DOUBLE_BIT_ECC_ERROR)" false;
    RetiredPending ["DCGM_FI_DEV_RETIRED_PENDING"] Counter "0/1" "nvmlDeviceGetRetiredPagesPendingStatus" false;
    UncorrectableRemappedRows ["DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS"] Counter "rows" "nvmlDeviceGetRemappedRows .uncRows" false;
    CorrectableRemappedRows ["DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS"] Counter "rows" "nvmlDeviceGetRemappedRows .corrRows" false;
    RowRemapFailure ["DCGM_FI_DEV_ROW_REMAP_FAILURE"] Gauge "0/1" "nvmlDeviceGetRemappedRows .failureOccurred" false;
    NvlinkBandwidthTotal ["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"] Counter "counter units" "nvmlDeviceGetFieldValues(NVML_FI_DEV_NVLINK_BANDWIDTH_C0_TOTAL)" false;
    ProfGrEngineActive ["DCGM_FI_PROF_GR_ENGINE_ACTIVE"] Gauge "ratio" "GPM NVML_GPM_METRIC_GRAPHICS_UTIL / 100 (else utilization.gpu / 100)" true;
    ProfPipeTensorActive ["DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"] Gauge "ratio" "GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100 (GPM only)" true;
    ProfDramActive ["DCGM_FI_PROF_DRAM_ACTIVE"] Gauge "ratio" "GPM NVML_GPM_METRIC_DRAM_BW_UTIL / 100 (else utilization.memory / 100)" true;
    DriverVersion ["DCGM_FI_DRIVER_VERSION"] Label "" "nvmlSystemGetDriverVersion" false;
}

/// The field `name` (any of its DCGM names).
pub fn lookup(name: &str) -> Option<&'static FieldInfo> {
    CATALOGUE.iter().find(|info| info.names.contains(&name))
}

/// The catalogue entry of `field`.
pub fn info(field: Field) -> &'static FieldInfo {
    // Entry `field as usize` is `field`'s (a test checks every entry); the search only
    // keeps this total should the two ever drift apart.
    match CATALOGUE.get(field as usize) {
        Some(info) if info.field == field => info,
        _ => CATALOGUE
            .iter()
            .find(|info| info.field == field)
            .unwrap_or(&CATALOGUE[0]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_is_unique_and_found() {
        let mut seen = std::collections::HashSet::new();
        for (at, entry) in CATALOGUE.iter().enumerate() {
            assert_eq!(
                entry.field as usize, at,
                "{:?} is out of place",
                entry.field
            );
            assert_eq!(info(entry.field).field, entry.field, "{:?}", entry.field);
            for name in entry.names {
                assert!(seen.insert(*name), "{name} listed twice");
                assert_eq!(lookup(name).map(|i| i.field), Some(entry.field), "{name}");
            }
        }
        assert!(lookup("DCGM_FI_DEV_NO_SUCH_FIELD").is_none());
    }
}

// SPDX-License-Identifier: Apache-2.0
//! One scrape's readings of a GPU or a MIG GPU instance: [`Readings`], a value (or none)
//! per [`Field`], filled from NVML for the fields in the set only. A reading NVML cannot
//! give (a driver without the function, `NOT_SUPPORTED`, a GPU that fell off the bus) is
//! left empty, never 0. GPM's previous samples ([`GpmTrack`]) live here too.

use std::sync::Arc;

use crate::nvml::{
    Clock, Device, EccCounter, FIELD_MEMORY_TEMPERATURE, FIELD_NVLINK_BANDWIDTH_C0_TOTAL,
    GPM_METRIC_ANY_TENSOR_UTIL, GPM_METRIC_DRAM_BW_UTIL, GPM_METRIC_GRAPHICS_UTIL, GpmSample, Nvml,
    NvmlError, PcieDirection, RetirementCause,
};

use super::catalogue::{CATALOGUE, Field};

/// Bytes in a MiB: DCGM reports framebuffer memory in whole MiB.
const MIB: u64 = 1024 * 1024;

/// A value per field, indexed by the field's place in the catalogue.
#[derive(Debug, Clone)]
pub(super) struct Readings {
    values: Vec<Option<f64>>,
}

impl Readings {
    pub fn new() -> Readings {
        Readings {
            values: vec![None; CATALOGUE.len()],
        }
    }

    pub fn get(&self, field: Field) -> Option<f64> {
        self.values.get(field as usize).copied().flatten()
    }

    pub fn set(&mut self, field: Field, value: Option<f64>) {
        if let Some(slot) = self.values.get_mut(field as usize) {
            *slot = value;
        }
    }
}

/// Which fields a scrape reads.
pub(super) type Wanted<'a> = &'a dyn Fn(Field) -> bool;

fn ok<T>(result: Result<T, NvmlError>) -> Option<T> {
    result.ok()
}

/// Reads the whole-GPU fields of `device` that `wanted` asks for.
pub(super) fn read_gpu(device: &Device<'_>, wanted: Wanted<'_>, out: &mut Readings) {
    let mut put = |field: Field, read: &dyn Fn() -> Option<f64>| {
        if wanted(field) {
            out.set(field, read());
        }
    };
    put(Field::SmClock, &|| {
        ok(device.clock_info(Clock::Sm)).map(f64::from)
    });
    put(Field::MemClock, &|| {
        ok(device.clock_info(Clock::Memory)).map(f64::from)
    });
    put(Field::ClockThrottleReasons, &|| {
        ok(device.clocks_event_reasons()).map(|mask| mask as f64)
    });
    put(Field::GpuTemp, &|| ok(device.temperature()).map(f64::from));
    put(Field::PowerUsage, &|| {
        ok(device.power_usage()).map(|mw| f64::from(mw) / 1000.0)
    });
    put(Field::TotalEnergyConsumption, &|| {
        ok(device.total_energy_consumption()).map(|mj| mj as f64)
    });
    put(Field::PcieTxThroughput, &|| {
        ok(device.pcie_throughput(PcieDirection::Tx)).map(f64::from)
    });
    put(Field::PcieRxThroughput, &|| {
        ok(device.pcie_throughput(PcieDirection::Rx)).map(f64::from)
    });
    put(Field::PcieReplayCounter, &|| {
        ok(device.pcie_replay_counter()).map(f64::from)
    });
    put(Field::EncUtil, &|| {
        ok(device.encoder_utilization()).map(f64::from)
    });
    put(Field::DecUtil, &|| {
        ok(device.decoder_utilization()).map(f64::from)
    });
    let ecc = |uncorrected, aggregate| {
        ok(device.total_ecc_errors(EccCounter {
            uncorrected,
            aggregate,
        }))
        .map(|n| n as f64)
    };
    put(Field::EccSbeVolTotal, &|| ecc(false, false));
    put(Field::EccDbeVolTotal, &|| ecc(true, false));
    put(Field::EccSbeAggTotal, &|| ecc(false, true));
    put(Field::EccDbeAggTotal, &|| ecc(true, true));
    put(Field::RetiredSbe, &|| {
        ok(device.retired_page_count(RetirementCause::SingleBit)).map(f64::from)
    });
    put(Field::RetiredDbe, &|| {
        ok(device.retired_page_count(RetirementCause::DoubleBit)).map(f64::from)
    });
    put(Field::RetiredPending, &|| {
        ok(device.retired_pages_pending()).map(|p| if p { 1.0 } else { 0.0 })
    });
    read_utilization(device, wanted, out);
    read_remapped_rows(device, wanted, out);
    read_field_values(device, wanted, out);
    read_memory(device, wanted, out);
}

fn read_utilization(device: &Device<'_>, wanted: Wanted<'_>, out: &mut Readings) {
    let fields = [
        Field::GpuUtil,
        Field::MemCopyUtil,
        Field::ProfGrEngineActive,
        Field::ProfDramActive,
    ];
    if !fields.iter().any(|f| wanted(*f)) {
        return;
    }
    let Ok(utilization) = device.utilization_rates() else {
        return;
    };
    let (gpu, memory) = (f64::from(utilization.gpu), f64::from(utilization.memory));
    for (field, value) in fields
        .into_iter()
        .zip([gpu, memory, gpu / 100.0, memory / 100.0])
    {
        if wanted(field) {
            out.set(field, Some(value));
        }
    }
}

fn read_remapped_rows(device: &Device<'_>, wanted: Wanted<'_>, out: &mut Readings) {
    let fields = [
        Field::CorrectableRemappedRows,
        Field::UncorrectableRemappedRows,
        Field::RowRemapFailure,
    ];
    if !fields.iter().any(|f| wanted(*f)) {
        return;
    }
    let Ok(rows) = device.remapped_rows() else {
        return;
    };
    let failed = if rows.failed { 1.0 } else { 0.0 };
    let values = [
        f64::from(rows.correctable),
        f64::from(rows.uncorrectable),
        failed,
    ];
    for (field, value) in fields.into_iter().zip(values) {
        if wanted(field) {
            out.set(field, Some(value));
        }
    }
}

fn read_field_values(device: &Device<'_>, wanted: Wanted<'_>, out: &mut Readings) {
    let fields: Vec<(Field, u32)> = [
        (Field::MemoryTemp, FIELD_MEMORY_TEMPERATURE),
        (Field::NvlinkBandwidthTotal, FIELD_NVLINK_BANDWIDTH_C0_TOTAL),
    ]
    .into_iter()
    .filter(|(field, _)| wanted(*field))
    .collect();
    if fields.is_empty() {
        return;
    }
    let ids: Vec<u32> = fields.iter().map(|(_, id)| *id).collect();
    let Ok(values) = device.field_values(&ids) else {
        return;
    };
    for ((field, _), value) in fields.iter().zip(values) {
        out.set(*field, value.ok());
    }
}

/// FB_FREE/USED/RESERVED of a GPU or a MIG device, in MiB: `_v2` where the driver has it
/// (the only source of the reserved size), else the original call.
pub(super) fn read_memory(device: &Device<'_>, wanted: Wanted<'_>, out: &mut Readings) {
    if ![Field::FbFree, Field::FbUsed, Field::FbReserved]
        .iter()
        .any(|f| wanted(*f))
    {
        return;
    }
    let mib = |bytes: u64| Some((bytes / MIB) as f64);
    let (free, used, reserved) = match device.memory_info_v2() {
        Ok(m) => (mib(m.free), mib(m.used), mib(m.reserved)),
        Err(_) => match device.memory_info() {
            Ok(m) => (mib(m.free), mib(m.used), None),
            Err(_) => return,
        },
    };
    for (field, value) in [
        (Field::FbFree, free),
        (Field::FbUsed, used),
        (Field::FbReserved, reserved),
    ] {
        if wanted(field) {
            out.set(field, value);
        }
    }
}

/// The GPM metrics behind the PROF fields, in percent.
const GPM_FIELDS: [(Field, u32); 3] = [
    (Field::ProfGrEngineActive, GPM_METRIC_GRAPHICS_UTIL),
    (Field::ProfPipeTensorActive, GPM_METRIC_ANY_TENSOR_UTIL),
    (Field::ProfDramActive, GPM_METRIC_DRAM_BW_UTIL),
];

/// Whether any GPM-backed field is wanted.
pub(super) fn wants_gpm(wanted: Wanted<'_>) -> bool {
    GPM_FIELDS.iter().any(|(field, _)| wanted(*field))
}

/// GPM of a GPU or one of its GPU instances: the previous sample and a spare to take the
/// next into; each scrape computes the metrics between them and swaps.
pub(super) struct GpmTrack {
    previous: GpmSample,
    next: GpmSample,
    /// The GPU instance id for a MIG instance, `None` for the whole GPU.
    instance: Option<u32>,
}

impl GpmTrack {
    /// Takes the first sample of `device` (the GPU, for an instance too); `None` when GPM
    /// is not there.
    pub fn start(nvml: &Arc<Nvml>, device: &Device<'_>, instance: Option<u32>) -> Option<Self> {
        if !device.gpm_supported().ok()? {
            return None;
        }
        let mut track = GpmTrack {
            previous: GpmSample::new(nvml).ok()?,
            next: GpmSample::new(nvml).ok()?,
            instance,
        };
        let taken = match instance {
            Some(id) => device.gpm_mig_sample(id, &mut track.previous),
            None => device.gpm_sample(&mut track.previous),
        };
        if let Err(error) = taken {
            tracing::debug!(%error, ?instance, "no GPM sample; the PROF fields come from utilization");
            return None;
        }
        Some(track)
    }

    /// Takes a new sample and sets the PROF fields from it and the previous one (ratios).
    pub fn read(
        &mut self,
        nvml: &Nvml,
        device: &Device<'_>,
        wanted: Wanted<'_>,
        out: &mut Readings,
    ) {
        let taken = match self.instance {
            Some(id) => device.gpm_mig_sample(id, &mut self.next),
            None => device.gpm_sample(&mut self.next),
        };
        if let Err(error) = taken {
            tracing::debug!(%error, "GPM sample failed; PROF fields left out of this scrape");
            for (field, _) in GPM_FIELDS {
                out.set(field, None);
            }
            return;
        }
        let ids: Vec<u32> = GPM_FIELDS.iter().map(|(_, id)| *id).collect();
        let values = nvml.gpm_metrics(&self.previous, &self.next, &ids);
        std::mem::swap(&mut self.previous, &mut self.next);
        let values = values.unwrap_or_default();
        for (at, (field, _)) in GPM_FIELDS.iter().enumerate() {
            if wanted(*field) {
                let value = values.get(at).and_then(|v| v.ok()).map(|pct| pct / 100.0);
                out.set(*field, value);
            }
        }
    }
}

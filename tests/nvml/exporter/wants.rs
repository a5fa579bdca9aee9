// SPDX-License-Identifier: Apache-2.0
//! What the default set must give on the node `super` builds: each counter's type and value
//! per GPU and GPU instance, or no series at all.

use super::{GIB, MIB};

/// (metric, type, GPU index, GPU instance, value): every default counter with a value;
/// `None` where that unit must have no series of it.
pub type Want = (
    &'static str,
    &'static str,
    u32,
    Option<(&'static str, u32)>,
    Option<f64>,
);

pub fn default_set_wants() -> Vec<Want> {
    let fb_total_mib = (80 * GIB / MIB) as f64;
    let mut wants: Vec<Want> = vec![
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", 1, None, Some(1410.0)),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 1, None, Some(1593.0)),
        (
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "gauge",
            1,
            None,
            Some(4.0),
        ),
        ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 1, None, Some(41.0)),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", 1, None, Some(35.0)),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", 1, None, Some(123.456)),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            1,
            None,
            Some(123_456_789.0),
        ),
        (
            "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
            "counter",
            1,
            None,
            Some(1000.0),
        ),
        (
            "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
            "counter",
            1,
            None,
            Some(2000.0),
        ),
        (
            "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
            "counter",
            1,
            None,
            Some(3.0),
        ),
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", 1, None, Some(30.0)),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", 1, None, Some(20.0)),
        ("DCGM_FI_DEV_ENC_UTIL", "gauge", 1, None, Some(7.0)),
        ("DCGM_FI_DEV_DEC_UTIL", "gauge", 1, None, Some(9.0)),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", 1, None, Some(79.0)),
        (
            "DCGM_FI_DEV_FB_FREE",
            "gauge",
            1,
            None,
            Some(fb_total_mib - 2048.0 - 512.0),
        ),
        ("DCGM_FI_DEV_FB_USED", "gauge", 1, None, Some(2048.0)),
        ("DCGM_FI_DEV_FB_RESERVED", "gauge", 1, None, Some(512.0)),
        (
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "counter",
            1,
            None,
            Some(1.0),
        ),
        (
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "counter",
            1,
            None,
            Some(2.0),
        ),
        (
            "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
            "counter",
            1,
            None,
            Some(3.0),
        ),
        (
            "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
            "counter",
            1,
            None,
            Some(4.0),
        ),
        ("DCGM_FI_DEV_RETIRED_SBE", "counter", 1, None, Some(5.0)),
        ("DCGM_FI_DEV_RETIRED_DBE", "counter", 1, None, Some(6.0)),
        ("DCGM_FI_DEV_RETIRED_PENDING", "counter", 1, None, Some(1.0)),
        (
            "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
            "counter",
            1,
            None,
            Some(8.0),
        ),
        (
            "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
            "counter",
            1,
            None,
            Some(7.0),
        ),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", 1, None, Some(1.0)),
        (
            "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
            "counter",
            1,
            None,
            Some(4096.0),
        ),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            1,
            None,
            Some(0.25),
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            1,
            None,
            Some(0.125),
        ),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", 1, None, Some(0.5)),
    ];
    // GPU 2: no telemetry and no power sensor, so only the basic readings; without GPM the
    // PROF engine and DRAM fields come from utilization (0 %), the tensor one not at all.
    wants.extend([
        ("DCGM_FI_DEV_SM_CLOCK", "gauge", 2, None, Some(1410.0)),
        ("DCGM_FI_DEV_GPU_TEMP", "gauge", 2, None, Some(35.0)),
        ("DCGM_FI_DEV_POWER_USAGE", "gauge", 2, None, None),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 2, None, None),
        ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 2, None, None),
        (
            "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
            "counter",
            2,
            None,
            None,
        ),
        ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "counter", 2, None, None),
        ("DCGM_FI_DEV_FB_USED", "gauge", 2, None, Some(0.0)),
        ("DCGM_FI_DEV_FB_RESERVED", "gauge", 2, None, None),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", 2, None, Some(0.0)),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", 2, None, Some(0.0)),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", 2, None, None),
    ]);
    // GPU 0, in MIG mode: no utilization, GPM and nothing else; its GPU instances have
    // memory and (GI 1) GPM.
    wants.extend([
        ("DCGM_FI_DEV_GPU_UTIL", "gauge", 0, None, None),
        ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 0, None, None),
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", 0, None, Some(0.4)),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            0,
            None,
            Some(0.0),
        ),
        ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", 0, None, Some(0.6)),
        ("DCGM_FI_DEV_XID_ERRORS", "gauge", 0, None, Some(0.0)),
        (
            "DCGM_FI_DEV_FB_USED",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            Some(1024.0),
        ),
        (
            "DCGM_FI_DEV_FB_FREE",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            Some(9.0 * 1024.0),
        ),
        (
            "DCGM_FI_DEV_FB_RESERVED",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            Some(0.0),
        ),
        (
            "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            Some(0.1),
        ),
        (
            "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            Some(0.2),
        ),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            Some(0.3),
        ),
        (
            "DCGM_FI_DEV_FB_FREE",
            "gauge",
            0,
            Some(("2g.20gb", 2)),
            Some(20.0 * 1024.0),
        ),
        (
            "DCGM_FI_DEV_FB_RESERVED",
            "gauge",
            0,
            Some(("2g.20gb", 2)),
            None,
        ),
        (
            "DCGM_FI_PROF_DRAM_ACTIVE",
            "gauge",
            0,
            Some(("2g.20gb", 2)),
            None,
        ),
        (
            "DCGM_FI_DEV_GPU_TEMP",
            "gauge",
            0,
            Some(("1g.10gb", 1)),
            None,
        ),
    ]);
    wants
}

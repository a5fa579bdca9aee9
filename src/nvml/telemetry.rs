// SPDX-License-Identifier: Apache-2.0
//! What a [`Device`] is doing now: utilisation, temperature, power draw and clocks, as the
//! device plugin's metrics sample them at each scrape. Every call here is optional: a
//! driver that lacks the function reports [`NvmlError::SymbolMissing`], and a GPU that
//! cannot measure something (a MIG device, a GPU in MIG mode, a board without a power
//! sensor) answers `NOT_SUPPORTED`; callers treat both as "no reading".
#![allow(unsafe_code)]

use std::ffi::c_uint;

use super::{Device, NvmlError, ffi};

/// `NVML_TEMPERATURE_GPU`: the GPU die's sensor, the only one `nvml.h` defines.
const TEMPERATURE_GPU: c_uint = 0;

/// `nvmlUtilization_t`, in percent of the driver's last sample period (1/6 s to 1 s,
/// depending on the product).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Utilization {
    /// Time one or more kernels ran on the GPU.
    pub gpu: u32,
    /// Time device memory was read or written.
    pub memory: u32,
}

/// `nvmlClockType_t`: which clock [`Device::clock_info`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Clock {
    /// `NVML_CLOCK_GRAPHICS` (0).
    Graphics,
    /// `NVML_CLOCK_SM` (1): the streaming multiprocessors.
    Sm,
    /// `NVML_CLOCK_MEM` (2).
    Memory,
    /// `NVML_CLOCK_VIDEO` (3).
    Video,
}

impl Clock {
    /// The C enum's value.
    fn raw(self) -> c_uint {
        match self {
            Clock::Graphics => 0,
            Clock::Sm => 1,
            Clock::Memory => 2,
            Clock::Video => 3,
        }
    }
}

impl Device<'_> {
    /// `nvmlDeviceGetUtilizationRates`. `NOT_SUPPORTED` on MIG devices and on GPUs in MIG
    /// mode.
    pub fn utilization_rates(&self) -> Result<Utilization, NvmlError> {
        let raw = self.out(&self.nvml.api.utilization, ffi::Utilization::default())?;
        Ok(Utilization {
            gpu: raw.gpu,
            memory: raw.memory,
        })
    }

    /// `nvmlDeviceGetTemperature` of the GPU die (`NVML_TEMPERATURE_GPU`), in °C.
    pub fn temperature(&self) -> Result<u32, NvmlError> {
        self.enum_out(&self.nvml.api.temperature, TEMPERATURE_GPU)
    }

    /// `nvmlDeviceGetPowerUsage`: the whole board's draw, in milliwatts.
    pub fn power_usage(&self) -> Result<u32, NvmlError> {
        self.out(&self.nvml.api.power_usage, 0)
    }

    /// `nvmlDeviceGetClockInfo`: the current `clock`, in MHz.
    pub fn clock_info(&self, clock: Clock) -> Result<u32, NvmlError> {
        self.enum_out(&self.nvml.api.clock_info, clock.raw())
    }

    /// Calls a getter shaped `(nvmlDevice_t, <enum> which, unsigned int *)`.
    fn enum_out(
        &self,
        sym: &super::Sym<ffi::DeviceEnumUintFn>,
        which: c_uint,
    ) -> Result<u32, NvmlError> {
        let (f, name) = self.nvml.function(sym)?;
        let mut value: c_uint = 0;
        // SAFETY: `value` is a valid out-pointer for the unsigned int the function writes;
        // `which` is one of the enum's defined values (an int-sized C enum).
        let ret = unsafe { f(self.handle, which, &mut value) };
        self.nvml.check(name, ret)?;
        Ok(value)
    }
}

#[cfg(test)]
mod tests {
    use super::Clock;

    #[test]
    fn clock_types_have_nvml_values() {
        let cases = [
            (Clock::Graphics, 0),
            (Clock::Sm, 1),
            (Clock::Memory, 2),
            (Clock::Video, 3),
        ];
        for (clock, want) in cases {
            assert_eq!(clock.raw(), want, "case {clock:?}");
        }
    }
}

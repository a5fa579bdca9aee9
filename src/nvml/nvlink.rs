// SPDX-License-Identifier: Apache-2.0
//! NVLink queries on a [`Device`]: whether a link is up and what sits at its far end. The
//! device plugin's preferred allocation counts the links between GPU pairs from these; the
//! counting itself lives in `inventory::nvlink`, this file only wraps the two C calls.
#![allow(unsafe_code)]

use std::ffi::c_uint;

use super::device::PciInfo;
use super::ffi;
use super::{Device, NvmlError};

/// `NVML_NVLINK_MAX_LINKS` in current headers (18 on Hopper; older headers said 6 or 12).
/// Link numbers run `0..NVLINK_MAX_LINKS`; a GPU with fewer links answers
/// `NVML_ERROR_INVALID_ARGUMENT` (or `NOT_SUPPORTED`) for the ones it lacks.
pub const NVLINK_MAX_LINKS: u32 = 18;

/// `NVML_FEATURE_ENABLED`.
const FEATURE_ENABLED: c_uint = 1;

impl Device<'_> {
    /// `nvmlDeviceGetNvLinkState`: whether `link` is active. `NOT_SUPPORTED` on GPUs
    /// without NVLink (and on MIG devices).
    pub fn nvlink_state(&self, link: u32) -> Result<bool, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.nvlink_state)?;
        let mut state: c_uint = 0;
        // SAFETY: `state` is a valid out-pointer for the int-sized nvmlEnableState_t.
        let ret = unsafe { f(self.handle, link, &mut state) };
        self.nvml.check(name, ret)?;
        Ok(state == FEATURE_ENABLED)
    }

    /// `nvmlDeviceGetNvLinkRemotePciInfo_v2`: the PCI address of the device at the other
    /// end of `link` (another GPU, or an NVSwitch).
    pub fn nvlink_remote_pci_info(&self, link: u32) -> Result<PciInfo, NvmlError> {
        let (f, name) = self.nvml.function(&self.nvml.api.nvlink_remote_pci)?;
        let mut raw = ffi::PciInfo::default();
        // SAFETY: `raw` is a valid nvmlPciInfo_t in the `_v2` layout the function fills
        // (layout-checked in `ffi`).
        let ret = unsafe { f(self.handle, link, &mut raw) };
        self.nvml.check(name, ret)?;
        Ok(PciInfo::from_raw(&raw))
    }
}

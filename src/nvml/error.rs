// SPDX-License-Identifier: Apache-2.0
//! NVML's return codes ([`Return`]) and this module's error type ([`NvmlError`]). Pure data:
//! no `unsafe`, no calls into the library.

use std::fmt;
use std::path::PathBuf;

macro_rules! returns {
    ($($(#[$doc:meta])* $variant:ident = $value:literal => $cname:literal,)*) => {
        /// NVML's `nvmlReturn_t`, with the values of `nvml.h`.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Return {
            $($(#[$doc])* $variant,)*
            /// A code this crate does not know (a newer driver's).
            Other(u32),
        }

        impl Return {
            /// The typed code for a raw `nvmlReturn_t`.
            pub fn from_raw(raw: u32) -> Return {
                match raw {
                    $($value => Return::$variant,)*
                    other => Return::Other(other),
                }
            }

            /// The raw `nvmlReturn_t` value.
            pub fn raw(self) -> u32 {
                match self {
                    $(Return::$variant => $value,)*
                    Return::Other(raw) => raw,
                }
            }

            /// The C constant's name, e.g. `NVML_ERROR_NOT_FOUND`; `None` for [`Return::Other`].
            pub fn c_name(self) -> Option<&'static str> {
                match self {
                    $(Return::$variant => Some($cname),)*
                    Return::Other(_) => None,
                }
            }
        }
    };
}

returns! {
    Success = 0 => "NVML_SUCCESS",
    Uninitialized = 1 => "NVML_ERROR_UNINITIALIZED",
    InvalidArgument = 2 => "NVML_ERROR_INVALID_ARGUMENT",
    NotSupported = 3 => "NVML_ERROR_NOT_SUPPORTED",
    NoPermission = 4 => "NVML_ERROR_NO_PERMISSION",
    AlreadyInitialized = 5 => "NVML_ERROR_ALREADY_INITIALIZED",
    NotFound = 6 => "NVML_ERROR_NOT_FOUND",
    InsufficientSize = 7 => "NVML_ERROR_INSUFFICIENT_SIZE",
    InsufficientPower = 8 => "NVML_ERROR_INSUFFICIENT_POWER",
    DriverNotLoaded = 9 => "NVML_ERROR_DRIVER_NOT_LOADED",
    Timeout = 10 => "NVML_ERROR_TIMEOUT",
    IrqIssue = 11 => "NVML_ERROR_IRQ_ISSUE",
    LibraryNotFound = 12 => "NVML_ERROR_LIBRARY_NOT_FOUND",
    FunctionNotFound = 13 => "NVML_ERROR_FUNCTION_NOT_FOUND",
    CorruptedInforom = 14 => "NVML_ERROR_CORRUPTED_INFOROM",
    GpuIsLost = 15 => "NVML_ERROR_GPU_IS_LOST",
    ResetRequired = 16 => "NVML_ERROR_RESET_REQUIRED",
    OperatingSystem = 17 => "NVML_ERROR_OPERATING_SYSTEM",
    LibRmVersionMismatch = 18 => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
    InUse = 19 => "NVML_ERROR_IN_USE",
    Memory = 20 => "NVML_ERROR_MEMORY",
    NoData = 21 => "NVML_ERROR_NO_DATA",
    /// `NVML_ERROR_VGPU_ECC_NOT_SUPPORTED` in `nvml.h`.
    VgpuEccNotSupported = 22 => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
    InsufficientResources = 23 => "NVML_ERROR_INSUFFICIENT_RESOURCES",
    FreqNotSupported = 24 => "NVML_ERROR_FREQ_NOT_SUPPORTED",
    ArgumentVersionMismatch = 25 => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    Deprecated = 26 => "NVML_ERROR_DEPRECATED",
    NotReady = 27 => "NVML_ERROR_NOT_READY",
    GpuNotFound = 28 => "NVML_ERROR_GPU_NOT_FOUND",
    InvalidState = 29 => "NVML_ERROR_INVALID_STATE",
    Unknown = 999 => "NVML_ERROR_UNKNOWN",
}

impl fmt::Display for Return {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.c_name() {
            Some(name) => f.write_str(name),
            None => write!(f, "nvmlReturn_t {}", self.raw()),
        }
    }
}

/// Why loading NVML, or a call into it, failed.
#[derive(Debug, thiserror::Error)]
pub enum NvmlError {
    /// `dlopen` failed: no such file, wrong architecture, unresolved dependencies.
    #[error("cannot load the NVML library {}: {}", library.display(), dl_reason(source))]
    Open {
        library: PathBuf,
        #[source]
        source: libloading::Error,
    },
    /// The library lacks a function we need (an old driver, or not NVML at all).
    #[error("the NVML library {} has no function {name} (driver too old, or not libnvidia-ml?)", library.display())]
    SymbolMissing {
        library: PathBuf,
        name: &'static str,
    },
    /// An NVML call returned an error; `message` is NVML's own `nvmlErrorString` text.
    #[error("{function} failed: {message} ({code})")]
    Call {
        function: &'static str,
        code: Return,
        message: String,
    },
    /// A UUID with an interior NUL cannot be passed to C.
    #[error("invalid GPU UUID {uuid:?}: it contains a NUL byte")]
    InvalidUuid { uuid: String },
}

impl NvmlError {
    /// The NVML code of a failed call, `None` for load errors.
    pub fn code(&self) -> Option<Return> {
        match self {
            NvmlError::Call { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// True when the driver cannot answer this query on this device: the call returned
    /// `NOT_SUPPORTED`, or the library predates the function.
    pub fn is_not_supported(&self) -> bool {
        matches!(
            self,
            NvmlError::SymbolMissing { .. }
                | NvmlError::Call {
                    code: Return::NotSupported | Return::FunctionNotFound,
                    ..
                }
        )
    }
}

/// libloading 0.9 keeps `dlerror()`'s text in the error's source; the message alone only
/// says "dlopen failed".
fn dl_reason(error: &libloading::Error) -> String {
    match std::error::Error::source(error) {
        Some(source) => format!("{error}: {source}"),
        None => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn return_codes_round_trip() {
        let cases = [
            (0, Return::Success, "NVML_SUCCESS"),
            (2, Return::InvalidArgument, "NVML_ERROR_INVALID_ARGUMENT"),
            (9, Return::DriverNotLoaded, "NVML_ERROR_DRIVER_NOT_LOADED"),
            (10, Return::Timeout, "NVML_ERROR_TIMEOUT"),
            (29, Return::InvalidState, "NVML_ERROR_INVALID_STATE"),
            (999, Return::Unknown, "NVML_ERROR_UNKNOWN"),
        ];
        for (raw, code, name) in cases {
            assert_eq!(Return::from_raw(raw), code, "case {name}");
            assert_eq!(code.raw(), raw, "case {name}");
            assert_eq!(code.to_string(), name, "case {name}");
        }
        assert_eq!(Return::from_raw(30), Return::Other(30));
        assert_eq!(Return::Other(30).to_string(), "nvmlReturn_t 30");
    }
}

//! The config file's enum values (`mode`, `log-level`, `cuda-compat-mode`): each is one
//! of a fixed set of words, and a word outside the set is an [`UnknownValue`] naming it
//! and the valid set.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer};
use serde::{Deserialize, Serialize, Serializer};

use crate::request::Quoted;

/// A config value that is not one of the valid words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown value {value} (valid: {})", valid.join(", "))]
pub struct UnknownValue {
    pub value: Quoted,
    pub valid: &'static [&'static str],
}

/// An enum spelled as one of a fixed set of words in the file.
pub(super) trait Words: Sized + Copy + PartialEq + 'static {
    /// Every accepted spelling; the first one listed for a value is how it is written.
    const WORDS: &'static [(&'static str, Self)];
    /// The spellings, in the same order, for error messages.
    const VALID: &'static [&'static str];
    /// Whether upper case is accepted too.
    const ANY_CASE: bool = false;

    fn word(self) -> &'static str {
        Self::WORDS
            .iter()
            .find(|(_, v)| *v == self)
            .map_or("", |(w, _)| w)
    }

    fn from_word(word: &str) -> Result<Self, UnknownValue> {
        Self::WORDS
            .iter()
            .find(|(w, _)| {
                if Self::ANY_CASE {
                    w.eq_ignore_ascii_case(word)
                } else {
                    *w == word
                }
            })
            .map(|(_, v)| *v)
            .ok_or_else(|| UnknownValue {
                value: Quoted::new(word),
                valid: Self::VALID,
            })
    }
}

/// Implements `as_str`, `FromStr`, `Display`, `Serialize` and `Deserialize` for a
/// [`Words`] enum; the deserialize error names the value and the valid set.
macro_rules! words_impls {
    ($ty:ty) => {
        impl $ty {
            /// How the value is written in the file.
            pub fn as_str(self) -> &'static str {
                self.word()
            }
        }
        impl FromStr for $ty {
            type Err = UnknownValue;
            fn from_str(s: &str) -> Result<Self, Self::Err> {
                Self::from_word(s)
            }
        }
        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.word())
            }
        }
        impl Serialize for $ty {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.word())
            }
        }
        impl<'de> Deserialize<'de> for $ty {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let word = String::deserialize(d)?;
                Self::from_word(&word).map_err(de::Error::custom)
            }
        }
    };
}

/// `nvidia-container-runtime.mode`: how a container's devices are injected.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Chosen per container and platform (NVIDIA's runtime: `cdi` for fully qualified
    /// CDI names, else `csv` on Tegra, else `jit-cdi`).
    Auto,
    /// A prestart hook that runs `nvidia-container-cli`.
    Legacy,
    /// Devices from CDI specs on disk.
    Cdi,
    /// CDI specs generated in memory for each container.
    JitCdi,
    /// Tegra/Jetson mount lists.
    Csv,
}

impl Words for Mode {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("auto", Self::Auto),
        ("legacy", Self::Legacy),
        ("cdi", Self::Cdi),
        ("jit-cdi", Self::JitCdi),
        ("csv", Self::Csv),
    ];
    const VALID: &'static [&'static str] = &["auto", "legacy", "cdi", "jit-cdi", "csv"];
}
words_impls!(Mode);

/// `nvidia-container-runtime.log-level`. NVIDIA's logger also accepts `warning`
/// (= `warn`) and `fatal` and `panic` (both = `error` here: we have no levels above
/// it), in any case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LogLevel {
    Trace,
    Debug,
    Info,
    Warn,
    Error,
}

impl Words for LogLevel {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("trace", Self::Trace),
        ("debug", Self::Debug),
        ("info", Self::Info),
        ("warn", Self::Warn),
        ("error", Self::Error),
        ("warning", Self::Warn),
        ("fatal", Self::Error),
        ("panic", Self::Error),
    ];
    const VALID: &'static [&'static str] = &[
        "trace", "debug", "info", "warn", "error", "warning", "fatal", "panic",
    ];
    const ANY_CASE: bool = true;
}
words_impls!(LogLevel);

impl From<LogLevel> for tracing::Level {
    fn from(level: LogLevel) -> Self {
        match level {
            LogLevel::Trace => Self::TRACE,
            LogLevel::Debug => Self::DEBUG,
            LogLevel::Info => Self::INFO,
            LogLevel::Warn => Self::WARN,
            LogLevel::Error => Self::ERROR,
        }
    }
}

/// `nvidia-container-runtime.modes.legacy.cuda-compat-mode`: how the legacy path makes
/// an image's CUDA forward-compat libraries usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CudaCompatMode {
    /// Add the compat directory to the container's ldconfig run.
    Ldconfig,
    /// Bind-mount the compat libraries over the driver's.
    Mount,
    /// The `enable-cuda-compat` createContainer hook does it.
    Hook,
    /// Do nothing.
    Disabled,
}

impl Words for CudaCompatMode {
    const WORDS: &'static [(&'static str, Self)] = &[
        ("ldconfig", Self::Ldconfig),
        ("mount", Self::Mount),
        ("hook", Self::Hook),
        ("disabled", Self::Disabled),
    ];
    const VALID: &'static [&'static str] = &["ldconfig", "mount", "hook", "disabled"];
}
words_impls!(CudaCompatMode);

/// `nvshim.driver-mounts`: how the runtime mounts the driver's read-only files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DriverMounts {
    /// One bind of a host staging directory, symlinks at the usual paths
    /// (`crate::driver_stage`).
    Staged,
    /// One bind mount per file, as NVIDIA's runtime does.
    PerFile,
}

impl Words for DriverMounts {
    const WORDS: &'static [(&'static str, Self)] =
        &[("staged", Self::Staged), ("per-file", Self::PerFile)];
    const VALID: &'static [&'static str] = &["staged", "per-file"];
}
words_impls!(DriverMounts);

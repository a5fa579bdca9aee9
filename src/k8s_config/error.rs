// SPDX-License-Identifier: Apache-2.0
//! [`K8sConfigError`]: a bad value of the shared config file's types, or a bad file. Each
//! variant quotes the bad value and, where there is one, the valid set; file errors carry
//! the file path and the line of the offending node.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Where in a config file something is: the path and, when known, the 1-based line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileSpot {
    pub path: PathBuf,
    /// 0 when the parser could not tell.
    pub line: u64,
}

impl fmt::Display for FileSpot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}", self.path.display())
        } else {
            write!(f, "{}:{}", self.path.display(), self.line)
        }
    }
}

/// Go's `strconv.ParseBool` spellings, which NVIDIA's flags and env vars accept.
pub const BOOL_SPELLINGS: &str = "1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False";

/// Why a value or the config file could not be read.
#[derive(Debug, thiserror::Error)]
pub enum K8sConfigError {
    #[error("unknown MIG strategy {value:?} (valid: none, single, mixed)")]
    MigStrategy { value: String },
    #[error(
        "unknown device list strategy {value:?} (valid: envvar, volume-mounts, cdi-annotations, cdi-cri)"
    )]
    DeviceListStrategy { value: String },
    #[error("unknown device id strategy {value:?} (valid: uuid, index)")]
    DeviceIdStrategy { value: String },
    #[error("unknown device discovery strategy {value:?} (valid: auto, nvml)")]
    DiscoveryStrategy { value: String },
    /// One of NVIDIA's strategies that nvshim does not implement yet.
    #[error(
        "device discovery strategy {value:?} is not supported by nvshim yet (valid: auto, nvml)"
    )]
    DiscoveryNotYet { value: String },
    #[error("{value:?} is not a boolean (valid: {BOOL_SPELLINGS})")]
    Bool { value: String },
    #[error(
        "{origin}: empty device list strategy (valid: envvar, volume-mounts, cdi-annotations, cdi-cri)"
    )]
    NoDeviceListStrategy { origin: String },

    #[error("cannot read device plugin config file {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Not YAML (or JSON), an unknown key, or a value of the wrong type: the parser's
    /// message, which carries the line and column.
    #[error("device plugin config file {}: {message}", path.display())]
    Syntax { path: PathBuf, message: String },
    #[error("{at}: unsupported config version {value:?} (valid: v1)")]
    Version { at: FileSpot, value: String },
    /// A bad value for a known key; `key` is its dotted path.
    #[error("{at}: {key}: {source}")]
    FileValue {
        at: FileSpot,
        key: &'static str,
        #[source]
        source: Box<K8sConfigError>,
    },
    #[error(
        "{at}: flags.plugin.sharedDevicesAllocationPolicy: {value:?} is not supported by nvshim (valid: distributed)"
    )]
    AllocationPolicy { at: FileSpot, value: String },
    #[error(
        "{at}: imex.channelIDs: {value} is not a valid channel list (valid: [] or [0], as in NVIDIA's plugin)"
    )]
    ImexChannels { at: FileSpot, value: String },
    #[error(
        "{at}: resources: resource renaming is not supported (NVIDIA's plugin disables it too); remove the key"
    )]
    ResourceNaming { at: FileSpot },
    #[error(
        "{at}: sharing.timeSlicing and sharing.mps ({mps}) are both set; a resource is shared one way (NVIDIA's plugin silently uses sharing.mps): remove one"
    )]
    BothSharing { at: FileSpot, mps: FileSpot },
    #[error("{at}: {key}.resources is empty (list at least one resource to share)")]
    NoSharedResources { at: FileSpot, key: &'static str },
    /// `valid` lists what the sharing kind can share: MPS cannot share MIG devices.
    #[error("{at}: {key}.resources: cannot share {name:?} (valid: {valid})")]
    SharedResourceName {
        at: FileSpot,
        key: &'static str,
        name: String,
        valid: &'static str,
    },
    #[error("{at}: {key}.resources: {name:?} is listed twice")]
    DuplicateSharedResource {
        at: FileSpot,
        key: &'static str,
        name: String,
    },
    #[error(
        "{at}: {key}.resources: {name:?}: replicas {replicas} is out of range (valid: 2 to {})",
        u32::MAX
    )]
    Replicas {
        at: FileSpot,
        key: &'static str,
        name: String,
        replicas: i64,
    },
    #[error(
        "{at}: {key}.resources: {name:?}: nvshim supports only `devices: all` (NVIDIA's plugin ignores other values)"
    )]
    SharedDevices {
        at: FileSpot,
        key: &'static str,
        name: String,
    },
    #[error(
        "{at}: {key}.resources: {name:?}: rename {rename:?} is not supported by nvshim, which has no per-resource rename (use renameByDefault)"
    )]
    Rename {
        at: FileSpot,
        key: &'static str,
        name: String,
        rename: String,
    },
    #[error("{at}: flags.mpsRoot: {value:?} is not an absolute path")]
    MpsRootRelative { at: FileSpot, value: String },
}

// SPDX-License-Identifier: Apache-2.0
//! A GPU's live readings: utilisation, temperature, power, SM clock and memory used, as
//! the device plugin's metrics sample them.
//!
//! The rest of the node is fixed at `nvmlInit`, but readings change while a process runs,
//! so tests must be able to change them under a running plugin: before each reading the
//! mock compares the config file's inode, size and modification time with what it last
//! read (one `stat`, cheap next to the event-file read every call already does) and, when
//! they differ, takes the new readings of the GPUs it already reports (matched by UUID).
//! Nothing else is re-read: GPUs, MIG devices and NVLinks stay as they were at init. A
//! file that does not parse (say, caught half-written) is reported on stderr and the old
//! readings are kept until it changes again.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::state::{CONFIG_ENV, Dev, Node, Ret, code};

/// `NVML_TEMPERATURE_GPU`, the only sensor nvml.h defines.
pub const TEMPERATURE_GPU: u32 = 0;
/// `NVML_CLOCK_GRAPHICS`, `NVML_CLOCK_SM`, `NVML_CLOCK_MEM`, `NVML_CLOCK_VIDEO`.
pub const CLOCK_GRAPHICS: u32 = 0;
pub const CLOCK_SM: u32 = 1;
pub const CLOCK_MEM: u32 = 2;
pub const CLOCK_VIDEO: u32 = 3;

/// Which version of a file was read: it changes when the file is rewritten in place or
/// replaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Stamp {
    inode: u64,
    len: u64,
    modified: (i64, i64),
}

impl Stamp {
    fn of(path: &Path) -> Option<Stamp> {
        let meta = std::fs::metadata(path).ok()?;
        Some(Stamp {
            inode: meta.ino(),
            len: meta.len(),
            modified: (meta.mtime(), meta.mtime_nsec()),
        })
    }
}

/// The config file a node came from, and the version of it last read.
#[derive(Debug, Clone)]
pub struct ConfigFile {
    path: PathBuf,
    stamp: Option<Stamp>,
}

impl ConfigFile {
    /// Reads and parses the config at `path`; the error says why it cannot be used.
    pub fn read(path: &Path) -> Result<(Config, ConfigFile), String> {
        // Stamped before reading: a write racing the read shows up as a change next time.
        let stamp = Stamp::of(path);
        let text = std::fs::read_to_string(path).map_err(|error| {
            format!("cannot read {CONFIG_ENV} file {}: {error}", path.display())
        })?;
        let config: Config = serde_json::from_str(&text)
            .map_err(|error| format!("invalid {CONFIG_ENV} file {}: {error}", path.display()))?;
        let file = ConfigFile {
            path: path.to_path_buf(),
            stamp,
        };
        Ok((config, file))
    }
}

impl Node {
    /// Takes the GPUs' readings from the config file again if it has changed since it was
    /// last read.
    pub fn refresh_readings(&mut self) {
        let Some(file) = self.config_file.as_mut() else {
            return;
        };
        let now = Stamp::of(&file.path);
        if now == file.stamp {
            return;
        }
        let config = match ConfigFile::read(&file.path) {
            Ok((config, fresh)) => {
                *file = fresh;
                config
            }
            Err(why) => {
                file.stamp = now;
                eprintln!("nvshim-mock-nvml: keeping the old GPU readings: {why}");
                return;
            }
        };
        for gpu in &mut self.gpus {
            let Some(new) = config.gpus.iter().find(|g| g.uuid == gpu.config.uuid) else {
                continue;
            };
            let old = &mut gpu.config;
            old.memory_used_bytes = new.memory_used_bytes;
            old.utilization_gpu_percent = new.utilization_gpu_percent;
            old.utilization_memory_percent = new.utilization_memory_percent;
            old.temperature_celsius = new.temperature_celsius;
            old.power_milliwatts = new.power_milliwatts;
            old.sm_clock_mhz = new.sm_clock_mhz;
            old.telemetry = new.telemetry.clone();
            for (mig, fresh) in old.mig_devices.iter_mut().zip(&new.mig_devices) {
                if mig.uuid == fresh.uuid {
                    mig.telemetry = fresh.telemetry.clone();
                }
            }
        }
    }

    /// `nvmlDeviceGetUtilizationRates`: `(gpu, memory)` percent. Like a real GPU, MIG
    /// devices and GPUs in MIG mode cannot report it.
    pub fn utilization(&self, dev: Dev) -> Result<(u32, u32), Ret> {
        let config = &self.whole_gpu(dev)?.config;
        if config.mig_mode {
            return Err(code::NOT_SUPPORTED);
        }
        match (
            config.utilization_gpu_percent,
            config.utilization_memory_percent,
        ) {
            (Some(gpu), Some(memory)) => Ok((gpu, memory)),
            _ => Err(code::NOT_SUPPORTED),
        }
    }

    /// `nvmlDeviceGetTemperature`: only the GPU sensor exists.
    pub fn temperature(&self, dev: Dev, sensor: u32) -> Result<u32, Ret> {
        if sensor != TEMPERATURE_GPU {
            return Err(code::INVALID_ARGUMENT);
        }
        supported(self.whole_gpu(dev)?.config.temperature_celsius)
    }

    /// `nvmlDeviceGetPowerUsage`, milliwatts.
    pub fn power(&self, dev: Dev) -> Result<u32, Ret> {
        supported(self.whole_gpu(dev)?.config.power_milliwatts)
    }

    /// `nvmlDeviceGetClockInfo`: the graphics and SM clocks read `sm_clock_mhz`; the mock
    /// has no memory or video clock.
    pub fn clock(&self, dev: Dev, clock_type: u32) -> Result<u32, Ret> {
        let config = &self.whole_gpu(dev)?.config;
        match clock_type {
            CLOCK_GRAPHICS | CLOCK_SM => supported(config.sm_clock_mhz),
            // The memory clock is a `telemetry` reading (`telemetry.rs`).
            CLOCK_MEM => self.memory_clock(dev),
            CLOCK_VIDEO => Err(code::NOT_SUPPORTED),
            _ => Err(code::INVALID_ARGUMENT),
        }
    }

    /// The GPU behind `dev`; readings are per board, so a MIG device has none.
    fn whole_gpu(&self, dev: Dev) -> Result<&crate::state::Gpu, Ret> {
        match dev {
            Dev::Gpu(_) => Ok(self.gpu(dev)),
            Dev::Mig(..) => Err(code::NOT_SUPPORTED),
        }
    }
}

fn supported(reading: Option<u32>) -> Result<u32, Ret> {
    reading.ok_or(code::NOT_SUPPORTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GPU: &str = r#"{"name":"NVIDIA A100-SXM4-80GB","uuid":"GPU-0","bus_id":"0:7:0.0","minor":0,"memory_total_bytes":1000,"compute_capability":[8,0],"mig_mode":false"#;

    fn config(readings: &str) -> String {
        format!(
            r#"{{"driver_version":"1","cuda_driver_version":12040,"gpus":[{GPU}{readings}}}]}}"#
        )
    }

    fn node(dir: &Path, readings: &str) -> Result<Node, Box<dyn std::error::Error>> {
        std::fs::write(dir.join("nvidia0"), "")?;
        let path = dir.join("config.json");
        std::fs::write(&path, config(readings))?;
        let (config, file) = ConfigFile::read(&path)?;
        let mut node = Node::new(config, dir)?;
        node.config_file = Some(file);
        Ok(node)
    }

    #[test]
    fn readings_have_defaults_and_null_is_not_supported() -> Result<(), Box<dyn std::error::Error>>
    {
        let dir = tempfile::tempdir()?;
        let gpu = Dev::Gpu(0);
        let defaults = node(dir.path(), "")?;
        assert_eq!(defaults.utilization(gpu), Ok((0, 0)), "case utilization");
        assert_eq!(defaults.temperature(gpu, 0), Ok(35), "case temperature");
        assert_eq!(defaults.power(gpu), Ok(60_000), "case power");
        assert_eq!(defaults.clock(gpu, CLOCK_SM), Ok(1410), "case SM clock");
        assert_eq!(defaults.clock(gpu, CLOCK_MEM), Err(code::NOT_SUPPORTED));
        assert_eq!(defaults.clock(gpu, 9), Err(code::INVALID_ARGUMENT));
        assert_eq!(defaults.temperature(gpu, 1), Err(code::INVALID_ARGUMENT));

        let nulls = node(
            dir.path(),
            r#","power_milliwatts":null,"utilization_memory_percent":null"#,
        )?;
        assert_eq!(
            nulls.power(gpu),
            Err(code::NOT_SUPPORTED),
            "case null power"
        );
        assert_eq!(nulls.utilization(gpu), Err(code::NOT_SUPPORTED));
        assert_eq!(nulls.temperature(gpu, 0), Ok(35), "case others stay");
        Ok(())
    }

    #[test]
    fn readings_follow_the_config_file() -> Result<(), Box<dyn std::error::Error>> {
        let dir = tempfile::tempdir()?;
        let gpu = Dev::Gpu(0);
        let mut node = node(dir.path(), r#","temperature_celsius":40"#)?;
        let path = dir.path().join("config.json");
        std::fs::write(
            &path,
            config(
                r#","temperature_celsius":81,"memory_used_bytes":250,"utilization_gpu_percent":97"#,
            ),
        )?;
        node.refresh_readings();
        assert_eq!(node.temperature(gpu, 0), Ok(81), "case temperature");
        assert_eq!(node.utilization(gpu), Ok((97, 0)), "case utilization");
        assert_eq!(node.memory(gpu), (1000, 750, 250), "case memory");

        // A broken file keeps the old readings; the next good one is taken.
        std::fs::write(&path, "{")?;
        node.refresh_readings();
        assert_eq!(node.temperature(gpu, 0), Ok(81), "case broken file");
        std::fs::write(&path, config(r#","temperature_celsius":50"#))?;
        node.refresh_readings();
        assert_eq!(node.temperature(gpu, 0), Ok(50), "case fixed file");
        Ok(())
    }
}

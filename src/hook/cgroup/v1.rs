//! cgroup v1 device access: one `c <major>:<minor> rwm` line per device, written to
//! the container's `devices.allow`, each in its own `write` (the kernel parses one
//! rule per write).

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;

use super::{CgroupError, CharDevice};

/// The rule text for one device.
pub fn rule(device: CharDevice) -> String {
    format!("c {}:{} rwm", device.major, device.minor)
}

/// Allows `devices` in the v1 devices cgroup directory `dir`.
pub fn grant(dir: &Path, devices: &[CharDevice]) -> Result<(), CgroupError> {
    let path = dir.join("devices.allow");
    let mut file = OpenOptions::new()
        .write(true)
        .open(&path)
        .map_err(|source| CgroupError::Open {
            path: path.clone(),
            source,
        })?;
    for device in devices {
        let rule = rule(*device);
        file.write_all(rule.as_bytes())
            .map_err(|source| CgroupError::V1 {
                path: path.clone(),
                rule: rule.clone(),
                source,
            })?;
        tracing::debug!(path = %path.display(), %rule, "device cgroup rule");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_and_writes() {
        assert_eq!(
            rule(CharDevice {
                major: 195,
                minor: 255
            }),
            "c 195:255 rwm"
        );
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("devices.allow"), "").unwrap();
        grant(
            tmp.path(),
            &[CharDevice {
                major: 195,
                minor: 1,
            }],
        )
        .unwrap();
        assert_eq!(
            std::fs::read_to_string(tmp.path().join("devices.allow")).unwrap(),
            "c 195:1 rwm"
        );
        let missing = grant(&tmp.path().join("nope"), &[]);
        assert!(matches!(missing, Err(CgroupError::Open { .. })));
    }
}

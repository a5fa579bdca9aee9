//! The driver's `proc/driver/nvidia/params`: whether NVML may create device nodes
//! (`ModifyDeviceFiles: 1`, the driver's default), and the copy that says it may not,
//! which `hook::params` puts over the container's file.

/// Where the driver's parameters are, in a container and under the host's proc root.
pub const PARAMS: &str = "proc/driver/nvidia/params";

const ON: &str = "ModifyDeviceFiles: 1";
const OFF: &str = "ModifyDeviceFiles: 0";

/// Whether `params` (the driver's params file) lets NVML create device nodes.
pub fn modifies_device_files(params: &str) -> bool {
    params.lines().any(|l| l.trim_end() == ON)
}

/// `params` with device-file creation turned off; `None` when it already is.
pub fn disabled(params: &str) -> Option<String> {
    if !modifies_device_files(params) {
        return None;
    }
    let mut out = String::with_capacity(params.len());
    for line in params.split_inclusive('\n') {
        let text = line.trim_end();
        if text == ON {
            out.push_str(OFF);
            out.push_str(&line[text.len()..]);
        } else {
            out.push_str(line);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARAMS_TEXT: &str =
        "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 1\nDeviceFileUID: 0\n";

    #[test]
    fn only_the_modify_line_changes() {
        let out = disabled(PARAMS_TEXT).unwrap();
        assert_eq!(
            out,
            "ResmanDebugLevel: 4294967295\nModifyDeviceFiles: 0\nDeviceFileUID: 0\n"
        );
        assert!(!modifies_device_files(&out));
        assert_eq!(disabled(&out), None, "already off");
        assert_eq!(disabled(""), None, "empty");
        assert_eq!(
            disabled("ModifyDeviceFiles: 1").as_deref(),
            Some("ModifyDeviceFiles: 0"),
            "no final newline"
        );
        assert!(!modifies_device_files("ModifyDeviceFiles: 10\n"));
    }
}

//! Device-visibility attacks (`docs/security.md`):
//! - S11: any unprivileged pod can set `NVIDIA_VISIBLE_DEVICES=all` (NGC images ship
//!   it) and get every GPU behind the scheduler's back. With
//!   `accept-nvidia-visible-devices-envvar-when-unprivileged = false` such a container
//!   gets no GPU through our runtime, our prestart hook or a CDI name in the variable
//!   (no `/dev/nvidia*`, no driver files, `config.json` byte for byte as written),
//!   while a privileged one (`CAP_SYS_ADMIN` in the bounding set) still does;
//! - S12: without `ModifyDeviceFiles: 0` in `/proc/driver/nvidia/params`, NVML in the
//!   container `mknod`s `/dev/nvidia<N>` for GPUs it was not given. NVIDIA mounts a
//!   copy of the host's params with that line set to 0 over the container's file;
//!   so do we (`hook::params`). `tests/runtime/driver_params.rs` checks it on the simulated
//!   node, with a driver directory put into the container's procfs by the test; the
//!   test here reads the real driver's file and runs on a GPU host only.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;

use crate::harness::{Job, Lab, Via, nvidia_nodes};
use serde_json::json;

const NO_ENV_FROM_UNPRIVILEGED: &str =
    "accept-nvidia-visible-devices-envvar-when-unprivileged = false";

#[test]
fn s11_unprivileged_env_request_gets_no_gpu_when_the_config_says_so() {
    let lab = Lab::build();
    let script = "ls /dev; echo ---; for p in /usr/bin/nvidia-smi /usr/lib/x86_64-linux-gnu/libcuda.so.1; \
                  do test -e $p && echo \"present $p\"; done; true";
    for via in Via::ALL {
        for value in ["all", "0", "nvidia.com/gpu=all"] {
            if value.contains('=') && via == Via::Hook {
                continue; // the hook plans CDI names in memory; covered by the runtime
            }
            let request = format!("NVIDIA_VISIBLE_DEVICES={value}");
            let env = [request.as_str(), "NVIDIA_DRIVER_CAPABILITIES=all"];
            for privileged in [false, true] {
                let case = format!("S11 via {via:?}, {request}, privileged: {privileged}");
                let job = Job {
                    top: NO_ENV_FROM_UNPRIVILEGED,
                    ..Job::new(via, &env, script)
                };
                let run = lab.run(&job, |_, spec| {
                    let caps = &mut spec["process"]["capabilities"]["bounding"];
                    assert!(
                        !caps.as_array().unwrap().contains(&json!("CAP_SYS_ADMIN")),
                        "runc spec's default grew CAP_SYS_ADMIN"
                    );
                    if privileged {
                        caps.as_array_mut().unwrap().push(json!("CAP_SYS_ADMIN"));
                    }
                });
                let out = run.ok(&case);
                let nodes = nvidia_nodes(out.split("---").next().unwrap());
                eprintln!("{case}: {nodes:?}");
                if privileged {
                    assert!(nodes.contains(&lab.gpu_node(0)), "{case}: {nodes:?}");
                    assert!(out.contains("present /usr/bin/nvidia-smi"), "{case}: {out}");
                } else {
                    assert!(nodes.is_empty(), "{case}: {nodes:?}");
                    assert!(!out.contains("present"), "{case}: {out}");
                    assert!(run.spec_untouched(), "{case}: config.json was rewritten");
                }
            }
        }
    }
}

/// Runs wherever the container's own procfs has the driver's directory, i.e. on a GPU
/// host. The simulated node has a `proc/driver/nvidia` under its proc root for the
/// planner, but the containers' procfs is the VM's, which has no NVIDIA driver: the
/// cover has nothing to cover there (see `docs/security.md`).
#[test]
#[ignore = "S12 on a GPU host; tests/runtime/driver_params.rs covers it on the simulated node"]
fn s12_params_inside_reads_modify_device_files_0() {
    let lab = Lab::build();
    let real = std::path::Path::new("/proc/driver/nvidia/params");
    let host = fs::read_to_string(real)
        .or_else(|_| fs::read_to_string(lab.sim.dir.join("proc/driver/nvidia/params")))
        .unwrap();
    let want = host.replace("ModifyDeviceFiles: 1", "ModifyDeviceFiles: 0");
    assert!(want.contains("ModifyDeviceFiles: 0"), "{host}");
    let env = ["NVIDIA_VISIBLE_DEVICES=0"];
    for via in Via::ALL {
        let case = format!("S12 via {via:?}");
        let run = lab.run(
            &Job::new(via, &env, "cat /proc/driver/nvidia/params"),
            |_, _| {},
        );
        let out = run.ok(&case);
        assert_eq!(out, want, "{case}: the container's params");
        if let Ok(after) = fs::read_to_string(real) {
            assert_eq!(after, host, "{case}: the host's params changed");
        }
    }
}

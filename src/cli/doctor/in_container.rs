//! `nvshim doctor --in-container`: the validation workload. Run inside a container that
//! asked for GPUs through the `nvidia` runtime (the Kustomize and Helm validation Job), it
//! checks what the runtime gave the container, the way NVIDIA's validator proves a node
//! before workloads land: NVML loads and lists at least one GPU, the device node of each
//! GPU it lists is there, `nvidia-smi -L` runs from `PATH`, and, when the container asked
//! for `compute`, `libcuda.so.1` is in the container's linker cache. Reads only.
//!
//! Each check stands alone, so a container that got nothing (no GPU asked for, or a
//! runtime that did not inject) fails every one and names each missing piece.

use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Check, Status};
use crate::inventory::{self, Backend, Gpu, Source};
use crate::request::{Capability, DriverCapabilities, ENV_DRIVER_CAPABILITIES};
use crate::roots::Roots;

/// The loader's cache inside the container.
const LD_CACHE: &str = "/etc/ld.so.cache";
/// The CUDA driver library a compute workload loads.
const LIBCUDA: &str = "libcuda.so.1";
/// NVIDIA's tool, which the runtime mounts with the `utility` capability.
const NVIDIA_SMI: &str = "nvidia-smi";

/// What the checks look at: the container's own view, passed in so tests can point it
/// at a directory tree and a PATH of their own.
#[derive(Debug, Clone)]
pub struct View {
    /// Root under which `dev/nvidia*` are looked for (`/` in a container).
    pub dev_root: PathBuf,
    /// The NVML library to load; `None`: the one `/etc/ld.so.cache` names.
    pub nvml_library: Option<PathBuf>,
    /// The linker cache to look for `libcuda.so.1` in.
    pub ld_cache: PathBuf,
    /// `PATH`, to find `nvidia-smi` in.
    pub path: String,
    /// `NVIDIA_DRIVER_CAPABILITIES` as the container has it (`None`: unset).
    pub capabilities: Option<String>,
}

impl View {
    /// The running container's view: `/`, its `PATH` and environment.
    pub fn of_this_container(nvml_library: Option<PathBuf>) -> View {
        View {
            dev_root: PathBuf::from("/"),
            nvml_library,
            ld_cache: PathBuf::from(LD_CACHE),
            path: std::env::var("PATH").unwrap_or_default(),
            capabilities: std::env::var(ENV_DRIVER_CAPABILITIES).ok(),
        }
    }
}

/// Runs every check, in the order a GPU program depends on them.
pub fn checks(view: &View) -> Vec<Check> {
    let mut out = Vec::new();
    let roots = Roots {
        driver: PathBuf::from("/"),
        dev: view.dev_root.clone(),
        proc: PathBuf::from("/"),
    };
    let listed = inventory::load(
        &roots,
        &Source {
            backend: Backend::Nvml,
            nvml_library: view.nvml_library.clone(),
        },
    );
    let gpus = match listed {
        Ok(inv) if !inv.gpus.is_empty() => {
            out.push(Check::ok(
                "nvml",
                format!(
                    "driver {}, {} GPU(s): {}",
                    inv.driver.version,
                    inv.gpus.len(),
                    inv.gpus
                        .iter()
                        .map(|g| g.uuid.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
            inv.gpus
        }
        Ok(_) => {
            out.push(Check::bad(
                Status::Fail,
                "nvml",
                "NVML loaded but lists no GPU",
                ASK_FOR_GPUS,
            ));
            Vec::new()
        }
        Err(e) => {
            out.push(Check::bad(
                Status::Fail,
                "nvml",
                e.to_string(),
                ASK_FOR_GPUS,
            ));
            Vec::new()
        }
    };
    out.push(device_nodes(&view.dev_root, &gpus));
    out.push(nvidia_smi(&view.path));
    out.push(libcuda(view));
    out
}

/// The fix for a container that got no GPU: how a pod asks for one.
const ASK_FOR_GPUS: &str = "run the pod with runtimeClassName: nvidia and NVIDIA_VISIBLE_DEVICES=all (or a nvidia.com/gpu limit)";

/// `/dev/nvidiactl` and `/dev/nvidia<minor>` for every GPU NVML lists.
fn device_nodes(dev_root: &Path, gpus: &[Gpu]) -> Check {
    let mut names = vec!["nvidiactl".to_owned()];
    names.extend(gpus.iter().map(|g| format!("nvidia{}", g.minor)));
    let mut bad = Vec::new();
    for name in &names {
        let path = dev_root.join("dev").join(name);
        match std::fs::metadata(&path) {
            Ok(m) if m.file_type().is_char_device() => {}
            Ok(_) => bad.push(format!("{} is not a character device", path.display())),
            Err(_) => bad.push(format!("{} is missing", path.display())),
        }
    }
    if bad.is_empty() {
        Check::ok("device nodes", format!("{} present", names.join(", ")))
    } else {
        Check::bad(Status::Fail, "device nodes", bad.join("; "), ASK_FOR_GPUS)
    }
}

/// `nvidia-smi -L` from `path`: found, exits 0, prints a `GPU ` line.
fn nvidia_smi(path: &str) -> Check {
    let Some(program) = std::env::split_paths(path)
        .map(|dir| dir.join(NVIDIA_SMI))
        .find(|p| p.is_file())
    else {
        return Check::bad(
            Status::Fail,
            NVIDIA_SMI,
            format!("not found in PATH ({path})"),
            "ask for the utility capability (NVIDIA_DRIVER_CAPABILITIES=compute,utility)",
        );
    };
    match Command::new(&program).arg("-L").output() {
        Ok(out) if out.status.success() => {
            let text = String::from_utf8_lossy(&out.stdout);
            let gpus = text.lines().filter(|l| l.starts_with("GPU ")).count();
            if gpus > 0 {
                Check::ok(
                    NVIDIA_SMI,
                    format!("{} -L lists {gpus} GPU(s)", program.display()),
                )
            } else {
                Check::bad(
                    Status::Fail,
                    NVIDIA_SMI,
                    format!("{} -L lists no GPU: {}", program.display(), text.trim()),
                    ASK_FOR_GPUS,
                )
            }
        }
        Ok(out) => Check::bad(
            Status::Fail,
            NVIDIA_SMI,
            format!(
                "{} -L failed ({}): {}",
                program.display(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
            "check that the driver's user-space libraries match the kernel module (nvshim doctor on the node)",
        ),
        Err(e) => Check::bad(
            Status::Fail,
            NVIDIA_SMI,
            format!("cannot run {}: {e}", program.display()),
            "check that the driver's user-space libraries match the kernel module (nvshim doctor on the node)",
        ),
    }
}

/// `libcuda.so.1` in the linker cache, when the container asked for `compute`
/// (unset or empty `NVIDIA_DRIVER_CAPABILITIES` asks for it: NVIDIA's default set).
fn libcuda(view: &View) -> Check {
    const NAME: &str = "linker cache";
    let asked = view.capabilities.as_deref().unwrap_or_default();
    let caps = match asked.parse::<DriverCapabilities>() {
        Ok(caps) => caps,
        Err(e) => {
            return Check::bad(
                Status::Fail,
                NAME,
                e.to_string(),
                "set NVIDIA_DRIVER_CAPABILITIES to a list of compute, compat32, graphics, utility, video, display, ngx or all",
            );
        }
    };
    if !caps.contains(Capability::Compute) {
        return Check::ok(
            NAME,
            format!(
                "compute not asked for ({ENV_DRIVER_CAPABILITIES}={asked}): {LIBCUDA} not needed"
            ),
        );
    }
    match crate::ldcache::load(&view.ld_cache) {
        Ok(cache) => match cache.lookup(LIBCUDA).next() {
            Some(entry) => Check::ok(
                NAME,
                format!(
                    "{LIBCUDA} => {} in {}",
                    entry.value,
                    view.ld_cache.display()
                ),
            ),
            None => Check::bad(
                Status::Fail,
                NAME,
                format!("{} has no {LIBCUDA}", view.ld_cache.display()),
                ASK_FOR_GPUS,
            ),
        },
        Err(e) => Check::bad(
            Status::Fail,
            NAME,
            format!("{}: {e}", view.ld_cache.display()),
            ASK_FOR_GPUS,
        ),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A view of an empty directory: a container that got nothing.
    fn empty_view(dir: &Path) -> View {
        View {
            dev_root: dir.to_path_buf(),
            nvml_library: Some(dir.join("libnvidia-ml.so.1")),
            ld_cache: dir.join("ld.so.cache"),
            path: dir.join("bin").display().to_string(),
            capabilities: None,
        }
    }

    #[test]
    fn a_container_that_got_nothing_fails_every_check_naming_what_is_missing() {
        let dir = tempfile::tempdir().unwrap();
        let checks = checks(&empty_view(dir.path()));
        let names: Vec<&str> = checks.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["nvml", "device nodes", NVIDIA_SMI, "linker cache"]);
        for (check, names) in checks.iter().zip([
            "libnvidia-ml.so.1",
            "nvidiactl is missing",
            "not found in PATH",
            "ld.so.cache",
        ]) {
            assert_eq!(check.status, Status::Fail, "case {}: {check:?}", check.name);
            assert!(
                check.detail.contains(names),
                "case {}: {check:?}",
                check.name
            );
            assert!(check.fix.is_some(), "case {}", check.name);
        }
    }

    #[test]
    fn libcuda_is_needed_only_with_compute() {
        let dir = tempfile::tempdir().unwrap();
        for (caps, status) in [
            (None, Status::Fail),
            (Some(""), Status::Fail),
            (Some("compute,utility"), Status::Fail),
            (Some("all"), Status::Fail),
            (Some("utility"), Status::Ok),
            (Some("graphics,display"), Status::Ok),
            (Some("utility,warp-drive"), Status::Fail),
        ] {
            let view = View {
                capabilities: caps.map(str::to_owned),
                ..empty_view(dir.path())
            };
            assert_eq!(libcuda(&view).status, status, "case {caps:?}");
        }
    }

    #[test]
    fn nvidia_smi_must_list_a_gpu() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let smi = dir.path().join(NVIDIA_SMI);
        for (script, status, detail) in [
            (
                "echo 'GPU 0: Test (UUID: GPU-1)'",
                Status::Ok,
                "lists 1 GPU",
            ),
            ("echo 'No devices were found'", Status::Fail, "lists no GPU"),
            ("echo broken >&2; exit 9", Status::Fail, "broken"),
        ] {
            std::fs::write(&smi, format!("#!/bin/sh\n{script}\n")).unwrap();
            std::fs::set_permissions(&smi, std::fs::Permissions::from_mode(0o755)).unwrap();
            let path = format!("/nonexistent:{}", dir.path().display());
            let check = nvidia_smi(&path);
            assert_eq!(check.status, status, "case {script}: {check:?}");
            assert!(check.detail.contains(detail), "case {script}: {check:?}");
        }
    }
}

//! The whole `nvidia-container-runtime` process: read runc's argv, prepare the bundle
//! on `create`/`run`, then `exec` the low-level runtime. Front-end plumbing like
//! `cli`: it initialises logging and writes the one error line a failure produces.
//!
//! The installed runtime binary is static (it starts about a millisecond sooner than a
//! dynamically linked one, on every container start) and so never loads NVML: a request
//! that needs NVML (MIG devices, `NVIDIA_REQUIRE_*`) is handed, before anything is
//! written, to `nvshim runtime -- <argv>` next to it, which runs this same code with
//! NVML allowed. One `exec`, no child process, only for those requests.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use super::args::{self, Invocation};
use super::create::Outcome;
use super::{ERROR_PREFIX, RuntimeError, lowlevel};
use crate::config;
use crate::container::{NVML_HELPER, RUNTIME_HELPER_COMMAND};
use crate::logging::{self, LogSettings};
use crate::pipeline::NvmlAccess;

/// Runs the shim with runc's arguments (`argv[1..]`). Returns only on failure or
/// when `exec` itself fails; success `exec`s the low-level runtime.
pub fn main(raw: Vec<OsString>, nvml: NvmlAccess) -> ExitCode {
    let lossy: Vec<String> = raw
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // A command line we cannot read is runc's to reject: pass it through.
    let invocation = args::scan(&lossy).unwrap_or_default();
    let fail = |message: String| fail(&invocation, &message);
    // `--version`: ours first, then runc's (the one write to stdout), as NVIDIA's does.
    if invocation.version {
        print_version();
    }

    let argv0 = std::env::args_os().next();
    let loaded = config::load_installed(|key| std::env::var(key).ok(), argv0.as_deref());
    let config = match (&loaded, invocation.creates_container()) {
        (Ok(l), _) => l.config.clone(),
        // `delete`, `kill`, `state` must keep working with a broken config file.
        (Err(_), false) => config::Config::default(),
        (Err(e), true) => return fail(format!("{ERROR_PREFIX}: {e}")),
    };
    let debug_file = &config.nvidia_container_runtime.debug;
    let _ = logging::init(&LogSettings {
        debug: false,
        file: (!debug_file.as_os_str().is_empty()
            && debug_file.as_path() != Path::new("/dev/null"))
        .then(|| debug_file.clone()),
        file_level: Some(config.nvidia_container_runtime.log_level.into()),
        // Errors reach stderr (and runc's --log) once, from `fail`.
        no_stderr: true,
        stderr_filter: None,
    });
    if let Ok(l) = &loaded {
        for key in &l.unknown_keys {
            tracing::warn!(path = %l.path.display(), "unknown config key {key}, ignored");
        }
    }

    // Looked up before the bundle is touched: a create that cannot reach runc must leave
    // config.json as it was.
    let dirs = lowlevel::search_dirs(std::env::var_os("PATH").as_deref());
    let self_exe = PathBuf::from("/proc/self/exe");
    let runc = match lowlevel::find(&config.nvidia_container_runtime.runtimes, &dirs, &self_exe) {
        Ok(runc) => runc,
        Err(e) => return fail(format!("{ERROR_PREFIX}: {e}")),
    };

    // Only a create needs the cwd (the default bundle): `delete` or `kill` run from a
    // bundle directory that is already gone must still reach runc.
    let outcome = if invocation.creates_container() {
        std::env::current_dir()
            .map_err(RuntimeError::Cwd)
            .and_then(|cwd| super::prepare(&invocation, &cwd, &config, nvml))
    } else {
        Ok(None)
    };
    match outcome {
        Ok(Some(Outcome::NeedsNvml { reason })) => {
            let helper = nvml_helper();
            tracing::debug!(reason, helper = %helper.display(), "handing the request to the NVML helper");
            let mut argv = vec![OsString::from(RUNTIME_HELPER_COMMAND), OsString::from("--")];
            argv.extend(raw);
            let err = lowlevel::exec(&helper, &argv);
            return fail(format!(
                "{ERROR_PREFIX}: this request needs NVML ({reason}), which runs in {}: {err}",
                helper.display()
            ));
        }
        Ok(Some(outcome)) => tracing::info!(?outcome, "prepared bundle"),
        Ok(None) => {}
        Err(e) => {
            tracing::error!("{e}");
            return fail(format!("{ERROR_PREFIX}: {e}"));
        }
    }

    if invocation.version {
        println!();
    }
    let err = lowlevel::exec(&runc, &raw);
    fail(format!("{ERROR_PREFIX}: {err}"))
}

/// NVIDIA's version block: `NVIDIA Container Runtime version X`, the build's commit
/// when the build was given one, and the OCI runtime-spec version of the fragments we
/// write. Rust's stdout flushes each line, so nothing is lost to the `exec`.
fn print_version() {
    println!(
        "NVIDIA Container Runtime version {}",
        env!("CARGO_PKG_VERSION")
    );
    if let Some(commit) = option_env!("NVSHIM_GIT_COMMIT") {
        println!("commit: {commit}");
    }
    println!("spec: {}", oci_spec::runtime::VERSION);
}

/// `nvshim` in the directory of the running binary.
fn nvml_helper() -> PathBuf {
    crate::roots::beside_self(NVML_HELPER)
}

/// Reports a failure on stderr and, when runc was given `--log`, in runc's log format
/// there too, so containerd and docker show it.
fn fail(invocation: &Invocation, message: &str) -> ExitCode {
    eprintln!("{message}");
    if let Some(log) = &invocation.log {
        let json = invocation.log_format.as_deref() == Some("json");
        let _ = lowlevel::report(log, json, message);
    }
    ExitCode::FAILURE
}

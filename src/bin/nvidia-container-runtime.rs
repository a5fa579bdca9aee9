//! `nvidia-container-runtime`: a runc shim. On `create`/`run` it adds the requested
//! GPUs to the bundle's config.json; every command then goes to runc through `exec`.

use std::ffi::OsString;
use std::process::ExitCode;

use nvshim::config;
use nvshim::logging::{self, LogSettings};
use nvshim::runtime::{self, ERROR_PREFIX, args, lowlevel};

fn main() -> ExitCode {
    let raw: Vec<OsString> = std::env::args_os().skip(1).collect();
    let lossy: Vec<String> = raw
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    // A command line we cannot read is runc's to reject: pass it through.
    let invocation = args::scan(&lossy).unwrap_or_default();
    let fail = |message: String| {
        eprintln!("{message}");
        if let Some(log) = &invocation.log {
            let json = invocation.log_format.as_deref() == Some("json");
            let _ = lowlevel::report(log, json, &message);
        }
        ExitCode::FAILURE
    };

    let loaded = config::load(|key| std::env::var(key).ok());
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
            && debug_file.as_path() != std::path::Path::new("/dev/null"))
        .then(|| debug_file.clone()),
        file_level: Some(config.nvidia_container_runtime.log_level.into()),
        // Errors reach stderr (and runc's --log) once, from `fail`.
        no_stderr: true,
    });
    if let Ok(l) = &loaded {
        for key in &l.unknown_keys {
            tracing::warn!(path = %l.path.display(), "unknown config key {key}, ignored");
        }
    }

    let outcome = std::env::current_dir()
        .map_err(runtime::RuntimeError::Cwd)
        .and_then(|cwd| runtime::prepare(&invocation, &cwd, &config));
    match outcome {
        Ok(Some(outcome)) => tracing::info!(?outcome, "prepared bundle"),
        Ok(None) => {}
        Err(e) => {
            tracing::error!("{e}");
            return fail(format!("{ERROR_PREFIX}: {e}"));
        }
    }

    let dirs = lowlevel::search_dirs(std::env::var_os("PATH").as_deref());
    let self_exe = std::path::PathBuf::from("/proc/self/exe");
    let runtimes = &config.nvidia_container_runtime.runtimes;
    match lowlevel::find(runtimes, &dirs, &self_exe) {
        Ok(runc) => {
            let err = lowlevel::exec(&runc, &raw);
            fail(format!("{ERROR_PREFIX}: {err}"))
        }
        Err(e) => fail(format!("{ERROR_PREFIX}: {e}")),
    }
}

//! `nvidia-container-runtime-hook [-config FILE] [-debug] prestart|poststart|poststop`:
//! the OCI hook docker's `--gpus` and `hooks.d` add. Reads the OCI state on stdin and
//! injects the GPUs into the container; see `nvshim::hook`.
//!
//! Single-threaded on purpose: the hook `setns`es into the container's mount
//! namespace, which a multi-threaded process cannot do. Never writes to stdout.

use std::io::Read;
use std::path::Path;
use std::process::ExitCode;

use nvshim::logging::{self, LogSettings};
use nvshim::{config, hook};

const NAME: &str = "nvidia-container-runtime-hook";

/// The command line, as NVIDIA's hook takes it (Go flags: `-flag`, `--flag`,
/// `-flag=value` or `-flag value`, before the stage).
#[derive(Debug, Default)]
struct Args {
    config: Option<String>,
    debug: bool,
    version: bool,
    stage: Option<String>,
}

fn parse(args: &[String]) -> Result<Args, String> {
    let mut parsed = Args::default();
    let mut rest = args.iter();
    while let Some(arg) = rest.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            parsed.stage = Some(arg.clone());
            break;
        };
        let (name, value) = match flag.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (flag, None),
        };
        match name {
            "config" => {
                let value = value.or_else(|| rest.next().cloned());
                parsed.config = Some(value.ok_or("-config needs a file")?);
            }
            "debug" => parsed.debug = value.is_none_or(|v| v != "false"),
            "version" => parsed.version = true,
            other => {
                return Err(format!(
                    "unknown flag -{other} (valid: -config, -debug, -version)"
                ));
            }
        }
    }
    Ok(parsed)
}

fn main() -> ExitCode {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    let args = match parse(&raw) {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{NAME}: {e}");
            return ExitCode::FAILURE;
        }
    };
    if args.version {
        eprintln!("{NAME} (nvshim) {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    match args.stage.as_deref() {
        Some("prestart") => {}
        Some("poststart" | "poststop") => return ExitCode::SUCCESS,
        Some(other) => {
            eprintln!("{NAME}: unknown stage {other:?} (valid: prestart, poststart, poststop)");
            return ExitCode::FAILURE;
        }
        None => {
            eprintln!(
                "{NAME}: usage: {NAME} [-config FILE] [-debug] prestart|poststart|poststop \
                 (reads the OCI state on stdin)"
            );
            return ExitCode::FAILURE;
        }
    }
    // `-config` names the file as NVIDIA_CTK_CONFIG_FILE_PATH would (a missing file is
    // then an error).
    let loaded = config::load(|key| match (&args.config, key) {
        (Some(path), config::ENV_CONFIG_FILE_PATH) => Some(path.clone()),
        _ => std::env::var(key).ok(),
    });
    let loaded = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("{NAME}: {e}");
            return ExitCode::FAILURE;
        }
    };
    let log = &loaded.config.nvidia_container_cli.debug;
    let _ = logging::init(&LogSettings {
        debug: args.debug,
        file: (!log.as_os_str().is_empty() && log.as_path() != Path::new("/dev/null"))
            .then(|| log.clone()),
        // The runtime's `log-level` (default info) applies to the hook's file too.
        file_level: Some(loaded.config.nvidia_container_runtime.log_level.into()),
        // The one error line comes from below; -debug shows the rest on stderr.
        no_stderr: !args.debug,
        stderr_filter: None,
    });
    for key in &loaded.unknown_keys {
        tracing::warn!(path = %loaded.path.display(), "unknown config key {key}, ignored");
    }

    let mut state = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut state) {
        eprintln!("{NAME}: cannot read the OCI state from stdin: {e}");
        return ExitCode::FAILURE;
    }
    match hook::prestart(&state, &loaded.config) {
        Ok(outcome) => {
            tracing::debug!(?outcome, "prestart done");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!("{e}");
            eprintln!("{NAME}: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Result<Args, String> {
        parse(&list.iter().map(|s| s.to_string()).collect::<Vec<_>>())
    }

    #[test]
    fn go_style_flags_before_the_stage() {
        let a = args(&["-config", "/etc/x.toml", "-debug", "prestart"]).unwrap();
        assert_eq!(
            (a.config.as_deref(), a.debug, a.stage.as_deref()),
            (Some("/etc/x.toml"), true, Some("prestart"))
        );
        let a = args(&["--config=/c.toml", "poststop"]).unwrap();
        assert_eq!(a.config.as_deref(), Some("/c.toml"));
        assert_eq!(a.stage.as_deref(), Some("poststop"));
        assert!(args(&["-version"]).unwrap().version);
        assert!(args(&["-bogus", "prestart"]).is_err());
        assert!(args(&["-config"]).is_err());
    }
}

//! tracing-subscriber setup shared by every binary: stderr, plus an optional log file.
//!
//! Synchronous writers only: the runtime `exec`s runc, so buffered or background
//! writers would lose events, and a writer thread would break `setns` in the hook.
//! The log file is opened `O_APPEND | O_CLOEXEC` and each event is one `write`, so
//! parallel processes do not interleave lines. The library never calls this.

use std::fs::OpenOptions;
use std::io::IsTerminal;
use std::os::unix::fs::OpenOptionsExt;
use std::path::PathBuf;
use std::sync::Arc;

use nix::fcntl::{FcntlArg, OFlag, fcntl};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{Layer, fmt};

/// How a binary wants to log.
#[derive(Debug, Clone, Default)]
pub struct LogSettings {
    /// `debug` on stderr instead of `warn` (`RUST_LOG` overrides either: a level, or
    /// `target=level` directives separated by commas).
    pub debug: bool,
    /// Also append events to this file.
    pub file: Option<PathBuf>,
    /// The file's level (`debug` when unset).
    pub file_level: Option<tracing::Level>,
    /// No stderr layer: the runtime prints its one error line itself.
    pub no_stderr: bool,
    /// The stderr filter when `RUST_LOG` is unset, e.g. `info` (overrides `debug`).
    pub stderr_filter: Option<String>,
}

#[derive(Debug, thiserror::Error)]
pub enum LoggingError {
    #[error("cannot open log file {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("a logger is already installed: {0}")]
    AlreadySet(String),
}

/// Installs the global subscriber; none when there is nowhere to write (no stderr
/// layer and no file), so events cost nothing: the runtime's default, with
/// `debug` unset in config.toml, skips about 40 µs of set-up on every create.
pub fn init(settings: &LogSettings) -> Result<(), LoggingError> {
    if settings.no_stderr && settings.file.is_none() {
        return Ok(());
    }
    // Built only when used: parsing filter directives costs about a millisecond,
    // which the runtime (no stderr layer) must not pay on every container start.
    let stderr = (!settings.no_stderr).then(|| {
        let default = match &settings.stderr_filter {
            Some(filter) => filter.as_str(),
            None if settings.debug => "debug",
            None => "warn",
        };
        // `Targets`, not `EnvFilter`: the same level and `target=level` directives
        // without the span and field filters, so the static binaries link no regex
        // engine (`EnvFilter` brings one, with hundreds of KB of Unicode tables).
        let parse = |text: &str| text.parse::<Targets>().ok();
        let stderr_filter = std::env::var("RUST_LOG")
            .ok()
            .and_then(|text| parse(&text))
            .or_else(|| parse(default))
            .unwrap_or_else(|| Targets::new().with_default(tracing::Level::WARN));
        fmt::layer()
            .with_writer(std::io::stderr)
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .with_filter(stderr_filter)
    });
    let file = match &settings.file {
        Some(path) => {
            let open_error = |source| LoggingError::Open {
                path: path.clone(),
                source,
            };
            // O_NONBLOCK for the open only: opening a FIFO nobody reads would otherwise
            // wait forever (a runtime stuck before runc, every container start hung); this
            // way it fails with ENXIO. Writes block again, so no event is dropped.
            let handle = OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_NONBLOCK)
                .open(path)
                .map_err(open_error)?;
            fcntl(&handle, FcntlArg::F_SETFL(OFlag::O_APPEND))
                .map_err(|errno| open_error(errno.into()))?;
            Some(
                fmt::layer()
                    .with_writer(Arc::new(handle))
                    .with_ansi(false)
                    .with_filter(tracing_subscriber::filter::LevelFilter::from_level(
                        settings.file_level.unwrap_or(tracing::Level::DEBUG),
                    )),
            )
        }
        None => None,
    };
    tracing_subscriber::registry()
        .with(stderr)
        .with(file)
        .try_init()
        .map_err(|e| LoggingError::AlreadySet(e.to_string()))
}

//! `nvshim doctor --wait-for PATH`: blocks until a file exists, for an init container
//! that must not let its pod start before the toolkit installer has put the runtime in
//! place. The installer writes its ready file (`/run/nvidia/validations/toolkit-ready`,
//! where NVIDIA's toolkit container writes its own) once the engine knows the runtime;
//! the device plugin, labels and exporter pods wait for it, as NVIDIA's operator makes
//! its operands wait for the validator's files. Reads only; changes nothing.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// How often the file is looked for. Short enough that a pod starts soon after the
/// installer is done, long enough to cost nothing while it is not.
pub const POLL_INTERVAL: Duration = Duration::from_millis(500);

#[derive(Debug, thiserror::Error)]
pub enum WaitError {
    #[error(
        "{} did not appear within {} s (the toolkit installer writes it once the runtime is registered; see its pod's log, or raise --timeout, 0 = forever)",
        path.display(),
        timeout.as_secs_f64()
    )]
    Timeout { path: PathBuf, timeout: Duration },
    #[error("cannot tell whether {} exists: {source}", path.display())]
    Stat {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

/// Waits until `path` exists, looking every `poll`; `timeout` `None` waits forever.
/// Returns how long it waited. A path that cannot be looked at (permission denied on a
/// directory above it, say) is an error at once: waiting would never end.
pub fn wait_for(
    path: &Path,
    timeout: Option<Duration>,
    poll: Duration,
) -> Result<Duration, WaitError> {
    let start = Instant::now();
    loop {
        match path.try_exists() {
            Ok(true) => return Ok(start.elapsed()),
            Ok(false) => {}
            Err(source) => {
                return Err(WaitError::Stat {
                    path: path.to_path_buf(),
                    source,
                });
            }
        }
        let waited = start.elapsed();
        let nap = match timeout {
            Some(limit) if waited >= limit => {
                return Err(WaitError::Timeout {
                    path: path.to_path_buf(),
                    timeout: limit,
                });
            }
            Some(limit) => poll.min(limit - waited),
            None => poll,
        };
        std::thread::sleep(nap);
    }
}

/// The command: says what it waits for (one line, before waiting, so a pod's log shows
/// why it is not ready), then waits. `timeout_s` 0 waits forever.
pub fn run(path: &Path, timeout_s: u64, out: &mut dyn Write) -> Result<(), WaitError> {
    let timeout = (timeout_s > 0).then(|| Duration::from_secs(timeout_s));
    match timeout {
        Some(t) => writeln!(
            out,
            "waiting for {} (at most {} s)",
            path.display(),
            t.as_secs()
        )?,
        None => writeln!(out, "waiting for {}", path.display())?,
    }
    out.flush()?;
    let waited = wait_for(path, timeout, POLL_INTERVAL)?;
    writeln!(
        out,
        "{} exists (waited {:.1} s)",
        path.display(),
        waited.as_secs_f64()
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_existing_file_returns_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("toolkit-ready");
        std::fs::write(&file, "").unwrap();
        let mut out = Vec::new();
        run(&file, 5, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("waiting for "), "{text}");
        assert!(text.contains("toolkit-ready exists"), "{text}");
    }

    #[test]
    fn a_missing_file_times_out_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("toolkit-ready");
        let error = wait_for(
            &file,
            Some(Duration::from_millis(30)),
            Duration::from_millis(10),
        )
        .unwrap_err();
        assert!(matches!(error, WaitError::Timeout { .. }), "{error:?}");
        let message = error.to_string();
        assert!(message.contains(&file.display().to_string()), "{message}");
        assert!(message.contains("--timeout"), "{message}");
    }

    #[test]
    fn a_file_made_while_waiting_ends_the_wait() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("toolkit-ready");
        let waiter = {
            let file = file.clone();
            std::thread::spawn(move || {
                wait_for(
                    &file,
                    Some(Duration::from_secs(20)),
                    Duration::from_millis(5),
                )
            })
        };
        std::fs::write(&file, "").unwrap();
        let waited = waiter.join().unwrap().unwrap();
        assert!(waited < Duration::from_secs(20), "{waited:?}");
    }
}

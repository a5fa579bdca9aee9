//! Finding the low-level runtime (runc, crun) and handing over to it with `exec`.
//!
//! The candidates come from `nvidia-container-runtime.runtimes`; a name is looked up
//! in `PATH` and then the usual system directories, an absolute path is used as is.
//! A candidate that is this very binary (same device and inode, however it was
//! reached) is skipped, so installing the shim as `runc` cannot make it exec itself
//! in a loop.

use std::ffi::OsStr;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

/// Searched after `PATH`, as NVIDIA's runtime does: the same system directories
/// discovery searches for the driver's binaries.
const DEFAULT_DIRS: &[&str] = crate::discover::table::BINARY_DIRS;

#[derive(Debug, thiserror::Error)]
pub enum LowLevelError {
    #[error(
        "no low-level runtime found: tried {tried}, names in {dirs} (set \
         nvidia-container-runtime.runtimes in config.toml to the path of runc or crun)"
    )]
    NotFound {
        /// The candidates, quoted, with why a found one was not used.
        tried: String,
        /// The directories names were looked up in, `:`-separated.
        dirs: String,
    },
    #[error("cannot exec {path}: {source}")]
    Exec {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Where names are looked up: the absolute entries of `PATH`, then the system dirs.
pub fn search_dirs(path_env: Option<&OsStr>) -> Vec<PathBuf> {
    path_env
        .map(|p| std::env::split_paths(p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain(DEFAULT_DIRS.iter().map(PathBuf::from))
        .filter(|d| d.is_absolute())
        .collect()
}

/// The first usable candidate, names looked up in `dirs`. `self_exe` is our own binary
/// (`/proc/self/exe`).
pub fn find(
    candidates: &[String],
    dirs: &[PathBuf],
    self_exe: &Path,
) -> Result<PathBuf, LowLevelError> {
    let me = fs::metadata(self_exe).ok().map(|m| (m.dev(), m.ino()));
    let mut tried = Vec::new();
    for candidate in candidates {
        let paths: Vec<PathBuf> = if candidate.starts_with('/') {
            vec![PathBuf::from(candidate)]
        } else if candidate.contains('/') || candidate.is_empty() {
            // A relative path would depend on the caller's cwd: never use one.
            tried.push(format!("{candidate:?} (not a name or an absolute path)"));
            continue;
        } else {
            dirs.iter().map(|d| d.join(candidate)).collect()
        };
        for path in paths {
            match fs::metadata(&path) {
                Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
                    if me == Some((m.dev(), m.ino())) {
                        tried.push(format!("{} (that is this shim itself)", path.display()));
                        continue;
                    }
                    return Ok(path);
                }
                _ => {}
            }
        }
        if !candidate.starts_with('/') || !tried.iter().any(|t| t.starts_with(candidate.as_str())) {
            tried.push(format!("{candidate:?}"));
        }
    }
    let mut searched: Vec<String> = Vec::new();
    for dir in dirs.iter().map(|d| d.display().to_string()) {
        if !searched.contains(&dir) {
            searched.push(dir);
        }
    }
    Err(LowLevelError::NotFound {
        tried: tried.join(", "),
        dirs: searched.join(":"),
    })
}

/// Replaces this process with `runtime`, passing `args` (argv without `argv[0]`) and the
/// environment unchanged. Returns only on failure.
pub fn exec(runtime: &Path, args: &[std::ffi::OsString]) -> LowLevelError {
    let source = Command::new(runtime).arg0(runtime).args(args).exec();
    LowLevelError::Exec {
        path: runtime.to_path_buf(),
        source,
    }
}

/// Appends `message` to runc's `--log` file in runc's own format, so containerd and
/// docker, which read that file when runc fails, show our error to the user.
pub fn report(log: &Path, json: bool, message: &str) -> std::io::Result<()> {
    let time = rfc3339(SystemTime::now());
    let line = if json {
        let mut line =
            serde_json::json!({"level": "error", "msg": message, "time": time}).to_string();
        line.push('\n');
        line
    } else {
        format!(
            "time=\"{time}\" level=error msg={}\n",
            serde_json::Value::from(message)
        )
    };
    let mut file = fs::OpenOptions::new()
        .create(true)
        .append(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(log)?;
    // One write: parallel runtimes appending to one log must not interleave.
    file.write_all(line.as_bytes())
}

/// `2026-11-22T05:17:28Z` without a date library (UTC, civil-from-days).
fn rfc3339(now: SystemTime) -> String {
    let secs = now.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn exe(path: &Path) -> std::io::Result<()> {
        fs::write(path, "#!/bin/sh\n")?;
        fs::set_permissions(path, fs::Permissions::from_mode(0o755))
    }

    #[test]
    fn candidates_are_searched_in_order_and_never_ourselves() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let bin = tmp.path().join("bin");
        fs::create_dir(&bin)?;
        exe(&bin.join("crun"))?;
        exe(&bin.join("shim"))?;
        fs::hard_link(bin.join("shim"), bin.join("runc"))?;
        fs::write(bin.join("docker-runc"), "not executable")?;
        let path = &[bin.clone()][..];
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();

        let found = find(
            &names(&["docker-runc", "runc", "crun"]),
            path,
            &bin.join("shim"),
        );
        assert_eq!(
            found.ok(),
            Some(bin.join("crun")),
            "runc is a hard link to the shim: skipped"
        );
        let found = find(&names(&["runc"]), path, &tmp.path().join("elsewhere"));
        assert_eq!(found.ok(), Some(bin.join("runc")));
        let abs = bin.join("crun").display().to_string();
        assert_eq!(
            find(&[abs], &[], &bin.join("shim")).ok(),
            Some(bin.join("crun"))
        );
        match find(&names(&["nope", "./runc"]), path, &bin.join("shim")) {
            Err(e) => {
                let msg = e.to_string();
                assert!(msg.contains("\"nope\"") && msg.contains("./runc"), "{msg}");
                assert!(
                    msg.contains(&format!("names in {} (", bin.display())),
                    "the directories searched: {msg}"
                );
            }
            Ok(p) => panic!("found {p:?}"),
        }
        Ok(())
    }

    #[test]
    fn search_dirs_keep_path_order_then_system_dirs() {
        let dirs = search_dirs(Some(OsStr::new("/opt/bin:relative:/usr/bin")));
        assert_eq!(
            dirs[..2],
            [PathBuf::from("/opt/bin"), PathBuf::from("/usr/bin")]
        );
        assert_eq!(dirs.last(), Some(&PathBuf::from("/bin")));
    }

    #[test]
    fn reports_use_runc_log_formats() -> std::io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let log = tmp.path().join("log.json");
        report(&log, true, "unknown GPU \"9\"")?;
        report(&log, false, "second")?;
        let text = fs::read_to_string(&log)?;
        let mut lines = text.lines();
        let first: serde_json::Value = serde_json::from_str(lines.next().unwrap_or_default())
            .map_err(std::io::Error::other)?;
        assert_eq!(first["level"], "error");
        assert_eq!(first["msg"], "unknown GPU \"9\"");
        assert!(first["time"].as_str().is_some_and(|t| t.ends_with('Z')));
        let second = lines.next().unwrap_or_default();
        assert!(
            second.starts_with("time=\"") && second.ends_with("level=error msg=\"second\""),
            "{second}"
        );
        Ok(())
    }

    #[test]
    fn timestamps_are_rfc3339_utc() {
        let cases = [
            (0, "1970-01-01T00:00:00Z"),
            (951_782_400, "2000-02-29T00:00:00Z"),
            (1_795_324_648, "2026-11-22T05:17:28Z"),
        ];
        for (secs, want) in cases {
            assert_eq!(
                rfc3339(UNIX_EPOCH + Duration::from_secs(secs)),
                want,
                "case {secs}"
            );
        }
    }
}

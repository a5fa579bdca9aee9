//! `nvidia-docker`: the wrapper NVIDIA's `nvidia-docker2` package shipped as a bash
//! script, with its behaviour kept word for word:
//! - the arguments are scanned up to the first `run`, `create`, `version` or `--`;
//! - `run`/`create` get `--runtime=nvidia` right after them, and `-e
//!   NVIDIA_VISIBLE_DEVICES=<NV_GPU>` too when `NV_GPU` is set and not empty (its spaces
//!   become commas, so `NV_GPU='0 1'` means GPUs 0 and 1);
//! - `version` prints `NVIDIA Docker: <version>` first;
//! - then docker runs with the arguments, by `exec`, so its exit code is the wrapper's.
//!
//! docker is `$NV_DOCKER` (split on whitespace, as the script's unquoted expansion did,
//! so `NV_DOCKER='sudo docker'` works), else `docker` from `PATH`. `NV_DEBUG` set and not
//! empty prints the command line on stderr first, as the script's `set -x` did.

use std::ffi::{OsStr, OsString};
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, ExitCode};

/// The name packages install it under.
pub const BINARY: &str = "nvidia-docker";

/// What `nvidia-docker version` prints first; packaging tests look for this prefix.
pub const VERSION_PREFIX: &str = "NVIDIA Docker: ";

/// The runtime name `run`/`create` get, as NVIDIA's wrapper and daemon.json have it.
const RUNTIME_FLAG: &str = "--runtime=nvidia";

/// Names the docker command; `docker` when unset or empty.
pub const ENV_DOCKER: &str = "NV_DOCKER";
/// The GPUs for `run`/`create`, as `NVIDIA_VISIBLE_DEVICES` takes them.
pub const ENV_GPU: &str = "NV_GPU";
/// Print the command line before running it.
pub const ENV_DEBUG: &str = "NV_DEBUG";

/// docker's command line, as the wrapper rewrites it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rewritten {
    pub args: Vec<OsString>,
    /// `version` was the first subcommand word: print ours first.
    pub version: bool,
}

/// Rewrites `args` (argv without argv[0]) the way NVIDIA's script did. Pure.
pub fn rewrite(args: &[OsString], nv_gpu: Option<&OsStr>) -> Rewritten {
    let mut out = Vec::with_capacity(args.len() + 3);
    let mut version = false;
    let mut rest = args.iter();
    for arg in rest.by_ref() {
        out.push(arg.clone());
        match arg.as_bytes() {
            b"run" | b"create" => {
                out.push(RUNTIME_FLAG.into());
                if let Some(gpus) = nv_gpu.filter(|g| !g.is_empty()) {
                    let gpus = gpus.to_string_lossy().replace(' ', ",");
                    out.push("-e".into());
                    out.push(format!("NVIDIA_VISIBLE_DEVICES={gpus}").into());
                }
                break;
            }
            b"version" => {
                version = true;
                break;
            }
            b"--" => break,
            _ => {}
        }
    }
    out.extend(rest.cloned());
    Rewritten { args: out, version }
}

/// The docker command: `$NV_DOCKER` split on whitespace, else `docker`.
pub fn docker_command(nv_docker: Option<&OsStr>) -> Vec<OsString> {
    let words: Vec<OsString> = nv_docker
        .map(|v| {
            v.as_bytes()
                .split(|b| b.is_ascii_whitespace())
                .filter(|w| !w.is_empty())
                .map(|w| OsStr::from_bytes(w).to_owned())
                .collect()
        })
        .unwrap_or_default();
    if words.is_empty() {
        vec![OsString::from("docker")]
    } else {
        words
    }
}

/// `nvidia-docker …` (`args` includes argv[0]). Returns only when docker cannot be run.
pub fn main(args: Vec<OsString>) -> ExitCode {
    let env = |name| std::env::var_os(name);
    let rewritten = rewrite(args.get(1..).unwrap_or_default(), env(ENV_GPU).as_deref());
    let mut docker = docker_command(env(ENV_DOCKER).as_deref());
    let program = docker.remove(0);
    if rewritten.version {
        let stdout = std::io::stdout();
        let mut out = stdout.lock();
        // Written and flushed before the exec replaces this process.
        let _ = writeln!(out, "{VERSION_PREFIX}{}", env!("CARGO_PKG_VERSION"));
        let _ = out.flush();
    }
    let argv: Vec<OsString> = docker.into_iter().chain(rewritten.args).collect();
    if env(ENV_DEBUG).is_some_and(|v| !v.is_empty()) {
        let words: Vec<String> = std::iter::once(&program)
            .chain(&argv)
            .map(|w| w.to_string_lossy().into_owned())
            .collect();
        eprintln!("+ {}", words.join(" "));
    }
    let err = Command::new(&program).args(&argv).exec();
    let program = program.to_string_lossy();
    if err.kind() == std::io::ErrorKind::NotFound {
        eprintln!(
            "{BINARY}: cannot run {program}: not found (install docker, put it on PATH, \
             or name it with {ENV_DOCKER})"
        );
        // What a shell returns for a command it cannot find.
        ExitCode::from(127)
    } else {
        eprintln!("{BINARY}: cannot run {program}: {err}");
        ExitCode::from(126)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<OsString> {
        s.split_whitespace().map(OsString::from).collect()
    }

    #[test]
    fn arguments_are_rewritten_as_the_old_script_did() {
        // (case, argv, NV_GPU, docker's argv, version printed)
        let cases = [
            (
                "run",
                "run --rm img cmd",
                None,
                "run --runtime=nvidia --rm img cmd",
                false,
            ),
            (
                "create with NV_GPU",
                "create img",
                Some("0 1"),
                "create --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=0,1 img",
                false,
            ),
            (
                "empty NV_GPU",
                "run img",
                Some(""),
                "run --runtime=nvidia img",
                false,
            ),
            (
                "global flags first",
                "-H unix:///s run -it img",
                Some("GPU-a"),
                "-H unix:///s run --runtime=nvidia -e NVIDIA_VISIBLE_DEVICES=GPU-a -it img",
                false,
            ),
            (
                "only the first command word counts",
                "run img run",
                None,
                "run --runtime=nvidia img run",
                false,
            ),
            ("version", "version", Some("0"), "version", true),
            (
                "version with flags",
                "version --format x",
                None,
                "version --format x",
                true,
            ),
            ("ps untouched", "ps -a", Some("0"), "ps -a", false),
            ("after --", "-- run img", Some("0"), "-- run img", false),
            ("nothing", "", None, "", false),
        ];
        for (name, argv, gpu, want, version) in cases {
            let got = rewrite(&words(argv), gpu.map(OsStr::new));
            assert_eq!(
                got,
                Rewritten {
                    args: words(want),
                    version
                },
                "{name}"
            );
        }
    }

    #[test]
    fn docker_is_nv_docker_split_on_whitespace() {
        for (name, value, want) in [
            ("unset", None, "docker"),
            ("empty", Some("  "), "docker"),
            ("path", Some("/opt/docker"), "/opt/docker"),
            ("with sudo", Some("sudo  docker"), "sudo docker"),
        ] {
            assert_eq!(docker_command(value.map(OsStr::new)), words(want), "{name}");
        }
    }
}

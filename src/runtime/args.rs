//! Reads a runc command line the way runc does, to find what the shim needs: the
//! subcommand, the bundle, and where runc's caller wants errors logged.
//!
//! NVIDIA's runtime looks for the word `create` anywhere in argv, so
//! `exec <id> echo create` is mistaken for a create. We parse runc's global flags
//! (Go's flag syntax: `-x`, `--x`, `--x=v`, `--x v`), take the first non-flag word as
//! the subcommand, and for `create`/`run` scan the command's own flags, which runc's
//! CLI library also accepts after the container id. Nothing here changes argv: the
//! shim always passes it through untouched.

use std::path::PathBuf;

/// runc's global flags that take a value.
const GLOBAL_VALUE_FLAGS: &[&str] = &["log", "log-format", "root", "criu", "rootless"];
/// `create`/`run` flags that take a value.
const COMMAND_VALUE_FLAGS: &[&str] = &[
    "bundle",
    "b",
    "console-socket",
    "pidfd-socket",
    "pid-file",
    "preserve-fds",
];

/// What the shim learned from argv.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invocation {
    /// The runc subcommand (`create`, `start`, `delete`, …), if any.
    pub subcommand: Option<String>,
    /// `--bundle`/`-b` of `create`/`run` (the last one wins, as in runc).
    pub bundle: Option<PathBuf>,
    /// The container id of `create`/`run`.
    pub container_id: Option<String>,
    /// runc's `--log`: where containerd and docker read runc's errors from.
    pub log: Option<PathBuf>,
    /// runc's `--log-format` (`text` or `json`).
    pub log_format: Option<String>,
    /// runc's `--version`/`-v` before the subcommand: the shim prints its own version
    /// first.
    pub version: bool,
}

impl Invocation {
    /// `create` and `run` are the commands whose spec we edit.
    pub fn creates_container(&self) -> bool {
        matches!(self.subcommand.as_deref(), Some("create" | "run"))
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ArgsError {
    #[error("flag {flag:?} needs a value")]
    MissingValue { flag: String },
}

/// A flag word split into its name and an inline `=value`.
fn flag(word: &str) -> Option<(&str, Option<&str>)> {
    let body = word.strip_prefix("--").or_else(|| word.strip_prefix('-'))?;
    if body.is_empty() {
        return None;
    }
    Some(match body.split_once('=') {
        Some((name, value)) => (name, Some(value)),
        None => (body, None),
    })
}

/// Scans `args` (argv without `argv[0]`).
pub fn scan(args: &[String]) -> Result<Invocation, ArgsError> {
    let mut inv = Invocation::default();
    let mut i = 0;
    while i < args.len() {
        let word = &args[i];
        if word == "--" {
            // Go's flag package stops here; the next word is the subcommand.
            i += 1;
            break;
        }
        let Some((name, inline)) = flag(word) else {
            break;
        };
        let value = if GLOBAL_VALUE_FLAGS.contains(&name) {
            match inline {
                Some(v) => Some(v.to_string()),
                None => {
                    i += 1;
                    Some(
                        args.get(i)
                            .cloned()
                            .ok_or_else(|| ArgsError::MissingValue { flag: word.clone() })?,
                    )
                }
            }
        } else {
            None
        };
        match (name, value) {
            ("log", Some(v)) => inv.log = Some(PathBuf::from(v)),
            ("log-format", Some(v)) => inv.log_format = Some(v),
            ("version" | "v", None) => inv.version = true,
            _ => {}
        }
        i += 1;
    }
    let Some(subcommand) = args.get(i) else {
        return Ok(inv);
    };
    inv.subcommand = Some(subcommand.clone());
    if inv.creates_container() {
        scan_create(&args[i + 1..], &mut inv)?;
    }
    Ok(inv)
}

fn scan_create(args: &[String], inv: &mut Invocation) -> Result<(), ArgsError> {
    let mut i = 0;
    let mut positional = Vec::new();
    while i < args.len() {
        let word = &args[i];
        if word == "--" {
            positional.extend(args[i + 1..].iter().cloned());
            break;
        }
        match flag(word) {
            Some((name, inline)) if COMMAND_VALUE_FLAGS.contains(&name) => {
                let value = match inline {
                    Some(v) => v.to_string(),
                    None => {
                        i += 1;
                        args.get(i)
                            .cloned()
                            .ok_or_else(|| ArgsError::MissingValue { flag: word.clone() })?
                    }
                };
                if name == "bundle" || name == "b" {
                    inv.bundle = Some(PathBuf::from(value));
                }
            }
            Some(_) => {}
            None => positional.push(word.clone()),
        }
        i += 1;
    }
    inv.container_id = positional.into_iter().next();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn argv(s: &str) -> Vec<String> {
        s.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn commands_and_bundles_are_found_as_runc_parses_them() {
        // (name, argv, subcommand, bundle, container id)
        type Case<'a> = (
            &'a str,
            &'a str,
            Option<&'a str>,
            Option<&'a str>,
            Option<&'a str>,
        );
        let cases: &[Case] = &[
            // (name, argv, subcommand, bundle, container id)
            (
                "containerd",
                "--root /run/containerd/runc/k8s.io --log /run/x/log.json --log-format json create --bundle /b/c1 --pid-file /b/init.pid c1",
                Some("create"),
                Some("/b/c1"),
                Some("c1"),
            ),
            (
                "docker",
                "--root /var/run/docker/runtime-runc/moby --log /x/log.json --log-format json --systemd-cgroup create --bundle /b --pid-file /b/pid cid",
                Some("create"),
                Some("/b"),
                Some("cid"),
            ),
            (
                "short flag",
                "create -b /b cid",
                Some("create"),
                Some("/b"),
                Some("cid"),
            ),
            (
                "inline value",
                "create --bundle=/b cid",
                Some("create"),
                Some("/b"),
                Some("cid"),
            ),
            (
                "single dash long",
                "-root /r create -bundle /b cid",
                Some("create"),
                Some("/b"),
                Some("cid"),
            ),
            (
                "flags after id",
                "create cid --bundle /b",
                Some("create"),
                Some("/b"),
                Some("cid"),
            ),
            (
                "last bundle wins",
                "create -b /a --bundle /b cid",
                Some("create"),
                Some("/b"),
                Some("cid"),
            ),
            ("no bundle", "run cid", Some("run"), None, Some("cid")),
            (
                "run detach",
                "run -d --bundle /b cid",
                Some("run"),
                Some("/b"),
                Some("cid"),
            ),
            (
                "exec is not create",
                "exec cid echo create",
                Some("exec"),
                None,
                None,
            ),
            (
                "bundle value named create",
                "start create",
                Some("start"),
                None,
                None,
            ),
            (
                "global value named create",
                "--root create start cid",
                Some("start"),
                None,
                None,
            ),
            ("state", "--root /r state cid", Some("state"), None, None),
            ("no command", "--version", None, None, None),
            ("empty", "", None, None, None),
            (
                "double dash",
                "--debug -- create -b /b x",
                Some("create"),
                Some("/b"),
                Some("x"),
            ),
        ];
        for (name, line, sub, bundle, id) in cases {
            let inv = scan(&argv(line)).unwrap_or_else(|e| panic!("case {name}: {e}"));
            assert_eq!(inv.subcommand.as_deref(), *sub, "case {name}");
            assert_eq!(
                inv.bundle.as_deref().and_then(|p| p.to_str()),
                *bundle,
                "case {name}"
            );
            assert_eq!(inv.container_id.as_deref(), *id, "case {name}");
        }
    }

    #[test]
    fn log_flags_are_kept_for_error_reports() {
        let inv = scan(&argv("--log /x/log.json --log-format=json delete c")).unwrap_or_default();
        assert_eq!(
            inv.log.as_deref().and_then(|p| p.to_str()),
            Some("/x/log.json")
        );
        assert_eq!(inv.log_format.as_deref(), Some("json"));
        assert!(!inv.creates_container());
    }

    #[test]
    fn version_is_runcs_global_flag_only() {
        for (line, version) in [
            ("--version", true),
            ("-v", true),
            ("--root /r -version", true),
            ("exec cid app --version", false),
            ("state cid", false),
        ] {
            assert_eq!(
                scan(&argv(line)).unwrap_or_default().version,
                version,
                "case {line}"
            );
        }
    }

    #[test]
    fn missing_values_are_errors() {
        for line in ["create --bundle", "--root", "run cid -b"] {
            assert!(
                matches!(scan(&argv(line)), Err(ArgsError::MissingValue { .. })),
                "case {line}"
            );
        }
    }

    proptest! {
        #[test]
        fn scanning_never_panics(args in prop::collection::vec("(-{0,2}[a-z=/-]{0,10})|create|run", 0..12)) {
            let _ = scan(&args);
        }
    }
}

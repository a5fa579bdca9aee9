//! Files that must not load: syntax, type and value errors, the checks beyond the
//! types, where each error points, and property tests that `parse` never panics.

use std::path::Path;

use proptest::prelude::*;

use super::location::line_column;
use super::tests::{FILE, NVIDIA_DEFAULT, parse_err, parse_ok};
use super::*;
use crate::request::Capability;

#[test]
fn bad_enum_value_names_key_value_and_valid_set() {
    let cases = [
        (
            "mode",
            "[nvidia-container-runtime]\nmode = \"bogus\"\n",
            "/etc/nvidia-container-runtime/config.toml:2:8: nvidia-container-runtime.mode: \
             unknown value \"bogus\" (valid: auto, legacy, cdi, jit-cdi, csv)",
        ),
        (
            "log-level",
            "[nvidia-container-runtime]\nlog-level = \"loud\"\n",
            "/etc/nvidia-container-runtime/config.toml:2:13: nvidia-container-runtime.log-level: \
             unknown value \"loud\" (valid: trace, debug, info, warn, error, warning, fatal, panic)",
        ),
        (
            "cuda-compat-mode",
            "[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = \"sometimes\"\n",
            "/etc/nvidia-container-runtime/config.toml:2:20: \
             nvidia-container-runtime.modes.legacy.cuda-compat-mode: \
             unknown value \"sometimes\" (valid: ldconfig, mount, hook, disabled)",
        ),
        (
            "mode as a dotted key",
            "nvidia-container-runtime.mode = \"\"\n",
            "/etc/nvidia-container-runtime/config.toml:1:33: nvidia-container-runtime.mode: \
             unknown value \"\" (valid: auto, legacy, cdi, jit-cdi, csv)",
        ),
    ];
    for (name, text, want) in cases {
        let err = parse_err(text);
        assert!(matches!(err, ConfigError::Value { .. }), "{name}: {err:?}");
        assert_eq!(err.to_string(), want, "{name}");
    }
}

#[test]
fn syntax_error_reports_line_and_column() {
    let cases = [
        (
            "unclosed table header",
            "disable-require = false\n[nvidia-container-runtime\nmode = \"cdi\"\n",
            (2, 26),
        ),
        (
            "missing value",
            "[nvidia-container-cli]\nroot =\nload-kmods = true\n",
            (2, 7),
        ),
        (
            "duplicate key",
            "[nvidia-ctk]\npath = \"a\"\npath = \"b\"\n",
            (3, 1),
        ),
        ("column counts characters", "# é\n  ü = = 1\n", (2, 7)),
    ];
    for (name, text, (line, column)) in cases {
        match parse_err(text) {
            ConfigError::Syntax { at, message } => {
                assert_eq!((at.line, at.column), (line, column), "{name}: {message}");
                assert_eq!(at.path, Path::new(FILE), "{name}");
                assert!(!message.is_empty(), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(
        parse_err("disable-require = false\n[nvidia-container-runtime\n").to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:26: invalid TOML: unclosed table, expected `]`"
    );
}

#[test]
fn type_error_reports_line_column_and_key() {
    let cases = [
        (
            "string for a list",
            "# comment\n[nvidia-container-runtime]\nruntimes = \"runc\"\n",
            (3, 12),
            "nvidia-container-runtime.runtimes",
        ),
        (
            "number in a list",
            "[nvidia-container-runtime]\nruntimes = [\"runc\", 7]\n",
            (2, 21),
            "nvidia-container-runtime.runtimes",
        ),
        (
            "string for a bool",
            "disable-require = \"yes\"\n",
            (1, 19),
            "disable-require",
        ),
        (
            "value for a table",
            "nvidia-ctk = 3\n",
            (1, 14),
            "nvidia-ctk",
        ),
        (
            "number for a path",
            "[nvshim]\nproc-root = 1\n",
            (2, 13),
            "nvshim.proc-root",
        ),
        (
            "string for a number",
            "[nvshim]\nnvml-timeout = \"10s\"\n",
            (2, 16),
            "nvshim.nvml-timeout",
        ),
    ];
    for (name, text, (line, column), want_key) in cases {
        match parse_err(text) {
            ConfigError::Value { at, key, message } => {
                assert_eq!((at.line, at.column), (line, column), "{name}: {message}");
                assert_eq!(key, want_key, "{name}");
                assert!(message.starts_with("invalid type"), "{name}: {message}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(
        parse_err("[nvidia-container-runtime]\nruntimes = \"runc\"\n").to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:12: nvidia-container-runtime.runtimes: \
         invalid type: string \"runc\", expected a sequence"
    );
}

#[test]
fn supported_driver_capabilities() {
    let all = DriverCapabilities::all();
    let compute_video = DriverCapabilities::EMPTY
        .with(Capability::Compute)
        .with(Capability::Video);
    let cases = [
        ("default", None, all),
        ("all", Some("all"), all),
        ("subset", Some("video, compute"), compute_video),
        (
            "empty means none, as in NVIDIA's hook",
            Some(""),
            DriverCapabilities::EMPTY,
        ),
    ];
    for (name, value, want) in cases {
        let text = value.map_or(String::new(), |v| {
            format!("supported-driver-capabilities = \"{v}\"\n")
        });
        let (config, _) = parse_ok(&text);
        assert_eq!(config.supported_capabilities().ok(), Some(want), "{name}");
    }

    let err = parse_err("\nsupported-driver-capabilities = \"compute,gpu\"\n");
    assert_eq!(
        err.to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:33: supported-driver-capabilities: \
         unsupported driver capability \"gpu\" in \"compute,gpu\" \
         (valid: compat32, compute, display, graphics, ngx, utility, video, all)"
    );

    let config = Config {
        supported_driver_capabilities: "compute,gpu".into(),
        ..Config::default()
    };
    assert!(matches!(
        config.supported_capabilities(),
        Err(ConfigError::Capabilities(_))
    ));
}

#[test]
fn ldconfig_must_be_a_host_path_unless_allowed() {
    let cases = [
        (
            "host path",
            "[nvidia-container-cli]\nldconfig = \"@/sbin/ldconfig.real\"\n",
            true,
        ),
        (
            "container path",
            "[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n",
            false,
        ),
        ("empty", "[nvidia-container-cli]\nldconfig = \"\"\n", false),
        (
            "container path, allowed",
            "[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n\
             [features]\nallow-ldconfig-from-container = true\n",
            true,
        ),
    ];
    for (name, text, ok) in cases {
        assert_eq!(parse(text, Path::new(FILE)).is_ok(), ok, "{name}");
    }
    assert_eq!(
        parse_err("[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n").to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:12: nvidia-container-cli.ldconfig: \
         \"/sbin/ldconfig\" is not a host path (no leading '@'); an ldconfig inside the \
         container needs features.allow-ldconfig-from-container = true"
    );
}

#[test]
fn line_column_of_offsets() {
    let text = "ab\ncé\n\nd";
    let cases = [
        (0, (1, 1)),
        (2, (1, 3)),
        (3, (2, 1)),
        (4, (2, 2)),
        (5, (2, 2)), // inside 'é': rounds down to its start
        (6, (2, 3)),
        (7, (3, 1)),
        (8, (4, 1)),
        (9, (4, 2)),
        (99, (4, 2)),
    ];
    for (offset, want) in cases {
        assert_eq!(line_column(text, offset), want, "offset {offset}");
    }
}

/// Random edits of the NVIDIA default file: delete a range, insert text, or replace a
/// character.
fn mutated_default() -> impl Strategy<Value = String> {
    let edit = (
        0usize..4,
        any::<prop::sample::Index>(),
        0usize..40,
        ".{0,12}",
    );
    prop::collection::vec(edit, 1..6).prop_map(|edits| {
        let mut chars: Vec<char> = NVIDIA_DEFAULT.chars().collect();
        for (kind, at, len, insert) in edits {
            let at = at.index(chars.len() + 1);
            match kind {
                0 => {
                    let end = (at + len).min(chars.len());
                    chars.drain(at..end);
                }
                1 => {
                    chars.splice(at..at, insert.chars());
                }
                2 if at < chars.len() => {
                    chars[at] = insert.chars().next().unwrap_or('"');
                }
                _ => {
                    let pick = ['"', '[', ']', '=', '\n', '.', ',', '#', '\\', '{'];
                    chars.insert(at, pick[len % pick.len()]);
                }
            }
        }
        chars.into_iter().collect()
    })
}

proptest! {
    #[test]
    fn parse_never_panics(text in "\\PC*") {
        let _ = parse(&text, Path::new(FILE));
    }

    #[test]
    fn parse_never_panics_on_toml_like_text(text in "[\\[\\]a-z\\-\\.=\"#, \\n{}0-9@/]{0,200}") {
        let _ = parse(&text, Path::new(FILE));
    }

    #[test]
    fn parse_never_panics_on_mutated_default(text in mutated_default()) {
        match parse(&text, Path::new(FILE)) {
            // Every error points into the file.
            Err(ConfigError::Syntax { at, .. } | ConfigError::Value { at, .. }) => {
                prop_assert!(at.line <= text.lines().count() + 1, "{at} in {text:?}");
            }
            Err(e) => prop_assert!(false, "unexpected error kind {e:?}"),
            Ok(_) => {}
        }
    }
}

// SPDX-License-Identifier: Apache-2.0
//! `nvidia-ctk config --set`: format-preserving edits, checked by the config parser.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const FILE: &str = "# top comment\n\
disable-require = false\n\
\n\
[nvidia-container-cli]\n\
# keep me\n\
ldconfig = \"@/sbin/ldconfig\" # trailing\n\
\n\
[someone-elses]\n\
answer = 42\n";

fn sets(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| (*s).to_owned()).collect()
}

fn edited(text: &str, list: &[&str]) -> String {
    edit(text, Path::new("config.toml"), &sets(list)).unwrap()
}

fn failed(text: &str, list: &[&str]) -> String {
    edit(text, Path::new("config.toml"), &sets(list))
        .unwrap_err()
        .to_string()
}

#[test]
fn sets_keep_comments_order_and_unknown_tables() {
    let out = edited(
        FILE,
        &[
            "nvidia-container-cli.no-cgroups",
            "nvidia-container-cli.ldconfig=@/sbin/ldconfig.real",
            "nvidia-container-runtime.modes.cdi.spec-dirs=/etc/cdi,/run/cdi",
            "nvidia-container-runtime.log-level=debug",
            "nvshim.nvml-timeout=3",
        ],
    );
    let want = "# top comment\n\
disable-require = false\n\
\n\
[nvidia-container-cli]\n\
# keep me\n\
ldconfig = \"@/sbin/ldconfig.real\" # trailing\n\
no-cgroups = true\n\
\n\
[someone-elses]\n\
answer = 42\n\
\n\
[nvidia-container-runtime]\n\
log-level = \"debug\"\n\
\n\
[nvidia-container-runtime.modes.cdi]\n\
spec-dirs = [\"/etc/cdi\", \"/run/cdi\"]\n\
\n\
[nvshim]\n\
nvml-timeout = 3\n";
    assert_eq!(out, want);
    let (config, unknown) = nvconfig::parse(&out, Path::new("x")).unwrap();
    assert!(config.nvidia_container_cli.no_cgroups);
    assert_eq!(config.nvshim.nvml_timeout, 3);
    assert_eq!(unknown, ["someone-elses"]);
}

#[test]
fn no_sets_prints_the_file_unchanged_and_empty_values_remove() {
    assert_eq!(edited(FILE, &[]), FILE);
    let out = edited(FILE, &["nvidia-container-cli.ldconfig=", "swarm-resource="]);
    assert!(!out.contains("ldconfig ="), "{out}");
    assert!(out.contains("# top comment"), "{out}");
    assert_eq!(
        edited("", &["disable-require=true"]),
        "disable-require = true\n"
    );
    // An optional key the defaults leave unset is still known to the parser.
    assert_eq!(
        edited("", &["nvidia-container-cli.dev-root=/run/nvidia/driver"]),
        "[nvidia-container-cli]\ndev-root = \"/run/nvidia/driver\"\n"
    );
}

#[test]
fn bad_keys_and_values_name_what_is_wrong() {
    let cases: &[(&str, &[&str])] = &[
        (
            "nvidia-container-cli.no-such-key=1",
            &["unknown key", "nvidia-container-cli.no-cgroups (boolean)"],
        ),
        (
            "features.allow-ldconfig-from-container=maybe",
            &["\"maybe\" is not a boolean"],
        ),
        ("nvshim.nvml-timeout=soon", &["\"soon\" is not an integer"]),
        (
            "nvidia-container-runtime.log-level=loud",
            &["nvidia-container-runtime.log-level", "loud"],
        ),
        ("nvidia-container-runtime.mode", &["expected key=value"]),
        ("nvidia-container-cli=1", &["is a table"]),
        ("a..b=1", &["dotted key"]),
        ("someone-elses=1", &["unknown key"]),
    ];
    for (set, wants) in cases {
        let err = failed(FILE, &[set]);
        for want in *wants {
            assert!(err.contains(want), "{set}: {err:?} lacks {want:?}");
        }
    }
    let syntax = failed("[broken", &[]);
    assert!(syntax.contains("config.toml"), "{syntax}");
}

#[test]
fn the_default_is_the_shipped_file_and_parses_to_our_defaults() {
    let (config, unknown) = nvconfig::parse(DEFAULT_CONFIG, Path::new("default")).unwrap();
    assert_eq!(config, Config::default());
    assert!(unknown.is_empty(), "{unknown:?}");
}

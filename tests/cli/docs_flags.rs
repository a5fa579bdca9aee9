//! The docs against the code: every flag a binary defines and every config key is
//! documented, and the docs' flag and key tables name nothing the code does not define.
//!
//! Where the names come from (the source of truth, never a list kept here):
//! - `nvshim`: its clap command (`CommandFactory`), every subcommand, long names and
//!   aliases;
//! - NVIDIA's names of the `nvshim` binary (`nvidia-ctk`, `nvidia-cdi-hook`,
//!   `nvidia-container-cli`): their clap commands, on one page;
//! - `nvidia-device-plugin`: the built binary's `--help`, found in the target directory
//!   this test runs from (the binary may live in another workspace crate);
//! - `nvidia-container-runtime-hook`: the valid sets its own parse errors name;
//! - `nvidia-container-runtime`: runc's flags that change what `runtime::args::scan`
//!   reads (the shim defines none of its own and passes the rest to runc);
//! - `config.toml`: a default `Config` serialized to TOML, every leaf key;
//! - the device plugin's config file: the key sets its parser names when it rejects an
//!   unknown key, table by table.
//!
//! What counts as documented: a row of a flag table (header cell `flag`) in the binary's
//! page, or of a key table (`key` for config.toml, `file key` for the plugin's file) in
//! `docs/configuration.md`. The first cell of each row names the flag or key in
//! backticks; aliases go in the same cell. The reverse holds too: a table row naming a
//! flag or key the code does not define fails. Fast: no engine, no container.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use clap::CommandFactory;

/// Where each binary's flag table lives.
const RUNTIME_PAGE: &str = "docs/runtime.md";
const HOOK_PAGE: &str = "docs/hook.md";
const CLI_PAGE: &str = "docs/cli.md";
const NVIDIA_TOOLS_PAGE: &str = "docs/nvidia-tools.md";
const PLUGIN_PAGE: &str = "docs/configuration.md";
const CONFIG_PAGE: &str = "docs/configuration.md";

/// clap's own flags, documented once by clap itself.
const CLAP_BUILTINS: [&str; 4] = ["help", "version", "h", "V"];

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn read(page: &str) -> String {
    std::fs::read_to_string(repo().join(page)).unwrap_or_else(|e| panic!("{page}: {e}"))
}

// ---- the docs side ----

/// Splits a table row into cells on `|`, keeping markdown's escaped `\|` inside a cell.
fn cells(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cell = String::new();
    let mut chars = line.trim().trim_start_matches('|').chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'|') => {
                cell.push('|');
                chars.next();
            }
            '|' => out.push(std::mem::take(&mut cell).trim().to_owned()),
            c => cell.push(c),
        }
    }
    if !cell.trim().is_empty() {
        out.push(cell.trim().to_owned());
    }
    out
}

/// The first cells of every row of the tables on `page` whose header's first cell is
/// `header`, with the line number of each row.
pub(crate) fn table_first_cells(text: &str, header: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut in_table = false;
    let mut wanted = false;
    for (n, line) in text.lines().enumerate() {
        if !line.trim_start().starts_with('|') {
            in_table = false;
            continue;
        }
        let row = cells(line);
        let first = row.first().cloned().unwrap_or_default();
        if !in_table {
            in_table = true;
            wanted = first.trim_matches('`').eq_ignore_ascii_case(header);
            continue;
        }
        if !wanted || first.chars().all(|c| matches!(c, '-' | ':' | ' ')) {
            continue;
        }
        out.push((n + 1, first));
    }
    out
}

/// The backticked spans of `cell`.
pub(crate) fn code_spans(cell: &str) -> Vec<&str> {
    cell.split('`').skip(1).step_by(2).collect()
}

/// Flag names (without dashes) a flag-table cell names: every word in backticks that
/// starts with `-`, cut at `=`, `[` or anything that is not part of a name (NVIDIA's
/// names may hold dots: `--cdi.enabled`).
fn flags_in_cell(cell: &str) -> Vec<String> {
    code_spans(cell)
        .into_iter()
        .flat_map(str::split_whitespace)
        .filter(|w| w.starts_with('-'))
        .map(|w| {
            w.trim_start_matches('-')
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '.'))
                .collect::<String>()
                .trim_end_matches('.')
                .to_owned()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

/// The flags a page's flag tables document, with where.
fn documented_flags(page: &str) -> Vec<(String, String)> {
    let text = read(page);
    table_first_cells(&text, "flag")
        .into_iter()
        .flat_map(|(line, cell)| {
            flags_in_cell(&cell)
                .into_iter()
                .map(move |f| (f, format!("{page}:{line}")))
        })
        .collect()
}

/// The keys a page's key tables (header `header`) document, with where.
fn documented_keys(page: &str, header: &str) -> Vec<(String, String)> {
    let text = read(page);
    table_first_cells(&text, header)
        .into_iter()
        .flat_map(|(line, cell)| {
            code_spans(&cell)
                .into_iter()
                .map(|k| (k.to_owned(), format!("{page}:{line}")))
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Both directions for one binary or key set: `defined` all documented on `page`, and
/// the page's tables naming only what is defined.
fn compare(what: &str, defined: &BTreeSet<String>, documented: &[(String, String)]) -> Vec<String> {
    let names: BTreeSet<&str> = documented.iter().map(|(n, _)| n.as_str()).collect();
    let mut problems = Vec::new();
    for name in defined {
        if !names.contains(name.as_str()) {
            problems.push(format!("{what}: `{name}` is defined but not documented"));
        }
    }
    for (name, at) in documented {
        if !defined.contains(name) {
            problems.push(format!(
                "{what}: `{name}` ({at}) is documented but not defined"
            ));
        }
    }
    problems
}

fn assert_none(problems: Vec<String>) {
    assert!(
        problems.is_empty(),
        "docs and code disagree:\n  {}",
        problems.join("\n  ")
    );
}

// ---- the code side ----

/// The directory holding the workspace's binaries: this test runs from its `deps/`.
fn target_bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let deps = exe.parent().expect("the test's directory");
    let dir = if deps.ends_with("deps") {
        deps.parent().expect("the target profile directory")
    } else {
        deps
    };
    dir.to_path_buf()
}

/// Long and short names and aliases of a clap command and all its subcommands.
fn clap_flags(cmd: &clap::Command, out: &mut BTreeSet<String>) {
    for arg in cmd.get_arguments() {
        if let Some(long) = arg.get_long() {
            out.insert(long.to_owned());
        }
        if let Some(short) = arg.get_short() {
            out.insert(short.to_string());
        }
        for alias in arg.get_all_aliases().unwrap_or_default() {
            out.insert(alias.to_owned());
        }
    }
    for sub in cmd.get_subcommands() {
        clap_flags(sub, out);
    }
}

fn without_builtins(mut flags: BTreeSet<String>) -> BTreeSet<String> {
    for builtin in CLAP_BUILTINS {
        flags.remove(builtin);
    }
    flags
}

/// Every `--name` in a help text.
fn long_flags_in(text: &str) -> BTreeSet<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, ',' | '[' | ']' | '(' | ')'))
        .filter_map(|w| w.strip_prefix("--"))
        .map(|w| {
            w.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                .collect::<String>()
        })
        .filter(|name| !name.is_empty())
        .collect()
}

fn run_output(bin: &Path, args: &[&str]) -> String {
    let out = Command::new(bin)
        .args(args)
        .env_clear()
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("running {}: {e}", bin.display()));
    let mut text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stderr));
    text
}

/// The flag names after `valid:` in an error message (`-config`, `--link`, …).
fn valid_set(message: &str) -> BTreeSet<String> {
    let tail = message
        .split_once("valid:")
        .unwrap_or_else(|| panic!("no valid set in {message:?}"))
        .1;
    tail.split(|c: char| c.is_whitespace() || matches!(c, ',' | '(' | ')'))
        .filter(|w| w.starts_with('-'))
        .map(|w| w.trim_start_matches('-').to_owned())
        .collect()
}

fn nvshim_flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    clap_flags(&nvshim::cli::Cli::command(), &mut flags);
    // `gpu-feature-discovery` is `nvshim labels` under GFD's name: the same flags, in
    // the same tables.
    clap_flags(
        &nvshim::cli::labels::feature_discovery::GfdCli::command(),
        &mut flags,
    );
    without_builtins(flags)
}

/// `nvidia-ctk`, `nvidia-cdi-hook` (the same hooks as `nvidia-ctk hook`) and
/// `nvidia-container-cli`.
fn nvidia_tools_flags() -> BTreeSet<String> {
    let mut flags = BTreeSet::new();
    clap_flags(&nvshim::ctk::Ctk::command(), &mut flags);
    clap_flags(&nvshim::ctk::CdiHook::command(), &mut flags);
    clap_flags(&nvshim::container_cli::ContainerCli::command(), &mut flags);
    without_builtins(flags)
}

fn plugin_flags() -> BTreeSet<String> {
    let bin = target_bin_dir().join("nvidia-device-plugin");
    assert!(
        bin.is_file(),
        "{} is not built: build the workspace's binaries first (cargo build --workspace)",
        bin.display()
    );
    let mut flags = long_flags_in(&run_output(&bin, &["--help"]));
    flags.extend(long_flags_in(&run_output(
        &bin,
        &["mps-control-daemon", "--help"],
    )));
    without_builtins(flags)
}

fn hook_flags() -> BTreeSet<String> {
    let bin = Path::new(env!("CARGO_BIN_EXE_nvidia-container-runtime-hook"));
    let mut flags = valid_set(&run_output(bin, &["-docs-probe"]));
    flags.extend(valid_set(&run_output(
        bin,
        &["link-driver", "--docs-probe"],
    )));
    flags.extend(valid_set(&run_output(
        bin,
        &["disable-device-node-modification", "--docs-probe"],
    )));
    flags
}

/// runc's global and `create`/`run` flags: the universe the shim may read from.
const RUNC_FLAGS: &[&str] = &[
    "debug",
    "log",
    "log-format",
    "root",
    "criu",
    "systemd-cgroup",
    "rootless",
    "bundle",
    "b",
    "console-socket",
    "pidfd-socket",
    "pid-file",
    "no-pivot",
    "no-new-keyring",
    "preserve-fds",
    "detach",
    "d",
    "keep",
    "no-subreaper",
    "version",
    "v",
];

/// Whether the shim reads runc flag `name` (given before or after `create`).
fn runtime_reads(name: &str) -> bool {
    let strings = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let dashes = if name.len() == 1 { "-" } else { "--" };
    let flag = format!("{dashes}{name}=docs-probe");
    let base = nvshim::runtime::args::scan(&strings(&["create", "ctr"])).expect("base argv");
    [
        strings(&[&flag, "create", "ctr"]),
        strings(&["create", &flag, "ctr"]),
    ]
    .iter()
    .any(|argv| nvshim::runtime::args::scan(argv).is_ok_and(|inv| inv != base))
}

fn runtime_flags() -> BTreeSet<String> {
    RUNC_FLAGS
        .iter()
        .filter(|f| runtime_reads(f))
        .map(|f| f.to_string())
        .collect()
}

/// Dotted leaf keys of a TOML table.
fn toml_keys(prefix: &str, table: &toml::Table, out: &mut BTreeSet<String>) {
    for (key, value) in table {
        let path = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        match value {
            toml::Value::Table(inner) => toml_keys(&path, inner, out),
            _ => {
                out.insert(path);
            }
        }
    }
}

fn config_keys() -> BTreeSet<String> {
    let mut config = nvshim::config::Config::default();
    // Optional keys serialize only when set.
    config.nvidia_container_cli.dev_root = Some(PathBuf::from("/"));
    let table = toml::Table::try_from(&config).expect("Config serializes to a TOML table");
    let mut keys = BTreeSet::new();
    toml_keys("", &table, &mut keys);
    keys
}

/// The keys the plugin's config parser accepts in the table at `path`, from the error
/// it gives for an unknown key there. `yaml` holds the key `docsProbe` in that table.
fn plugin_table_keys(path: &str, yaml: &str) -> BTreeSet<String> {
    let err = nvshim::k8s_config::parse_file(yaml.as_bytes(), Path::new("probe.yaml"))
        .expect_err("an unknown key is an error")
        .to_string();
    // serde's words: "unknown field `x`, expected one of a, b, c at line 2, column 9"
    // (or "expected a or b", "expected a").
    let expected = err
        .split_once("expected")
        .unwrap_or_else(|| panic!("no expected keys in {err:?}"))
        .1;
    let expected = expected.split(" at line").next().unwrap_or(expected);
    let expected = expected.trim().trim_start_matches("one of").trim();
    expected
        .split(", ")
        .flat_map(|k| k.split(" or "))
        .map(|k| k.trim().trim_matches('`'))
        .filter(|k| !k.is_empty())
        .map(|k| {
            if path.is_empty() {
                k.to_owned()
            } else {
                format!("{path}.{k}")
            }
        })
        .collect()
}

fn plugin_file_keys() -> BTreeSet<String> {
    let tables = [
        ("", "version: v1\ndocsProbe: 1\n"),
        ("flags", "version: v1\nflags: {docsProbe: 1}\n"),
        (
            "flags.plugin",
            "version: v1\nflags: {plugin: {docsProbe: 1}}\n",
        ),
        ("flags.gfd", "version: v1\nflags: {gfd: {docsProbe: 1}}\n"),
        ("resources", "version: v1\nresources: {docsProbe: 1}\n"),
        ("sharing", "version: v1\nsharing: {docsProbe: 1}\n"),
        (
            "sharing.timeSlicing",
            "version: v1\nsharing: {timeSlicing: {docsProbe: 1}}\n",
        ),
        (
            "sharing.mps",
            "version: v1\nsharing: {mps: {docsProbe: 1}}\n",
        ),
        (
            "sharing.timeSlicing.resources[]",
            "version: v1\nsharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, docsProbe: 1}]}}\n",
        ),
        (
            "sharing.mps.resources[]",
            "version: v1\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2, docsProbe: 1}]}}\n",
        ),
        ("imex", "version: v1\nimex: {docsProbe: 1}\n"),
    ];
    let mut keys = BTreeSet::new();
    for (path, yaml) in tables {
        keys.extend(plugin_table_keys(path, yaml));
    }
    // A table is documented by its keys, not by its own name.
    let parents: BTreeSet<String> = tables.iter().map(|(p, _)| p.to_string()).collect();
    keys.retain(|k| !parents.contains(k) && !parents.contains(&format!("{k}[]")));
    keys
}

// ---- the tests ----

#[test]
fn nvshim_flags_are_documented() {
    assert_none(compare(
        "nvshim",
        &nvshim_flags(),
        &documented_flags(CLI_PAGE),
    ));
}

#[test]
fn nvidia_tools_flags_are_documented() {
    assert_none(compare(
        "nvidia-ctk, nvidia-cdi-hook, nvidia-container-cli",
        &nvidia_tools_flags(),
        // nvidia-container-cli's `--version`/`-V` are documented for the lines it prints.
        &documented_flags(NVIDIA_TOOLS_PAGE)
            .into_iter()
            .filter(|(flag, _)| !CLAP_BUILTINS.contains(&flag.as_str()))
            .collect::<Vec<_>>(),
    ));
}

#[test]
fn device_plugin_flags_are_documented() {
    assert_none(compare(
        "nvidia-device-plugin",
        &plugin_flags(),
        &documented_flags(PLUGIN_PAGE),
    ));
}

#[test]
fn hook_flags_are_documented() {
    assert_none(compare(
        "nvidia-container-runtime-hook",
        &hook_flags(),
        &documented_flags(HOOK_PAGE),
    ));
}

#[test]
fn runtime_flags_are_documented() {
    let defined = runtime_flags();
    assert!(
        defined.contains("bundle") && defined.contains("log"),
        "the probe of runtime::args::scan finds the flags it reads: {defined:?}"
    );
    assert_none(compare(
        "nvidia-container-runtime",
        &defined,
        &documented_flags(RUNTIME_PAGE),
    ));
}

#[test]
fn config_toml_keys_are_documented() {
    let keys = config_keys();
    assert!(
        keys.contains("nvidia-container-runtime.modes.cdi.spec-dirs"),
        "nested keys are walked: {keys:?}"
    );
    assert_none(compare(
        "config.toml",
        &keys,
        &documented_keys(CONFIG_PAGE, "key"),
    ));
}

#[test]
fn device_plugin_file_keys_are_documented() {
    let keys = plugin_file_keys();
    assert!(
        keys.contains("flags.plugin.deviceListStrategy"),
        "the parser's key sets are read: {keys:?}"
    );
    assert_none(compare(
        "device plugin config file",
        &keys,
        &documented_keys(CONFIG_PAGE, "file key"),
    ));
}

/// The docs side finds what it should: a flag in a flag table, an escaped `|` kept in
/// its cell, aliases in the first cell, and nothing from other tables.
#[test]
fn the_table_reader_reads_flag_tables_only() {
    let page = "\
| flag | default |\n\
| --- | --- |\n\
| `--mig-strategy none\\|single` (`--alias-x`) | `none` |\n\
| `-config FILE` | |\n\
\n\
| variable | flag |\n\
| --- | --- |\n\
| `--not-a-flag-row` | `--x` |\n";
    let rows = table_first_cells(page, "flag");
    let flags: Vec<String> = rows.iter().flat_map(|(_, c)| flags_in_cell(c)).collect();
    assert_eq!(flags, ["mig-strategy", "alias-x", "config"]);
    let defined: BTreeSet<String> = ["mig-strategy".to_owned()].into();
    let documented: Vec<(String, String)> = flags.iter().map(|f| (f.clone(), "t".into())).collect();
    let problems = compare("case", &defined, &documented);
    assert_eq!(
        problems.len(),
        2,
        "alias-x and config are not defined: {problems:?}"
    );
    let problems = compare("case", &["gone".to_owned()].into(), &[]);
    assert_eq!(
        problems.len(),
        1,
        "an undocumented flag is reported: {problems:?}"
    );
}

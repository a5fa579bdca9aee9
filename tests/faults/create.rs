//! Faults around `nvidia-container-runtime create` (issue 9, item 5), each with the real
//! runtime binary on a simulated node and (but for one run through real runc) a stand-in
//! runc that records whether it ran:
//! a `config.json` that cannot be read or parsed, or is huge; a low-level runtime that is
//! not there; a debug log that cannot be written. A failed create must say what was
//! wrong, never reach runc, and leave the bundle exactly as it was.
//!
//! Disk full (and a read-only bundle), a hanging NVML and `kill -9` mid-create are in the
//! modules `disk`, `nvml` and `kill`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::symlink;
use std::path::Path;

use crate::kit::{FAKE_RUNC_EXIT, Host, entries, stderr, temp_files};
use nix::sys::stat::Mode;
use nvshim_testkit::runc_bundle;
use serde_json::Value;

const GPU: &str = "NVIDIA_VISIBLE_DEVICES=0";

/// What a bundle's `config.json` is, for comparing before and after: the bytes of a
/// file, the target of a symlink, or the kind of anything else.
#[derive(Debug, PartialEq, Eq)]
enum Entry {
    File(Vec<u8>),
    Link(std::path::PathBuf),
    Other(String),
}

fn entry(path: &Path) -> Entry {
    let meta = fs::symlink_metadata(path).unwrap();
    if meta.is_symlink() {
        Entry::Link(fs::read_link(path).unwrap())
    } else if meta.is_file() {
        Entry::File(fs::read(path).unwrap())
    } else {
        Entry::Other(format!("{:?}", meta.file_type()))
    }
}

/// Not a file, not JSON, not an object: one error line naming the file (also in runc's
/// `--log`), and nothing in the bundle changed or added.
#[test]
fn a_config_json_that_cannot_be_read_or_parsed_fails_the_create_and_stays_as_it_was() {
    let host = Host::new(2);
    type Make = fn(&Path);
    let cases: [(&str, Make, &[&str]); 8] = [
        (
            "a directory",
            |p| fs::create_dir(p).unwrap(),
            &["is not a regular file (found a directory)"],
        ),
        (
            "a FIFO",
            |p| nix::unistd::mkfifo(p, Mode::from_bits_truncate(0o644)).unwrap(),
            &["is not a regular file (found a FIFO)"],
        ),
        (
            "a symlink to /dev/zero",
            |p| symlink("/dev/zero", p).unwrap(),
            &["is not a regular file (found a character device)"],
        ),
        (
            "a dangling symlink",
            |p| symlink("/nonexistent/nvshim-config.json", p).unwrap(),
            &["cannot read", "No such file or directory"],
        ),
        (
            "empty",
            |p| fs::write(p, b"").unwrap(),
            &["is not valid JSON", "EOF"],
        ),
        (
            "not JSON",
            |p| fs::write(p, b"{\"ociVersion\": \"1.2.0\", oops}").unwrap(),
            &["is not valid JSON", "line 1 column"],
        ),
        (
            "truncated JSON",
            |p| fs::write(p, &crate::kit::spec_bytes(&[GPU], "rootfs")[..600]).unwrap(),
            &["is not valid JSON", "EOF while parsing"],
        ),
        (
            "a JSON array",
            |p| fs::write(p, b"[{\"ociVersion\": \"1.2.0\"}]").unwrap(),
            &["must be a JSON object, found an array"],
        ),
    ];
    for (case, make, want) in cases {
        let slug: String = case
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        let bundle = host.dir.path().join(&slug);
        fs::create_dir_all(bundle.join("rootfs")).unwrap();
        let config = bundle.join("config.json");
        make(&config);
        let before = entry(&config);
        let names = entries(&bundle);
        host.forget_runc();

        let b = bundle.to_str().unwrap();
        let log = host.dir.path().join(format!("{slug}.runc-log"));
        let args = ["--log", log.to_str().unwrap(), "create", "--bundle", b, "c"];
        let out = host.runtime(case, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {err}");
        assert!(
            err.starts_with("nvidia-container-runtime: ")
                && err.contains(&*config.to_string_lossy()),
            "{case}: the error names the file: {err}"
        );
        for w in want {
            assert!(err.contains(w), "{case}: {w:?} in {err}");
        }
        let logged = fs::read_to_string(&log).unwrap_or_default();
        assert!(
            logged.contains("level=error") && logged.contains("config.json"),
            "{case}: runc's --log has the error: {logged}"
        );
        assert!(host.runc_argv().is_none(), "{case}: runc must not run");
        assert_eq!(entry(&config), before, "{case}: config.json as it was");
        assert_eq!(
            entries(&bundle),
            names,
            "{case}: nothing added to the bundle"
        );
    }
}

/// 100 MB of valid JSON (one annotation holding a 100 MB string): there is no size limit
/// on `config.json` (runc has none either), so the create succeeds and the big value
/// comes back byte for byte. (The JSON is spliced as bytes: a debug build's serde takes
/// seconds per 100 MB, and the runtime's own parse and rewrite is what is under test.)
#[test]
fn a_huge_config_json_is_injected_whole() {
    let host = Host::new(2);
    let bundle = host.bundle("huge", &[GPU]);
    let config = bundle.join("config.json");
    let mut spec: Value = serde_json::from_slice(&fs::read(&config).unwrap()).unwrap();
    spec["annotations"]["example.com/huge"] = Value::String("HUGE".into());
    let small = serde_json::to_vec(&spec).unwrap();
    // Mostly ASCII, with characters JSON must escape and multi-byte UTF-8 now and then,
    // as serde_json escapes them (so the rewrite must reproduce these very bytes).
    let unit = r#"0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcd\"\\\né\t"#;
    let big = format!("\"{}\"", unit.repeat(100 * 1024 * 1024 / unit.len()));
    let at = find(&small, b"\"HUGE\"").unwrap();
    let bytes = [&small[..at], big.as_bytes(), &small[at + 6..]].concat();
    assert!(bytes.len() > 100 * 1000 * 1000, "{} bytes", bytes.len());
    fs::write(&config, &bytes).unwrap();
    drop(bytes);

    let out = host.runtime(
        "huge",
        &["create", "--bundle", bundle.to_str().unwrap(), "c"],
    );
    assert_eq!(out.status.code(), Some(FAKE_RUNC_EXIT), "{}", stderr(&out));
    let after = fs::read(&config).unwrap();
    let key = b"\"example.com/huge\":";
    let at = find(&after, key).expect("the annotation is still there") + key.len();
    assert!(
        after[at..].starts_with(big.as_bytes()),
        "the 100 MB annotation survives the rewrite byte for byte"
    );
    let mut rest: Value =
        serde_json::from_slice(&[&after[..at], b"null", &after[at + big.len()..]].concat())
            .unwrap();
    assert_eq!(rest["annotations"]["nvshim.io/injected"], "0");
    // GPU 0 of the standard node is /dev/nvidia1 (the testkit swaps the last two minors).
    let devices = rest["linux"]["devices"].take();
    let devices = devices.as_array().unwrap();
    assert!(
        devices.iter().any(|d| d["path"] == "/dev/nvidia1"),
        "{devices:?}"
    );
    assert_eq!(temp_files(&bundle), Vec::<std::path::PathBuf>::new());
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Neither the absolute path nor the name in `runtimes` exists: every command fails
/// naming both and the directories the name was looked up in, and a create leaves
/// `config.json` alone.
#[test]
fn a_missing_low_level_runtime_is_named_with_where_it_was_looked_for() {
    let host = Host::new(2);
    let config = host.default_config().replace(
        &format!("runtimes = [\"{}\"]", host.fake_runc().display()),
        "runtimes = [\"/nonexistent/runc\", \"nvshim-no-such-runc\"]",
    );
    assert!(config.contains("nvshim-no-such-runc"), "{config}");
    host.write_config(&config);
    let gpu = host.bundle("gpu", &[GPU]);
    let plain = host.bundle("plain", &[]);
    let cases: [(&str, Vec<&str>, Option<&Path>); 5] = [
        (
            "create with a GPU",
            vec!["create", "--bundle", gpu.to_str().unwrap(), "c"],
            Some(&gpu),
        ),
        (
            "run without a GPU",
            vec!["run", "--bundle", plain.to_str().unwrap(), "c"],
            Some(&plain),
        ),
        ("state", vec!["state", "c"], None),
        ("delete", vec!["delete", "--force", "c"], None),
        ("version", vec!["--version"], None),
    ];
    for (case, args, bundle) in cases {
        let before = bundle.map(|b| fs::read(b.join("config.json")).unwrap());
        let out = host.runtime(case, &args);
        let err = stderr(&out);
        assert_eq!(out.status.code(), Some(1), "{case}: {err}");
        for want in [
            "no low-level runtime found",
            "\"/nonexistent/runc\"",
            "\"nvshim-no-such-runc\"",
            "/usr/sbin",
            "/usr/bin",
        ] {
            assert!(err.contains(want), "{case}: {want:?} in {err}");
        }
        assert_eq!(err.lines().count(), 1, "{case}: one line: {err}");
        if let (Some(b), Some(before)) = (bundle, before) {
            assert_eq!(
                fs::read(b.join("config.json")).unwrap(),
                before,
                "{case}: config.json untouched"
            );
            assert_eq!(temp_files(b), Vec::<std::path::PathBuf>::new(), "{case}");
        }
    }
}

/// A debug log the runtime cannot open (under /proc, a directory, a FIFO nobody reads)
/// costs the log, not the container: the GPUs are injected and runc runs.
#[test]
fn an_unwritable_debug_log_does_not_stop_containers() {
    let host = Host::new(2);
    let dir_log = host.dir.path().join("log-is-a-dir");
    fs::create_dir(&dir_log).unwrap();
    let fifo = host.dir.path().join("log-is-a-fifo");
    nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o644)).unwrap();
    let cases = [
        (
            "under /proc",
            Path::new("/proc/nvshim-cannot-write/runtime.log"),
        ),
        ("a directory", dir_log.as_path()),
        ("a FIFO without a reader", fifo.as_path()),
    ];
    for (case, log) in cases {
        let config = host.default_config().replace(
            &format!("debug = \"{}\"", host.debug_log().display()),
            &format!("debug = \"{}\"", log.display()),
        );
        assert!(config.contains(&*log.to_string_lossy()), "{case}: {config}");
        host.write_config(&config);
        let bundle = host.bundle(&case.replace(' ', "-"), &[GPU]);
        host.forget_runc();
        let out = host.runtime(case, &["create", "--bundle", bundle.to_str().unwrap(), "c"]);
        assert_eq!(
            out.status.code(),
            Some(FAKE_RUNC_EXIT),
            "{case}: runc ran: {}",
            stderr(&out)
        );
        assert!(host.runc_argv().is_some(), "{case}");
        let spec: Value =
            serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
        assert_eq!(spec["annotations"]["nvshim.io/injected"], "0", "{case}");
    }
    assert!(
        !Path::new("/proc/nvshim-cannot-write").exists(),
        "nothing was created under /proc"
    );
    assert!(fs::read_dir(&dir_log).unwrap().next().is_none());
}

/// The same through real runc: with the debug log a directory, a GPU container still
/// starts and sees its GPU.
#[test]
fn an_unwritable_debug_log_still_starts_a_gpu_container_in_runc() {
    let host = Host::new(2);
    let log_dir = host.dir.path().join("log-is-a-dir");
    fs::create_dir(&log_dir).unwrap();
    let config = host.node.sim.runtime_config("runc", Some(&log_dir));
    host.write_config(&config);
    let rootfs = host.dir.path().join("rootfs-src");
    host.node.sim.container_rootfs().build(&rootfs).unwrap();
    let bundle = host.dir.path().join("runc-bundle");
    runc_bundle(&bundle, &rootfs, &["sh", "-c", "ls /dev"], &[GPU]).unwrap();
    let id = format!("nvshim-faults-log-{}", std::process::id());
    let root = host.dir.path().join("runc-root");
    let out = host.runtime(
        "real runc",
        &[
            "--root",
            root.to_str().unwrap(),
            "run",
            "--bundle",
            bundle.to_str().unwrap(),
            &id,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the container ran ({}): {stdout}\n{}",
        out.status,
        stderr(&out)
    );
    // GPU 0 of the 2-GPU node is /dev/nvidia1.
    let nodes: Vec<&str> = stdout.lines().filter(|l| l.starts_with("nvidia")).collect();
    assert!(
        nodes.contains(&"nvidia1") && nodes.contains(&"nvidiactl"),
        "{nodes:?}"
    );
    assert!(fs::read_dir(&log_dir).unwrap().next().is_none());
}

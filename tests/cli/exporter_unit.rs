// SPDX-License-Identifier: Apache-2.0
//! The exporter's systemd unit (`deployments/systemd/nvshim-exporter.service`) through
//! systemd's own checker: `systemd-analyze verify` (syntax, directives, the ExecStart
//! binary) and `systemd-analyze security --offline` (its hardening stays in place).
//! Verify needs ExecStart's binary to exist, so it checks a copy that runs the binary
//! this build made; the shipped unit runs `/usr/bin/nvshim exporter`.

use std::path::Path;
use std::process::Command;

const UNIT: &str = "deployments/systemd/nvshim-exporter.service";
const SHIPPED_EXEC: &str = "ExecStart=/usr/bin/nvshim exporter";

/// `systemd-analyze ARGS… UNIT_FILE`: exit status and stderr. verify exits 0 on
/// directives it ignores and only reports them on stderr, so both count.
fn analyze(args: &[&str], unit: &Path) -> (bool, String) {
    let out = Command::new("systemd-analyze")
        .args(args)
        .arg(unit)
        .output()
        .unwrap_or_else(|e| panic!("cannot run systemd-analyze (.ci/run installs systemd): {e}"));
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The unit with its ExecStart pointing at this build's binary, written to `dir`.
fn local_copy(dir: &Path, text: &str) -> std::path::PathBuf {
    let local = text.replace(
        SHIPPED_EXEC,
        &format!("ExecStart={} exporter", env!("CARGO_BIN_EXE_nvshim")),
    );
    let path = dir.join("nvshim-exporter.service");
    std::fs::write(&path, local).unwrap();
    path
}

#[test]
fn the_exporter_unit_passes_systemd_analyze() {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join(UNIT)).unwrap();
    assert!(
        text.contains(&format!("\n{SHIPPED_EXEC}\n")),
        "{UNIT} runs {SHIPPED_EXEC}"
    );
    let dir = tempfile::tempdir().unwrap();
    let unit = local_copy(dir.path(), &text);
    let (ok, stderr) = analyze(&["verify"], &unit);
    assert!(
        ok && stderr.is_empty(),
        "systemd-analyze verify {UNIT}:\n{stderr}"
    );
    // 5.0 of 10 at most ("MEDIUM" begins there); the unit scores about 3.8.
    let (ok, stderr) = analyze(
        &["security", "--offline=true", "--threshold=50", "--no-pager"],
        &unit,
    );
    assert!(
        ok,
        "systemd-analyze security {UNIT} over the threshold:\n{stderr}"
    );

    // The same checks catch a broken directive and lost hardening.
    let broken = local_copy(
        dir.path(),
        &text.replace("Restart=on-failure", "Restart=sometimes"),
    );
    let (_, stderr) = analyze(&["verify"], &broken);
    assert!(
        stderr.contains("restart specifier"),
        "verify took Restart=sometimes: {stderr:?}"
    );
    let open: String = text
        .lines()
        .filter(|l| {
            !l.starts_with("Protect")
                && !l.starts_with("Restrict")
                && !l.starts_with("CapabilityBoundingSet")
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let open = local_copy(dir.path(), &open);
    let (ok, _) = analyze(
        &["security", "--offline=true", "--threshold=50", "--no-pager"],
        &open,
    );
    assert!(!ok, "security passed a unit without its hardening");
}

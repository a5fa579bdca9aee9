//! The arm64 packages: `NVSHIM_ARCH=arm64 packaging/build.sh` on the aarch64 binaries that
//! scripts/arm64.sh builds, in `target/packages-arm64/`. Each .deb says `arm64` (the
//! nvidia-docker2 wrapper `all`) and ships the same files as the amd64 set, its binaries
//! are 64-bit aarch64 ELF (`e_machine` 183), the runtime and the hook static, and its
//! library dependencies are arm64's (dpkg-shlibdeps against libc6:arm64); each .rpm is `aarch64` (nvidia-docker2 `noarch`)
//! and requires aarch64's loader.
//!
//! The packages exist only where the aarch64 build ran: `make test-arm64` (scripts/arm64.sh,
//! which CI runs after `make test`) builds them and runs this test with
//! `NVSHIM_TEST_ARM64=1`, which requires them; elsewhere the test says so and passes.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{DOCKER2, REPO, find, have, ok, package_set, pkg_version};

/// The binaries that ship in the packages, by package.
const BINARIES: &[(&str, &[&str])] = &[
    (
        super::BASE,
        &["/usr/bin/nvidia-container-runtime", "/usr/bin/nvidia-ctk"],
    ),
    (super::TOOLKIT, &["/usr/bin/nvidia-container-runtime-hook"]),
    (super::NVSHIM, &["/usr/bin/nvidia-device-plugin"]),
];

fn arm64_dir() -> PathBuf {
    Path::new(REPO).join("target/packages-arm64")
}

/// `target/packages-arm64/<prefix>*<suffix>`; required under `NVSHIM_TEST_ARM64=1`.
fn arm64_built(prefix: &str, suffix: &str) -> Option<PathBuf> {
    let found = find(&arm64_dir(), prefix, suffix);
    if found.is_none() {
        let what = format!("target/packages-arm64/{prefix}*{suffix} is missing");
        assert!(
            std::env::var("NVSHIM_TEST_ARM64").as_deref() != Ok("1"),
            "under NVSHIM_TEST_ARM64=1: {what}"
        );
        eprintln!("skipping: {what} (make test-arm64 builds it and runs this test)");
    }
    found
}

/// The ELF class and machine of a file: (`EI_CLASS`, `e_machine`).
fn elf_class_and_machine(path: &Path) -> (u8, u16) {
    let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(&bytes[..4], b"\x7fELF", "{}: not ELF", path.display());
    (bytes[4], u16::from_le_bytes([bytes[18], bytes[19]]))
}

#[test]
fn arm64_packages_hold_aarch64_binaries() {
    if !have(&["dpkg-deb", "rpm", "readelf"]) {
        return;
    }
    let version = pkg_version();
    for package in package_set() {
        let name = package.name;
        let Some(deb) = arm64_built(&format!("{name}_{version}_"), ".deb") else {
            return;
        };
        let want_arch = if name == DOCKER2 { "all" } else { "arm64" };
        let field = |f: &str| ok(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(f));
        assert_eq!(
            field("Architecture").trim(),
            want_arch,
            "{name}: Architecture"
        );
        assert!(
            deb.to_string_lossy()
                .ends_with(&format!("_{want_arch}.deb")),
            "{name}: file name {}",
            deb.display()
        );
        // The same files as the amd64 set.
        let listing = ok(Command::new("dpkg-deb").arg("-c").arg(&deb));
        let got: BTreeSet<String> = listing
            .lines()
            .filter(|l| !l.starts_with('d'))
            .filter_map(|l| l.split_whitespace().nth(5))
            .map(|p| p.trim_start_matches('.').to_owned())
            .filter(|p| !p.starts_with("/usr/share/doc/") && !p.starts_with("/usr/share/lintian/"))
            .collect();
        let want: BTreeSet<String> = package
            .all_entries()
            .into_iter()
            .map(|(p, _)| p)
            .filter(|p| !p.starts_with("/usr/share/doc/"))
            .collect();
        assert_eq!(got, want, "{name}: files");

        let binaries = BINARIES
            .iter()
            .find(|(p, _)| *p == name)
            .map_or(&[][..], |(_, b)| *b);
        let tree = tempfile::tempdir().unwrap();
        ok(Command::new("dpkg-deb")
            .arg("-x")
            .arg(&deb)
            .arg(tree.path()));
        let mut dynamic = false;
        for bin in binaries {
            let path = tree.path().join(bin.trim_start_matches('/'));
            assert_eq!(
                elf_class_and_machine(&path),
                (2, 183),
                "{name}: {bin} is not 64-bit aarch64 ELF"
            );
            // The runtime and the hook are static (static glibc on arm64), as on amd64.
            let needed = ok(Command::new("readelf").arg("-d").arg(&path)).contains("NEEDED");
            if bin.contains("nvidia-container-runtime") {
                assert!(!needed, "{name}: {bin} is dynamic");
            }
            dynamic |= needed;
        }
        // dpkg-shlibdeps found the arm64 libc for the dynamic ones (`libc6 (>= …)`).
        let depends = field("Depends");
        assert_eq!(
            depends.contains("libc6 (>= "),
            dynamic,
            "{name}: Depends {depends}"
        );

        let Some(rpm) = arm64_built(&format!("{name}-{version}-1."), ".rpm") else {
            return;
        };
        let rpm_arch = if name == DOCKER2 { "noarch" } else { "aarch64" };
        let query = |q: &str| ok(Command::new("rpm").args(["-qp", q]).arg(&rpm));
        assert_eq!(query("--qf=%{ARCH}"), rpm_arch, "{name}: rpm ARCH");
        assert!(
            rpm.to_string_lossy().ends_with(&format!(".{rpm_arch}.rpm")),
            "{name}: rpm file name {}",
            rpm.display()
        );
        let requires = query("--requires");
        if dynamic {
            assert!(
                requires.contains("ld-linux-aarch64.so.1()(64bit)"),
                "{name}: rpm requires\n{requires}"
            );
        }
        assert!(
            !requires.contains("ld-linux-x86-64"),
            "{name}: rpm requires\n{requires}"
        );
    }
}

//! The .debs and .rpms ship the same files, links, modes and relationships; the .debs
//! are reproducible and lintian-clean.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::{
    BASE, DOCKER2, Entry, NVSHIM, TOOLKIT, TOOLS, build_sh, deb, deb_version, have, names, ok,
    package_set, relation_names, rpm, run,
};

/// `dpkg-deb -c`: (absolute path, what it is) per file or link; directories left out.
fn deb_entries(deb: &Path) -> Vec<(String, Entry)> {
    let listing = ok(Command::new("dpkg-deb").arg("-c").arg(deb));
    let mut entries = Vec::new();
    for line in listing.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (perms, path) = (fields[0], fields[5].trim_start_matches('.'));
        let mode = perms[1..]
            .chars()
            .fold(0, |m, c| m << 1 | u32::from(c != '-'));
        let entry = match perms.chars().next() {
            Some('d') => continue,
            // `-> target` follows the path; leaked so the Entry can be compared.
            Some('l') => Entry::Link(String::leak(fields[7].to_owned())),
            _ => Entry::File(mode),
        };
        entries.push((path.to_owned(), entry));
    }
    entries
}

/// `rpm -qp --dump`: (path, what it is) per file or link the rpm lists; directories left out.
fn rpm_entries(rpm: &Path) -> Vec<(String, Entry)> {
    let dump = ok(Command::new("rpm").arg("-qp").arg("--dump").arg(rpm));
    let mut entries = Vec::new();
    // path size mtime digest mode owner group isconfig isdoc rdev symlink
    for line in dump.lines() {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let mode = u32::from_str_radix(fields[4], 8).unwrap();
        let entry = match mode & 0o170000 {
            0o040000 => continue,
            0o120000 => Entry::Link(String::leak(fields[10].to_owned())),
            _ => Entry::File(mode & 0o7777),
        };
        entries.push((fields[0].to_owned(), entry));
    }
    entries
}

#[test]
fn debs_and_rpms_ship_the_same_files_and_links() {
    if !have(&["dpkg-deb", "rpm"]) {
        return;
    }
    for package in package_set() {
        let (Some(deb), Some(rpm)) = (deb(package.name), rpm(package.name)) else {
            return;
        };
        let want: BTreeSet<(String, Entry)> = package.all_entries().into_iter().collect();
        let mut deb_got: BTreeSet<(String, Entry)> = deb_entries(&deb).into_iter().collect();
        // Debian-only (0644): the native package's changelog and the lintian overrides.
        let changelog = format!("/usr/share/doc/{}/changelog.gz", package.name);
        let overrides = format!("/usr/share/lintian/overrides/{}", package.name);
        assert!(
            deb_got.remove(&(changelog, Entry::File(0o644))),
            "{}: no changelog.gz",
            package.name
        );
        let has_overrides = [BASE, TOOLKIT].contains(&package.name);
        let removed = deb_got.remove(&(overrides, Entry::File(0o644)));
        assert_eq!(
            removed, has_overrides,
            "{}: lintian overrides",
            package.name
        );
        assert_eq!(deb_got, want, "{}: deb entries (left)", package.name);
        let rpm_got: BTreeSet<(String, Entry)> = rpm_entries(&rpm).into_iter().collect();
        assert_eq!(rpm_got, want, "{}: rpm entries (left)", package.name);

        let configs = ok(Command::new("rpm").arg("-qpc").arg(&rpm));
        // `dpkg-deb -I` fails for a package without conffiles.
        let conffiles = run(Command::new("dpkg-deb")
            .arg("-I")
            .arg(&deb)
            .arg("conffiles"));
        let conffiles = String::from_utf8_lossy(&conffiles.stdout);
        assert_eq!(
            configs, conffiles,
            "{}: rpm %config vs deb conffiles",
            package.name
        );
    }
}

/// Per package: deb field or rpm query flag, and the names it must hold (our own
/// provides and rpm's automatic library requirements left out).
type Relations = [(&'static str, &'static [&'static str])];

const DEB_RELATIONS: &[(&str, &Relations)] = &[
    (
        BASE,
        &[
            ("Provides", &["nvidia-container-runtime"]),
            ("Breaks", &["nvidia-container-runtime", TOOLKIT, NVSHIM]),
            ("Replaces", &["nvidia-container-runtime", TOOLKIT, NVSHIM]),
            ("Conflicts", &[]),
            ("Recommends", &["crun", "runc"]),
        ],
    ),
    (
        TOOLKIT,
        &[
            ("Depends", &[BASE, TOOLS]),
            ("Provides", &["nvidia-container-runtime-hook"]),
            ("Conflicts", &["nvidia-container-runtime-hook"]),
            ("Breaks", &["nvidia-container-runtime", NVSHIM]),
            (
                "Replaces",
                &[
                    "nvidia-container-runtime",
                    "nvidia-container-runtime-hook",
                    NVSHIM,
                ],
            ),
        ],
    ),
    (TOOLS, &[("Depends", &[BASE]), ("Conflicts", &[])]),
    (
        DOCKER2,
        &[
            ("Depends", &[TOOLKIT]),
            ("Recommends", &["docker-ce", "docker.io", "moby-engine"]),
            ("Conflicts", &["nvidia-docker"]),
            ("Replaces", &["nvidia-docker"]),
        ],
    ),
    (NVSHIM, &[("Conflicts", &[]), ("Breaks", &[])]),
];

const RPM_RELATIONS: &[(&str, &Relations)] = &[
    (
        BASE,
        &[
            ("--provides", &["nvidia-container-runtime"]),
            ("--obsoletes", &["nvidia-container-runtime"]),
            ("--conflicts", &[NVSHIM]),
        ],
    ),
    (
        TOOLKIT,
        &[
            ("--provides", &["nvidia-container-runtime-hook"]),
            ("--obsoletes", &["nvidia-container-runtime-hook"]),
            ("--conflicts", &[]),
        ],
    ),
    (TOOLS, &[("--obsoletes", &[]), ("--conflicts", &[])]),
    (
        DOCKER2,
        &[("--obsoletes", &["nvidia-docker"]), ("--conflicts", &[])],
    ),
    (NVSHIM, &[("--obsoletes", &[]), ("--conflicts", &[])]),
];

/// Asserts `table`'s relationships for package `name`, `get` reading a field.
fn check_relations(
    table: &[(&str, &Relations)],
    name: &str,
    get: &dyn Fn(&str) -> String,
    format: &str,
) {
    let found = table.iter().find(|(n, _)| *n == name);
    for (f, want) in found.map_or(&[][..], |(_, r)| *r) {
        let mut got = relation_names(&get(f));
        // rpm's own provides: the name, `name(x86-64)`, `config(name)`.
        got.retain(|n| n != name && !n.contains('('));
        assert_eq!(got, names(want), "{format} {name} {f}");
    }
}

#[test]
fn debs_and_rpms_declare_the_relationships_for_nvidia_upgrades() {
    if !have(&["dpkg-deb", "rpm"]) {
        return;
    }
    let ours = names(&[BASE, TOOLKIT, TOOLS, DOCKER2, NVSHIM]);
    let same = format!("(= {})", deb_version());
    for package in package_set() {
        let name = package.name;
        let (Some(deb), Some(rpm)) = (deb(name), rpm(name)) else {
            return;
        };
        let field = |f: &str| ok(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(f));
        let query = |flag: &str| ok(Command::new("rpm").arg("-qp").arg(flag).arg(&rpm));
        check_relations(DEB_RELATIONS, name, &field, "deb");
        check_relations(RPM_RELATIONS, name, &query, "rpm");

        // Both formats depend on the same packages of the set, at exactly this build.
        let depends = field("Depends");
        let deb_ours: BTreeSet<String> = relation_names(&depends)
            .intersection(&ours)
            .cloned()
            .collect();
        for dep in &deb_ours {
            let pinned = format!("{dep} {same}");
            assert!(depends.contains(&pinned), "deb {name} Depends: {depends}");
        }
        let requires = query("--requires");
        let rpm_ours: BTreeSet<String> = relation_names(&requires)
            .intersection(&ours)
            .cloned()
            .collect();
        assert_eq!(deb_ours, rpm_ours, "{name}: deb Depends vs rpm Requires");
        let rpm_same = format!("= {}-1", deb_version());
        for line in requires
            .lines()
            .filter(|l| ours.iter().any(|o| l.starts_with(o)))
        {
            assert!(line.ends_with(&rpm_same), "rpm {name} Requires: {line}");
        }
        let version = field("Version");
        assert_eq!(version.trim(), deb_version(), "deb {name} Version");
        let epoch = query("--qf=%{EPOCH}");
        assert_eq!(epoch, super::EPOCH, "rpm {name} Epoch");
    }
    let base = deb(BASE).unwrap();
    let depends = ok(Command::new("dpkg-deb").arg("-f").arg(&base).arg("Depends"));
    assert!(
        depends.starts_with("libc6 (>= 2."),
        "deb Depends: {depends}"
    );
}

/// A second build of the same inputs gives the same bytes: the .debs `make package`
/// built (their epoch is the last commit's, their version Cargo's) against ones built
/// here the same way into a tempdir.
#[test]
fn deb_build_is_reproducible() {
    if !have(&["dpkg-deb", "sha256sum"]) {
        return;
    }
    let Some(first) = deb(BASE) else { return };
    let dir = tempfile::tempdir().unwrap();
    build_sh(dir.path(), &[("NVSHIM_FORMATS", "deb")]);
    let sha256 = |file: &Path| {
        let sum = ok(Command::new("sha256sum").arg(file));
        sum.split_whitespace().next().unwrap().to_owned()
    };
    for package in package_set() {
        let deb = if package.name == BASE {
            first.clone()
        } else {
            deb(package.name).unwrap()
        };
        let again = dir.path().join(deb.file_name().unwrap());
        let (a, b) = (sha256(&deb), sha256(&again));
        eprintln!("{}: sha256 of both builds: {a} {b}", package.name);
        assert_eq!(
            a, b,
            "{}: two builds of the same inputs differ",
            package.name
        );
    }
}

#[test]
fn lintian_finds_no_error() {
    if !have(&["lintian"]) {
        return;
    }
    let mut debs = Vec::new();
    for package in package_set() {
        let Some(deb) = deb(package.name) else { return };
        debs.push(deb);
    }
    let out = run(Command::new("lintian")
        .args(["--fail-on", "error", "--info"])
        .args(&debs));
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!("lintian:\n{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "lintian reports errors:\n{stdout}");
    assert!(!stdout.lines().any(|l| l.starts_with("E: ")), "{stdout}");
}

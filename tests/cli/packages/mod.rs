//! The packages `make package` builds (`packaging/build.sh`), under NVIDIA's names:
//! `nvidia-container-toolkit-base`, `nvidia-container-toolkit`, `libnvidia-container-tools`,
//! `nvidia-docker2` and `nvshim`, as .debs and .rpms from signed repositories.
//!
//! - `files`: both formats ship the same files, links, modes and relationships; the .debs
//!   are reproducible and lintian-clean.
//! - `rpm`: the rpm set's signatures verify with the exported key (and fail without it),
//!   `repomd.xml.asc` verifies with gpgv; the set installs with `rpm --root` over NVIDIA's
//!   nvidia-docker2 (a fake owning daemon.json), keeps that daemon.json and points its
//!   runtime at ours; erasing `nvidia-docker2` takes the runtime out again.
//! - `apt`: apt in a debootstrapped Debian chroot, from our signed `file:` repository with
//!   `signed-by=` and no `[trusted=yes]`: a wrong key or a tampered `InRelease` is
//!   refused; remove keeps the admin's edited config, purge deletes it, an upgrade keeps it.
//! - `docker`: `apt-get install -y nvidia-docker2` pulls the toolkit, adds the runtime to a
//!   daemon.json with other keys, a dockerd on that file runs `docker run --gpus
//!   '"device=0,1,2"'` with those GPUs; the set upgrades over NVIDIA's 1.13.0 packages, and
//!   purge takes the runtime out of daemon.json again, also after that upgrade.
//!
//! - `arm64`: the arm64 set (`target/packages-arm64/`, built by `make test-arm64`, which
//!   then runs this test with `NVSHIM_TEST_ARM64=1`) is arm64/aarch64 throughout, with
//!   aarch64 binaries.
//!
//! Every other test reads `target/packages/`: without it the test is skipped, or fails under
//! `CI=true`. (That the shipped config.toml is every default is a unit test,
//! `config::shipped_tests`.) The chroot (`debootstrap --variant=minbase bookworm`, about
//! 30 s) is cached in `target/pkgtest-chroot/` (or `$NVSHIM_PKGTEST_CACHE`, which `.ci/run`
//! keeps between runs) and copied per test.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

mod apt;
mod arm64;
mod chroot;
mod docker;
mod files;
mod rpm;

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const VERSION: &str = env!("CARGO_PKG_VERSION");
/// The epoch build.sh gives every package, so that ours is newer than NVIDIA's 1.x.
const EPOCH: &str = "1";
const CONFIG: &str = "/etc/nvidia-container-runtime/config.toml";
const HOOKS_D: &str = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json";
const UDEV_RULE: &str = "deployments/udev/71-nvidia-dev-char.rules";
const SYSTEMD_UNIT: &str = "deployments/systemd/nvidia-dev-char-symlinks.service";
const EXPORTER_UNIT: &str = "/usr/lib/systemd/system/nvshim-exporter.service";

/// What a package installs at a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Entry {
    /// A file with this mode.
    File(u32),
    /// A symlink with this target.
    Link(&'static str),
}

/// One package of the set: its name, files and links (docs aside: every package has
/// `/usr/share/doc/<name>/copyright`, the .debs also `changelog.gz`).
struct Package {
    name: &'static str,
    entries: Vec<(&'static str, Entry)>,
}

const BASE: &str = "nvidia-container-toolkit-base";
const TOOLKIT: &str = "nvidia-container-toolkit";
const TOOLS: &str = "libnvidia-container-tools";
const DOCKER2: &str = "nvidia-docker2";
const NVSHIM: &str = "nvshim";
/// What `apt-get install nvidia-docker2` installs.
const DOCKER_SET: [&str; 4] = [BASE, TOOLKIT, TOOLS, DOCKER2];

/// The set, as build.sh stages it. The udev rule and systemd unit are in the base
/// package when the repository has them (build.sh requires them unless told otherwise).
fn package_set() -> Vec<Package> {
    use Entry::{File, Link};
    let mut base = vec![
        ("/usr/bin/nvidia-container-runtime", File(0o755)),
        ("/usr/bin/nvidia-ctk", File(0o755)),
        ("/usr/bin/nvidia-cdi-hook", Link("nvidia-ctk")),
        ("/usr/bin/nvshim", Link("nvidia-ctk")),
        (CONFIG, File(0o644)),
        // The exporter's unit, shipped disabled (build.sh always requires it).
        (EXPORTER_UNIT, File(0o644)),
    ];
    if Path::new(REPO).join(UDEV_RULE).exists() {
        base.push((
            "/usr/lib/udev/rules.d/71-nvidia-dev-char.rules",
            File(0o644),
        ));
    }
    if Path::new(REPO).join(SYSTEMD_UNIT).exists() {
        let unit = "/usr/lib/systemd/system/nvidia-dev-char-symlinks.service";
        base.push((unit, File(0o644)));
    }
    let hook = "nvidia-container-runtime-hook";
    vec![
        Package {
            name: BASE,
            entries: base,
        },
        Package {
            name: TOOLKIT,
            entries: vec![
                ("/usr/bin/nvidia-container-runtime-hook", File(0o755)),
                ("/usr/bin/nvidia-container-toolkit", Link(hook)),
                (HOOKS_D, File(0o644)),
            ],
        },
        Package {
            name: TOOLS,
            entries: vec![("/usr/bin/nvidia-container-cli", Link("nvidia-ctk"))],
        },
        Package {
            name: DOCKER2,
            entries: vec![("/usr/bin/nvidia-docker", Link("nvidia-ctk"))],
        },
        Package {
            name: NVSHIM,
            entries: vec![
                ("/usr/bin/nvidia-device-plugin", File(0o755)),
                ("/usr/bin/gpu-feature-discovery", Link("nvidia-ctk")),
                ("/usr/share/doc/nvshim/README.md", File(0o644)),
            ],
        },
    ]
}

impl Package {
    /// Its files and links, with the copyright every package has.
    fn all_entries(&self) -> Vec<(String, Entry)> {
        let mut all: Vec<(String, Entry)> = (self.entries.iter())
            .map(|(p, e)| (p.to_string(), *e))
            .collect();
        let copyright = format!("/usr/share/doc/{}/copyright", self.name);
        all.push((copyright, Entry::File(0o644)));
        all
    }
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Panics under CI, otherwise says why the test is skipped and returns false.
fn prerequisite(found: bool, what: &str) -> bool {
    if !found {
        assert!(!in_ci(), "under CI=true: {what}");
        eprintln!("skipping: {what}");
    }
    found
}

fn have(tools: &[&str]) -> bool {
    tools.iter().all(|tool| {
        let found = run(Command::new("sh").args(["-c", &format!("command -v {tool}")]));
        prerequisite(found.status.success(), &format!("{tool} is not installed"))
    })
}

fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `cmd`, asserts success, returns stdout and stderr.
fn ok_both(cmd: &mut Command) -> (String, String) {
    let out = run(cmd);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    let status = out.status;
    assert!(
        status.success(),
        "{cmd:?} failed ({status}):\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    (stdout, stderr)
}

/// Runs `cmd`, asserts success, returns stdout.
fn ok(cmd: &mut Command) -> String {
    ok_both(cmd).0
}

/// Runs `cmd`, asserts failure, returns stdout and stderr together.
fn fails(cmd: &mut Command) -> String {
    let out = run(cmd);
    let all = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(!out.status.success(), "{cmd:?} succeeded:\n{all}");
    all
}

fn mode(path: &Path) -> u32 {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    meta.permissions().mode() & 0o7777
}

/// The version as the packages spell it (build.sh turns a cargo `-` into `~`).
fn pkg_version() -> String {
    VERSION.replace('-', "~")
}

/// The Debian version, with the epoch.
fn deb_version() -> String {
    format!("{EPOCH}:{}", pkg_version())
}

fn packages_dir() -> PathBuf {
    Path::new(REPO).join("target/packages")
}

/// The gnupg home `make package` generated the signing key in (build.sh's default).
fn gpg_home() -> PathBuf {
    Path::new(REPO).join("target/packages.gnupg")
}

/// The file in `dir` named `<prefix>*<suffix>` (the architecture is the `*`).
fn find(dir: &Path, prefix: &str, suffix: &str) -> Option<PathBuf> {
    let mut entries = fs::read_dir(dir).ok()?.map(|e| e.unwrap().path());
    let name = |p: &PathBuf| p.file_name().unwrap().to_string_lossy().into_owned();
    entries.find(|p| name(p).starts_with(prefix) && name(p).ends_with(suffix))
}

/// A package `make package` left in `target/packages/`, if it is there.
fn built(prefix: &str, suffix: &str) -> Option<PathBuf> {
    let found = find(&packages_dir(), prefix, suffix);
    let what = format!("target/packages/{prefix}*{suffix} is missing: run make package first");
    prerequisite(found.is_some(), &what)
        .then_some(found)
        .flatten()
}

fn deb(name: &str) -> Option<PathBuf> {
    built(&format!("{name}_{}_", pkg_version()), ".deb")
}

fn rpm(name: &str) -> Option<PathBuf> {
    built(&format!("{name}-{}-1.", pkg_version()), ".rpm")
}

/// Runs packaging/build.sh into `out`, on the binaries already built, signing with the
/// key `make package` used.
fn build_sh(out: &Path, env: &[(&str, &str)]) {
    ok(Command::new("bash")
        .arg(Path::new(REPO).join("packaging/build.sh"))
        .env("NVSHIM_SKIP_CARGO", "1")
        .env("NVSHIM_PACKAGE_DIR", out)
        .env("NVSHIM_GPG_HOME", gpg_home())
        .envs(env.iter().copied()));
}

/// `packaging/repo.sh <args>` with the key `make package` used.
fn repo_sh(args: &[&str]) {
    ok(Command::new("bash")
        .arg(Path::new(REPO).join("packaging/repo.sh"))
        .args(args)
        .env("NVSHIM_GPG_HOME", gpg_home()));
}

/// A fake package `name` at `version` (Architecture all) in `dir`: `files` as (path,
/// content), the ones under /etc as conffiles, and the control fields in `fields`.
fn fake_deb(
    dir: &Path,
    name: &str,
    version: &str,
    files: &[(&str, &str)],
    fields: &str,
) -> PathBuf {
    let root = dir.join(name);
    fs::create_dir_all(root.join("DEBIAN")).unwrap();
    let mut conffiles = String::new();
    for (path, content) in files {
        let at = root.join(&path[1..]);
        fs::create_dir_all(at.parent().unwrap()).unwrap();
        fs::write(&at, content).unwrap();
        if path.starts_with("/etc/") {
            conffiles.push_str(&format!("{path}\n"));
        }
    }
    let control = format!(
        "Package: {name}\nVersion: {version}\nArchitecture: all\n\
         Maintainer: fake <fake@example.org>\n{fields}Description: fake {name}\n"
    );
    fs::write(root.join("DEBIAN/control"), control).unwrap();
    if !conffiles.is_empty() {
        fs::write(root.join("DEBIAN/conffiles"), conffiles).unwrap();
    }
    let deb = dir.join(format!("{name}_{version}_all.deb"));
    let mut build = Command::new("dpkg-deb");
    ok(build
        .args(["--build", "--root-owner-group"])
        .arg(&root)
        .arg(&deb));
    deb
}

/// The package names in a relationship field (`a (>= 1), b | c` → a, b, c).
fn relation_names(field: &str) -> BTreeSet<String> {
    let relations = field.split([',', '|', '\n']);
    relations
        .filter_map(|r| r.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

fn names(list: &[&str]) -> BTreeSet<String> {
    list.iter().map(|s| s.to_string()).collect()
}

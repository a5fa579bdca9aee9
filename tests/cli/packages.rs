//! The packages `make package` builds (`packaging/build.sh`): the .deb and the .rpm ship
//! the same files, modes and relationships, the .deb is reproducible and lintian-clean,
//! and the README's install story works: apt installs it from a local `file:` repository
//! into a debootstrapped Debian chroot, remove keeps the admin's edited config, purge
//! deletes it, an upgrade keeps it, and the installed binaries give a test dockerd
//! `docker run --gpus all` on a simulated node after `nvshim configure docker`.
//!
//! Every test reads `target/packages/`: without it the test is skipped, or fails under
//! `CI=true`. (That the shipped config.toml is every default is a unit test,
//! `config::shipped_tests`.) The chroot (`debootstrap --variant=minbase bookworm`, about
//! 30 s) is cached in `target/pkgtest-chroot/` and copied per test.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use crate::common::{Node, node};
use nvshim_testkit::{Dockerd, NodeSpec, path_with_prefix, tar_rootfs};

const REPO: &str = env!("CARGO_MANIFEST_DIR");
const VERSION: &str = env!("CARGO_PKG_VERSION");
const CONFIG: &str = "/etc/nvidia-container-runtime/config.toml";
const HOOKS_D: &str = "/usr/share/containers/oci/hooks.d/oci-nvidia-hook.json";
/// What both packages install, with its mode.
const FILES: &[(&str, u32)] = &[
    ("/usr/bin/nvidia-container-runtime", 0o755),
    ("/usr/bin/nvidia-container-runtime-hook", 0o755),
    ("/usr/bin/nvidia-device-plugin", 0o755),
    ("/usr/bin/nvshim", 0o755),
    (CONFIG, 0o644),
    (HOOKS_D, 0o644),
    ("/usr/share/doc/nvshim/README.md", 0o644),
    ("/usr/share/doc/nvshim/copyright", 0o644),
];
/// Debian-only (0644): the native package's changelog and the lintian overrides.
const DEB_ONLY: &[&str] = &[
    "/usr/share/doc/nvshim/changelog.gz",
    "/usr/share/lintian/overrides/nvshim",
];
/// We ship NVIDIA's paths, so conflict with (and, deb, replace) NVIDIA's packages, and
/// provide only what we really ship.
const CONFLICTS: &[&str] = &[
    "nvidia-container-runtime",
    "nvidia-container-toolkit",
    "nvidia-container-toolkit-base",
];
const PROVIDES: &[&str] = &["nvidia-container-runtime"];
/// The chroot's only apt source (apt is told to read nothing else: no network).
const APT_SOURCE: &str = "/etc/apt/sources.list.d/nvshim.list";
const IMAGE: &str = "nvshim-packages:glibc";

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

/// Runs `cmd`, asserts success, returns stdout and stderr.
fn ok_both(cmd: &mut Command) -> (String, String) {
    let out = run(cmd);
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
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

fn mode(path: &Path) -> u32 {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    meta.permissions().mode() & 0o7777
}

/// Asserts that `text` names every GPU of the node.
fn names_every_gpu(text: &str, node: &Node, what: &str) {
    for gpu in &node.sim.spec.gpus {
        assert!(
            text.contains(&gpu.uuid),
            "{what} lacks {}:\n{text}",
            gpu.uuid
        );
    }
}

/// The version as the packages spell it (build.sh turns a cargo `-` into `~`).
fn pkg_version() -> String {
    VERSION.replace('-', "~")
}

fn packages_dir() -> PathBuf {
    Path::new(REPO).join("target/packages")
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

fn deb() -> Option<PathBuf> {
    built(&format!("nvshim_{}_", pkg_version()), ".deb")
}

fn rpm() -> Option<PathBuf> {
    built(&format!("nvshim-{}-1.", pkg_version()), ".rpm")
}

/// Runs packaging/build.sh into `out`, on the binaries already built.
fn build_sh(out: &Path, env: &[(&str, &str)]) {
    ok(Command::new("bash")
        .arg(Path::new(REPO).join("packaging/build.sh"))
        .env("NVSHIM_SKIP_CARGO", "1")
        .env("NVSHIM_PACKAGE_DIR", out)
        .envs(env.iter().copied()));
}

/// `dpkg-deb -c`: (absolute path, is a directory, mode) per entry.
fn deb_entries(deb: &Path) -> Vec<(String, bool, u32)> {
    let listing = ok(Command::new("dpkg-deb").arg("-c").arg(deb));
    let entry = |line: &str| {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (perms, path) = (fields[0], fields[5].trim_start_matches('.'));
        let mode = perms[1..]
            .chars()
            .fold(0, |m, c| m << 1 | u32::from(c != '-'));
        (
            path.trim_end_matches('/').to_owned(),
            perms.starts_with('d'),
            mode,
        )
    };
    listing
        .lines()
        .map(entry)
        .filter(|e| !e.0.is_empty())
        .collect()
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

#[test]
fn deb_and_rpm_ship_the_same_files_and_relationships() {
    if !have(&["dpkg-deb", "rpm"]) {
        return;
    }
    let (Some(deb), Some(rpm)) = (deb(), rpm()) else {
        return;
    };
    let entries = deb_entries(&deb);
    let paths = |dirs: bool| -> BTreeSet<String> {
        let chosen = entries.iter().filter(|e| e.1 == dirs);
        chosen.map(|e| e.0.clone()).collect()
    };
    let (deb_files, deb_dirs) = (paths(false), paths(true));
    let want: BTreeSet<String> = FILES.iter().map(|f| f.0.to_owned()).collect();
    assert_eq!(deb_files, &want | &names(DEB_ONLY), "deb files (left)");
    for (path, _, mode) in entries.iter().filter(|e| !e.1) {
        let want = FILES.iter().find(|f| f.0 == path).map_or(0o644, |f| f.1);
        assert_eq!(*mode, want, "deb: mode of {path}");
    }

    let rpm_list = ok(Command::new("rpm").arg("-qlp").arg(&rpm));
    let rpm_paths: BTreeSet<String> = rpm_list.lines().map(str::to_owned).collect();
    // rpm lists only the directories the package owns; the deb lists every parent.
    let rpm_files: BTreeSet<String> = rpm_paths.difference(&deb_dirs).cloned().collect();
    assert_eq!(rpm_files, want, "rpm files (left) vs the deb's");
    let configs = ok(Command::new("rpm").arg("-qpc").arg(&rpm));
    assert_eq!(configs.trim(), CONFIG, "rpm %config files");

    let field = |name: &str| ok(Command::new("dpkg-deb").arg("-f").arg(&deb).arg(name));
    let query = |flag: &str| ok(Command::new("rpm").arg("-qp").arg(flag).arg(&rpm));
    let (deb_rel, rpm_rel) = (|f| relation_names(&field(f)), |f| relation_names(&query(f)));
    // Leaves out rpm's own provides: nvshim, nvshim(x86-64), config(nvshim).
    let mut rpm_provides = rpm_rel("--provides");
    rpm_provides.retain(|p| !p.contains("nvshim"));
    let cases: [(&str, BTreeSet<String>, &[&str]); 7] = [
        ("deb Conflicts", deb_rel("Conflicts"), CONFLICTS),
        ("deb Replaces", deb_rel("Replaces"), CONFLICTS),
        ("deb Provides", deb_rel("Provides"), PROVIDES),
        ("deb Recommends", deb_rel("Recommends"), &["crun", "runc"]),
        ("rpm Conflicts", rpm_rel("--conflicts"), CONFLICTS),
        ("rpm Obsoletes", rpm_rel("--obsoletes"), &[]),
        ("rpm Provides", rpm_provides, PROVIDES),
    ];
    for (case, got, want) in cases {
        assert_eq!(got, names(want), "{case}");
    }
    let depends = field("Depends");
    assert!(
        depends.starts_with("libc6 (>= 2."),
        "deb Depends: {depends}"
    );
}

#[test]
fn rpm_installs_into_a_root_with_the_right_modes_and_scriptlets() {
    if !have(&["rpm", "busybox"]) {
        return;
    }
    let Some(rpm) = rpm() else { return };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    // Just enough of a system for the scriptlets: busybox as sh, cat, grep and echo.
    fs::create_dir_all(root.join("bin")).unwrap();
    let busybox = ok(Command::new("sh").args(["-c", "command -v busybox"]));
    fs::copy(busybox.trim(), root.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "grep", "echo"] {
        symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let rpm_in_root = |args: &[&str]| {
        let (stdout, stderr) = ok_both(Command::new("rpm").arg("--root").arg(root).args(args));
        assert!(
            !stderr.contains("scriptlet failed"),
            "rpm {args:?}:\n{stderr}"
        );
        format!("{stdout}{stderr}")
    };
    rpm_in_root(&["--initdb"]);
    let installed = rpm_in_root(&["-i", "--nodeps", rpm.to_str().unwrap()]);
    assert!(
        installed.contains("nvshim configure docker"),
        "%post: {installed}"
    );
    for (path, want) in FILES {
        assert_eq!(
            mode(&root.join(&path[1..])),
            *want,
            "rpm -i: mode of {path}"
        );
    }
    let nvr = rpm.file_stem().unwrap().to_str().unwrap();
    assert_eq!(rpm_in_root(&["-q", "nvshim"]).trim(), nvr);

    // %preun names an engine config still using the runtime; an edited
    // %config(noreplace) is kept as .rpmsave.
    let docker = root.join("etc/docker");
    fs::create_dir_all(&docker).unwrap();
    let daemon = r#"{"runtimes": {"nvidia": {"path": "/usr/bin/nvidia-container-runtime"}}}"#;
    fs::write(docker.join("daemon.json"), daemon).unwrap();
    let config = root.join(&CONFIG[1..]);
    let edited = format!("{}# edited\n", fs::read_to_string(&config).unwrap());
    fs::write(&config, &edited).unwrap();
    let erased = rpm_in_root(&["-e", "nvshim"]);
    assert!(
        erased.contains("/etc/docker/daemon.json"),
        "%preun: {erased}"
    );
    assert!(
        !root.join("usr/bin/nvshim").exists(),
        "rpm -e left the binaries"
    );
    let saved = fs::read_to_string(config.with_extension("toml.rpmsave")).unwrap();
    assert_eq!(saved, edited, "rpm -e: the edited config");
}

/// A second build of the same inputs gives the same bytes: the .deb `make package`
/// built (its epoch is the last commit's, its version Cargo's) against one built here
/// the same way into a tempdir.
#[test]
fn deb_build_is_reproducible() {
    if !have(&["dpkg-deb", "sha256sum"]) {
        return;
    }
    let Some(deb) = deb() else { return };
    let dir = tempfile::tempdir().unwrap();
    build_sh(dir.path(), &[("NVSHIM_FORMATS", "deb")]);
    let sha256 = |file: &Path| {
        let sum = ok(Command::new("sha256sum").arg(file));
        sum.split_whitespace().next().unwrap().to_owned()
    };
    let (a, b) = (
        sha256(&deb),
        sha256(&dir.path().join(deb.file_name().unwrap())),
    );
    eprintln!("sha256 of both builds: {a} {b}");
    assert_eq!(a, b, "two builds of the same inputs differ");
}

#[test]
fn lintian_finds_no_error() {
    if !have(&["lintian"]) {
        return;
    }
    let Some(deb) = deb() else { return };
    let out = run(Command::new("lintian")
        .args(["--fail-on", "error", "--info"])
        .arg(&deb));
    let stdout = String::from_utf8_lossy(&out.stdout);
    eprintln!(
        "lintian {}:\n{stdout}{}",
        deb.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "lintian reports errors:\n{stdout}");
    assert!(!stdout.lines().any(|l| l.starts_with("E: ")), "{stdout}");
}

/// A private copy of the cached minbase Debian chroot, deleted on drop. Nothing is
/// mounted in it: apt and dpkg work without /proc.
struct Chroot {
    dir: tempfile::TempDir,
}

impl Chroot {
    /// Copies the cached chroot (debootstrapping it first if needed), with a copy of
    /// `target/packages/apt` at `/srv/nvshim` as its only apt source.
    fn new() -> Option<Chroot> {
        if !have(&["debootstrap", "flock", "chroot"]) {
            return None;
        }
        deb()?;
        let base = base_chroot();
        let chroot = Chroot {
            dir: tempfile::tempdir().unwrap(),
        };
        ok(Command::new("cp").arg("-a").arg(&base).arg(chroot.root()));
        let srv = chroot.path("/srv/nvshim");
        ok(Command::new("cp")
            .arg("-a")
            .arg(packages_dir().join("apt"))
            .arg(&srv));
        let source = "deb [trusted=yes] file:/srv/nvshim ./\n";
        fs::write(chroot.path(APT_SOURCE), source).unwrap();
        chroot.apt(&["update"]);
        Some(chroot)
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A path inside, as seen from the host.
    fn path(&self, inside: &str) -> PathBuf {
        self.root().join(inside.trim_start_matches('/'))
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("chroot");
        cmd.arg(self.root()).args(args).env_clear();
        let env = [("LC_ALL", "C"), ("DEBIAN_FRONTEND", "noninteractive")];
        cmd.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").envs(env);
        cmd
    }

    /// `chroot <root> <args>`; asserts success.
    fn exec(&self, args: &[&str]) -> String {
        ok(&mut self.command(args))
    }

    /// `apt-get -y <args>` reading only our source.
    fn apt(&self, args: &[&str]) -> String {
        let list = format!("Dir::Etc::sourcelist={APT_SOURCE}");
        let mut all = vec!["apt-get", "-y", "-o", &list];
        all.extend(["-o", "Dir::Etc::sourceparts=-"]);
        all.extend_from_slice(args);
        self.exec(&all)
    }

    /// dpkg's status abbreviation and version (`ii0.1.0`), empty once dpkg forgot it.
    fn status(&self) -> String {
        let format = "${db:Status-Abbrev}${Version}";
        let out = run(&mut self.command(&["dpkg-query", "-W", "-f", format, "nvshim"]));
        String::from_utf8_lossy(&out.stdout).replace(' ', "")
    }

    fn config(&self) -> String {
        fs::read_to_string(self.path(CONFIG)).unwrap_or_default()
    }

    fn config_has(&self, mark: &str) -> bool {
        self.config().contains(&format!("# {mark}\n"))
    }

    fn has(&self, path: &str) -> bool {
        self.path(path).exists()
    }

    /// The admin edits the conffile.
    fn edit_config(&self, mark: &str) {
        fs::write(self.path(CONFIG), format!("{}# {mark}\n", self.config())).unwrap();
    }
}

/// `target/pkgtest-chroot/bookworm`, debootstrapped once (under a lock: the tests run
/// in parallel processes); complete when the marker next to it exists.
fn base_chroot() -> PathBuf {
    let cache = Path::new(REPO).join("target/pkgtest-chroot");
    fs::create_dir_all(&cache).unwrap();
    let base = cache.join("bookworm");
    let mirror = std::env::var("NVSHIM_DEBIAN_MIRROR")
        .unwrap_or_else(|_| "http://deb.debian.org/debian".to_owned());
    let script = r#"set -eu
if [ ! -e "$1.complete" ]; then
  rm -rf "$1"
  start=$(date +%s)
  debootstrap --variant=minbase bookworm "$1" "$2" >"$1.log" 2>&1 ||
    { tail -n 30 "$1.log" >&2; exit 1; }
  touch "$1.complete"
  echo "debootstrap took $(( $(date +%s) - start )) s" >&2
fi"#;
    let mut cmd = Command::new("flock");
    cmd.arg(cache.join(".lock"))
        .args(["sh", "-c", script, "sh"]);
    let (_, stderr) = ok_both(cmd.arg(&base).arg(&mirror));
    eprint!("{stderr}");
    base
}

#[test]
fn apt_installs_removes_upgrades_and_purges_in_a_chroot() {
    let Some(ch) = Chroot::new() else { return };
    let current = format!("ii{}", pkg_version());

    ch.apt(&["install", "nvshim"]);
    assert_eq!(ch.status(), current);
    let listed = ch.exec(&["dpkg", "-L", "nvshim"]);
    for (path, want) in FILES {
        let found = listed.lines().any(|l| l == *path);
        assert!(found, "dpkg -L lacks {path}:\n{listed}");
        assert_eq!(mode(&ch.path(path)), *want, "mode of {path}");
    }
    let shipped = fs::read_to_string(Path::new(REPO).join("packaging/config.toml")).unwrap();
    assert_eq!(ch.config(), shipped, "the installed config.toml");
    let printed = ch.exec(&["/usr/bin/nvshim", "--version"]);
    assert!(printed.contains(VERSION), "nvshim --version: {printed}");

    // The installed binary, run from the host (the same Debian), on a simulated node.
    let node = node(&NodeSpec::standard(2));
    let mut info = Command::new(ch.path("/usr/bin/nvshim"));
    info.env_clear().args(["info", "--backend", "procfs"]);
    names_every_gpu(&ok(info.args(node.sim.root_args())), &node, "nvshim info");

    // remove keeps the admin's edited conffile, and so does installing again.
    ch.edit_config("edited");
    ch.apt(&["remove", "nvshim"]);
    assert!(!ch.has("/usr/bin/nvshim"), "remove left nvshim");
    assert!(ch.config_has("edited"), "remove lost the edit");
    assert_eq!(ch.status(), current.replace("ii", "rc"));
    ch.apt(&["install", "nvshim"]);
    assert!(ch.has("/usr/bin/nvidia-container-runtime"));
    assert!(ch.config_has("edited"), "reinstall lost the edit");
    ch.apt(&["purge", "nvshim"]);
    assert_eq!(ch.status(), "", "purge left dpkg state");
    let dir = CONFIG.rsplit_once('/').unwrap().0;
    assert!(!ch.has(dir), "purge left {dir}");

    // Upgrade from an older build: the admin's edit survives.
    let old_dir = tempfile::tempdir().unwrap();
    let env = [("NVSHIM_VERSION", "0.0.9"), ("NVSHIM_FORMATS", "deb")];
    build_sh(old_dir.path(), &env);
    let old = find(old_dir.path(), "nvshim_0.0.9_", ".deb").unwrap();
    fs::copy(&old, ch.path("/srv/old.deb")).unwrap();
    ch.apt(&["install", "/srv/old.deb"]);
    assert_eq!(ch.status(), "ii0.0.9");
    ch.edit_config("edited on 0.0.9");
    ch.apt(&["-o", "Dpkg::Options::=--force-confold", "install", "nvshim"]);
    assert_eq!(ch.status(), current);
    assert!(ch.config_has("edited on 0.0.9"), "upgrade lost the edit");
    ch.apt(&["purge", "nvshim"]);
    assert!(!ch.has(CONFIG), "purge left the config");
}

#[test]
fn first_run_story_gives_docker_run_gpus_all() {
    if !have(&["dockerd", "docker", "runc"]) {
        return;
    }
    let Some(ch) = Chroot::new() else { return };
    ch.apt(&["install", "nvshim"]);
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();

    // `nvshim configure docker --set-as-default`, by the installed nvshim.
    let daemon_json = dir.path().join("daemon.json");
    let runtime = ch.path("/usr/bin/nvidia-container-runtime");
    let mut configure = Command::new(ch.path("/usr/bin/nvshim"));
    configure
        .env_clear()
        .args(["configure", "docker", "--set-as-default"]);
    ok(configure
        .arg("--config")
        .arg(&daemon_json)
        .arg("--runtime-path")
        .arg(runtime));
    let configured: serde_json::Value =
        serde_json::from_str(&fs::read_to_string(&daemon_json).unwrap()).unwrap();
    assert_eq!(configured["default-runtime"], "nvidia", "{configured}");

    // "Restart docker": a test dockerd with that daemon.json. It offers --gpus only
    // when the installed hook is on its PATH; the runtime's config points at the node.
    let config = dir.path().join("config.toml");
    fs::write(&config, node.sim.runtime_config("runc", None)).unwrap();
    let bin = dir.path().join("bin");
    fs::create_dir_all(&bin).unwrap();
    let hook = "nvidia-container-runtime-hook";
    symlink(ch.path(&format!("/usr/bin/{hook}")), bin.join(hook)).unwrap();
    let path = path_with_prefix(&bin);
    let env = [
        ("PATH", path.to_str().unwrap()),
        ("NVIDIA_CTK_CONFIG_FILE_PATH", config.to_str().unwrap()),
    ];
    let daemon = Dockerd::start_with_env(&dir.path().join("docker"), &configured, &env).unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let tar = dir.path().join("rootfs.tar");
    tar_rootfs(&rootfs, &tar).unwrap();
    daemon.import(&tar, IMAGE).unwrap();

    let mock = format!("{}:/etc/mock-nvml.json:ro", node.sim.mock_config.display());
    let smi = |flags: &[&str]| {
        let mut docker = daemon.docker();
        docker.args(["run", "--rm", "-v", &mock]);
        docker.args(["-e", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"]);
        docker.args(["-e", "MOCK_NVML_DEV_ROOT=/dev"]);
        let out = ok(docker.args(flags).args([IMAGE, "nvidia-smi", "-L"]));
        let gpus = out.lines().filter(|l| l.starts_with("GPU ")).count();
        (out, gpus)
    };
    let (out, gpus) = smi(&["--gpus", "all"]);
    assert_eq!(gpus, node.sim.spec.gpus.len(), "--gpus all:\n{out}");
    names_every_gpu(&out, &node, "--gpus all");
    // The default runtime is ours: the variable alone (no --gpus: no hook) gets a GPU.
    let (out, gpus) = smi(&["-e", "NVIDIA_VISIBLE_DEVICES=1"]);
    let uuid = &node.sim.spec.gpus[1].uuid;
    assert!(gpus == 1 && out.contains(uuid), "only GPU 1:\n{out}");
}

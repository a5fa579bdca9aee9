//! A private copy of a cached minbase Debian chroot whose only apt source is a signed
//! `file:` repository, trusted through `signed-by=` and nothing else.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{BASE, REPO, deb, fails, have, ok, ok_both, packages_dir, repo_sh, run};

/// The chroot's only apt source (apt is told to read nothing else: no network).
pub(super) const APT_SOURCE: &str = "/etc/apt/sources.list.d/nvshim.list";
/// Where the repository's public key goes, as the install docs put it.
pub(super) const KEYRING: &str = "/usr/share/keyrings/nvshim.gpg";
/// The repository, inside the chroot.
pub(super) const SRV: &str = "/srv/nvshim";

/// Nothing is mounted in it: apt and dpkg work without /proc. Deleted on drop.
pub(super) struct Chroot {
    dir: tempfile::TempDir,
}

/// A copy of `target/packages/apt` (as build.sh signed it) in a new tempdir; with
/// `extra` packages, they are added and the repository is signed again (`repo.sh apt`,
/// the same key).
pub(super) fn signed_repo(extra: &[PathBuf]) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("apt");
    ok(Command::new("cp")
        .arg("-a")
        .arg(packages_dir().join("apt"))
        .arg(&repo));
    if !extra.is_empty() {
        for deb in extra {
            fs::copy(deb, repo.join(deb.file_name().unwrap())).unwrap();
        }
        repo_sh(&["apt", repo.to_str().unwrap()]);
    }
    dir
}

impl Chroot {
    /// Copies the cached chroot (debootstrapping it first if needed), with `repo`'s
    /// `apt/` at [`SRV`] and its key at [`KEYRING`]; `apt-get update` is the caller's.
    pub(super) fn new(repo: &Path) -> Option<Chroot> {
        if !have(&["debootstrap", "flock", "chroot"]) {
            return None;
        }
        deb(BASE)?;
        let base = base_chroot();
        let chroot = Chroot {
            dir: tempfile::tempdir().unwrap(),
        };
        ok(Command::new("cp").arg("-a").arg(&base).arg(chroot.root()));
        let srv = chroot.path(SRV);
        ok(Command::new("cp").arg("-a").arg(repo.join("apt")).arg(&srv));
        fs::copy(srv.join("nvshim.gpg"), chroot.path(KEYRING)).unwrap();
        chroot.set_source(KEYRING);
        Some(chroot)
    }

    /// Our repository as the only source, trusted through the key in `keyring`.
    pub(super) fn set_source(&self, keyring: &str) {
        let source = format!("deb [signed-by={keyring}] file:{SRV} ./\n");
        fs::write(self.path(APT_SOURCE), source).unwrap();
    }

    pub(super) fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    /// A path inside, as seen from the host.
    pub(super) fn path(&self, inside: &str) -> PathBuf {
        self.root().join(inside.trim_start_matches('/'))
    }

    pub(super) fn command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new("chroot");
        cmd.arg(self.root()).args(args).env_clear();
        let env = [("LC_ALL", "C"), ("DEBIAN_FRONTEND", "noninteractive")];
        cmd.env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin").envs(env);
        cmd
    }

    /// `chroot <root> <args>`; asserts success.
    pub(super) fn exec(&self, args: &[&str]) -> String {
        ok(&mut self.command(args))
    }

    fn apt_command(&self, args: &[&str]) -> Command {
        let list = format!("Dir::Etc::sourcelist={APT_SOURCE}");
        let mut all = vec!["apt-get", "-y", "-o", &list];
        all.extend(["-o", "Dir::Etc::sourceparts=-"]);
        all.extend_from_slice(args);
        self.command(&all)
    }

    /// `apt-get -y <args>` reading only our source; asserts success, returns stdout and
    /// stderr together.
    pub(super) fn apt(&self, args: &[&str]) -> String {
        let (stdout, stderr) = ok_both(&mut self.apt_command(args));
        format!("{stdout}{stderr}")
    }

    /// `apt-get -y <args>`; asserts failure, returns what it printed.
    pub(super) fn apt_fails(&self, args: &[&str]) -> String {
        fails(&mut self.apt_command(args))
    }

    /// dpkg's status abbreviation and version (`ii1:0.1.0`), empty once dpkg forgot it.
    pub(super) fn status(&self, package: &str) -> String {
        let format = "${db:Status-Abbrev}${Version}";
        let out = run(&mut self.command(&["dpkg-query", "-W", "-f", format, package]));
        String::from_utf8_lossy(&out.stdout).replace(' ', "")
    }

    pub(super) fn read(&self, inside: &str) -> String {
        fs::read_to_string(self.path(inside)).unwrap_or_default()
    }

    pub(super) fn has(&self, inside: &str) -> bool {
        self.path(inside).symlink_metadata().is_ok()
    }
}

/// `target/pkgtest-chroot/bookworm` (or `$NVSHIM_PKGTEST_CACHE/bookworm`: `.ci/run` keeps
/// it between CI runs, like the kubelet), debootstrapped once (under a lock: the tests run
/// in parallel processes); complete when the marker next to it exists, and made again when
/// that marker is over a week old.
fn base_chroot() -> PathBuf {
    let cache = std::env::var_os("NVSHIM_PKGTEST_CACHE")
        .filter(|dir| !dir.is_empty())
        .map_or_else(
            || Path::new(REPO).join("target/pkgtest-chroot"),
            PathBuf::from,
        );
    fs::create_dir_all(&cache).unwrap();
    let base = cache.join("bookworm");
    let mirror = std::env::var("NVSHIM_DEBIAN_MIRROR")
        .unwrap_or_else(|_| "http://deb.debian.org/debian".to_owned());
    let script = r#"set -eu
if [ ! -e "$1.complete" ] || [ -n "$(find "$1.complete" -mtime +7)" ]; then
  rm -rf "$1" "$1.complete"
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

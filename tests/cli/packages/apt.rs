//! apt in a Debian chroot, from the signed repository: a wrong key and a tampered
//! `InRelease` or `Release` are refused; `nvidia-container-toolkit-base` installs with
//! its files and modes, remove keeps the admin's edited conffile, purge deletes it, and
//! an upgrade from an older build keeps the edit.

use std::fs;
use std::path::Path;
use std::process::Command;

use super::chroot::{Chroot, KEYRING, SRV, signed_repo};
use super::{
    BASE, CONFIG, Entry, HOOKS_D, NVSHIM, REPO, SYSTEMD_UNIT, TOOLKIT, TOOLS, VERSION, build_sh,
    deb_version, fake_deb, find, mode, ok, package_set, run,
};
use crate::common::node;
use nvshim_testkit::NodeSpec;

/// Another key than the repository's, exported as a keyring file to `out`.
fn other_keyring(out: &Path) {
    let home = tempfile::tempdir().unwrap();
    let gnupg = home.path().join("gnupg");
    let repo_sh = Path::new(REPO).join("packaging/repo.sh");
    ok(Command::new("bash").arg(repo_sh).arg("keygen").arg(&gnupg));
    let mut export = Command::new("gpg");
    export
        .arg("--homedir")
        .arg(&gnupg)
        .args(["--batch", "--export"]);
    let exported = run(&mut export);
    assert!(exported.status.success() && !exported.stdout.is_empty());
    fs::write(out, exported.stdout).unwrap();
    let mut kill = Command::new("gpgconf");
    run(kill
        .arg("--homedir")
        .arg(&gnupg)
        .args(["--kill", "gpg-agent"]));
}

/// What a refused `apt-get update` says: the signature did not verify.
fn assert_refused(said: &str, what: &str) {
    let refused = [
        "NO_PUBKEY",
        "BADSIG",
        "not signed",
        "signatures were invalid",
    ];
    assert!(
        refused.iter().any(|r| said.contains(r)),
        "{what}: apt-get update failed without a signature error:\n{said}"
    );
}

const HOOK: &str = "nvidia-container-runtime-hook";

fn config_has(ch: &Chroot, mark: &str) -> bool {
    ch.read(CONFIG).contains(&format!("# {mark}\n"))
}

/// The admin edits the conffile.
fn edit_config(ch: &Chroot, mark: &str) {
    fs::write(ch.path(CONFIG), format!("{}# {mark}\n", ch.read(CONFIG))).unwrap();
}

#[test]
fn apt_refuses_bad_signatures_then_installs_removes_upgrades_and_purges() {
    let repo = signed_repo(&[]);
    let Some(ch) = Chroot::new(repo.path()) else {
        return;
    };
    // Before any update succeeded (no index to fall back on), and with every warning an
    // error: a key that did not sign the repository.
    let update = ["update", "--error-on=any"];
    let other = "/usr/share/keyrings/other.gpg";
    other_keyring(&ch.path(other));
    ch.set_source(other);
    assert_refused(&ch.apt_fails(&update), "another key");
    ch.set_source(KEYRING);
    // A changed InRelease; then, without InRelease, a changed Release (Release.gpg).
    let in_release = ch.path(&format!("{SRV}/InRelease"));
    let release = ch.path(&format!("{SRV}/Release"));
    let (good_in, good) = (fs::read(&in_release).unwrap(), fs::read(&release).unwrap());
    let tamper = |file: &Path| {
        let text = fs::read_to_string(file).unwrap();
        assert!(text.contains("Origin: nvshim\n"), "{text}");
        fs::write(file, text.replace("Origin: nvshim\n", "Origin: nvshim-x\n")).unwrap();
    };
    tamper(&in_release);
    assert_refused(&ch.apt_fails(&update), "tampered InRelease");
    fs::remove_file(&in_release).unwrap();
    tamper(&release);
    assert_refused(&ch.apt_fails(&update), "tampered Release");
    fs::write(&release, good).unwrap();
    ch.apt(&update);
    fs::write(&in_release, good_in).unwrap();
    ch.apt(&update);

    let current = format!("ii{}", deb_version());
    ch.apt(&["install", BASE]);
    assert_eq!(ch.status(BASE), current);
    let listed = ch.exec(&["dpkg", "-L", BASE]);
    let base = package_set().into_iter().find(|p| p.name == BASE).unwrap();
    for (path, entry) in base.all_entries() {
        let found = listed.lines().any(|l| l == path);
        assert!(found, "dpkg -L lacks {path}:\n{listed}");
        match entry {
            Entry::File(want) => assert_eq!(mode(&ch.path(&path)), want, "mode of {path}"),
            Entry::Link(to) => assert_eq!(fs::read_link(ch.path(&path)).unwrap(), Path::new(to)),
        }
    }
    // The /dev/char unit is enabled (deb-systemd-helper, as debhelper's scripts do).
    let unit = Path::new(REPO).join(SYSTEMD_UNIT).exists();
    let wants = "/etc/systemd/system/multi-user.target.wants/nvidia-dev-char-symlinks.service";
    assert_eq!(ch.has(wants), unit, "{wants} after install");
    // The exporter's unit is installed (the loop above) but left disabled.
    let exporter = "/etc/systemd/system/multi-user.target.wants/nvshim-exporter.service";
    assert!(
        !ch.has(exporter),
        "{exporter} after install: the exporter is opt-in"
    );
    let shipped = fs::read_to_string(Path::new(REPO).join("packaging/config.toml")).unwrap();
    assert_eq!(ch.read(CONFIG), shipped, "the installed config.toml");
    let printed = ch.exec(&["/usr/bin/nvshim", "--version"]);
    assert!(printed.contains(VERSION), "nvshim --version: {printed}");

    // The installed binary, run from the host (the same Debian), on a simulated node.
    let node = node(&NodeSpec::standard(2));
    let mut info = Command::new(ch.path("/usr/bin/nvshim"));
    info.env_clear().args(["info", "--backend", "procfs"]);
    let text = ok(info.args(node.sim.root_args()));
    for gpu in &node.sim.spec.gpus {
        assert!(
            text.contains(&gpu.uuid),
            "nvshim info lacks {}:\n{text}",
            gpu.uuid
        );
    }

    // remove keeps the admin's edited conffile, and so does installing again.
    edit_config(&ch, "edited");
    ch.apt(&["remove", BASE]);
    assert!(!ch.has("/usr/bin/nvidia-ctk"), "remove left nvidia-ctk");
    assert!(config_has(&ch, "edited"), "remove lost the edit");
    assert_eq!(ch.status(BASE), current.replace("ii", "rc"));
    ch.apt(&["install", BASE]);
    assert!(ch.has("/usr/bin/nvidia-container-runtime"));
    assert!(config_has(&ch, "edited"), "reinstall lost the edit");
    ch.apt(&["purge", BASE]);
    assert_eq!(ch.status(BASE), "", "purge left dpkg state");
    let dir = CONFIG.rsplit_once('/').unwrap().0;
    assert!(!ch.has(dir), "purge left {dir}");
    assert!(!ch.has(wants), "purge left {wants}");

    // Upgrade from an older build: the admin's edit survives.
    let old_dir = tempfile::tempdir().unwrap();
    let env = [
        ("NVSHIM_VERSION", "0.0.9"),
        ("NVSHIM_FORMATS", "deb"),
        ("NVSHIM_DEBS", BASE),
    ];
    build_sh(old_dir.path(), &env);
    let old = find(old_dir.path(), &format!("{BASE}_0.0.9_"), ".deb").unwrap();
    fs::copy(&old, ch.path("/srv/old.deb")).unwrap();
    ch.apt(&["install", "/srv/old.deb"]);
    assert_eq!(ch.status(BASE), "ii1:0.0.9");
    edit_config(&ch, "edited on 0.0.9");
    ch.apt(&["-o", "Dpkg::Options::=--force-confold", "install", BASE]);
    assert_eq!(ch.status(BASE), current);
    assert!(config_has(&ch, "edited on 0.0.9"), "upgrade lost the edit");
    ch.apt(&["purge", BASE]);
    assert!(!ch.has(CONFIG), "purge left the config");

    // Upgrade from the single `nvshim` package of earlier builds (a fake with its files
    // and relationships): the new nvshim brings the whole toolkit, so no binary goes
    // missing, and the edited config, now the base's conffile, survives.
    let script = "#!/bin/sh\necho old nvshim\n";
    let bins = [
        "nvshim",
        "nvidia-container-runtime",
        HOOK,
        "nvidia-device-plugin",
    ];
    let paths: Vec<String> = bins.iter().map(|b| format!("/usr/bin/{b}")).collect();
    let mut files: Vec<(&str, &str)> = paths.iter().map(|p| (p.as_str(), script)).collect();
    files.extend([(CONFIG, "# old nvshim\n"), (HOOKS_D, "{}")]);
    let nvidia =
        "nvidia-container-runtime, nvidia-container-toolkit, nvidia-container-toolkit-base";
    let fields =
        format!("Conflicts: {nvidia}\nReplaces: {nvidia}\nProvides: nvidia-container-runtime\n");
    let old = fake_deb(old_dir.path(), NVSHIM, "0.1.0", &files, &fields);
    fs::copy(&old, ch.path("/srv/old-nvshim.deb")).unwrap();
    ch.apt(&["install", "/srv/old-nvshim.deb"]);
    assert_eq!(ch.status(NVSHIM), "ii0.1.0");
    edit_config(&ch, "edited on the old nvshim");
    ch.apt(&["-o", "Dpkg::Options::=--force-confold", "install", NVSHIM]);
    for package in [NVSHIM, BASE, TOOLKIT, TOOLS] {
        assert_eq!(ch.status(package), current, "{package}");
    }
    for path in &paths {
        let bytes = fs::read(ch.path(path)).unwrap();
        assert!(
            !String::from_utf8_lossy(&bytes).contains("old nvshim"),
            "{path} is the old one"
        );
    }
    assert!(
        config_has(&ch, "edited on the old nvshim"),
        "upgrade lost the edit"
    );
}

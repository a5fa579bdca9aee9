//! The rpm set: signatures that verify with the exported key (and not without it), a
//! signed `repomd.xml`, and the set installed with `rpm --root` into a root that has
//! just enough of a system (busybox, and the host's glibc for the dynamic `nvshim` that
//! `nvidia-docker2`'s scriptlets run).

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::{
    BASE, CONFIG, DOCKER2, Entry, NVSHIM, REPO, TOOLKIT, TOOLS, fails, have, mode, ok, ok_both,
    package_set, packages_dir, rpm,
};

/// Copies the shared libraries `binary` needs (and the loader) into `root`, at their paths.
fn copy_libraries(binary: &Path, root: &Path) {
    let ldd = ok(Command::new("ldd").arg(binary));
    for line in ldd.lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x…)` or `/lib64/ld-linux… (0x…)`
        let Some(path) = line.split_whitespace().find(|w| w.starts_with('/')) else {
            continue;
        };
        let dest = root.join(&path[1..]);
        fs::create_dir_all(dest.parent().unwrap()).unwrap();
        fs::copy(path, &dest).unwrap_or_else(|e| panic!("copy {path}: {e}"));
    }
}

/// NVIDIA's nvidia-docker2 2.13.0 as far as daemon.json goes: the file as
/// `%config(noreplace)`, with the runtime entry NVIDIA shipped.
fn fake_nvidia_docker2(dir: &Path) -> PathBuf {
    let top = dir.join("fake-rpm");
    let files = top.join("files");
    fs::create_dir_all(files.join("etc/docker")).unwrap();
    fs::create_dir_all(files.join("usr/bin")).unwrap();
    let shipped =
        r#"{"runtimes": {"nvidia": {"path": "nvidia-container-runtime", "runtimeArgs": []}}}"#;
    fs::write(files.join("etc/docker/daemon.json"), shipped).unwrap();
    fs::write(files.join("usr/bin/nvidia-docker"), "#!/bin/sh\n").unwrap();
    let spec = format!(
        "Name: nvidia-docker2\nVersion: 2.13.0\nRelease: 1\nSummary: fake\nLicense: none\n\
         BuildArch: noarch\n%description\nfake\n%install\ncp -a {}/. %{{buildroot}}/\n\
         %files\n%config(noreplace) /etc/docker/daemon.json\n\
         %attr(0755,root,root) /usr/bin/nvidia-docker\n",
        files.display()
    );
    fs::write(top.join("fake.spec"), spec).unwrap();
    let mut build = Command::new("rpmbuild");
    build.args(["-bb", "--quiet", "--define"]);
    build.arg(format!("_topdir {}", top.display()));
    build.args(["--define", "__os_install_post %{nil}"]);
    ok(build.arg(top.join("fake.spec")));
    top.join("RPMS/noarch/nvidia-docker2-2.13.0-1.noarch.rpm")
}

#[test]
fn rpm_set_verifies_installs_into_a_root_and_configures_docker() {
    if !have(&["rpm", "rpmkeys", "busybox", "gpgv", "ldd"]) {
        return;
    }
    let mut rpms = Vec::new();
    for package in package_set() {
        let Some(rpm) = rpm(package.name) else { return };
        rpms.push(rpm);
    }
    let yum = packages_dir().join("yum");
    let key = yum.join("gpgkey");
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");

    // The repository's metadata signature, and a tampered copy refused.
    let repomd = yum.join("repodata/repomd.xml");
    let gpgv = |data: &Path| {
        let mut cmd = Command::new("gpgv");
        cmd.arg("--keyring").arg(yum.join("nvshim.gpg"));
        cmd.arg(yum.join("repodata/repomd.xml.asc")).arg(data);
        cmd
    };
    ok_both(&mut gpgv(&repomd));
    let tampered = dir.path().join("repomd.xml");
    let text = fs::read_to_string(&repomd).unwrap();
    fs::write(&tampered, text.replacen("<revision>", "<revision>1", 1)).unwrap();
    fails(&mut gpgv(&tampered));

    // Just enough of a system for the scriptlets: busybox as sh and the tools they use.
    fs::create_dir_all(root.join("bin")).unwrap();
    let busybox = ok(Command::new("sh").args(["-c", "command -v busybox"]));
    fs::copy(busybox.trim(), root.join("bin/busybox")).unwrap();
    for applet in ["sh", "cat", "grep", "echo", "cp", "rm", "mkdir", "cmp"] {
        symlink("busybox", root.join("bin").join(applet)).unwrap();
    }
    let rpm_in_root = |args: &[&str]| {
        let (stdout, stderr) = ok_both(Command::new("rpm").arg("--root").arg(&root).args(args));
        assert!(
            !stderr.contains("scriptlet failed"),
            "rpm {args:?}:\n{stderr}"
        );
        format!("{stdout}{stderr}")
    };
    rpm_in_root(&["--initdb"]);
    // Signed: not OK without the key, OK once it is imported.
    let checksig = |rpm: &Path| {
        let mut cmd = Command::new("rpmkeys");
        cmd.arg("--root").arg(&root).arg("--checksig").arg(rpm);
        cmd
    };
    let refused = fails(&mut checksig(&rpms[0]));
    assert!(refused.contains("NOT OK"), "without the key: {refused}");
    ok(Command::new("rpmkeys")
        .arg("--root")
        .arg(&root)
        .arg("--import")
        .arg(&key));
    for rpm in &rpms {
        let checked = ok(&mut checksig(rpm));
        assert!(checked.contains("signatures OK"), "{checked}");
    }

    // The glibc the dynamic nvidia-ctk needs, from the host (the binaries' build host);
    // the packaged nvidia-ctk is the release `nvshim`, stripped.
    copy_libraries(&Path::new(REPO).join("target/static/release/nvshim"), &root);

    // NVIDIA's nvidia-docker2 first (a fake), its %config(noreplace) daemon.json edited by
    // the admin; then ours over it, in one transaction.
    let nvidia = fake_nvidia_docker2(dir.path());
    rpm_in_root(&["-i", "--nodeps", nvidia.to_str().unwrap()]);
    let daemon_json = root.join("etc/docker/daemon.json");
    let edited = r#"{"log-level": "warn", "runtimes": {"nvidia": {"path": "/opt/nvidia/nvidia-container-runtime", "runtimeArgs": ["--debug"]}}}"#;
    fs::write(&daemon_json, edited).unwrap();
    let mut install = vec!["-U"];
    install.extend(rpms.iter().map(|r| r.to_str().unwrap()));
    // rpm's library requirements name files the root's empty database does not know.
    install.push("--nodeps");
    let installed = rpm_in_root(&install);
    assert!(
        installed.contains("nvshim configure docker"),
        "%post: {installed}"
    );
    for package in package_set() {
        for (path, entry) in package.all_entries() {
            let at = root.join(&path[1..]);
            match entry {
                Entry::File(want) => assert_eq!(mode(&at), want, "rpm -i: mode of {path}"),
                Entry::Link(to) => assert_eq!(fs::read_link(&at).unwrap(), Path::new(to)),
            }
        }
        let nvr = rpm_in_root(&["-q", package.name]);
        assert!(nvr.starts_with(package.name), "rpm -q: {nvr}");
    }
    let json = || -> serde_json::Value {
        serde_json::from_str(&fs::read_to_string(&daemon_json).unwrap()).unwrap()
    };
    // rpm deleted NVIDIA's edited daemon.json with the old package (saving it as
    // .rpmsave); %posttrans put it back and pointed the entry at our runtime.
    let configured = json();
    assert_eq!(configured["log-level"], "warn", "{configured}");
    let nvidia = &configured["runtimes"]["nvidia"];
    assert_eq!(nvidia["path"], "nvidia-container-runtime", "{configured}");
    assert_eq!(
        nvidia["runtimeArgs"],
        serde_json::json!(["--debug"]),
        "{configured}"
    );
    let rpmsave = root.join("etc/docker/daemon.json.rpmsave");
    assert!(!rpmsave.exists(), "left {}", rpmsave.display());

    // Erasing nvidia-docker2 takes the runtime out again; erasing the base names the
    // engine config that still uses it (none now) and keeps an edited config.
    rpm_in_root(&["-e", DOCKER2]);
    assert_eq!(json(), serde_json::json!({"log-level": "warn"}));
    fs::write(
        &daemon_json,
        r#"{"runtimes": {"x": {"path": "/usr/bin/nvidia-container-runtime"}}}"#,
    )
    .unwrap();
    let config = root.join(&CONFIG[1..]);
    let edited = format!("{}# edited\n", fs::read_to_string(&config).unwrap());
    fs::write(&config, &edited).unwrap();
    let erased = rpm_in_root(&["-e", NVSHIM, TOOLKIT, TOOLS, BASE]);
    assert!(
        erased.contains("/etc/docker/daemon.json"),
        "%preun: {erased}"
    );
    assert!(
        !root.join("usr/bin/nvidia-ctk").exists(),
        "rpm -e left the binaries"
    );
    let saved = fs::read_to_string(config.with_extension("toml.rpmsave")).unwrap();
    assert_eq!(saved, edited, "rpm -e: the edited config");
}

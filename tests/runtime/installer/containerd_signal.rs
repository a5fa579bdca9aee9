// SPDX-License-Identifier: Apache-2.0
//! containerd with `--restart-mode signal`, the installer's default for it and the Helm
//! chart's: containerd exits on SIGHUP and its service manager starts it again, so the test
//! plays the service manager (a shell loop, `Restart=always`). The installer signals the
//! process on the socket, waits for a new one to serve it and only then writes the ready
//! file; the new containerd's CRI plugin has the `nvidia` runtime. Uninstall does the same
//! the other way, and leaves the host tree as it was.

use std::os::unix::process::CommandExt;

use super::*;

/// containerd under a restart loop, in a process group of its own (killed on drop).
struct Supervised {
    group: Child,
    log: PathBuf,
    address: PathBuf,
}

impl Supervised {
    fn start(
        config: &Path,
        address: PathBuf,
        log: PathBuf,
        env: &[(&'static str, String)],
    ) -> Self {
        let script = format!(
            "while :; do containerd --config '{}' >>'{}' 2>&1; done",
            s(config),
            s(&log)
        );
        let group = Command::new("/bin/sh")
            .args(["-c", &script])
            .env_clear()
            .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
            .stdin(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap();
        let supervised = Supervised {
            group,
            log,
            address,
        };
        wait_until("containerd serving its socket", || supervised.serves());
        supervised
    }

    fn serves(&self) -> bool {
        Command::new("ctr")
            .args(["--address", s(&self.address), "version"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|st| st.success())
    }

    /// The CRI plugin's config line of each containerd start, in order.
    fn cri_starts(&self) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("Start cri plugin with config"))
            .map(str::to_owned)
            .collect()
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        let group = Pid::from_raw(-i32::try_from(self.group.id()).unwrap());
        let _ = kill(group, Signal::SIGKILL);
        let _ = self.group.wait();
    }
}

#[test]
fn containerd_signal_mode_waits_for_the_restarted_engine_and_undoes_the_same_way() {
    let host = Host::new();
    let tmp = host.tmp();
    let config = host.root().join("etc/containerd/config.toml");
    fs::create_dir_all(config.parent().unwrap()).unwrap();
    let own = tmp.join("ctd");
    fs::write(&config, containerd_config(&own)).unwrap();
    let address = own.join("run/containerd/containerd.sock");
    let before = tree(&host.root());
    let containerd = Supervised::start(
        &config,
        address.clone(),
        tmp.join("containerd.log"),
        &host.engine_env(),
    );
    assert_eq!(containerd.cri_starts().len(), 1, "one start so far");

    let build = source_dir(&tmp.join("build"), b"");
    let mut flags = host.flags("containerd", &config, &build);
    flags.extend(["--restart-mode", "signal", "--socket", s(&address)].map(str::to_owned));
    let printed = run_ok(
        nvshim(&["install", "--no-daemon"]).args(&flags),
        "install --restart-mode signal",
    );
    // The ready file comes after the restarted containerd serves the socket, with the runtime.
    assert!(host.ready_file().exists(), "no ready file:\n{printed}");
    assert!(containerd.serves(), "containerd is back:\n{printed}");
    wait_until("the restarted containerd's CRI plugin", || {
        containerd.cri_starts().len() >= 2
    });
    let starts = containerd.cri_starts();
    let binary = host.toolkit().join("nvidia-container-runtime");
    assert_eq!(starts.len(), 2, "one restart by the signal:\n{starts:#?}");
    assert!(
        starts[1].contains("nvidia:{Type:io.containerd.runc.v2")
            && starts[1].contains(&format!("BinaryName:{}", s(&binary))),
        "the restarted CRI plugin's runtimes: {}",
        starts[1]
    );

    let toolkit = host.toolkit();
    let uninstall = ["--host-root", "/", "--toolkit-dir", s(&toolkit)];
    let printed = run_ok(nvshim(&["uninstall"]).args(uninstall), "uninstall");
    assert!(containerd.serves(), "containerd is back:\n{printed}");
    wait_until("containerd restarted by the undo", || {
        containerd.cri_starts().len() >= 3
    });
    let starts = containerd.cri_starts();
    assert_eq!(starts.len(), 3, "one restart by the undo:\n{printed}");
    assert!(
        !starts[2].contains("nvidia:{"),
        "the runtime is gone from the CRI plugin: {}",
        starts[2]
    );
    let changes = tree_changes(&before, &tree(&host.root()));
    assert!(changes.is_empty(), "uninstall left changes:\n{changes}");
}

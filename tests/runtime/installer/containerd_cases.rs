// SPDX-License-Identifier: Apache-2.0
//! containerd: install with `--no-daemon`, `containerd config dump`, a GPU container through
//! the dumped `BinaryName`, uninstall; then an installer daemon, an upgrade to another build
//! under a loop of container creates, and SIGTERM to the old and the new daemon. Also the
//! `--host-root` case, which needs no engine.

use super::*;

/// The node's GPUs 0 and 2 in a container `ctr run` starts with `binary` as runc.
fn ctr_run_gpus_0_and_2(host: &Host, containerd: &Containerd, shim: &str, binary: &str, n: u32) {
    let rootfs = host.rootfs(&format!("rootfs-ctr-{n}"));
    let mount = format!(
        "type=bind,src={},dst=/etc/mock-nvml.json,options=rbind:ro",
        host.mock_mount()
    );
    let id = format!("nvshim-installer-{}-{n}", std::process::id());
    let out = containerd
        .ctr_run()
        .args([
            "--rm",
            "--rootfs",
            "--runtime",
            shim,
            "--runc-binary",
            binary,
        ])
        .args(["--mount", &mount])
        .args(["--env", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
        .args(["--env", "MOCK_NVML_DEV_ROOT=/dev"])
        .args(["--env", "NVIDIA_VISIBLE_DEVICES=0,2"])
        .arg(&rootfs)
        .arg(&id)
        .args(["/bin/sh", "-c", GPU_SCRIPT])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let what = format!("ctr run #{n} through {binary}");
    assert!(out.status.success(), "{what}: {}", text(&out));
    assert_gpus_0_and_2(host, &String::from_utf8_lossy(&out.stdout), &what);
}

/// Container creates through the toolkit's runtime in a thread, until stopped: each one puts
/// the bundle's `config.json` and linker cache back, runs `<toolkit>/nvidia-container-runtime
/// create` (which edits the spec, then execs runc, which runs the hooks the spec names), checks
/// the GPU was injected, and deletes the container. Each create's version is read from the
/// hook the runtime put in the spec: the runtime names the hook beside its own resolved
/// executable, `<toolkit>/versions/<version>/`.
struct CreateLoop {
    stop: Arc<AtomicBool>,
    /// Creates finished.
    creates: Arc<AtomicUsize>,
    /// Creates started.
    started: Arc<AtomicUsize>,
    thread: std::thread::JoinHandle<Result<Vec<String>, String>>,
}

impl CreateLoop {
    fn start(host: &Host, runtime: PathBuf) -> CreateLoop {
        let tmp = host.tmp();
        let versions_dir = host.toolkit().join("versions");
        let bundle = tmp.join("bundle");
        let rootfs = host.rootfs("rootfs-loop");
        runc_bundle(
            &bundle,
            &rootfs,
            &["/bin/true"],
            &["NVIDIA_VISIBLE_DEVICES=0"],
        )
        .unwrap();
        let spec = fs::read(bundle.join("config.json")).unwrap();
        let cache = fs::read(bundle.join("rootfs/etc/ld.so.cache")).unwrap();
        let env = host.engine_env();
        let (stop, creates) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicUsize::new(0)),
        );
        let started = Arc::new(AtomicUsize::new(0));
        let (stop_flag, count, starts) = (stop.clone(), creates.clone(), started.clone());
        let thread = std::thread::spawn(move || {
            let root = tmp.join("runc-root");
            let errors = tmp.join("create-errors.log");
            let prefix = format!("nvshim-installer-loop-{}", std::process::id());
            let mut versions = Vec::new();
            while !stop_flag.load(Ordering::SeqCst) {
                let n = count.load(Ordering::SeqCst);
                let id = format!("{prefix}-{n}");
                fs::write(bundle.join("config.json"), &spec).unwrap();
                fs::write(bundle.join("rootfs/etc/ld.so.cache"), &cache).unwrap();
                starts.fetch_add(1, Ordering::SeqCst);
                // runc hands its stdio to the container's init, which outlives `create`:
                // a file, not a pipe, or waiting for the pipe's end would hang.
                let status = Command::new(&runtime)
                    .env_clear()
                    .envs(env.iter().map(|(k, v)| (k, v)))
                    .arg("--root")
                    .arg(&root)
                    .args(["create", "--bundle"])
                    .arg(&bundle)
                    .arg(&id)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(File::create(&errors).unwrap())
                    .status()
                    .unwrap();
                let injected = fs::read_to_string(bundle.join("config.json")).unwrap();
                let deleted = Command::new("runc")
                    .arg("--root")
                    .arg(&root)
                    .args(["delete", "--force", &id])
                    .output()
                    .unwrap();
                if !status.success() {
                    let err = fs::read_to_string(&errors).unwrap_or_default();
                    return Err(format!("create #{n} ({status}): {err}"));
                }
                if !injected.contains("\"/dev/nvidia0\"") {
                    return Err(format!(
                        "create #{n}: /dev/nvidia0 not injected:\n{injected}"
                    ));
                }
                if !deleted.status.success() {
                    return Err(format!("delete #{n}: {}", text(&deleted)));
                }
                let version = hook_version(&injected, &versions_dir).ok_or_else(|| {
                    format!("create #{n}: no hook under {versions_dir:?}: {injected}")
                })?;
                versions.push(version);
                count.fetch_add(1, Ordering::SeqCst);
            }
            Ok(versions)
        });
        CreateLoop {
            stop,
            creates,
            started,
            thread,
        }
    }

    fn creates(&self) -> usize {
        self.creates.load(Ordering::SeqCst)
    }

    fn started(&self) -> usize {
        self.started.load(Ordering::SeqCst)
    }

    /// Waits until `n` creates have succeeded in all; fails with the loop's error if it ended.
    fn wait_for(&self, n: usize, what: &str) {
        wait_until(what, || {
            assert!(
                !self.thread.is_finished(),
                "{what}: the create loop ended early"
            );
            self.creates() >= n
        });
    }

    /// Stops the loop; the version each create ran, in order.
    fn finish(self) -> Vec<String> {
        self.stop.store(true, Ordering::SeqCst);
        match self.thread.join().unwrap() {
            Ok(versions) => versions,
            Err(e) => panic!("a container create failed: {e}"),
        }
    }
}

/// The `<version>` of the first hook in `spec` whose path is under `versions_dir`.
fn hook_version(spec: &str, versions_dir: &Path) -> Option<String> {
    let spec: serde_json::Value = serde_json::from_str(spec).ok()?;
    let hooks = spec["hooks"].as_object()?;
    hooks
        .values()
        .filter_map(|stage| stage.as_array())
        .flatten()
        .filter_map(|hook| hook["path"].as_str())
        .find_map(|path| {
            let rel = Path::new(path).strip_prefix(versions_dir).ok()?;
            Some(
                rel.components()
                    .next()?
                    .as_os_str()
                    .to_string_lossy()
                    .into_owned(),
            )
        })
}

/// The version `<toolkit>/current` names.
fn current_version(toolkit: &Path) -> String {
    let target = fs::read_link(toolkit.join("current")).unwrap();
    target.file_name().unwrap().to_string_lossy().into_owned()
}

/// Whether every stable name in the toolkit holds the bytes of the build in `source`.
fn toolkit_runs(toolkit: &Path, source: &Path) -> bool {
    let read = |p: PathBuf| fs::read(p).ok();
    let nvshim = read(source.join("nvshim"));
    let same = |name: &str, from: &str| read(toolkit.join(name)) == read(source.join(from));
    nvshim.is_some()
        && same("nvidia-container-runtime", "nvidia-container-runtime")
        && same(
            "nvidia-container-runtime-hook",
            "nvidia-container-runtime-hook",
        )
        && ["nvshim", "nvidia-ctk", "nvidia-cdi-hook"]
            .iter()
            .all(|name| same(name, "nvshim"))
}

#[test]
fn containerd_runs_gpu_containers_through_the_toolkit_and_an_upgrade_swaps_it_atomically() {
    let host = Host::new();
    let tmp = host.tmp();
    let config = host.root().join("etc/containerd/config.toml");
    fs::create_dir_all(config.parent().unwrap()).unwrap();
    // containerd makes the dirs its config names (CNI, `opt`): in its own dir, not the host's.
    fs::write(&config, containerd_config(&tmp.join("ctd"))).unwrap();
    let before = tree(&host.root());
    let build_a = source_dir(&tmp.join("build-a"), b"");
    let mut flags = host.flags("containerd", &config, &build_a);
    flags.extend(["--restart-mode", "none"].map(str::to_owned));

    // Install, look, uninstall.
    run_ok(
        nvshim(&["install", "--no-daemon"]).args(&flags),
        "install --no-daemon",
    );
    assert!(host.ready_file().exists(), "no ready file after install");
    let runtime = host.installed_runtime();
    assert!(
        toolkit_runs(&host.toolkit(), &build_a),
        "the toolkit holds build A"
    );
    let (shim, binary) = dumped_nvidia_runtime(&config);
    assert_eq!(shim, "io.containerd.runc.v2");
    assert_eq!(binary, s(&runtime), "BinaryName in the merged config");
    let env = host.engine_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let containerd = Containerd::start_with_config(&tmp.join("ctd"), &config, &env).unwrap();
    // The running daemon's CRI plugin, which is what kubelet's RuntimeClass reaches, has it too.
    let log = fs::read_to_string(containerd.log()).unwrap();
    let cri = log
        .lines()
        .find(|l| l.contains("Start cri plugin with config"))
        .unwrap_or_else(|| panic!("the CRI plugin did not start:\n{log}"));
    assert!(
        cri.contains("nvidia:{Type:io.containerd.runc.v2")
            && cri.contains(&format!("BinaryName:{binary}")),
        "the CRI plugin's runtimes: {cri}"
    );
    ctr_run_gpus_0_and_2(&host, &containerd, &shim, &binary, 1);
    let toolkit = host.toolkit();
    let uninstall = ["--host-root", "/", "--toolkit-dir", s(&toolkit)];
    run_ok(nvshim(&["uninstall"]).args(uninstall), "uninstall");
    let changes = tree_changes(&before, &tree(&host.root()));
    assert!(changes.is_empty(), "uninstall left changes:\n{changes}");

    // The daemon, and an upgrade under a loop of creates.
    let mut daemon_a = Daemon::spawn(&flags, tmp.join("install-a.log"));
    wait_until("install A's ready file", || {
        daemon_a.assert_running("install A");
        host.ready_file().exists()
    });
    let creates = CreateLoop::start(&host, host.installed_runtime());
    let version_a = current_version(&host.toolkit());
    creates.wait_for(2, "creates through build A");
    // B writes the ready file once it has taken over: removed here, it says when B is done.
    fs::remove_file(host.ready_file()).unwrap();
    let build_b = source_dir(&tmp.join("build-b"), b"\0nvshim test build B\0");
    let before_b = creates.creates();
    let mut flags_b = flags.clone();
    let at = flags_b.iter().position(|f| f == "--source-dir").unwrap();
    flags_b[at + 1] = s(&build_b).to_owned();
    let mut daemon_b = Daemon::spawn(&flags_b, tmp.join("install-b.log"));
    wait_until("install B's ready file and binaries", || {
        daemon_b.assert_running("install B");
        host.ready_file().exists() && toolkit_runs(&host.toolkit(), &build_b)
    });
    // Creates that overlapped B's install: started before it was done, not finished before
    // it began.
    let during_b = creates.started() - before_b;
    let version_b = current_version(&host.toolkit());
    assert_ne!(version_a, version_b, "B is a version of its own");
    // Creates started from here on run B: two of them.
    creates.wait_for(creates.started() + 2, "creates through build B");
    // Every create succeeded (finish panics otherwise), each ran A or B whole, and the loop
    // ran across the switch: A's creates, then B's, never back.
    let versions = creates.finish();
    let switch = versions
        .iter()
        .position(|v| *v != version_a)
        .unwrap_or(versions.len());
    let (on_a, on_b) = versions.split_at(switch);
    let summary = format!(
        "{} creates, {before_b} before B started, {during_b} overlapping its install: {versions:?} \
         (A {version_a}, B {version_b})",
        versions.len()
    );
    assert!(on_a.len() >= 2 && on_b.len() >= 2, "{summary}");
    assert!(on_b.iter().all(|v| *v == version_b), "{summary}");
    assert!(during_b >= 1, "no create overlapped B's install; {summary}");
    ctr_run_gpus_0_and_2(&host, &containerd, &shim, &binary, 2);

    // SIGTERM to A, no longer the owner, changes nothing; B's undoes everything.
    let installed = tree(&host.root());
    daemon_a.terminate("SIGTERM to install A");
    let changes = tree_changes(&installed, &tree(&host.root()));
    assert!(
        changes.is_empty(),
        "SIGTERM to A (replaced by B) changed:\n{changes}"
    );
    daemon_b.terminate("SIGTERM to install B");
    let changes = tree_changes(&before, &tree(&host.root()));
    assert!(changes.is_empty(), "SIGTERM to B left changes:\n{changes}");
    drop(containerd);
}

/// `--host-root H` with the defaults: files land under H, while the paths written in them are
/// the host's (`/usr/local/nvidia/toolkit/...`, `/etc/containerd/...`), never H's. containerd,
/// whose drop-in and `imports` carry host paths of their own; docker's daemon.json gets only
/// the runtime's path, which the same code writes.
///
/// The install runs as the toolkit image runs it: by NVIDIA's name, from the dir that holds
/// the binaries (the default source), the engine and restart mode from NVIDIA's variables.
#[test]
fn host_root_gets_the_files_and_host_paths_inside_them() {
    let dir = tempfile::tempdir().unwrap();
    let tmp = dir.path().canonicalize().unwrap();
    let source = source_dir(&tmp.join("build"), b"");
    let root = tmp.join("host");
    let config = root.join("etc/containerd/config.toml");
    fs::create_dir_all(config.parent().unwrap()).unwrap();
    fs::write(&config, containerd_config(Path::new(""))).unwrap();
    let before = tree(&root);
    let installer = source.join("nvidia-ctk-installer");
    std::os::unix::fs::symlink("nvshim", &installer).unwrap();
    let out = Command::new(&installer)
        .env_clear()
        .envs([
            ("PATH", PATH),
            ("RUNTIME", "containerd"),
            ("RESTART_MODE", "none"),
        ])
        .args(["--no-daemon", "--host-root", s(&root)])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "nvidia-ctk-installer: {}", text(&out));
    fs::remove_file(&installer).unwrap();
    let toolkit = root.join(HOST_TOOLKIT_DIR.trim_start_matches('/'));
    assert!(
        toolkit_runs(&toolkit, &source),
        "binaries under the host root"
    );
    assert!(
        root.join(HOST_READY_FILE).exists(),
        "ready file under the host root"
    );
    let installed = tree(&root);
    // The files that hold `needle`.
    let mentions = |needle: &str| -> Vec<String> {
        installed
            .iter()
            .filter(|(_, e)| match e {
                // The binaries are the build's copies (checked above); the text files are
                // what the installer wrote. (A byte search of 90 MB of debug binaries would
                // cost seconds in a debug test.)
                Entry::File { bytes, .. } if !bytes.starts_with(b"\x7fELF") => {
                    String::from_utf8_lossy(bytes).contains(needle)
                }
                Entry::File { .. } | Entry::Dir { .. } => false,
                Entry::Link { target } => target.to_string_lossy().contains(needle),
            })
            .map(|(p, _)| p.display().to_string())
            .collect()
    };
    // Nothing written may name the host root: not what the host's software reads (engine
    // configs, config.toml, the ready file), nor the installer's record, which an uninstall
    // run with another view of the host (another --host-root) reads.
    assert_eq!(
        mentions(s(&root)),
        Vec::<String>::new(),
        "files naming the host root"
    );
    let runtime = format!("\"{HOST_TOOLKIT_DIR}/nvidia-container-runtime\"");
    let engine_files: Vec<String> = mentions(&runtime)
        .into_iter()
        .filter(|f| f.starts_with("etc/"))
        .collect();
    assert_eq!(
        engine_files,
        ["etc/containerd/conf.d/99-nvidia.toml"],
        "the engine's files naming {runtime}"
    );
    let imports = mentions("imports = [\"/etc/containerd/conf.d/*.toml\"]");
    assert_eq!(
        imports,
        ["etc/containerd/config.toml"],
        "the import of the drop-in"
    );
    let hook = format!("{HOST_TOOLKIT_DIR}/nvidia-container-runtime-hook");
    let config_toml = format!(
        "{}/{TOOLKIT_CONFIG}",
        HOST_TOOLKIT_DIR.trim_start_matches('/')
    );
    assert!(
        mentions(&hook).contains(&config_toml),
        "the toolkit's config.toml names {hook}"
    );
    let args = ["--host-root", s(&root), "--restart-mode", "none"];
    run_ok(nvshim(&["uninstall"]).args(args), "uninstall --host-root");
    let changes = tree_changes(&before, &tree(&root));
    assert!(changes.is_empty(), "uninstall left changes:\n{changes}");
}

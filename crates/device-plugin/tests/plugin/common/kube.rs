// SPDX-License-Identifier: Apache-2.0
//! A real kubelet (v1.20.2, built by `scripts/build-kubelet.sh`) in standalone mode on a
//! real containerd with the CRI plugin, for the device plugin's end-to-end test
//! (`tests/plugin/kubelet.rs`). Nothing here touches the host's kubelet state or daemons:
//!
//! - kubelet's device-plugin directory is hard-coded (`/var/lib/kubelet/device-plugins`)
//!   and it writes pod logs to `/var/log/pods`, so kubelet and containerd run in a private
//!   mount namespace ([`MountNs`]) where those paths are the test's own directories.
//!   containerd must share that namespace: kubelet hands it paths (`etc-hosts`, logs) that
//!   only the namespace shows. The test itself stays outside and reaches the same
//!   directories through their real paths;
//! - containerd serves its own socket, root and state (testkit's [`Containerd`]), with the
//!   CRI plugin on, our `nvidia-container-runtime` as runc's `BinaryName`, a sandbox image
//!   the test builds and imports (no network), and no CNI: pods use the host network;
//! - kubelet has no API server: pods are static pods from `--pod-manifest-path`, and their
//!   status comes from the read-only port's `/pods`;
//! - kubelet rewrites a few kernel sysctls at start (`vm.overcommit_memory`, `kernel.panic`,
//!   …); [`KubeNode`] saves them first and puts them back when it drops.
//!
//! Missing tools or kubelet binaries are a panic that names them: never a skip.

#![allow(dead_code, clippy::expect_used, clippy::unwrap_used)]

use std::ffi::OsString;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use nvshim_testkit::Containerd;
use serde_json::Value;

/// Where the test looks for `kubelet` and `kubelet-authority`.
pub const KUBELET_DIR_ENV: &str = "NVSHIM_KUBELET_DIR";
/// The CI cache `scripts/build-kubelet.sh` builds into (`.ci/run`).
pub const DEFAULT_KUBELET_DIR: &str = "/var/cache/nvshim-ci/kubelet/bin";
/// The sandbox ("pause") image containerd's CRI plugin is told to use.
pub const PAUSE_IMAGE: &str = "nvshim.test/pause:1";
/// containerd's namespace for CRI.
const CRI_NAMESPACE: &str = "k8s.io";
/// The node name kubelet uses; static pods are named `<name>-<node>`.
pub const NODE_NAME: &str = "nvshim-kubelet-test";
/// How often the waits look again.
const POLL: Duration = Duration::from_millis(200);

/// A sleep forever that also stops on SIGTERM (as PID 1 of the sandbox it gets no default
/// handlers), so sandboxes stop at once.
const PAUSE_C: &str = "#include <signal.h>\n#include <unistd.h>\n\
    static void bye(int s) { (void)s; _exit(0); }\n\
    int main(void) { signal(SIGINT, bye); signal(SIGTERM, bye); for (;;) pause(); }\n";

/// Sysctls kubelet 1.20 sets at start (`setupKernelTunables`), restored afterwards.
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The directory holding the kubelet binaries; panics naming what is missing.
pub fn kubelet_dir() -> PathBuf {
    let dir = std::env::var_os(KUBELET_DIR_ENV).map_or(DEFAULT_KUBELET_DIR.into(), PathBuf::from);
    let missing: Vec<String> = ["kubelet", "kubelet-authority"]
        .iter()
        .map(|b| dir.join(b))
        .filter(|p| !p.is_file())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        missing.is_empty(),
        "missing prerequisite: {} (build them with `scripts/build-kubelet.sh {}`, or set \
         {KUBELET_DIR_ENV} to a directory holding kubelet and kubelet-authority)",
        missing.join(", "),
        dir.parent().unwrap_or(&dir).display()
    );
    dir
}

/// Panics naming every tool of `tools` not on `PATH`.
pub fn require_tools(tools: &[&str]) {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let missing: Vec<&str> = tools
        .iter()
        .copied()
        .filter(|t| !std::env::split_paths(&path).any(|d| d.join(t).is_file()))
        .collect();
    assert!(
        missing.is_empty(),
        "missing prerequisite(s) on PATH: {}",
        missing.join(", ")
    );
}

/// A process holding a private mount namespace in which `/var/lib/kubelet` is
/// `<dir>/kubelet` and `/var/log/pods` is `<dir>/pods`. Killed on drop, which frees the
/// namespace and every mount in it once the processes started inside are gone too.
pub struct MountNs {
    child: Child,
}

impl MountNs {
    pub fn start(dir: &Path) -> MountNs {
        for sub in ["kubelet", "pods", "upper", "work"] {
            fs::create_dir_all(dir.join(sub)).unwrap();
        }
        // /var/lib and /var/log get an overlay and a tmpfs so that the mount points can be
        // made without creating anything on the host; the host's /var/lib stays readable.
        let script = r#"set -e
d=$1
mount -t overlay overlay -o "lowerdir=/var/lib,upperdir=$d/upper,workdir=$d/work" /var/lib
mkdir -p /var/lib/kubelet && mount --bind "$d/kubelet" /var/lib/kubelet
mount -t tmpfs tmpfs /var/log
mkdir -p /var/log/pods /var/log/containers && mount --bind "$d/pods" /var/log/pods
echo ready
exec sleep infinity"#;
        let mut child = Command::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(dir)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start unshare");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        if line.trim() != "ready" {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "could not set up the private mount namespace: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        MountNs { child }
    }

    /// `nsenter -t <pid> -m --`: the prefix that starts a program inside.
    pub fn enter(&self) -> Vec<OsString> {
        let pid = self.child.id().to_string();
        ["nsenter", "-t", &pid, "-m", "--"]
            .iter()
            .map(OsString::from)
            .collect()
    }
}

impl Drop for MountNs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One free TCP port on 127.0.0.1 (free when asked; kubelet binds it a moment later).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A simulated node's kubelet side: the namespace, containerd, and at most one kubelet.
/// Fields drop in order: kubelet, containerd, then the namespace.
pub struct KubeNode {
    kubelet: Option<Child>,
    pub containerd: Containerd,
    ns: MountNs,
    dir: PathBuf,
    read_only_port: u16,
    sysctls: Vec<(PathBuf, String)>,
    /// How many kubelets were started, to keep each one's log.
    started: usize,
}

impl KubeNode {
    /// Starts containerd in a new namespace under `dir`, its runc runtime being `runtime`
    /// (given `runtime_env`), and imports the pause image.
    pub fn start(dir: &Path, runtime: &Path, runtime_env: &[(&str, &str)]) -> KubeNode {
        require_tools(&[
            "unshare",
            "nsenter",
            "mount",
            "containerd",
            "ctr",
            "gcc",
            "tar",
            "sha256sum",
        ]);
        fs::create_dir_all(dir).unwrap();
        let dir = dir.canonicalize().unwrap();
        let sysctls = KUBELET_SYSCTLS
            .iter()
            .map(|s| Path::new("/proc/sys").join(s))
            .filter_map(|p| Some((p.clone(), fs::read_to_string(&p).ok()?)))
            .collect();
        let ns = MountNs::start(&dir.join("ns"));
        let ctd = dir.join("ctd");
        fs::create_dir_all(&ctd).unwrap();
        let config = ctd.join("config.toml");
        fs::write(&config, cri_config(&ctd, runtime)).unwrap();
        let containerd = Containerd::start_with_config_via(&ctd, &config, runtime_env, &ns.enter())
            .unwrap_or_else(|e| panic!("containerd with CRI did not start: {e}"));
        fs::create_dir_all(dir.join("manifests")).unwrap();
        let node = KubeNode {
            kubelet: None,
            containerd,
            ns,
            dir,
            read_only_port: free_port(),
            sysctls,
            started: 0,
        };
        node.import_pause();
        node
    }

    /// `<dir>/ns/kubelet`, which kubelet sees as `/var/lib/kubelet`.
    pub fn kubelet_root(&self) -> PathBuf {
        self.dir.join("ns/kubelet")
    }

    /// The device-plugin directory as this process sees it.
    pub fn device_plugins(&self) -> PathBuf {
        self.kubelet_root().join("device-plugins")
    }

    /// When kubelet last wrote its device checkpoint (`kubelet_internal_checkpoint`), if
    /// ever: the mark for [`Self::wait_devices_listed`].
    pub fn devices_checkpoint_mark(&self) -> Option<SystemTime> {
        fs::metadata(self.devices_checkpoint())
            .and_then(|m| m.modified())
            .ok()
    }

    /// Waits until kubelet has taken in a device list for `resource` with at least one
    /// healthy device, written after `mark`. kubelet handles each ListAndWatch response
    /// on its own goroutine and writes its checkpoint (`RegisteredDevices`: the healthy
    /// ids) right after; a pod admitted before that finds "Available: 0". A stream's end
    /// marks the devices unhealthy without writing the checkpoint, so only a new write
    /// counts.
    pub fn wait_devices_listed(&self, resource: &str, mark: Option<SystemTime>, within: Duration) {
        let file = self.devices_checkpoint();
        let deadline = Instant::now() + within;
        loop {
            let modified = self.devices_checkpoint_mark();
            let fresh = modified.is_some() && modified != mark;
            let listed = fs::read(&file)
                .ok()
                .and_then(|bytes| serde_json::from_slice::<Value>(&bytes).ok())
                .and_then(|c| {
                    c["Data"]["RegisteredDevices"][resource]
                        .as_array()
                        .map(Vec::len)
                })
                .unwrap_or(0);
            if fresh && listed > 0 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "kubelet listed no healthy {resource} device within {within:?} \
                 ({}: rewritten {fresh}, healthy ids {listed})",
                file.display()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn devices_checkpoint(&self) -> PathBuf {
        self.device_plugins().join("kubelet_internal_checkpoint")
    }

    /// The log of the kubelet started last.
    pub fn kubelet_log(&self) -> String {
        fs::read_to_string(self.dir.join(format!("kubelet-{}.log", self.started)))
            .unwrap_or_default()
    }

    fn import_pause(&self) {
        let src = self.dir.join("pause.c");
        fs::write(&src, PAUSE_C).unwrap();
        let root = self.dir.join("pause-rootfs");
        fs::create_dir_all(&root).unwrap();
        run(Command::new("gcc")
            .args(["-static", "-O2", "-o"])
            .arg(root.join("pause"))
            .arg(&src));
        self.import_image(PAUSE_IMAGE, &root, &["/pause"]);
    }

    /// Packs `rootfs` as a one-layer image `name` with `entrypoint` (docker-archive
    /// format, which `ctr images import` reads) and imports it for CRI.
    pub fn import_image(&self, name: &str, rootfs: &Path, entrypoint: &[&str]) {
        let work = tempfile::tempdir_in(&self.dir).unwrap();
        let layer = work.path().join("layer.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(rootfs)
            .args(["--numeric-owner", "-cf"])
            .arg(&layer)
            .arg("."));
        let sum = run(Command::new("sha256sum").arg(&layer));
        let digest = sum.split_whitespace().next().unwrap();
        let config = serde_json::json!({
            "architecture": "amd64",
            "os": "linux",
            "config": { "Entrypoint": entrypoint },
            "rootfs": { "type": "layers", "diff_ids": [format!("sha256:{digest}")] },
        });
        fs::write(work.path().join("config.json"), config.to_string()).unwrap();
        let manifest = serde_json::json!([
            { "Config": "config.json", "RepoTags": [name], "Layers": ["layer.tar"] }
        ]);
        fs::write(work.path().join("manifest.json"), manifest.to_string()).unwrap();
        let archive = work.path().join("image.tar");
        run(Command::new("tar")
            .arg("-C")
            .arg(work.path())
            .arg("-cf")
            .arg(&archive)
            .args(["manifest.json", "config.json", "layer.tar"]));
        run(self
            .containerd
            .ctr()
            .args(["-n", CRI_NAMESPACE, "images", "import"])
            .arg(&archive));
    }

    /// Starts `kubelet` (a path) inside the namespace and waits until its read-only port
    /// answers. Panics if one is running already.
    pub fn start_kubelet(&mut self, kubelet: &Path) {
        assert!(self.kubelet.is_none(), "a kubelet is running already");
        self.started += 1;
        let log = self.dir.join(format!("kubelet-{}.log", self.started));
        let file = fs::File::create(&log).unwrap();
        let endpoint = format!("unix://{}", self.containerd.address().display());
        let mut cmd = Command::new("nsenter");
        cmd.args(&self.ns.enter()[1..]).arg(kubelet);
        cmd.arg(format!(
            "--pod-manifest-path={}",
            self.dir.join("manifests").display()
        ))
        .args(["--container-runtime=remote", "--cgroup-driver=cgroupfs"])
        .arg(format!("--container-runtime-endpoint={endpoint}"))
        .arg(format!("--hostname-override={NODE_NAME}"))
        .arg("--address=127.0.0.1")
        .arg(format!("--read-only-port={}", self.read_only_port))
        .arg(format!("--port={}", free_port()))
        .args([
            // No API server, no swap check, no QoS cgroup tree of its own: the pods' cgroups
            // are containerd's; kubelet's own setup of the node would need more than a test.
            "--fail-swap-on=false",
            "--healthz-port=0",
            "--cgroups-per-qos=false",
            "--enforce-node-allocatable=",
            // Leave the host's iptables, its disk (image GC, eviction) and /usr/libexec alone.
            "--make-iptables-util-chains=false",
            "--image-gc-high-threshold=100",
            "--image-gc-low-threshold=99",
            "--eviction-hard=",
            "--volume-plugin-dir=/var/lib/kubelet/volume-plugins",
            "--file-check-frequency=1s",
            "--v=2",
        ])
        .stdin(Stdio::null())
        .stdout(file.try_clone().unwrap())
        .stderr(file);
        self.kubelet = Some(cmd.spawn().expect("start kubelet"));
        let deadline = Instant::now() + Duration::from_secs(60);
        while self.try_pods().is_none() {
            let exited = self.kubelet.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "kubelet {} did not answer on its read-only port ({exited:?}); log:\n{}",
                kubelet.display(),
                tail(&self.kubelet_log(), 40)
            );
            std::thread::sleep(POLL);
        }
    }

    /// Kills kubelet (as a crash or a node restart would) and waits for it.
    pub fn stop_kubelet(&mut self) {
        if let Some(mut child) = self.kubelet.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Writes a static pod manifest (JSON is YAML) named `<name>.json`.
    pub fn add_pod(&self, name: &str, pod: &Value) {
        let path = self.dir.join("manifests").join(format!("{name}.json"));
        fs::write(path, format!("{pod:#}\n")).unwrap();
    }

    /// Removes the static pod `name`; kubelet kills it.
    pub fn remove_pod(&self, name: &str) {
        let _ = fs::remove_file(self.dir.join("manifests").join(format!("{name}.json")));
    }

    /// Removes every manifest.
    pub fn remove_all_pods(&self) {
        for entry in fs::read_dir(self.dir.join("manifests")).unwrap().flatten() {
            let _ = fs::remove_file(entry.path());
        }
    }

    /// `/pods` from the read-only port, if kubelet answers.
    fn try_pods(&self) -> Option<Vec<Value>> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.read_only_port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        stream
            .write_all(b"GET /pods HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .ok()?;
        let mut text = String::new();
        stream.read_to_string(&mut text).ok()?;
        let (_, body) = text.split_once("\r\n\r\n")?;
        let list: Value = serde_json::from_str(body).ok()?;
        Some(list["items"].as_array().cloned().unwrap_or_default())
    }

    /// The status of static pod `name`, if kubelet knows it.
    pub fn pod_status(&self, name: &str) -> Option<Value> {
        let full = format!("{name}-{NODE_NAME}");
        self.try_pods()?
            .into_iter()
            .find(|p| p["metadata"]["name"] == full.as_str())
            .map(|p| p["status"].clone())
    }

    /// Waits at most `within` until `done` holds for pod `name`'s status; returns the last
    /// status seen (`Null` if the pod never showed), whether or not `done` held.
    pub fn wait_pod(&self, name: &str, within: Duration, done: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + within;
        loop {
            let status = self.pod_status(name).unwrap_or(Value::Null);
            if done(&status) || Instant::now() >= deadline {
                return status;
            }
            std::thread::sleep(POLL);
        }
    }

    /// What container `container` of static pod `name` printed (its first run), from the
    /// CRI log file with each line's timestamp, stream and tag taken off.
    pub fn container_output(&self, name: &str, container: &str) -> String {
        let prefix = format!("default_{name}-{NODE_NAME}_");
        let Ok(entries) = fs::read_dir(self.dir.join("ns/pods")) else {
            return String::new();
        };
        let Some(pod_dir) = entries
            .flatten()
            .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        else {
            return String::new();
        };
        let text =
            fs::read_to_string(pod_dir.path().join(container).join("0.log")).unwrap_or_default();
        let mut out = String::new();
        for line in text.lines() {
            // `<time> <stream> <P|F> <text>`: P is a partial line, F ends one.
            let mut parts = line.splitn(4, ' ');
            let (_, _, tag) = (parts.next(), parts.next(), parts.next());
            out.push_str(parts.next().unwrap_or(""));
            if tag != Some("P") {
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        self.stop_kubelet();
        for (path, value) in &self.sysctls {
            let _ = fs::write(path, value);
        }
    }
}

/// containerd's config: CRI on, runc's binary `runtime` with its state under `dir` (not
/// `/run/containerd/runc`), device-plugin CDI annotations
/// passed through to the OCI spec, no OOM score below containerd's own (the VM lacks
/// CAP_SYS_RESOURCE), the streaming server on a free port, CNI dirs that stay empty.
fn cri_config(dir: &Path, runtime: &Path) -> String {
    let q = |p: &Path| format!("{:?}", p.to_string_lossy());
    let cri = "plugins.\"io.containerd.grpc.v1.cri\"";
    format!(
        "version = 2\n\
         [plugins.\"io.containerd.internal.v1.opt\"]\n  path = {opt}\n\
         [{cri}]\n  sandbox_image = \"{PAUSE_IMAGE}\"\n  restrict_oom_score_adj = true\n  \
         stream_server_address = \"127.0.0.1\"\n  stream_server_port = \"0\"\n\
         [{cri}.containerd]\n  default_runtime_name = \"runc\"\n\
         [{cri}.containerd.runtimes.runc]\n  runtime_type = \"io.containerd.runc.v2\"\n  \
         container_annotations = [\"cdi.k8s.io/*\"]\n\
         [{cri}.containerd.runtimes.runc.options]\n  BinaryName = {runtime}\n  Root = {runc_root}\n\
         [{cri}.cni]\n  bin_dir = {cni_bin}\n  conf_dir = {cni_conf}\n",
        opt = q(&dir.join("opt")),
        runtime = q(runtime),
        runc_root = q(&dir.join("runc")),
        cni_bin = q(&dir.join("cni/bin")),
        cni_conf = q(&dir.join("cni/conf")),
    )
}

/// Runs `cmd`, panics with its output unless it succeeds; returns stdout.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}): {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The last `n` lines of `text`.
pub fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

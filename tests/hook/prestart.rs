//! `nvidia-container-runtime-hook prestart` through real runc, with the hook in the
//! spec as dockerd writes it for `--gpus` (`path`, `args: [name, "prestart"]`, the
//! daemon's env), on a simulated 8-GPU node with a glibc rootfs. Our runtime is not
//! involved: the hook alone gives the container its GPUs.
//!
//! Device access is measured with a small C program (`openprobe`) that `open()`s each
//! node and prints the errno: the node's major has no driver on this machine, so
//! `ENXIO` means the open got past the device cgroup, `EPERM` that the cgroup refused
//! it, `ENOENT` that the node is not there.
//!
//! On the standard node GPU 6 is `/dev/nvidia7` and GPU 7 is `/dev/nvidia6`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{GPU_SCRIPT, Node, Printed, node};
use nvshim_testkit::{NodeSpec, runc_bundle};
use serde_json::{Value, json};

const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

const PROBE_C: &str = r#"
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        int fd = open(argv[i], O_RDWR);
        const char *r = fd >= 0 ? "OPENED" : errno == ENXIO ? "ENXIO" : errno == EPERM ? "EPERM"
                      : errno == ENOENT ? "ENOENT" : strerror(errno);
        printf("%s %s\n", argv[i], r);
    }
    return 0;
}
"#;

/// Sections 0–2 are [`GPU_SCRIPT`]'s; 3 the probe; 4 the container's libcuda mounts;
/// 5 a write attempt on a mounted library.
const SCRIPT: &str = "; echo ---; openprobe /dev/nvidia1 /dev/nvidiactl /dev/nvidia-uvm /dev/nvidia0; \
     echo ---; grep libcuda.so /proc/self/mountinfo; \
     echo ---; (echo x >> /usr/lib/x86_64-linux-gnu/libcuda.so.1) 2>&1; echo \"write rc=$?\"";

pub(crate) struct E2e {
    pub(crate) node: Node,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) rootfs: PathBuf,
}

/// Builds `openprobe` with the host's gcc.
pub(crate) fn probe(dir: &Path) -> PathBuf {
    let src = dir.join("openprobe.c");
    let bin = dir.join("openprobe");
    fs::write(&src, PROBE_C).unwrap();
    let out = Command::new("gcc")
        .arg("-O1")
        .arg("-o")
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("gcc (needed to build the open() probe)");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

pub(crate) fn setup() -> E2e {
    let node = node(&NodeSpec::standard(8));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim
        .container_rootfs()
        .install(probe(dir.path()), "/usr/bin/openprobe")
        .build(&rootfs)
        .unwrap();
    E2e { node, dir, rootfs }
}

static IDS: AtomicUsize = AtomicUsize::new(0);

pub(crate) struct Run {
    pub(crate) out: Output,
    pub(crate) bundle: PathBuf,
    id: String,
}

impl Run {
    pub(crate) fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.out.stdout).into_owned()
    }
    fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn printed(&self) -> Printed {
        Printed(self.stdout())
    }
    pub(crate) fn ok(&self) -> &Run {
        assert!(
            self.out.status.success(),
            "container failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.out.status,
            self.stdout(),
            self.stderr()
        );
        self
    }
    /// The probe's verdict for each node.
    fn probe(&self) -> Vec<String> {
        self.printed()
            .section(3)
            .lines()
            .map(String::from)
            .collect()
    }
}

impl E2e {
    fn uuid(&self, index: usize) -> &str {
        &self.node.sim.spec.gpus[index].uuid
    }

    fn log(&self) -> PathBuf {
        self.dir.path().join("hook.log")
    }

    /// The hook's config.toml: the node's roots, the hook's log, `extra` lines in
    /// `[nvidia-container-cli]`.
    pub(crate) fn config(&self, extra: &str) -> PathBuf {
        let d = self.node.sim.dir.display();
        let path = self.dir.path().join(format!(
            "config-{}.toml",
            IDS.fetch_add(1, Ordering::Relaxed)
        ));
        fs::write(
            &path,
            format!(
                "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\n\
                 debug = \"{}\"\n{extra}\n[nvidia-container-runtime]\nlog-level = \"debug\"\n\n\
                 [nvshim]\nproc-root = \"{d}\"\n",
                self.log().display()
            ),
        )
        .unwrap();
        path
    }

    /// Runs `GPU_SCRIPT + SCRIPT` in a fresh bundle with `env` through plain runc, the
    /// hook in the spec's prestart hooks; `edit` may change the bundle (its directory
    /// and the spec) further.
    pub(crate) fn run_with(
        &self,
        env: &[&str],
        config: &Path,
        edit: impl FnOnce(&Path, &mut Value),
    ) -> Run {
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let id = format!("nvshim-hook-{}-{n}", std::process::id());
        let bundle = self.dir.path().join(&id);
        let mut all_env = vec![
            "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
            "MOCK_NVML_DEV_ROOT=/dev",
        ];
        all_env.extend_from_slice(env);
        let script = format!("{GPU_SCRIPT}{SCRIPT}");
        runc_bundle(&bundle, &self.rootfs, &["sh", "-c", &script], &all_env).unwrap();
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/etc/mock-nvml.json",
            "type": "bind",
            "source": self.node.sim.mock_config,
            "options": ["ro", "bind"],
        }));
        // As dockerd writes it: the binary found on PATH, the daemon's environment.
        spec["hooks"] = json!({"prestart": [{
            "path": crate::common::hook_bin(),
            "args": ["nvidia-container-runtime-hook", "prestart"],
            "env": [format!("PATH={PATH}"), format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display())],
        }]});
        edit(&bundle, &mut spec);
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        let out = Command::new("runc")
            .env_clear()
            .env("PATH", PATH)
            .arg("--root")
            .arg(self.dir.path().join("runc-root"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .output()
            .unwrap();
        Run { out, bundle, id }
    }

    fn run(&self, env: &[&str]) -> Run {
        self.run_with(env, &self.config(""), |_, _| {})
    }

    fn exists(&self, id: &str) -> bool {
        Command::new("runc")
            .arg("--root")
            .arg(self.dir.path().join("runc-root"))
            .args(["state", id])
            .output()
            .unwrap()
            .status
            .success()
    }
}

fn sorted(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

/// No mount of ours is left in the host's mount namespace.
fn no_host_mounts_under(dir: &Path) {
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let dir = dir.display().to_string();
    let leaked: Vec<&str> = mountinfo.lines().filter(|l| l.contains(&dir)).collect();
    assert!(leaked.is_empty(), "mounts leaked to the host: {leaked:#?}");
}

#[test]
fn one_gpu_by_index_is_all_the_container_sees_and_can_open() {
    let e = setup();
    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=1"]);
    run.ok();
    let printed = run.printed();
    assert_eq!(
        printed.nvidia_nodes(),
        sorted(&["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl", "nvidia1"]),
        "{}",
        run.stdout()
    );
    // Past the device cgroup for what was injected; nothing else exists.
    assert_eq!(
        run.probe(),
        [
            "/dev/nvidia1 ENXIO",
            "/dev/nvidiactl ENXIO",
            "/dev/nvidia-uvm ENXIO",
            "/dev/nvidia0 ENOENT"
        ],
        "{}",
        run.stdout()
    );
    let smi = printed.smi_lines();
    assert_eq!(smi.len(), 1, "{}", run.stdout());
    assert!(smi[0].contains(e.uuid(1)), "{smi:?}");
    let cache = printed.section(2);
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(
            cache.contains(&format!(
                "{lib} (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/{lib}"
            )),
            "{lib} not in the container's cache:\n{cache}"
        );
    }
    assert!(
        cache.contains("libc.so.6"),
        "the image's entries kept: {cache}"
    );
    // Read-only, nosuid, nodev bind mounts of the real file; libcuda.so.1 is a link to it.
    let mounts = printed.section(4);
    let real = format!(
        " /usr/lib/x86_64-linux-gnu/libcuda.so.{} ",
        e.node.sim.library_version()
    );
    let libcuda = mounts
        .lines()
        .find(|l| l.contains(&real))
        .unwrap_or_else(|| panic!("{real} not mounted: {mounts}"));
    let options = libcuda.split(' ').nth(5).unwrap();
    for flag in ["ro", "nosuid", "nodev"] {
        assert!(options.split(',').any(|o| o == flag), "{flag}: {libcuda}");
    }
    assert!(
        !libcuda.contains("shared:"),
        "our mounts are private: {libcuda}"
    );
    assert!(
        printed.section(5).contains("Read-only file system"),
        "{}",
        printed.section(5)
    );
    // Everything happened in the container's namespace.
    no_host_mounts_under(&run.bundle);
    let log = fs::read_to_string(e.log()).unwrap();
    assert!(log.contains("prestart: injected"), "{log}");
    assert!(log.contains("device cgroup rule"), "{log}");
}

#[test]
fn uuids_and_all_pick_the_right_minors() {
    let e = setup();
    let list = format!("NVIDIA_VISIBLE_DEVICES={},{}", e.uuid(0), e.uuid(6));
    let run = e.run(&[&list]);
    run.ok();
    assert_eq!(
        run.printed().gpu_nodes(),
        sorted(&["nvidia0", "nvidia7"]),
        "{}",
        run.stdout()
    );
    assert_eq!(run.printed().smi_lines().len(), 2, "{}", run.stdout());

    let run = e.run(&[
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=all",
    ]);
    run.ok();
    let all: Vec<String> = (0..8).map(|m| format!("nvidia{m}")).collect();
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    assert_eq!(run.printed().gpu_nodes(), sorted(&all), "{}", run.stdout());
    assert_eq!(run.printed().smi_lines().len(), 8, "{}", run.stdout());
}

#[test]
fn no_cgroups_leaves_the_device_cgroup_alone() {
    let e = setup();
    let config = e.config("no-cgroups = true");
    let run = e.run_with(&["NVIDIA_VISIBLE_DEVICES=1"], &config, |_, _| {});
    run.ok();
    // The node is there, but runc's device rules still refuse it.
    assert_eq!(run.probe()[0], "/dev/nvidia1 EPERM", "{}", run.stdout());
}

#[test]
fn void_unset_and_already_injected_do_nothing() {
    let e = setup();
    for env in [&["NVIDIA_VISIBLE_DEVICES=void"][..], &[][..]] {
        let run = e.run(env);
        run.ok();
        assert!(
            run.printed().nvidia_nodes().is_empty(),
            "{env:?}: {}",
            run.stdout()
        );
        assert!(!run.printed().section(2).contains("libcuda"), "{env:?}");
    }
    // A spec our runtime edited: the hook leaves it alone.
    let config = e.config("");
    let run = e.run_with(&["NVIDIA_VISIBLE_DEVICES=1"], &config, |_, spec| {
        spec["annotations"] = json!({"nvshim.io/injected": "1"});
    });
    run.ok();
    assert!(run.printed().nvidia_nodes().is_empty(), "{}", run.stdout());
}

#[test]
fn poststart_and_poststop_stages_are_accepted() {
    let e = setup();
    let config = e.config("");
    let run = e.run_with(&["NVIDIA_VISIBLE_DEVICES=1"], &config, |_, spec| {
        let hook = spec["hooks"]["prestart"][0].clone();
        for stage in ["poststart", "poststop"] {
            let mut h = hook.clone();
            h["args"] = json!(["nvidia-container-runtime-hook", stage]);
            spec["hooks"][stage] = json!([h]);
        }
    });
    run.ok();
    assert_eq!(run.printed().gpu_nodes(), ["nvidia1"], "{}", run.stdout());
}

#[test]
fn an_unknown_gpu_fails_the_create_and_names_it() {
    let e = setup();
    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=0,9"]);
    assert!(!run.out.status.success(), "{}", run.stdout());
    let err = run.stderr();
    assert!(
        err.contains("nvidia-container-runtime-hook: unknown GPU") && err.contains("9"),
        "{err}"
    );
    assert!(!e.exists(&run.id), "the container must not exist");
}

#[test]
fn a_failed_mount_undoes_what_the_hook_did() {
    let e = setup();
    let config = e.config("");
    // libnvidia-ml.so.<V> is a directory in this image. Mounts go by depth, then path,
    // so nvidia-smi's and libcuda's come first: the hook must take those back.
    let lib = "rootfs/usr/lib/x86_64-linux-gnu";
    let version = e.node.sim.library_version().to_string();
    let nvml = format!("libnvidia-ml.so.{version}");
    let run = e.run_with(&["NVIDIA_VISIBLE_DEVICES=1"], &config, |bundle, _| {
        fs::create_dir(bundle.join(lib).join(&nvml)).unwrap();
    });
    assert!(!run.out.status.success(), "{}", run.stdout());
    let err = run.stderr();
    assert!(
        err.contains(&format!("/usr/lib/x86_64-linux-gnu/{nvml}")) && err.contains("directory"),
        "{err}"
    );
    assert!(!e.exists(&run.id), "the container must not exist");
    for made in [
        format!("{lib}/libcuda.so.1"),
        format!("{lib}/libcuda.so.{version}"),
        "rootfs/usr/bin/nvidia-smi".to_string(),
    ] {
        assert!(
            fs::symlink_metadata(run.bundle.join(&made)).is_err(),
            "{made} was created and not removed"
        );
    }
    no_host_mounts_under(&run.bundle);
}

/// runc with a user namespace (container root is host uid 200000): its `/dev` tmpfs
/// belongs to that namespace, so the hook bind-mounts the host nodes onto mountpoints
/// created as the container's root.
#[test]
fn a_user_namespace_gets_the_host_nodes_bind_mounted() {
    let e = setup();
    let config = e.config("");
    let run = e.run_with(&["NVIDIA_VISIBLE_DEVICES=1"], &config, |bundle, spec| {
        // The mapped root cannot create runc's own mountpoint in a root-owned rootfs.
        fs::write(bundle.join("rootfs/etc/mock-nvml.json"), "").unwrap();
        spec["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(json!({"type": "user"}));
        let map = json!([{"containerID": 0, "hostID": 200000, "size": 65536}]);
        spec["linux"]["uidMappings"] = map.clone();
        spec["linux"]["gidMappings"] = map;
    });
    run.ok();
    assert_eq!(run.printed().gpu_nodes(), ["nvidia1"], "{}", run.stdout());
    // A node made with mknod on the namespace's /dev tmpfs would fail with EACCES
    // (nodev): ENXIO means the host node is there, bind-mounted, and the cgroup lets it.
    assert_eq!(run.probe()[0], "/dev/nvidia1 ENXIO", "{}", run.stdout());
    assert_eq!(run.printed().smi_lines().len(), 1, "{}", run.stdout());
}

/// The hook run by hand with a state whose pid is not a container being created (here
/// the test itself, in the host's mount namespace): refused before anything is done.
#[test]
fn a_pid_in_the_hooks_own_namespace_is_refused() {
    let e = setup();
    let config = e.config("");
    let bundle = e.dir.path().join("by-hand");
    runc_bundle(&bundle, &e.rootfs, &["true"], &["NVIDIA_VISIBLE_DEVICES=1"]).unwrap();
    let state = json!({"ociVersion": "1.0.2", "id": "x", "status": "creating",
                       "pid": std::process::id(), "bundle": bundle});
    let mut child = Command::new(crate::common::hook_bin())
        .arg("prestart")
        .env_clear()
        .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), state.to_string().as_bytes()).unwrap();
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("shares this hook's mount namespace"), "{err}");
    assert!(out.stdout.is_empty(), "the hook never writes to stdout");
    assert!(!bundle.join("rootfs/usr/bin/nvidia-smi").exists());
    no_host_mounts_under(&bundle);
}

/// The hook binary never loads NVML itself (installed, it is static): a request that
/// needs it (here `NVIDIA_REQUIRE_CUDA`) is handed to `nvshim runtime-hook` beside it
/// by `exec`, with the OCI state given again on stdin. Met and unmet constraints.
#[test]
fn requirements_are_checked_through_nvshim_with_nvml() {
    let e = setup();
    let config = e.config("");
    let mock_env = |_: &Path, spec: &mut Value| {
        let env = spec["hooks"]["prestart"][0]["env"].as_array_mut().unwrap();
        env.push(json!(format!(
            "MOCK_NVML_CONFIG={}",
            e.node.sim.mock_config.display()
        )));
        env.push(json!(format!(
            "MOCK_NVML_DEV_ROOT={}",
            e.node.sim.dev_root.display()
        )));
    };
    let run = e.run_with(
        &["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=1.0"],
        &config,
        mock_env,
    );
    run.ok();
    assert_eq!(run.printed().gpu_nodes(), ["nvidia1"], "{}", run.stdout());
    let log = fs::read_to_string(e.log()).unwrap();
    assert!(log.contains("handing the request to nvshim"), "{log}");

    let run = e.run_with(
        &["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_REQUIRE_CUDA=cuda>=99.0"],
        &config,
        mock_env,
    );
    assert!(!run.out.status.success(), "{}", run.stdout());
    assert!(run.stderr().contains("cuda>=99.0"), "{}", run.stderr());
    assert!(!e.exists(&run.id), "the container must not exist");
}

/// CUDA forward compatibility through the prestart hook: an image's compat `libcuda`
/// newer than the node's driver goes first in the container's linker cache, unless
/// `[features] disable-cuda-compat-lib-hook` turns it off.
#[test]
fn a_newer_cuda_compat_libcuda_goes_first_unless_opted_out() {
    let e = setup();
    let compat = e.rootfs.join("usr/local/cuda/compat");
    fs::create_dir_all(&compat).unwrap();
    fs::write(compat.join("libcuda.so.999.1.1"), b"").unwrap();
    std::os::unix::fs::symlink("libcuda.so.999.1.1", compat.join("libcuda.so.1")).unwrap();
    let libcuda = |run: &Run| -> Vec<String> {
        run.printed()
            .section(2)
            .lines()
            .filter(|l| l.trim_start().starts_with("libcuda.so.1 "))
            .filter_map(|l| l.split("=> ").nth(1))
            .map(str::to_owned)
            .collect()
    };
    const COMPAT: &str = "/usr/local/cuda/compat/libcuda.so.1";

    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=0"]);
    run.ok();
    let found = libcuda(&run);
    assert_eq!(found.len(), 2, "{}", run.stdout());
    assert_eq!(found[0], COMPAT, "{}", run.stdout());

    let config = e.config("\n[features]\ndisable-cuda-compat-lib-hook = true\n");
    let run = e.run_with(&["NVIDIA_VISIBLE_DEVICES=0"], &config, |_, _| {});
    run.ok();
    assert_eq!(libcuda(&run).len(), 1, "opted out: {}", run.stdout());
    assert_ne!(libcuda(&run)[0], COMPAT);
}

//! podman 4.3 as a consumer of the spec `nvshim cdi generate` writes: `podman run
//! --device nvidia.com/gpu=<name>` on a simulated 4-GPU node must give the container
//! the named GPUs and no others, the driver's files, and (through the spec's
//! `createContainer` hook, `nvshim hook link-driver`) the driver's symlinks and
//! linker cache entries.
//!
//! NVIDIA's names run the same way: a spec from `nvidia-ctk cdi generate` and one
//! shaped exactly as NVIDIA's tool writes it (`tests/fixtures/cdi`), both running
//! `nvidia-cdi-hook create-symlinks`, `update-ldcache --folder` and
//! `disable-device-node-modification` (a link named `nvidia-cdi-hook` to `nvshim`).
//!
//! podman 4.3 reads specs only from /etc/cdi and /var/run/cdi, so the test writes
//! one there for the length of a run. It must never clobber or shadow a real node's
//! spec: it refuses to run while either directory holds an `nvidia.com/gpu` spec
//! that is not ours, serialises with other test binaries through an exclusive
//! `flock` on [`LOCK`], and removes its spec in a `Drop` guard, even on panic.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs::{self, File, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::Output;

use crate::common::podman::{podman, require_podman, run_args, storage_with_image};
use crate::common::{GPU_SCRIPT, Node, Printed, node, nvshim};
use nix::fcntl::{Flock, FlockArg};
use nvshim_testkit::NodeSpec;
use serde_json::Value;

const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
/// Held (exclusive `flock`) by every test that writes a spec into the system's CDI
/// directories.
const LOCK: &str = "/run/lock/nvshim-cdi-test.lock";
/// Where podman 4.3 looks for specs (it has no flag for another directory).
const SPEC_DIRS: [&str; 2] = ["/etc/cdi", "/var/run/cdi"];
const SPEC_DIR: &str = "/etc/cdi";
/// Our spec files are `nvshim-test-<pid>.<json|yaml>`.
const OURS: &str = "nvshim-test-";
const KIND: &str = "nvidia.com/gpu";
const IMAGE: &str = "localhost/nvshim-cdi-e2e:glibc";
/// [`GPU_SCRIPT`], then section 3: where the hook's soname link points; section 4:
/// the variable the spec sets so no runtime injects GPUs a second time.
const SCRIPT_TAIL: &str = "; echo ---; readlink /usr/lib/x86_64-linux-gnu/libcuda.so.1; \
                           echo ---; echo \"NVIDIA_VISIBLE_DEVICES=$NVIDIA_VISIBLE_DEVICES\"";

/// `nvidia.com/gpu` specs in `dirs` that are not ours: `(path, why)`.
fn foreign_specs(dirs: &[&Path]) -> Vec<(PathBuf, String)> {
    let mut found = Vec::new();
    for dir in dirs {
        let Ok(entries) = fs::read_dir(dir) else {
            continue;
        };
        for path in entries.map(|e| e.unwrap().path()) {
            let ext = path.extension().and_then(|e| e.to_str()).unwrap_or("");
            if !matches!(ext, "json" | "yaml" | "yml") || our_stale_spec(&path) {
                continue;
            }
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            let parsed: Option<Value> = if ext == "json" {
                serde_json::from_str(&text).ok()
            } else {
                serde_saphyr::from_str(&text).ok()
            };
            match parsed {
                Some(spec) if spec["kind"] == KIND => {
                    found.push((path, format!("its kind is {KIND}")));
                }
                // Unreadable to us but maybe not to a CDI library: assume the worst.
                None if text.contains(KIND) => {
                    found.push((path, format!("it does not parse and mentions {KIND}")));
                }
                _ => {}
            }
        }
    }
    found
}

/// A spec file of ours whose process is gone: left by a test that was killed. Only
/// meaningful under [`LOCK`].
fn our_stale_spec(path: &Path) -> bool {
    let Some(pid) = path
        .file_stem()
        .and_then(|s| s.to_str())
        .and_then(|s| s.strip_prefix(OURS))
        .filter(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit()))
    else {
        return false;
    };
    pid != std::process::id().to_string() && !Path::new("/proc").join(pid).exists()
}

/// Our spec in [`SPEC_DIR`], installed under [`LOCK`]. Dropping it removes the spec
/// (and the directory, if we made it), then releases the lock.
struct SystemSpec {
    path: Option<PathBuf>,
    made_dir: bool,
    _lock: Flock<File>,
}

impl SystemSpec {
    /// Takes the lock, removes specs of ours that killed runs left, and refuses to go
    /// on if a real `nvidia.com/gpu` spec is present.
    fn claim() -> SystemSpec {
        fs::create_dir_all(Path::new(LOCK).parent().unwrap()).unwrap();
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(LOCK)
            .unwrap_or_else(|e| panic!("opening the lock file {LOCK}: {e}"));
        let lock = Flock::lock(file, FlockArg::LockExclusive)
            .unwrap_or_else(|(_, e)| panic!("locking {LOCK}: {e}"));
        let dirs: Vec<&Path> = SPEC_DIRS.iter().map(Path::new).collect();
        for dir in &dirs {
            for path in fs::read_dir(dir).into_iter().flatten() {
                let path = path.unwrap().path();
                if our_stale_spec(&path) {
                    fs::remove_file(&path).unwrap();
                }
            }
        }
        let foreign = foreign_specs(&dirs);
        assert!(
            foreign.is_empty(),
            "refusing to run: this host already has a CDI spec for {KIND}, which ours would \
             conflict with: {foreign:?}"
        );
        let made_dir = !Path::new(SPEC_DIR).exists();
        fs::create_dir_all(SPEC_DIR).unwrap();
        SystemSpec {
            path: None,
            made_dir,
            _lock: lock,
        }
    }

    /// (Re)writes our spec for `node` in `format` (`json` or `yaml`).
    fn install(&mut self, node: &Node, format: &str) -> PathBuf {
        self.remove();
        let path = Path::new(SPEC_DIR).join(format!("{OURS}{}.{format}", std::process::id()));
        self.path = Some(path.clone());
        let output = path.to_str().unwrap();
        let args = ["cdi", "generate", "--output", output, "--format", format];
        crate::common::ok(
            nvshim(
                node,
                &[&args[..], &["--nvidia-cdi-hook-path", NVSHIM]].concat(),
            ),
            "nvshim cdi generate",
        );
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(
            text.trim_start().starts_with('{'),
            format == "json",
            "{format} spec:\n{text}"
        );
        path
    }

    /// (Re)writes our spec as `text` in `format`.
    fn install_text(&mut self, text: &str, format: &str) -> PathBuf {
        self.remove();
        let path = Path::new(SPEC_DIR).join(format!("{OURS}{}.{format}", std::process::id()));
        self.path = Some(path.clone());
        fs::write(&path, text).unwrap();
        path
    }

    fn remove(&mut self) {
        if let Some(path) = self.path.take() {
            let _ = fs::remove_file(path);
        }
    }
}

impl Drop for SystemSpec {
    fn drop(&mut self) {
        self.remove();
        if self.made_dir {
            // Fails, as it should, if something else has put a file there meanwhile.
            let _ = fs::remove_dir(SPEC_DIR);
        }
    }
}

fn printed(output: Output, what: &str) -> Printed {
    Printed(crate::common::ok(output, what))
}

/// What a container given `gpus` (indices) must show.
fn assert_gets(node: &Node, printed: &Printed, case: &str, gpus: &[usize]) {
    let gpu_specs = &node.sim.spec.gpus;
    let mut want: Vec<String> = gpus
        .iter()
        .map(|&i| format!("nvidia{}", gpu_specs[i].minor))
        .collect();
    want.sort();
    let out = &printed.0;
    assert_eq!(printed.gpu_nodes(), want, "{case}: GPU nodes\n{out}");
    for control in ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] {
        assert!(
            printed.nvidia_nodes().iter().any(|n| n == control),
            "{case}: /dev/{control} missing\n{out}"
        );
    }
    let smi = printed.smi_lines();
    assert_eq!(smi.len(), gpus.len(), "{case}: nvidia-smi -L\n{out}");
    for &i in gpus {
        let uuid = &gpu_specs[i].uuid;
        assert!(
            smi.iter().any(|l| l.contains(uuid.as_str())),
            "{case}: GPU {i} ({uuid}) not listed by nvidia-smi\n{out}"
        );
    }
    assert!(
        printed.section(1).contains("rc=0"),
        "{case}: nvidia-smi failed\n{out}"
    );
    // Only the hook puts the driver into the container's linker cache and makes the
    // soname links.
    assert!(
        printed.section(2).contains("libcuda.so.1 "),
        "{case}: ldconfig -p lacks libcuda.so.1\n{out}"
    );
    assert_eq!(
        printed.section(3).trim(),
        format!("libcuda.so.{}", node.sim.library_version()),
        "{case}: readlink libcuda.so.1\n{out}"
    );
    assert_eq!(
        printed.section(4).trim(),
        "NVIDIA_VISIBLE_DEVICES=void",
        "{case}: env\n{out}"
    );
}

#[test]
fn podman_runs_the_devices_of_our_cdi_spec() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "needs root (device nodes, /etc/cdi, podman)"
    );
    require_podman();
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let storage = storage_with_image(&node, dir.path(), IMAGE);
    let run = |device: &str| {
        podman(&storage.0)
            .args(run_args(&node))
            .arg("--device")
            .arg(format!("{KIND}={device}"))
            .args([IMAGE, "sh", "-c"])
            .arg(format!("{GPU_SCRIPT}{SCRIPT_TAIL}"))
            .output()
            .unwrap()
    };

    let mut spec = SystemSpec::claim();
    spec.install(&node, "json");
    let p = printed(run("0"), "podman run --device nvidia.com/gpu=0 (JSON spec)");
    assert_gets(&node, &p, "gpu=0, JSON", &[0]);
    let uuid = &node.sim.spec.gpus[1].uuid;
    let p = printed(
        run(uuid),
        "podman run --device nvidia.com/gpu=<GPU 1's UUID>",
    );
    assert_gets(&node, &p, "gpu=UUID of GPU 1, JSON", &[1]);

    spec.install(&node, "yaml");
    let p = printed(
        run("all"),
        "podman run --device nvidia.com/gpu=all (YAML spec)",
    );
    assert_gets(&node, &p, "gpu=all, YAML", &[0, 1, 2, 3]);

    // A name the spec does not define: podman refuses rather than run without a GPU.
    let failed = run("7");
    assert!(!failed.status.success(), "gpu=7 ran: {failed:?}");

    // NVIDIA's names, as packages install them: links to the one binary.
    let names = tempfile::tempdir().unwrap();
    let ctk = names.path().join("nvidia-ctk");
    let hook = names.path().join("nvidia-cdi-hook");
    std::os::unix::fs::symlink(NVSHIM, &ctk).unwrap();
    std::os::unix::fs::symlink(NVSHIM, &hook).unwrap();
    let text = nvidia_ctk_spec(&node, &ctk, &hook, names.path());
    for stage in [
        "create-symlinks",
        "enable-cuda-compat",
        "update-ldcache",
        "update-application-profile",
    ] {
        assert!(
            text.contains(stage),
            "nvidia-ctk cdi generate: no {stage} hook\n{text}"
        );
    }
    assert!(!text.contains("link-driver"), "{text}");
    spec.install_text(&text, "yaml");
    let p = printed(
        run("1"),
        "podman run --device nvidia.com/gpu=1 (nvidia-ctk spec)",
    );
    assert_gets(&node, &p, "gpu=1, nvidia-ctk cdi generate", &[1]);

    spec.install_text(&nvidia_format_fixture(&node, &hook), "json");
    let p = printed(
        run("0"),
        "podman run --device nvidia.com/gpu=0 (NVIDIA's format)",
    );
    assert_gets(&node, &p, "gpu=0, spec in NVIDIA's format", &[0]);

    drop(spec);
    let path = Path::new(SPEC_DIR).join(format!("{OURS}{}.yaml", std::process::id()));
    assert!(!path.exists(), "{} was left behind", path.display());
    drop(storage);
    let mountinfo = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mountinfo.contains(dir.path().to_str().unwrap()),
        "podman left mounts under {}",
        dir.path().display()
    );
}

/// `nvidia-ctk --config <node's config> cdi generate --nvidia-cdi-hook-path <hook>`.
fn nvidia_ctk_spec(node: &Node, ctk: &Path, hook: &Path, scratch: &Path) -> String {
    let config = scratch.join("config.toml");
    fs::write(&config, node.sim.runtime_config("runc", None)).unwrap();
    let mut cmd = std::process::Command::new(ctk);
    cmd.env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .arg("--config")
        .arg(&config)
        .args(["cdi", "generate", "--nvidia-cdi-hook-path"])
        .arg(hook);
    for (k, v) in node.sim.env() {
        cmd.env(k, v);
    }
    crate::common::ok(cmd.output().unwrap(), "nvidia-ctk cdi generate")
}

/// The fixture with this node's paths, GPU 0's minor and `hook` filled in.
fn nvidia_format_fixture(node: &Node, hook: &Path) -> String {
    let template = include_str!("../fixtures/cdi/nvidia-ctk-generate.json");
    template
        .replace("@DRIVER@", node.sim.driver_root.to_str().unwrap())
        .replace("@DEV@", node.sim.dir.join("dev").to_str().unwrap())
        .replace("@MINOR0@", &node.sim.spec.gpus[0].minor.to_string())
        .replace("@VERSION@", node.sim.library_version())
        .replace("@HOOK@", hook.to_str().unwrap())
}

#[test]
fn a_real_nodes_spec_counts_as_foreign_and_ours_do_not() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let cases = [
        (
            "nvidia.yaml",
            "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices: []\n",
            true,
        ),
        (
            "nvidia.json",
            r#"{"cdiVersion":"0.5.0","kind":"nvidia.com/gpu"}"#,
            true,
        ),
        ("broken.json", r#"{"kind": "nvidia.com/gpu", "#, true),
        (
            "other.json",
            r#"{"cdiVersion":"0.5.0","kind":"vendor.com/net"}"#,
            false,
        ),
        ("notes.txt", "kind: nvidia.com/gpu", false),
        // A spec of a killed run (pid 0 is never a process): stale, ours to remove.
        ("nvshim-test-0.json", r#"{"kind":"nvidia.com/gpu"}"#, false),
    ];
    for (name, text, _) in cases {
        fs::write(d.join(name), text).unwrap();
    }
    let found = foreign_specs(&[d, &d.join("absent")]);
    for (name, _, foreign) in cases {
        assert_eq!(
            found.iter().any(|(p, _)| p.ends_with(name)),
            foreign,
            "{name}: {found:?}"
        );
    }
    assert!(our_stale_spec(&d.join("nvshim-test-0.json")));
    let live = d.join(format!("{OURS}{}.json", std::process::id()));
    assert!(!our_stale_spec(&live), "our own spec is not stale");
}

//! The runtime resolving CDI device names, through real runc on a simulated 4-GPU
//! node (GPU 2 is `/dev/nvidia3`, GPU 3 is `/dev/nvidia2`):
//! - from a spec file `nvshim cdi generate` wrote (`mode = "cdi"`, or `auto` when a
//!   spec defines the name), where the driver's symlinks and linker cache come from
//!   the spec's `createContainer` hook (`nvshim hook link-driver`);
//! - in memory (`mode = "jit-cdi"`, or `auto` with no spec, or the device plugin's
//!   `k8s.device-plugin.nvidia.com/gpu` names);
//! - and a plain `NVIDIA_VISIBLE_DEVICES=1`.
//!
//! All of them must give the container the same thing: the same device nodes, cgroup
//! rules and mounts in `config.json`, the same symlinks and the byte-identical
//! `ld.so.cache` in the rootfs, and GPU 1 only.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{GPU_SCRIPT, Node, Printed, node};
use nvshim_testkit::{NodeSpec, runc_bundle};
use serde_json::{Value, json};

const NVSHIM: &str = env!("CARGO_BIN_EXE_nvshim");
const HOOK: &str = env!("CARGO_BIN_EXE_nvidia-container-runtime-hook");
const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";

struct Setup {
    node: Node,
    dir: tempfile::TempDir,
    rootfs: PathBuf,
    /// Holds the generated spec.
    spec_dir: PathBuf,
    /// An empty spec directory.
    no_specs: PathBuf,
}

fn setup() -> Setup {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    node.sim.container_rootfs().build(&rootfs).unwrap();
    let spec_dir = dir.path().join("cdi");
    let no_specs = dir.path().join("no-specs");
    fs::create_dir_all(&no_specs).unwrap();
    let out = crate::common::nvshim(
        &node,
        &[
            "cdi",
            "generate",
            "--output",
            spec_dir.join("nvidia.json").to_str().unwrap(),
            "--nvidia-cdi-hook-path",
            NVSHIM,
        ],
    );
    crate::common::ok(out, "nvshim cdi generate");
    Setup {
        node,
        dir,
        rootfs,
        spec_dir,
        no_specs,
    }
}

static IDS: AtomicUsize = AtomicUsize::new(0);

/// One container run: its output, and its bundle after the runtime edited it.
struct Run {
    out: Output,
    bundle: PathBuf,
}

impl Run {
    fn ok(&self) -> Printed {
        assert!(
            self.out.status.success(),
            "container failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.out.status,
            String::from_utf8_lossy(&self.out.stdout),
            String::from_utf8_lossy(&self.out.stderr)
        );
        Printed(String::from_utf8_lossy(&self.out.stdout).into_owned())
    }

    fn spec(&self) -> Value {
        serde_json::from_slice(&fs::read(self.bundle.join("config.json")).unwrap()).unwrap()
    }

    /// Every symlink in the container's library directory (the image's and the
    /// driver's): name → target.
    fn links(&self) -> BTreeMap<String, String> {
        fs::read_dir(self.bundle.join("rootfs").join(LIB_DIR))
            .unwrap()
            .filter_map(|e| {
                let e = e.unwrap();
                let target = fs::read_link(e.path()).ok()?;
                Some((
                    e.file_name().to_string_lossy().into_owned(),
                    target.display().to_string(),
                ))
            })
            .collect()
    }

    fn ldcache(&self) -> Vec<u8> {
        fs::read(self.bundle.join("rootfs/etc/ld.so.cache")).unwrap()
    }
}

impl Setup {
    /// Runs GPU_SCRIPT with `env` and `annotations` through our runtime and real runc,
    /// with `mode` and `spec_dir` in config.toml.
    fn run(&self, mode: &str, spec_dir: &Path, env: &[&str], annotations: &[(&str, &str)]) -> Run {
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let id = format!("nvshim-cdi-{}-{n}", std::process::id());
        let bundle = self.dir.path().join(&id);
        let mut all_env = vec![
            "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
            "MOCK_NVML_DEV_ROOT=/dev",
            "NVIDIA_DRIVER_CAPABILITIES=all",
        ];
        all_env.extend_from_slice(env);
        runc_bundle(&bundle, &self.rootfs, &["sh", "-c", GPU_SCRIPT], &all_env).unwrap();
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/etc/mock-nvml.json",
            "type": "bind",
            "source": self.node.sim.mock_config,
            "options": ["ro", "bind"],
        }));
        for (k, v) in annotations {
            spec["annotations"][*k] = json!(v);
        }
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();

        let config = self.dir.path().join(format!("config-{n}.toml"));
        let text = self.node.sim.runtime_config("runc", None).replace(
            "[nvidia-container-runtime]\n",
            &format!("[nvidia-container-runtime]\nmode = \"{mode}\"\n"),
        ) + &format!(
            "\n[nvidia-container-runtime.modes.cdi]\nspec-dirs = [\"{}\"]\n",
            spec_dir.display()
        );
        fs::write(&config, text).unwrap();
        let out = Command::new(crate::common::runtime_bin())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", &config)
            .arg("--root")
            .arg(self.dir.path().join("runc-root"))
            .args(["run", "--bundle"])
            .arg(&bundle)
            .arg(&id)
            .output()
            .unwrap();
        Run { out, bundle }
    }
}

/// The parts of a spec the injection writes, minus what legitimately differs: the
/// request's own env var and the hooks (the spec-file path carries one).
fn injected(spec: &Value) -> Value {
    let env: Vec<&Value> = spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| !v.as_str().unwrap().starts_with("NVIDIA_VISIBLE_DEVICES="))
        .collect();
    json!({
        "devices": spec["linux"]["devices"],
        "cgroup": spec["linux"]["resources"]["devices"],
        "mounts": spec["mounts"],
        "env": env,
    })
}

fn env_value<'a>(spec: &'a Value, name: &str) -> Vec<&'a str> {
    spec["process"]["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| v.as_str()?.strip_prefix(&format!("{name}=")))
        .collect()
}

fn assert_gpu1_only(s: &Setup, printed: &Printed, case: &str) {
    let minor = s.node.sim.spec.gpus[1].minor;
    assert_eq!(
        printed.gpu_nodes(),
        [format!("nvidia{minor}")],
        "{case}: {}",
        printed.0
    );
    let smi = printed.smi_lines();
    assert!(
        smi.len() == 1 && smi[0].contains(&s.node.sim.spec.gpus[1].uuid),
        "{case}: {smi:?}"
    );
    assert!(
        printed.section(2).contains("libcuda.so.1 (libc6,x86-64)"),
        "{case}: {}",
        printed.0
    );
}

#[test]
fn spec_file_jit_and_direct_requests_give_identical_edits() {
    let s = setup();
    let direct = s.run("auto", &s.no_specs, &["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    let jit = s.run(
        "jit-cdi",
        &s.spec_dir,
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"],
        &[],
    );
    let file = s.run(
        "cdi",
        &s.spec_dir,
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"],
        &[],
    );
    let annotated = s.run(
        "auto",
        &s.spec_dir,
        &[],
        &[("cdi.k8s.io/test", "nvidia.com/gpu=1")],
    );
    let uuid = &s.node.sim.spec.gpus[1].uuid;
    let plugin = s.run(
        "auto",
        &s.no_specs,
        &[],
        &[(
            "cdi.k8s.io/nvidia-device-plugin_1",
            &format!("k8s.device-plugin.nvidia.com/gpu={uuid}"),
        )],
    );
    let runs = [
        ("direct", &direct),
        ("jit-cdi", &jit),
        ("cdi spec file", &file),
        ("annotation, spec file", &annotated),
        ("device plugin annotation, jit", &plugin),
    ];
    for (case, run) in &runs {
        assert_gpu1_only(&s, &run.ok(), case);
    }

    let want = injected(&direct.spec());
    let want_links = direct.links();
    let want_cache = direct.ldcache();
    assert!(want_links.contains_key("libcuda.so.1"), "{want_links:?}");
    for (case, run) in &runs[1..] {
        let spec = run.spec();
        assert_eq!(injected(&spec), want, "{case}: config.json edits differ");
        assert_eq!(run.links(), want_links, "{case}: symlinks differ");
        assert!(run.ldcache() == want_cache, "{case}: ld.so.cache differs");
    }

    // The spec-file runs carry the spec's hooks, with a fixed env, and void the
    // variable so that nothing injects a second time. Every run covers the driver's
    // params (the simulated host says `ModifyDeviceFiles: 1`): the in-memory runs with
    // the runtime's own hook, the spec-file runs with the spec's; nothing else runs.
    let stages = |spec: &Value| -> Vec<String> {
        spec["hooks"]["createContainer"]
            .as_array()
            .unwrap()
            .iter()
            .map(|h| {
                assert_eq!(h["env"], json!(["PATH=/usr/sbin:/usr/bin:/sbin:/bin"]));
                let args = h["args"].as_array().unwrap();
                let at = if args[0] == "nvshim" { 2 } else { 1 };
                args[at].as_str().unwrap().to_owned()
            })
            .collect()
    };
    for run in [&file, &annotated] {
        let spec = run.spec();
        // The spec's own hooks, then GPU 1's: the link-driver that makes its DRM
        // `by-path` links (the spec carries every capability, graphics included).
        assert_eq!(
            stages(&spec),
            [
                "link-driver",
                "disable-device-node-modification",
                "link-driver"
            ]
        );
        assert_eq!(spec["hooks"]["createContainer"][0]["path"], NVSHIM);
        assert_eq!(env_value(&spec, "NVIDIA_VISIBLE_DEVICES"), ["void"]);
    }
    // With `all`, GPU 1's DRM `by-path` links too: made by a link-driver hook once
    // runc has mounted the container's `/dev`.
    for run in [&direct, &jit, &plugin] {
        let spec = run.spec();
        assert_eq!(
            stages(&spec),
            ["disable-device-node-modification", "link-driver"]
        );
        assert_eq!(spec["hooks"]["createContainer"][0]["path"], HOOK);
    }
}

#[test]
fn all_from_the_spec_file_gives_every_gpu() {
    let s = setup();
    let run = s.run(
        "auto",
        &s.spec_dir,
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=all"],
        &[],
    );
    let printed = run.ok();
    let mut want: Vec<String> = s
        .node
        .sim
        .spec
        .gpus
        .iter()
        .map(|g| format!("nvidia{}", g.minor))
        .collect();
    want.sort();
    assert_eq!(printed.gpu_nodes(), want, "{}", printed.0);
    assert_eq!(printed.smi_lines().len(), 4, "{}", printed.0);
    assert!(run.spec()["hooks"]["createContainer"].is_array());
}

#[test]
fn cdi_mode_reads_plain_ids_as_names_of_the_default_kind() {
    let s = setup();
    let run = s.run("cdi", &s.spec_dir, &["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    assert_gpu1_only(&s, &run.ok(), "cdi mode, plain id");
    assert!(run.spec()["hooks"]["createContainer"].is_array());
}

#[test]
fn an_unknown_cdi_device_fails_the_create_and_leaves_the_bundle_alone() {
    let s = setup();
    for (mode, dir) in [("cdi", &s.spec_dir), ("cdi", &s.no_specs)] {
        let run = s.run(mode, dir, &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=9"], &[]);
        assert!(
            !run.out.status.success(),
            "{mode}: a GPU that does not exist"
        );
        let err = String::from_utf8_lossy(&run.out.stderr);
        assert!(err.contains("nvidia.com/gpu=9"), "{err}");
        assert!(run.spec()["linux"].get("devices").is_none_or(|d| {
            d.as_array()
                .unwrap()
                .iter()
                .all(|d| !d["path"].as_str().unwrap().starts_with("/dev/nvidia"))
        }));
    }
    // A kind no spec defines and we do not know.
    let run = s.run(
        "auto",
        &s.spec_dir,
        &["NVIDIA_VISIBLE_DEVICES=example.com/fpga=0"],
        &[],
    );
    assert!(!run.out.status.success());
    let err = String::from_utf8_lossy(&run.out.stderr);
    assert!(err.contains("example.com/fpga"), "{err}");
}

/// Packages install the static `nvidia-container-runtime-hook` beside `nvshim`, and
/// generated specs run `link-driver` through it: same result as `nvshim hook`.
#[test]
fn the_hook_binary_runs_link_driver_too() {
    let s = setup();
    let dir = s.dir.path().join("cdi-hook-binary");
    let out = crate::common::nvshim(
        &s.node,
        &[
            "cdi",
            "generate",
            "--output",
            dir.join("nvidia.yaml").to_str().unwrap(),
            "--nvidia-cdi-hook-path",
            HOOK,
        ],
    );
    crate::common::ok(out, "nvshim cdi generate");
    let direct = s.run("auto", &s.no_specs, &["NVIDIA_VISIBLE_DEVICES=1"], &[]);
    let file = s.run(
        "cdi",
        &dir,
        &["NVIDIA_VISIBLE_DEVICES=nvidia.com/gpu=1"],
        &[],
    );
    assert_gpu1_only(&s, &file.ok(), "static hook");
    direct.ok();
    let spec = file.spec();
    let hook = &spec["hooks"]["createContainer"][0];
    assert_eq!(hook["path"], HOOK);
    assert_eq!(hook["args"][0], "nvidia-container-runtime-hook");
    assert_eq!(hook["args"][1], "link-driver");
    assert_eq!(file.links(), direct.links());
    assert!(file.ldcache() == direct.ldcache(), "ld.so.cache differs");
}

/// Neither hook binary runs a `createContainer` stage with a loader variable in its
/// environment (CVE-2025-23266: an image's LD_PRELOAD reached NVIDIA's
/// createContainer hook). `prestart` gets dockerd's environment, where
/// LD_LIBRARY_PATH is legitimate, and runs (tests/hook/engines.rs).
#[test]
fn hooks_refuse_loader_variables() {
    // NVIDIA's names for the same binary, as packages install them.
    let names = tempfile::tempdir().unwrap();
    let cdi_hook = names.path().join("nvidia-cdi-hook");
    let ctk = names.path().join("nvidia-ctk");
    std::os::unix::fs::symlink(NVSHIM, &cdi_hook).unwrap();
    std::os::unix::fs::symlink(NVSHIM, &ctk).unwrap();
    let (cdi_hook, ctk) = (cdi_hook.to_str().unwrap(), ctk.to_str().unwrap());
    for (bin, args) in [
        (HOOK, &["link-driver", "--link", "a::/b"][..]),
        (NVSHIM, &["hook", "link-driver", "--link", "a::/b"][..]),
        (HOOK, &["disable-device-node-modification"][..]),
        (cdi_hook, &["create-symlinks", "--link", "a::/b"][..]),
        (cdi_hook, &["update-ldcache", "--folder", "/usr/lib64"][..]),
        (
            cdi_hook,
            &["chmod", "--mode", "755", "--path", "/dev/dri"][..],
        ),
        (
            cdi_hook,
            &["enable-cuda-compat", "--host-driver-version=550.1"][..],
        ),
        (cdi_hook, &["disable-device-node-modification"][..]),
        (cdi_hook, &["update-application-profile"][..]),
        (
            ctk,
            &["hook", "update-ldcache", "--folder", "/usr/lib64"][..],
        ),
    ] {
        for var in ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"] {
            let out = Command::new(bin)
                .env_clear()
                .env("PATH", "/usr/bin:/bin")
                .env(var, "/nonexistent/x.so")
                .args(args)
                .output()
                .unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{bin} {args:?} with {var}");
            assert!(
                err.contains(var) && err.contains("refusing"),
                "{bin} {var}: {err}"
            );
        }
    }
}

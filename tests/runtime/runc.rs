//! `nvidia-container-runtime run` through real runc, on a simulated 8-GPU node, with
//! a glibc rootfs: the container sees exactly the GPUs it asked for, the fake
//! `nvidia-smi -L` inside (the node's, mounted by the runtime, loading the node's
//! mock NVML through the container's own linker cache) lists them, and `ldconfig -p`
//! inside lists the driver's libraries.
//!
//! On the standard node the last two GPUs' minors are swapped (GPU 6 is
//! `/dev/nvidia7`), so index→minor mistakes show.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::common::{GPU_SCRIPT as SCRIPT, Node, Printed, node};
use nvshim_testkit::{NodeSpec, runc_bundle};
use serde_json::{Value, json};

pub(crate) struct E2e {
    pub(crate) node: Node,
    pub(crate) dir: tempfile::TempDir,
    pub(crate) rootfs: PathBuf,
}

pub(crate) fn setup() -> E2e {
    setup_with(None)
}

/// [`setup`], with the host program `install.0` copied to `install.1` in the rootfs.
fn setup_with(install: Option<(&Path, &str)>) -> E2e {
    let node = node(&NodeSpec::standard(8));
    let dir = tempfile::tempdir().unwrap();
    let rootfs = dir.path().join("rootfs");
    let mut builder = node.sim.container_rootfs();
    if let Some((host, inside)) = install {
        builder = builder.install(host, inside);
    }
    builder.build(&rootfs).unwrap();
    let log = dir.path().join("runtime.log");
    fs::write(
        dir.path().join("config.toml"),
        node.sim.runtime_config("runc", Some(&log)),
    )
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
    pub(crate) fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.out.stderr).into_owned()
    }
    fn printed(&self) -> Printed {
        Printed(self.stdout())
    }
}

impl E2e {
    fn uuid(&self, index: usize) -> &str {
        &self.node.sim.spec.gpus[index].uuid
    }

    fn runc_root(&self) -> PathBuf {
        self.dir.path().join("runc-root")
    }

    /// Runs SCRIPT in a fresh bundle with `env` through our runtime and real runc.
    fn run(&self, env: &[&str]) -> Run {
        self.run_script(env, SCRIPT)
    }

    /// [`E2e::run`] with `script` in place of SCRIPT.
    pub(crate) fn run_script(&self, env: &[&str], script: &str) -> Run {
        self.run_script_with_mounts(env, script, &[])
    }

    /// [`E2e::run_script`] with the host files `mounts.0` bind-mounted read-only at
    /// `mounts.1` in the container.
    pub(crate) fn run_script_with_mounts(
        &self,
        env: &[&str],
        script: &str,
        mounts: &[(&Path, &str)],
    ) -> Run {
        let n = IDS.fetch_add(1, Ordering::Relaxed);
        let id = format!("nvshim-e2e-{}-{n}", std::process::id());
        let bundle = self.bundle(env, script, mounts, &id);
        let out = self.runtime(&["run", "--bundle", bundle.to_str().unwrap(), &id]);
        Run { out, bundle, id }
    }

    /// `nvidia-container-runtime create` of `script` with `env` as container `id`
    /// (its bundle: `<dir>/<id>`); `runc start` runs it.
    pub(crate) fn create(&self, env: &[&str], script: &str, id: &str) -> Output {
        let bundle = self.bundle(env, script, &[], id);
        // The container inherits runc's stdio: a pipe would stay open while it runs.
        let log = self.dir.path().join(format!("{id}.log"));
        let mut cmd = self.runtime_command(&["create", "--bundle", bundle.to_str().unwrap(), id]);
        let status = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .status()
            .unwrap();
        Output {
            status,
            stdout: Vec::new(),
            stderr: fs::read(&log).unwrap(),
        }
    }

    /// Our runtime with the e2e config and runc root, nothing else inherited.
    fn runtime(&self, args: &[&str]) -> Output {
        self.runtime_command(args).output().unwrap()
    }

    fn runtime_command(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(crate::common::runtime_bin());
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env(
                "NVIDIA_CTK_CONFIG_FILE_PATH",
                self.dir.path().join("config.toml"),
            )
            .arg("--root")
            .arg(self.runc_root())
            .args(args);
        cmd
    }

    /// A bundle at `<dir>/<id>` running `script` with `env`, the node's mock NVML
    /// config and `mounts` (read-only binds) mounted in.
    fn bundle(&self, env: &[&str], script: &str, mounts: &[(&Path, &str)], id: &str) -> PathBuf {
        let bundle = self.dir.path().join(id);
        let mut all_env = vec![
            "MOCK_NVML_CONFIG=/etc/mock-nvml.json",
            "MOCK_NVML_DEV_ROOT=/dev",
        ];
        all_env.extend_from_slice(env);
        runc_bundle(&bundle, &self.rootfs, &["sh", "-c", script], &all_env).unwrap();
        // The mock NVML reads the node's GPUs from its config: mount it in.
        let path = bundle.join("config.json");
        let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
        spec["mounts"].as_array_mut().unwrap().push(json!({
            "destination": "/etc/mock-nvml.json",
            "type": "bind",
            "source": self.node.sim.mock_config,
            "options": ["ro", "bind"],
        }));
        for (host, inside) in mounts {
            spec["mounts"].as_array_mut().unwrap().push(json!({
                "destination": inside,
                "type": "bind",
                "source": host,
                "options": ["ro", "bind"],
            }));
        }
        fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        bundle
    }

    /// Whether runc knows the container (it must not after a failed create).
    fn exists(&self, id: &str) -> bool {
        Command::new("runc")
            .arg("--root")
            .arg(self.runc_root())
            .args(["state", id])
            .output()
            .unwrap()
            .status
            .success()
    }
}

pub(crate) fn ok(run: &Run) {
    assert!(
        run.out.status.success(),
        "container failed ({}):\nstdout:\n{}\nstderr:\n{}",
        run.out.status,
        run.stdout(),
        run.stderr()
    );
}

fn strings(list: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = list.iter().map(|s| s.to_string()).collect();
    v.sort();
    v
}

const CONTROL: [&str; 3] = ["nvidia-uvm", "nvidia-uvm-tools", "nvidiactl"];

#[test]
fn two_gpus_by_index_are_all_the_container_sees() {
    let e = setup();
    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=0,2"]);
    ok(&run);
    let mut want = CONTROL.to_vec();
    want.extend(["nvidia0", "nvidia2"]);
    assert_eq!(
        run.printed().nvidia_nodes(),
        strings(&want),
        "{}",
        run.stdout()
    );
    let smi = run.printed().smi_lines();
    assert_eq!(smi.len(), 2, "{}", run.stdout());
    assert!(
        smi[0].contains(e.uuid(0)) && smi[1].contains(e.uuid(2)),
        "{smi:?}"
    );
    let cache = run.printed().section(2);
    for lib in ["libcuda.so.1", "libnvidia-ml.so.1"] {
        assert!(
            cache.contains(&format!(
                "{lib} (libc6,x86-64) => /usr/lib/x86_64-linux-gnu/{lib}"
            )),
            "{lib} not in the container's cache:\n{cache}"
        );
    }
    // The image's own entries are still there.
    assert!(cache.contains("libc.so.6"), "{cache}");
    // The spec says why: the debug log has one line per injected item.
    let log = fs::read_to_string(e.dir.path().join("runtime.log")).unwrap();
    assert!(
        log.contains("inject device node") && log.contains("inject mount"),
        "{log}"
    );
}

#[test]
fn uuids_pick_the_right_minors() {
    let e = setup();
    // GPU 6 is /dev/nvidia7 on the standard node.
    let list = format!("NVIDIA_VISIBLE_DEVICES={},{}", e.uuid(1), e.uuid(6));
    let run = e.run(&[&list]);
    ok(&run);
    let mut want = CONTROL.to_vec();
    want.extend(["nvidia1", "nvidia7"]);
    assert_eq!(
        run.printed().nvidia_nodes(),
        strings(&want),
        "{}",
        run.stdout()
    );
    let smi = run.printed().smi_lines().join("\n");
    assert!(smi.contains(e.uuid(1)) && smi.contains(e.uuid(6)), "{smi}");
    assert_eq!(run.printed().smi_lines().len(), 2, "{smi}");
}

#[test]
fn all_none_void_and_unset() {
    let e = setup();

    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=all"]);
    ok(&run);
    let mut want = CONTROL.to_vec();
    let gpus: Vec<String> = (0..8).map(|m| format!("nvidia{m}")).collect();
    want.extend(gpus.iter().map(String::as_str));
    assert_eq!(run.printed().nvidia_nodes(), strings(&want));
    assert_eq!(run.printed().smi_lines().len(), 8, "{}", run.stdout());

    // `none`: the driver (control nodes, libraries, nvidia-smi) but no GPU.
    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=none"]);
    ok(&run);
    assert_eq!(
        run.printed().nvidia_nodes(),
        strings(&CONTROL),
        "{}",
        run.stdout()
    );
    assert!(run.printed().smi_lines().is_empty(), "{}", run.stdout());
    assert!(
        run.printed().section(2).contains("libcuda.so.1"),
        "{}",
        run.stdout()
    );

    // `void` and unset: nothing at all, and config.json is not rewritten.
    for env in [&["NVIDIA_VISIBLE_DEVICES=void"][..], &[][..]] {
        let run = e.run(env);
        ok(&run);
        assert!(
            run.printed().nvidia_nodes().is_empty(),
            "{env:?}: {}",
            run.stdout()
        );
        assert!(
            run.printed().section(1).contains("rc=127"),
            "no nvidia-smi: {}",
            run.stdout()
        );
        assert!(
            !run.printed().section(2).contains("libcuda"),
            "{}",
            run.stdout()
        );
        let spec = fs::read_to_string(run.bundle.join("config.json")).unwrap();
        assert!(!spec.contains("nvshim.io/injected"), "{env:?}");
    }
}

#[test]
fn an_unknown_gpu_fails_the_create_and_names_it() {
    let e = setup();
    let run = e.run(&["NVIDIA_VISIBLE_DEVICES=0,9"]);
    assert!(!run.out.status.success(), "{}", run.stdout());
    let err = run.stderr();
    assert!(err.contains("\"9\"") && err.contains("GPU"), "{err}");
    assert!(!e.exists(&run.id), "the container must not exist");
    let spec = fs::read_to_string(run.bundle.join("config.json")).unwrap();
    assert!(!spec.contains("/dev/nvidia"), "config.json untouched");
    assert!(
        !Path::new(&run.bundle)
            .join("rootfs/etc/ld.so.cache")
            .exists()
            || !fs::read(run.bundle.join("rootfs/etc/ld.so.cache"))
                .unwrap()
                .windows(12)
                .any(|w| w == b"libcuda.so.1"),
        "the rootfs's cache untouched"
    );
}

/// CUDA forward compatibility: an image's compat `libcuda` newer than the node's driver
/// (550) goes ahead of the driver's in the container's linker cache; an older one, or
/// NVIDIA's opt-out (`cuda-compat-mode = "disabled"`), leaves the driver's alone.
/// `dlprobe` in the container prints the file `dlopen("libcuda.so.1")` loaded.
#[test]
fn cuda_compat_libraries_go_first_only_when_newer_and_not_opted_out() {
    let scratch = tempfile::tempdir().unwrap();
    let e = setup_with(Some((&dlprobe(scratch.path()), "/usr/bin/dlprobe")));
    let script = format!("{SCRIPT}; echo ---; dlprobe");
    let compat = e.rootfs.join("usr/local/cuda/compat");
    fs::create_dir_all(&compat).unwrap();
    let stub = e
        .node
        .sim
        .lib_dir()
        .join(format!("libcuda.so.{}", e.node.sim.library_version()));
    let place_from = |version: &str, source: &Path| {
        for entry in fs::read_dir(&compat).unwrap() {
            fs::remove_file(entry.unwrap().path()).unwrap();
        }
        let name = format!("libcuda.so.{version}");
        fs::copy(source, compat.join(&name)).unwrap();
        std::os::unix::fs::symlink(&name, compat.join("libcuda.so.1")).unwrap();
    };
    let place = |version: &str| place_from(version, &stub);
    // What `ldconfig -p` in the container lists for libcuda.so.1, in the cache's order.
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

    place("999.1.1");
    let run = e.run_script(&["NVIDIA_VISIBLE_DEVICES=0"], &script);
    ok(&run);
    let found = libcuda(&run);
    assert_eq!(found.len(), 2, "{}", run.stdout());
    assert_eq!(found[0], COMPAT, "{}", run.stdout());
    assert_eq!(
        run.printed().section(3).trim(),
        COMPAT,
        "dlopen: {}",
        run.stdout()
    );

    place("535.1.1");
    let run = e.run_script(&["NVIDIA_VISIBLE_DEVICES=0"], &script);
    ok(&run);
    let found = libcuda(&run);
    assert_eq!(found.len(), 1, "{}", run.stdout());
    assert_ne!(found[0], COMPAT, "an older compat libcuda is not used");
    assert_eq!(
        run.printed().section(3).trim(),
        found[0],
        "dlopen: {}",
        run.stdout()
    );

    place("999.1.1");
    let config = e.dir.path().join("config.toml");
    let original = fs::read_to_string(&config).unwrap();
    let opted_out = "\n[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = \"disabled\"\n";
    fs::write(&config, format!("{original}{opted_out}")).unwrap();
    let run = e.run_script(&["NVIDIA_VISIBLE_DEVICES=0"], &script);
    ok(&run);
    assert_eq!(libcuda(&run).len(), 1, "opted out: {}", run.stdout());
    assert_ne!(libcuda(&run)[0], COMPAT);
    assert_eq!(run.printed().section(3).trim(), libcuda(&run)[0], "dlopen");

    // With NVIDIA's `.note.cuda.fwd_compatibility`, the note's driver branches decide,
    // not the file name: 999 is newer than 550 either way.
    fs::write(&config, &original).unwrap();
    for (branches, used) in [("550", true), ("535,545", false)] {
        place_from("999.1.1", &noted_libcuda(scratch.path(), branches));
        let run = e.run_script(&["NVIDIA_VISIBLE_DEVICES=0"], &script);
        ok(&run);
        let found = libcuda(&run);
        assert_eq!(
            found[0] == COMPAT,
            used,
            "note Driver [{branches}]: {}",
            run.stdout()
        );
        assert_eq!(
            run.printed().section(3).trim(),
            found[0],
            "dlopen, note Driver [{branches}]"
        );
    }
}

/// A compat `libcuda.so.1` carrying NVIDIA's `.note.cuda.fwd_compatibility` ELF note (owner
/// `NVIDIA Corporation`, a JSON descriptor) that lists the driver branches `branches`.
fn noted_libcuda(dir: &Path, branches: &str) -> PathBuf {
    let src = dir.join(format!("noted-{branches}.s"));
    let lib = dir.join(format!("noted-{branches}.so"));
    let desc = format!(r#"{{"Format":1,"CUDA Version":"13.0","Driver":[{branches}],"Device":[]}}"#)
        .replace('"', "\\\"");
    let asm = format!(
        ".section .note.cuda.fwd_compatibility,\"a\",@note\n.balign 4\n.long 19\n.long 2f-1f\n\
         .long 1\n.asciz \"NVIDIA Corporation\"\n.balign 4\n1: .ascii \"{desc}\"\n2: .balign 4\n\
         .text\n.globl cuInit\ncuInit: ret\n.section .note.GNU-stack,\"\",@progbits\n"
    );
    fs::write(&src, asm).unwrap();
    let out = Command::new("gcc")
        .args(["-shared", "-nostdlib", "-Wl,-soname,libcuda.so.1", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .expect("gcc (needed to build the noted compat libcuda)");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    lib
}

/// Builds `dlprobe` with the host's gcc: it prints the path of the `libcuda.so.1` that
/// `dlopen` loaded, as `ld.so` found it.
fn dlprobe(dir: &Path) -> PathBuf {
    const SRC: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stdio.h>
int main(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    struct link_map *m = 0;
    if (!h) { printf("dlopen: %s\n", dlerror()); return 1; }
    if (dlinfo(h, RTLD_DI_LINKMAP, &m) != 0 || !m) { printf("dlinfo failed\n"); return 1; }
    printf("%s\n", m->l_name);
    return 0;
}
"#;
    let src = dir.join("dlprobe.c");
    let bin = dir.join("dlprobe");
    fs::write(&src, SRC).unwrap();
    let out = Command::new("gcc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("gcc (needed to build the dlopen probe)");
    assert!(
        out.status.success(),
        "gcc: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

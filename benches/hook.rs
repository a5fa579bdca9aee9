//! Hook mode vs the runtime path: what `nvidia-container-runtime-hook prestart` adds to
//! a container's `runc create` on a simulated 8-GPU node (`NVIDIA_VISIBLE_DEVICES=all`,
//! `NVIDIA_DRIVER_CAPABILITIES=all`), printed beside what the runtime path adds to the
//! same create. Prints a table; run as root with `cargo bench --bench hook`.
//!
//! Rows, interleaved round by round so machine noise hits every row alike:
//! - runc alone on the GPU bundle (runc ignores the env vars): the baseline;
//! - runc with our prestart hook in the spec, as dockerd writes it for `--gpus`;
//! - `nvidia-container-runtime` → runc on the same bundle (spec edits, no hook);
//! - `nvidia-container-runtime` → `/bin/true` and `/bin/true` alone (its own work).
//!
//! Also the hook's own time in-process, from the `elapsed_us` of its log line.
//!
//! Every create starts from a fresh copy of the rootfs and `config.json` (made before
//! the timer starts), so the hook and the runtime do their whole job each time:
//! mountpoints, symlinks and the linker cache included. Containers are deleted after
//! each create, untimed.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BenchFs, median, ms, pct, rounds, runtime};
use nvshim_testkit::{Artifacts, GlibcRootfs, NodeSpec, SimNode, runc_bundle};
use serde_json::{Value, json};

const HOOK: &str = env!("CARGO_BIN_EXE_nvidia-container-runtime-hook");
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A bundle whose rootfs and spec are put back from pristine copies before each use.
struct Bundle {
    dir: PathBuf,
    spec: Vec<u8>,
    pristine: PathBuf,
}

impl Bundle {
    fn new(dir: PathBuf, rootfs: &Path, env: &[&str], hook_config: Option<&Path>) -> Bundle {
        runc_bundle(&dir, rootfs, &["/bin/true"], env).unwrap();
        let path = dir.join("config.json");
        if let Some(config) = hook_config {
            let mut spec: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
            spec["hooks"] = json!({"prestart": [{
                "path": HOOK,
                "args": ["nvidia-container-runtime-hook", "prestart"],
                "env": [format!("PATH={PATH}"), format!("NVIDIA_CTK_CONFIG_FILE_PATH={}", config.display())],
            }]});
            fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
        }
        Bundle {
            spec: fs::read(&path).unwrap(),
            pristine: rootfs.to_path_buf(),
            dir,
        }
    }

    fn reset(&self) {
        let rootfs = self.dir.join("rootfs");
        fs::remove_dir_all(&rootfs).unwrap();
        let status = Command::new("cp")
            .arg("-a")
            .arg(&self.pristine)
            .arg(&rootfs)
            .status()
            .unwrap();
        assert!(status.success(), "cp -a rootfs");
        // A new file, as an engine writes a new bundle's (see benches/create.rs).
        let config = self.dir.join("config.json");
        fs::remove_file(&config).unwrap();
        fs::write(&config, &self.spec).unwrap();
    }
}

/// Runs `cmd` to completion. Not through pipes: `runc create` hands its stdio to the
/// container's init, which keeps them open until the container is deleted.
fn time(cmd: &mut Command, stderr: &Path) -> Duration {
    let log = fs::File::create(stderr).unwrap();
    let start = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .status()
        .unwrap();
    let took = start.elapsed();
    assert!(
        status.success(),
        "{cmd:?} failed: {}",
        fs::read_to_string(stderr).unwrap_or_default()
    );
    took
}

fn main() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("bench hook: run as root (mknod, runc, mounts)");
        std::process::exit(1);
    }
    let bench_fs = BenchFs::new();
    let dir = bench_fs.data.as_path();
    let artifacts = Artifacts::locate().unwrap();
    let node = SimNode::build(&NodeSpec::standard(8), &dir.join("node"), &artifacts).unwrap();
    let rootfs = dir.join("rootfs");
    GlibcRootfs::new()
        .libraries_for(node.driver_root.join("usr/bin/nvidia-smi"))
        .build(&rootfs)
        .unwrap();
    let env = [
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=all",
    ];
    // A log at the default level (info): one line per run, with the hook's own time.
    // `NVSHIM_BENCH_HOOK_LOG_LEVEL=debug` adds the hook's phase times (and their cost),
    // and keeps the log in `NVSHIM_BENCH_HOOK_LOG` when that is set.
    let d = node.dir.display();
    let hook_config = dir.join("hook.toml");
    let hook_log = std::env::var_os("NVSHIM_BENCH_HOOK_LOG")
        .map_or_else(|| dir.join("hook.log"), PathBuf::from);
    let level = std::env::var("NVSHIM_BENCH_HOOK_LOG_LEVEL").unwrap_or_else(|_| "info".into());
    fs::write(
        &hook_config,
        format!(
            "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\ndebug = \"{}\"\n\n\
             [nvidia-container-runtime]\nlog-level = \"{level}\"\n\n\
             [nvshim]\nproc-root = \"{d}\"\n",
            hook_log.display()
        ),
    )
    .unwrap();
    let with_runc = dir.join("runc.toml");
    fs::write(&with_runc, node.runtime_config("runc", None)).unwrap();
    let with_true = dir.join("true.toml");
    fs::write(&with_true, node.runtime_config("/bin/true", None)).unwrap();

    let bare = Bundle::new(dir.join("bare"), &rootfs, &env, None);
    let hooked = Bundle::new(dir.join("hooked"), &rootfs, &env, Some(&hook_config));
    let shimmed = Bundle::new(dir.join("shimmed"), &rootfs, &env, None);
    let root = bench_fs.run.join("runc-root");

    let create = |program: &str, config: &Path, bundle: &Bundle, id: &str| {
        bundle.reset();
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env("PATH", PATH)
            .env("NVIDIA_CTK_CONFIG_FILE_PATH", config)
            .arg("--root")
            .arg(&root)
            .args(["create", "--bundle"])
            .arg(&bundle.dir)
            .arg(id);
        cmd
    };
    let delete = |id: &str| {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["delete", "--force", id])
            .output();
    };
    let stderr = dir.join("stderr");
    let timed = |program: &str, config: &Path, bundle: &Bundle, id: &str| {
        let mut cmd = create(program, config, bundle, id);
        let d = time(&mut cmd, &stderr);
        delete(id);
        d
    };
    // Container ids name cgroups too: unique per bench process.
    let id = |what: &str| format!("nvshim-bench-hook-{}-{what}", std::process::id());
    let (bare_id, hooked_id, shimmed_id, noop_id) =
        (id("bare"), id("hooked"), id("shimmed"), id("noop"));

    let runtime = runtime();
    let runtime = runtime.as_str();
    let names = [
        "runc create, 8-GPU bundle, no injection",
        "runc create + prestart hook, 8 GPUs, all caps",
        "nvidia-container-runtime create, 8 GPUs, all caps",
        "nvidia-container-runtime → /bin/true, 8 GPUs",
        "/bin/true alone",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    let n = rounds(25);
    for round in 0..=n {
        // Rotate the order of the three creates so none always follows the same one.
        let mut row = [Duration::ZERO; 5];
        for k in 0..3 {
            match (round + k) % 3 {
                0 => row[0] = timed("runc", &hook_config, &bare, &bare_id),
                1 => row[1] = timed("runc", &hook_config, &hooked, &hooked_id),
                _ => row[2] = timed(runtime, &with_runc, &shimmed, &shimmed_id),
            }
        }
        row[3] = time(
            &mut create(runtime, &with_true, &shimmed, &noop_id),
            &stderr,
        );
        row[4] = time(&mut Command::new("/bin/true"), &stderr);
        // The first round warms caches and is not counted.
        if round > 0 {
            for (s, v) in samples.iter_mut().zip(row) {
                s.push(v);
            }
        }
    }

    println!(
        "prestart hook vs runtime path, {n} interleaved rounds, simulated 8-GPU node (all caps)"
    );
    println!("hook: {HOOK}\nruntime: {runtime}\n{}\n", bench_fs.describe);
    println!(
        "| {:<50} | {:>9} | {:>9} | {:>9} |",
        "what", "median", "p10", "p90"
    );
    println!("| {:-<50} | {:->9} | {:->9} | {:->9} |", "", "", "", "");
    for (i, name) in names.iter().enumerate() {
        println!(
            "| {:<50} | {:>9} | {:>9} | {:>9} |",
            name,
            ms(median(&samples[i])),
            ms(pct(&samples[i], 10)),
            ms(pct(&samples[i], 90))
        );
    }
    let paired = |ours: usize, base: usize| {
        let mut v: Vec<f64> = samples[ours]
            .iter()
            .zip(&samples[base])
            .map(|(o, b)| (o.as_secs_f64() - b.as_secs_f64()) * 1e3)
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let base = median(&samples[0]).as_secs_f64() * 1e3;
    println!("\nmedians of per-round differences:");
    let hook = paired(1, 0);
    println!(
        "prestart hook adds:       {hook:.2} ms to runc create ({:.3}x)",
        1.0 + hook / base
    );
    let shim = paired(2, 0);
    println!(
        "runtime path adds:        {shim:.2} ms to runc create ({:.3}x)",
        1.0 + shim / base
    );
    println!(
        "runtime's own work:       {:.2} ms (runtime → true, minus true alone)",
        paired(3, 4)
    );
    // The hook's in-process time (state parsed → injected), from its log; the first
    // round's run is dropped like the rest of that round.
    let log = fs::read_to_string(&hook_log).unwrap_or_default();
    let mut own: Vec<Duration> = log
        .lines()
        .filter(|l| l.contains("prestart: injected"))
        .filter_map(|l| l.split("elapsed_us=").nth(1))
        .filter_map(|v| v.split_whitespace().next()?.parse().ok())
        .map(Duration::from_micros)
        .skip(1)
        .collect();
    if !own.is_empty() {
        own.sort();
        println!(
            "hook's in-process work:   {} median, {} p90 (plan, open, cgroup, setns, mounts, nodes, cache)",
            ms(median(&own)),
            ms(pct(&own, 90))
        );
    }
}

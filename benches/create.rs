//! `create` through `nvidia-container-runtime` vs plain runc, on a simulated 8-GPU
//! node with a glibc rootfs. Prints a table; run as root with `make bench`.
//!
//! Rows, interleaved round by round so machine noise hits every row alike:
//! - runc alone on the GPU bundle (runc ignores `NVIDIA_VISIBLE_DEVICES`);
//! - our runtime on the same bundle (`NVIDIA_VISIBLE_DEVICES=all`,
//!   `compute,utility`), then runc;
//! - runc alone on the bundle as our runtime leaves it (its `config.json`, linker cache
//!   and driver symlinks, captured once): what runc's own work on our plan costs, the
//!   floor for any runtime that hands runc that plan;
//! - runc and our runtime on a bundle that asks for no GPU;
//! - our runtime with `/bin/true` as the low-level runtime, on the GPU bundle and on
//!   the no-GPU bundle (its own work, plus one exec of `true`), and `/bin/true` alone.
//!
//! runc's `create` varies by several milliseconds from run to run on a small VM, more
//! than the whole non-GPU overhead, so the no-GPU cost is also given the precise way:
//! the runtime → `/bin/true` time minus `/bin/true` alone, since with runc in place of
//! `true` the runtime adds exactly that and runc does the same work either way.
//!
//! Before every GPU create the bundle is put back as a new container's would be, so
//! each create does the whole job: `config.json` and the rootfs's `/etc/ld.so.cache`
//! are written again, and whatever the last create added to the rootfs (the driver's
//! symlinks, runc's mount points) is removed. The two files are written as new files
//! (remove, then write), as an engine writes a new bundle's `config.json` and as an
//! image layer supplies the cache. Overwriting them in place would charge the runtime
//! for the bench's own writes: the runtime replaces both by rename, and on an ext4
//! mounted with `discard` (this VM's disk) dropping an old file whose blocks are
//! already allocated waits for a synchronous discard of those blocks, about 0.1 ms per
//! file here, which a file an engine has just written (or one in a lower image layer)
//! does not cost. Containers are deleted after each create, untimed. The three GPU rows
//! and the three no-op rows each run in a different order each round (see the loop).
//!
//! The whole table is measured twice in one run: on a journaled ext4 of its own (a loop
//! device, runc's state on a tmpfs) and on the machine's own disk (the temp dir), where
//! a VM's disk and its mount options (`discard`) show.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{BenchFs, median, ms, pct, rounds, runtime};
use nvshim_testkit::{Artifacts, GlibcRootfs, NodeSpec, SimNode, runc_bundle};

struct Bundle {
    dir: PathBuf,
    spec: Vec<u8>,
    cache: Vec<u8>,
    /// Every path in the rootfs as built, to remove what a create added.
    image: BTreeSet<PathBuf>,
}

impl Bundle {
    fn new(dir: PathBuf, rootfs: &Path, env: &[&str]) -> Bundle {
        runc_bundle(&dir, rootfs, &["/bin/true"], env).unwrap();
        Bundle {
            spec: fs::read(dir.join("config.json")).unwrap(),
            cache: fs::read(dir.join("rootfs/etc/ld.so.cache")).unwrap(),
            image: tree(&dir.join("rootfs")).into_iter().collect(),
            dir,
        }
    }

    /// Puts back `config.json` and the rootfs's `ld.so.cache` as new files, the way
    /// an engine writes a new bundle and an image supplies the cache (see the module
    /// docs for why not by overwriting them).
    fn reset(&self) {
        // The driver's symlinks the last create made (deepest first, for directories).
        for path in tree(&self.dir.join("rootfs")).iter().rev() {
            if !self.image.contains(path) {
                if fs::symlink_metadata(path).unwrap().is_dir() {
                    fs::remove_dir(path).unwrap();
                } else {
                    fs::remove_file(path).unwrap();
                }
            }
        }
        for (path, bytes) in [
            (self.dir.join("config.json"), &self.spec),
            (self.dir.join("rootfs/etc/ld.so.cache"), &self.cache),
        ] {
            fs::remove_file(&path).unwrap();
            fs::write(&path, bytes).unwrap();
        }
    }
}

/// What a create through our runtime leaves in a bundle, to hand to runc alone.
struct Produced {
    spec: Vec<u8>,
    cache: Vec<u8>,
    /// What it added to the rootfs, parents before children.
    added: Vec<(PathBuf, Added)>,
}

enum Added {
    Dir,
    Link(PathBuf),
    File(Vec<u8>),
}

impl Bundle {
    /// The bundle as it is now (after our runtime rewrote it).
    fn produced(&self) -> Produced {
        let added = tree(&self.dir.join("rootfs"))
            .into_iter()
            .filter(|p| !self.image.contains(p))
            .map(|p| {
                let meta = fs::symlink_metadata(&p).unwrap();
                let what = if meta.is_symlink() {
                    Added::Link(fs::read_link(&p).unwrap())
                } else if meta.is_dir() {
                    Added::Dir
                } else {
                    Added::File(fs::read(&p).unwrap())
                };
                (p, what)
            })
            .collect();
        Produced {
            spec: fs::read(self.dir.join("config.json")).unwrap(),
            cache: fs::read(self.dir.join("rootfs/etc/ld.so.cache")).unwrap(),
            added,
        }
    }

    /// Puts the bundle in the `produced` state, files written as new ones (as [`Bundle::reset`]).
    fn set(&self, produced: &Produced) {
        self.reset();
        for (path, bytes) in [
            (self.dir.join("config.json"), &produced.spec),
            (self.dir.join("rootfs/etc/ld.so.cache"), &produced.cache),
        ] {
            fs::remove_file(&path).unwrap();
            fs::write(&path, bytes).unwrap();
        }
        for (path, what) in &produced.added {
            match what {
                Added::Dir => fs::create_dir(path).unwrap(),
                Added::Link(target) => std::os::unix::fs::symlink(target, path).unwrap(),
                Added::File(bytes) => fs::write(path, bytes).unwrap(),
            }
        }
    }
}

/// Every path under `dir`, parents before children.
fn tree(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut entries: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        out.push(path.clone());
        if fs::symlink_metadata(&path).unwrap().is_dir() {
            out.extend(tree(&path));
        }
    }
    out
}

fn config(dir: &Path, node: &SimNode, runtime: &str, name: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, node.runtime_config(runtime, None)).unwrap();
    path
}

fn time(cmd: &mut Command) -> Duration {
    let start = Instant::now();
    let status = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    let took = start.elapsed();
    assert!(status.success(), "{cmd:?} failed");
    took
}

fn main() {
    if !fs::metadata("/proc/self").is_ok_and(|m| std::os::unix::fs::MetadataExt::uid(&m) == 0) {
        eprintln!("bench create: run as root (mknod, runc)");
        std::process::exit(1);
    }
    let artifacts = Artifacts::locate().unwrap();
    measure(&BenchFs::new(), &artifacts);
    println!();
    measure(&BenchFs::on_host(), &artifacts);
}

fn measure(bench_fs: &BenchFs, artifacts: &Artifacts) {
    let dir = bench_fs.data.as_path();
    let node = SimNode::build(&NodeSpec::standard(8), &dir.join("node"), artifacts).unwrap();
    let rootfs = dir.join("rootfs");
    GlibcRootfs::new()
        .libraries_for(node.driver_root.join("usr/bin/nvidia-smi"))
        .build(&rootfs)
        .unwrap();
    let gpu = Bundle::new(
        dir.join("gpu"),
        &rootfs,
        &[
            "NVIDIA_VISIBLE_DEVICES=all",
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        ],
    );
    let plain = Bundle::new(dir.join("plain"), &rootfs, &[]);
    let with_runc = config(dir, &node, "runc", "runc.toml");
    let with_true = config(dir, &node, "/bin/true", "true.toml");
    let root = bench_fs.run.join("runc-root");

    let create = |program: &str, config: &Path, bundle: &Bundle, id: &str| {
        let mut cmd = Command::new(program);
        cmd.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
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
            .status();
    };

    let runtime = runtime();
    let runtime = runtime.as_str();
    // Our runtime's plan for the GPU bundle, as runc receives it.
    gpu.reset();
    time(&mut create(runtime, &with_true, &gpu, "produce"));
    let produced = gpu.produced();

    let names = [
        "runc create, GPU bundle (no injection)",
        "nvidia-container-runtime create, 8 GPUs",
        "runc create, our runtime's spec (8 GPUs)",
        "runc create, no-GPU bundle",
        "nvidia-container-runtime create, no GPU",
        "nvidia-container-runtime → /bin/true, 8 GPUs",
        "nvidia-container-runtime → /bin/true, no GPU",
        "/bin/true alone",
    ];
    let mut samples: Vec<Vec<Duration>> = vec![Vec::new(); names.len()];
    let n = rounds(41);
    // Runs `first` and `second` back to back, in swapped order every other round, so
    // neither always pays for the other's clean-up (runc's delete finishes some of its
    // work after it returns).
    let pair = |round: usize, first: &dyn Fn() -> Duration, second: &dyn Fn() -> Duration| {
        if round.is_multiple_of(2) {
            let a = first();
            (a, second())
        } else {
            let b = second();
            (first(), b)
        }
    };
    let timed_create = |program: &str, bundle: &Bundle, id: &str| {
        if bundle.dir == gpu.dir {
            gpu.reset();
        }
        let d = time(&mut create(program, &with_runc, bundle, id));
        delete(id);
        d
    };
    let timed_produced = || {
        gpu.set(&produced);
        let d = time(&mut create("runc", &with_runc, &gpu, "runc-ours"));
        delete("runc-ours");
        d
    };
    for round in 0..=n {
        // The three GPU rows in a rotating order, like the no-op rows below.
        let mut gpu_rows = [Duration::ZERO; 3];
        for k in 0..3 {
            let row = (k + round) % 3;
            gpu_rows[row] = match row {
                0 => timed_create("runc", &gpu, "runc-gpu"),
                1 => timed_create(runtime, &gpu, "ours-gpu"),
                _ => timed_produced(),
            };
        }
        let [a, b, h] = gpu_rows;
        let (c, d) = pair(
            round,
            &|| timed_create("runc", &plain, "runc-plain"),
            &|| timed_create(runtime, &plain, "ours-plain"),
        );
        // The three no-op rows run in a rotating order: the first one after runc's
        // deletes pays for the clean-up runc leaves to the kernel (about 0.8 ms here),
        // so a fixed order would charge it to one row every time.
        let mut own = [Duration::ZERO; 3];
        for k in 0..3 {
            let row = (k + round) % 3;
            own[row] = match row {
                0 => {
                    gpu.reset();
                    time(&mut create(runtime, &with_true, &gpu, "noop"))
                }
                1 => time(&mut create(runtime, &with_true, &plain, "noop-plain")),
                _ => time(&mut Command::new("/bin/true")),
            };
        }
        let [e, f, g] = own;
        // The first round warms caches and is not counted.
        if round > 0 {
            for (s, v) in samples.iter_mut().zip([a, b, h, c, d, e, f, g]) {
                s.push(v);
            }
        }
    }

    let medians: Vec<Duration> = samples.iter().map(|s| median(s)).collect();
    println!("create, {n} interleaved rounds, simulated 8-GPU node (compute,utility)");
    println!("runtime: {runtime}");
    println!("{}\n", bench_fs.describe);
    println!(
        "| {:<46} | {:>9} | {:>9} | {:>9} |",
        "what", "median", "p10", "p90"
    );
    println!("| {:-<46} | {:->9} | {:->9} | {:->9} |", "", "", "", "");
    for (i, name) in names.iter().enumerate() {
        println!(
            "| {:<46} | {:>9} | {:>9} | {:>9} |",
            name,
            ms(medians[i]),
            ms(pct(&samples[i], 10)),
            ms(pct(&samples[i], 90))
        );
    }
    // Paired per round (the two runs of a pair are back to back, so a slow spell of the
    // machine hits both), then the median over rounds: steadier than a ratio of medians
    // when the machine is noisy.
    let paired = |ours: usize, base: usize, f: &dyn Fn(Duration, Duration) -> f64| {
        let mut v: Vec<f64> = samples[ours]
            .iter()
            .zip(&samples[base])
            .map(|(o, b)| f(*o, *b))
            .collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let ratio = |o: Duration, b: Duration| o.as_secs_f64() / b.as_secs_f64();
    let minus = |o: Duration, b: Duration| (o.as_secs_f64() - b.as_secs_f64()) * 1e3;
    println!();
    println!("medians of per-round pairs:");
    println!(
        "GPU create vs runc:      {:.3}x (target <= 1.15x)",
        paired(1, 0, &ratio)
    );
    println!(
        "runc on our spec vs runc: {:.3}x (runc's own work on our plan)",
        paired(2, 0, &ratio)
    );
    println!(
        "GPU create vs runc on our spec: {:.3}x (ours on top of that)",
        paired(1, 2, &ratio)
    );
    println!(
        "non-GPU create vs runc:  {:.3}x measured directly (target <= 1.02x)",
        paired(4, 3, &ratio)
    );
    let plain_cost = paired(6, 7, &minus);
    println!(
        "non-GPU added work:      {plain_cost:.2} ms (runtime → true, minus true alone) = {:.3}x of runc's median no-GPU create",
        1.0 + plain_cost / (medians[3].as_secs_f64() * 1e3)
    );
    println!(
        "own work (8 GPUs):       {:.2} ms (runtime → true, minus true alone; target <= 2 ms)",
        paired(5, 7, &minus)
    );
}

//! What the process benchmarks (`create`, `hook`) share: which runtime binary, how many
//! rounds, and the statistics they print.

#![allow(dead_code)]

use std::fs;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

/// `$NVSHIM_BENCH_RUNTIME` (`make bench` sets it to the static build packages install)
/// or cargo's build of the runtime.
pub fn runtime() -> String {
    std::env::var("NVSHIM_BENCH_RUNTIME")
        .unwrap_or_else(|_| env!("CARGO_BIN_EXE_nvidia-container-runtime").to_string())
}

/// `$NVSHIM_BENCH_ROUNDS`, else `default`.
pub fn rounds(default: usize) -> usize {
    std::env::var("NVSHIM_BENCH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

pub fn median(v: &[Duration]) -> Duration {
    pct(v, 50)
}

/// The `p`th percentile (nearest rank below).
pub fn pct(v: &[Duration], p: usize) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v[(v.len() - 1) * p / 100]
}

pub fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Where a process benchmark keeps its files: an ext4 with a journal for the node, the
/// bundles and their rootfs (a GPU node's `/var/lib`), and a tmpfs for runc's state (its
/// `/run`), both mounted for the bench and unmounted when this is dropped.
///
/// Not the disk the bench runs from: CI's VMs have an ext4 without a journal, mounted
/// with `discard`. Without a journal, ext4 hands out a new inode only after skipping
/// every inode freed in the last few minutes, one inode-table lookup each; a bench that
/// creates and deletes containers hundreds of times makes that scan long, and every
/// file and symlink a create makes pays for it (0.1–0.2 ms per new inode here, most of
/// what a create then costs). Nodes run engines on journaled filesystems, where that
/// scan does not happen. `NVSHIM_BENCH_FS=host` keeps everything in a directory on the
/// disk the bench runs from instead, to compare.
pub struct BenchFs {
    /// The journaled ext4 (or the host directory).
    pub data: PathBuf,
    /// The tmpfs for runc's `--root` (or a directory beside `data`).
    pub run: PathBuf,
    /// What the table's header says about it.
    pub describe: String,
    mounts: Vec<PathBuf>,
    _tmp: tempfile::TempDir,
}

impl BenchFs {
    pub fn new() -> BenchFs {
        let mut bench = BenchFs::in_temp_dir();
        if std::env::var("NVSHIM_BENCH_FS").as_deref() == Ok("host") {
            bench.describe = "files on the host disk (NVSHIM_BENCH_FS=host)".into();
            return bench;
        }
        match bench.mount() {
            Ok(()) => {
                bench.describe =
                    "files on a journaled ext4 (loop device), runc state on a tmpfs".into();
            }
            Err(e) => {
                eprintln!("bench: cannot mount a journaled ext4 ({e}); using the host disk");
                bench.describe = format!("files on the host disk (no loop ext4: {e})");
            }
        }
        bench
    }

    /// Files in a temp dir on the machine's own disk, runc's state beside them: what a
    /// container start costs on this machine's file system and its mount options.
    pub fn on_host() -> BenchFs {
        let mut bench = BenchFs::in_temp_dir();
        bench.describe = format!(
            "files and runc state on the machine's own disk ({})",
            bench._tmp.path().display()
        );
        bench
    }

    /// `data/` and `run/` in a fresh temp dir, nothing mounted yet.
    fn in_temp_dir() -> BenchFs {
        let tmp = tempfile::tempdir().unwrap();
        let data = tmp.path().join("data");
        let run = tmp.path().join("run");
        fs::create_dir_all(&data).unwrap();
        fs::create_dir_all(&run).unwrap();
        BenchFs {
            data,
            run,
            describe: String::new(),
            mounts: Vec::new(),
            _tmp: tmp,
        }
    }

    fn mount(&mut self) -> Result<(), String> {
        let image = self._tmp.path().join("ext4.img");
        let file = fs::File::create(&image).map_err(|e| e.to_string())?;
        file.set_len(1 << 30).map_err(|e| e.to_string())?;
        run(Command::new("mkfs.ext4")
            .args([
                "-q",
                "-F",
                "-O",
                "has_journal",
                // Everything written now: no lazy-init thread writing during the runs.
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
            ])
            .arg(&image))?;
        run(Command::new("mount")
            .args(["-o", "loop"])
            .arg(&image)
            .arg(&self.data))?;
        self.mounts.push(self.data.clone());
        run(Command::new("mount")
            .args(["-t", "tmpfs", "-o", "mode=0700", "tmpfs"])
            .arg(&self.run))?;
        self.mounts.push(self.run.clone());
        Ok(())
    }
}

impl Drop for BenchFs {
    fn drop(&mut self) {
        for mount in self.mounts.iter().rev() {
            let _ = Command::new("umount").arg("-l").arg(mount).status();
        }
    }
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{cmd:?}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

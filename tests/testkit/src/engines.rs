// SPDX-License-Identifier: Apache-2.0
//! Private container engines for end-to-end tests: a `containerd` and a `dockerd` that live
//! entirely under a directory the test owns and never talk to the system's daemons.
//!
//! Each guard starts its daemon on its own sockets, state and data directories, waits until it
//! answers, and on drop stops it, kills whatever it left behind (containers, shims) and detaches
//! every mount left under its directory, so the test's temp dir can be removed.
//!
//! A missing tool is an error naming it: tests that need an engine fail, they never skip.
//!
//! Two things are still shared with the host: containerd's shims put their sockets in
//! `/run/containerd/s/` (named by a hash of the private address, so they never collide) and
//! `ctr run` puts containers in the cgroup `/<namespace>/<id>`: give containers unique ids.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::error::{TestkitError, io_err};
use crate::files;
use crate::rootfs::{MAX_SOCKET_PATH, describe, output, which};

/// How long a daemon gets to answer after it was started.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a daemon gets to exit after SIGTERM before it is killed.
const STOP_GRACE: Duration = Duration::from_secs(20);
/// How long a clean-up CLI call may take.
const CLI_TIMEOUT: Duration = Duration::from_secs(20);
/// How many log lines a start-up error quotes.
const LOG_TAIL_LINES: usize = 30;

/// A private `containerd` serving `<dir>/containerd.sock`, with its root, state and `opt` dirs
/// under `dir` and the CRI plugin disabled (or on a config file of the test's own, see
/// [`Containerd::start_with_config`]). The default snapshotter is left as is: `ctr run
/// --rootfs` needs none and dockerd keeps images in its own storage driver.
#[derive(Debug)]
pub struct Containerd {
    dir: PathBuf,
    address: PathBuf,
    ctr: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Containerd {
    /// Starts containerd in `dir` (created if missing) with this process's environment.
    pub fn start(dir: &Path) -> Result<Containerd, TestkitError> {
        Containerd::start_with_env(dir, &[])
    }

    /// Starts containerd with `env` added to its environment. Shims and the OCI runtimes they run
    /// inherit it, so this is how a runtime under test receives its variables.
    pub fn start_with_env(dir: &Path, env: &[(&str, &str)]) -> Result<Containerd, TestkitError> {
        let dir = canonical_dir(dir)?;
        let address = dir.join("containerd.sock");
        let config = dir.join("config.toml");
        files::write(&config, config_toml(&dir, &address), 0o644)?;
        Containerd::launch(dir, &config, &[], env)
    }

    /// Starts containerd on a config file the test wrote (e.g. one `nvshim configure
    /// containerd` edited), loaded as it is — the CRI plugin too, if the file enables it — except
    /// that `--root`, `--state` and `--address` keep containerd's own state and socket under
    /// `dir`. Other host paths the file names (the `opt` plugin's `path`, the CNI dirs) are the
    /// caller's to point into its temp dir first.
    pub fn start_with_config(
        dir: &Path,
        config: &Path,
        env: &[(&str, &str)],
    ) -> Result<Containerd, TestkitError> {
        Containerd::start_with_config_via(dir, config, env, &[])
    }

    /// [`Containerd::start_with_config`], with containerd started through `wrapper` (a program
    /// and its arguments, e.g. `nsenter -t <pid> -m --`): how a test puts containerd in the
    /// same private mount namespace as a kubelet, which hands it paths only that namespace
    /// shows. Every path given to containerd must be absolute: `nsenter -m` starts it in `/`.
    pub fn start_with_config_via(
        dir: &Path,
        config: &Path,
        env: &[(&str, &str)],
        wrapper: &[OsString],
    ) -> Result<Containerd, TestkitError> {
        let dir = canonical_dir(dir)?;
        let address = dir.join("containerd.sock");
        let overrides = [
            ("--root", dir.join("root")),
            ("--state", dir.join("state")),
            ("--address", address),
        ];
        Containerd::launch_via(dir, config, &overrides, env, wrapper)
    }

    fn launch(
        dir: PathBuf,
        config: &Path,
        flags: &[(&str, PathBuf)],
        env: &[(&str, &str)],
    ) -> Result<Containerd, TestkitError> {
        Containerd::launch_via(dir, config, flags, env, &[])
    }

    fn launch_via(
        dir: PathBuf,
        config: &Path,
        flags: &[(&str, PathBuf)],
        env: &[(&str, &str)],
        wrapper: &[OsString],
    ) -> Result<Containerd, TestkitError> {
        let containerd = which("containerd")?;
        let ctr = which("ctr")?;
        which("containerd-shim-runc-v2")?;
        let address = dir.join("containerd.sock");
        check_socket_path(&address, ".ttrpc".len())?;
        let log = dir.join("containerd.log");
        let mut cmd = match wrapper.split_first() {
            Some((program, args)) => {
                let mut cmd = Command::new(program);
                cmd.args(args).arg(containerd);
                cmd
            }
            None => Command::new(containerd),
        };
        cmd.arg("--config").arg(config);
        for (flag, value) in flags {
            cmd.arg(flag).arg(value);
        }
        cmd.envs(env.iter().copied());
        let child = spawn_logged(&mut cmd, &log)?;
        let mut guard = Containerd {
            dir,
            address,
            ctr,
            log,
            child: Some(child),
        };
        let probe = guard.ctr();
        wait_ready("containerd", &mut guard.child, &guard.log, probe)?;
        Ok(guard)
    }

    /// The gRPC socket.
    pub fn address(&self) -> &Path {
        &self.address
    }

    /// containerd's stdout and stderr.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// `ctr --address <socket>`; add the subcommand.
    pub fn ctr(&self) -> Command {
        let mut cmd = Command::new(&self.ctr);
        cmd.args(["--connect-timeout", "5s", "--address"])
            .arg(&self.address);
        cmd
    }

    /// `ctr … run` with the FIFOs and runc's state kept under this containerd's directory
    /// (`--fifo-dir`, `--runc-root`) instead of `/run/containerd`. ctr 1.6 wants every flag before
    /// the positional arguments and `--rootfs` is a switch, so append e.g.
    /// `["--rm", "--rootfs", "--runc-binary", runtime, "--env", "K=V", rootfs_dir, id, cmd…]`.
    pub fn ctr_run(&self) -> Command {
        let mut cmd = self.ctr();
        cmd.arg("run")
            .arg("--fifo-dir")
            .arg(self.dir.join("fifo"))
            .arg("--runc-root")
            .arg(self.dir.join("runc"));
        cmd
    }

    /// Force-deletes every task, stops the daemon, kills its shims and detaches what is still
    /// mounted under its directory. Runs once; drop calls it.
    fn shutdown(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        if matches!(child.try_wait(), Ok(None)) {
            self.delete_tasks();
        }
        terminate(&mut child);
        kill_processes_with_arg(&self.address.to_string_lossy(), "containerd-shim");
        unmount_under(&self.dir);
    }

    fn delete_tasks(&self) {
        for ns in words_printed(self.ctr().args(["namespaces", "ls", "-q"])) {
            let ids = words_printed(self.ctr().args(["-n", &ns, "tasks", "ls", "-q"]));
            let delete = ["-n", &ns, "tasks", "delete", "--force"];
            if !ids.is_empty() {
                output_within(self.ctr().args(delete).args(&ids));
            }
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// A private `dockerd` serving `<dir>/docker.sock`, backed by its own [`Containerd`] in
/// `<dir>/containerd` (dockerd would otherwise adopt a system containerd whose socket exists), with
/// data in `<dir>/data`, run state in `<dir>/exec` and no iptables or bridge.
#[derive(Debug)]
pub struct Dockerd {
    dir: PathBuf,
    /// `unix://<dir>/docker.sock`
    host: String,
    docker: PathBuf,
    log: PathBuf,
    storage_driver: String,
    child: Option<Child>,
    containerd: Containerd,
}

impl Dockerd {
    /// Starts dockerd in `dir` with `daemon_json` (an object) as its config file; see
    /// [`Dockerd::start_with_env`].
    pub fn start(dir: &Path, daemon_json: &serde_json::Value) -> Result<Dockerd, TestkitError> {
        Dockerd::start_with_env(dir, daemon_json, &[])
    }

    /// Starts dockerd and its containerd with `env` added to their environment: the runtime
    /// binaries registered in `daemon_json` (`"runtimes": {"nvidia": {"path": …}}`) inherit it,
    /// and dockerd offers `--gpus` only when `nvidia-container-runtime-hook` is on its `PATH`
    /// (see [`path_with_prefix`]). Unless `daemon_json` sets them, `iptables` and `ip6tables`
    /// become false, `bridge` `none`, and `storage-driver` `overlay2` where an overlay mount works
    /// in `dir`, else `vfs`. Ready in well under a second here; waits up to 30 s.
    pub fn start_with_env(
        dir: &Path,
        daemon_json: &serde_json::Value,
        env: &[(&str, &str)],
    ) -> Result<Dockerd, TestkitError> {
        let dockerd = which("dockerd")?;
        let docker = which("docker")?;
        which("runc")?;
        let dir = canonical_dir(dir)?;
        let socket = dir.join("docker.sock");
        check_socket_path(&socket, 0)?;
        let config_path = dir.join("daemon.json");
        let mut config = daemon_json.clone();
        let Some(object) = config.as_object_mut() else {
            return Err(TestkitError::InvalidSpec {
                what: format!("daemon.json must be a JSON object, not {daemon_json}"),
            });
        };
        object.entry("iptables").or_insert(false.into());
        object.entry("ip6tables").or_insert(false.into());
        object.entry("bridge").or_insert("none".into());
        let storage_driver = match object.get("storage-driver").and_then(|v| v.as_str()) {
            Some(driver) => driver.to_owned(),
            None => default_storage_driver(&dir).to_owned(),
        };
        object.insert("storage-driver".to_owned(), storage_driver.clone().into());
        files::write(&config_path, format!("{config:#}\n"), 0o644)?;

        let containerd = Containerd::start_with_env(&dir.join("containerd"), env)?;
        let log = dir.join("dockerd.log");
        let mut cmd = Command::new(dockerd);
        let host = format!("unix://{}", socket.display());
        for (flag, value) in [
            ("--config-file", config_path),
            ("--host", PathBuf::from(&host)),
            ("--data-root", dir.join("data")),
            ("--exec-root", dir.join("exec")),
            ("--pidfile", dir.join("docker.pid")),
            ("--containerd", containerd.address().to_path_buf()),
        ] {
            cmd.arg(flag).arg(value);
        }
        cmd.envs(env.iter().copied());
        let child = spawn_logged(&mut cmd, &log)?;
        let mut guard = Dockerd {
            dir,
            host,
            docker,
            log,
            storage_driver,
            child: Some(child),
            containerd,
        };
        let probe = guard.docker();
        wait_ready("dockerd", &mut guard.child, &guard.log, probe)?;
        Ok(guard)
    }

    /// `docker -H unix://<dir>/docker.sock`, with the CLI's config dir kept under `dir` too.
    pub fn docker(&self) -> Command {
        let mut cmd = Command::new(&self.docker);
        cmd.env("DOCKER_CONFIG", self.dir.join("cli"))
            .arg("-H")
            .arg(&self.host);
        cmd
    }

    /// `docker import <tar> <name>` (see [`crate::tar_rootfs`]); returns the new image id.
    pub fn import(&self, tar: &Path, name: &str) -> Result<String, TestkitError> {
        let mut cmd = self.docker();
        cmd.arg("import").arg(tar).arg(name);
        Ok(output(&mut cmd)?.trim().to_owned())
    }

    /// dockerd's stdout and stderr.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// The storage driver in use (`overlay2` or `vfs` unless the daemon.json chose).
    pub fn storage_driver(&self) -> &str {
        &self.storage_driver
    }

    /// The private containerd behind this dockerd (namespace `moby`).
    pub fn containerd(&self) -> &Containerd {
        &self.containerd
    }
}

impl Drop for Dockerd {
    /// Removes all containers with `docker rm -f` (a SIGTERM-deaf PID 1 would otherwise hold
    /// shutdown for 10 s), stops dockerd, then its containerd, then detaches leftover mounts.
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let ids = words_printed(self.docker().args(["ps", "-aq"]));
            if !ids.is_empty() {
                output_within(self.docker().args(["rm", "-f"]).args(&ids));
            }
            terminate(&mut child);
        }
        self.containerd.shutdown();
        unmount_under(&self.dir);
    }
}

/// `PATH` for a daemon: `dir` first, then this process's `PATH`.
pub fn path_with_prefix(dir: &Path) -> OsString {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::iter::once(dir.to_path_buf()).chain(std::env::split_paths(&current));
    std::env::join_paths(dirs).unwrap_or(current)
}

fn canonical_dir(dir: &Path) -> Result<PathBuf, TestkitError> {
    files::mkdir_all(dir)?;
    dir.canonicalize().map_err(io_err("resolving", dir))
}

fn check_socket_path(path: &Path, suffix: usize) -> Result<(), TestkitError> {
    let max = MAX_SOCKET_PATH - suffix;
    if path.as_os_str().len() > max {
        return Err(TestkitError::SocketPathTooLong {
            path: path.to_path_buf(),
            max,
        });
    }
    Ok(())
}

fn config_toml(dir: &Path, address: &Path) -> String {
    // Rust's debug quoting matches TOML's basic strings for any path a test uses.
    let quote = |p: &Path| format!("{:?}", p.to_string_lossy());
    format!(
        "version = 2\nroot = {}\nstate = {}\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\n\
         [grpc]\n  address = {}\n\n[plugins.\"io.containerd.internal.v1.opt\"]\n  path = {}\n",
        quote(&dir.join("root")),
        quote(&dir.join("state")),
        quote(address),
        quote(&dir.join("opt")),
    )
}

/// Starts `cmd` with stdin closed and stdout and stderr appended to `log`.
fn spawn_logged(cmd: &mut Command, log: &Path) -> Result<Child, TestkitError> {
    let file = File::create(log).map_err(io_err("creating", log))?;
    let err = file.try_clone().map_err(io_err("duplicating", log))?;
    cmd.stdin(Stdio::null()).stdout(file).stderr(err);
    cmd.spawn().map_err(|source| TestkitError::Spawn {
        command: describe(cmd),
        source,
    })
}

/// Runs `<probe> version` until it succeeds, failing early if the daemon exits and after
/// [`READY_TIMEOUT`].
fn wait_ready(
    engine: &'static str,
    child: &mut Option<Child>,
    log: &Path,
    mut probe: Command,
) -> Result<(), TestkitError> {
    let start = Instant::now();
    probe.arg("version");
    while output_within(&mut probe).is_none() {
        let exited = child.as_mut().and_then(|c| c.try_wait().ok().flatten());
        if exited.is_some() || start.elapsed() > READY_TIMEOUT {
            let status = exited.map(|s| format!("\n({engine} exited: {s})"));
            let tail = log_tail(log) + &status.unwrap_or_default();
            return Err(TestkitError::EngineStart {
                engine,
                waited_s: start.elapsed().as_secs(),
                log: log.to_path_buf(),
                tail,
            });
        }
        sleep(Duration::from_millis(50));
    }
    Ok(())
}

fn log_tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// The words `cmd` prints, if it succeeds within [`CLI_TIMEOUT`]; none otherwise.
fn words_printed(cmd: &mut Command) -> Vec<String> {
    let text = output_within(cmd).unwrap_or_default();
    text.split_whitespace().map(str::to_owned).collect()
}

/// Runs `cmd` and returns its stdout if it succeeds within [`CLI_TIMEOUT`]; kills it otherwise.
/// For commands with short output: the pipe is read only once the command has exited.
fn output_within(cmd: &mut Command) -> Option<String> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    if !exited_within(&mut child, CLI_TIMEOUT) {
        kill_and_reap(&mut child);
        return None;
    }
    let status = child.wait().ok()?;
    let mut text = String::new();
    child.stdout.take()?.read_to_string(&mut text).ok()?;
    status.success().then_some(text)
}

/// Polls `child` until it exits or `timeout` passes; true if it exited.
fn exited_within(child: &mut Child, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    loop {
        if !matches!(child.try_wait(), Ok(None)) {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        sleep(Duration::from_millis(20));
    }
}

fn kill_and_reap(child: &mut Child) {
    let _ = child.kill();
    let _ = child.wait();
}

/// SIGTERM, up to [`STOP_GRACE`] to exit, then SIGKILL; always reaps.
fn terminate(child: &mut Child) {
    if let Ok(pid) = i32::try_from(child.id())
        && !exited_within(child, Duration::ZERO)
    {
        let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
    }
    if !exited_within(child, STOP_GRACE) {
        kill_and_reap(child);
    }
}

/// SIGKILLs every process whose program name starts with `program` and which has `arg` as one of
/// its arguments: containerd's shims, found by the private `-address` they were given.
fn kill_processes_with_arg(arg: &str, program: &str) {
    let Ok(entries) = fs::read_dir("/proc") else {
        return;
    };
    for entry in entries.flatten() {
        let pid = entry.file_name().to_str().and_then(|s| s.parse().ok());
        let cmdline = fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let mut args = cmdline.split(|b| *b == 0).map(String::from_utf8_lossy);
        let is_program = args.next().is_some_and(|argv0| {
            Path::new(argv0.as_ref())
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(program))
        });
        if let Some(pid) = pid.filter(|_| is_program && args.any(|a| a == arg)) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Detaches every mount at or below `dir`, deepest first, until none is left (a few passes at
/// most: detaching a parent can reveal nothing new, but mounts may race with exiting daemons).
fn unmount_under(dir: &Path) {
    for _ in 0..5 {
        let Ok(text) = fs::read_to_string("/proc/self/mountinfo") else {
            return;
        };
        let points: BTreeSet<(usize, PathBuf)> = text
            .lines()
            .filter_map(|line| line.split(' ').nth(4))
            .map(unescape_mountinfo)
            .filter(|p| p.starts_with(dir))
            .map(|p| (usize::MAX - p.components().count(), p))
            .collect();
        if points.is_empty() {
            return;
        }
        for (_, point) in points {
            let _ = umount2(&point, MntFlags::MNT_DETACH);
        }
    }
}

/// Undoes mountinfo's escapes: the kernel writes space, tab, newline and backslash in octal.
fn unescape_mountinfo(field: &str) -> PathBuf {
    let text = field.replace("\\040", " ").replace("\\011", "\t");
    PathBuf::from(text.replace("\\012", "\n").replace("\\134", "\\"))
}

/// `overlay2` if an overlay filesystem can be mounted with its layers in `dir` (it cannot on top
/// of another overlay, for instance), else `vfs`.
fn default_storage_driver(dir: &Path) -> &'static str {
    let probe = dir.join("overlay-probe");
    let layers = ["lower", "upper", "work", "merged"].map(|name| probe.join(name));
    let made = layers.iter().all(|d| fs::create_dir_all(d).is_ok());
    let [lower, upper, work, merged] = &layers;
    let options = format!(
        "lowerdir={},upperdir={},workdir={}",
        lower.display(),
        upper.display(),
        work.display()
    );
    let flags = MsFlags::empty();
    let works = made
        && mount(
            Some("overlay"),
            merged,
            Some("overlay"),
            flags,
            Some(&*options),
        )
        .is_ok();
    if works {
        let _ = umount2(merged, MntFlags::MNT_DETACH);
    }
    let _ = fs::remove_dir_all(&probe);
    if works { "overlay2" } else { "vfs" }
}

// SPDX-License-Identifier: Apache-2.0
//! The containers that still run through the toolkit's runtime, found where containerd's
//! runc shim keeps each container's options, and the undo's bounded wait for them to go.
//!
//! containerd-shim-runc-v2 does not keep the runtime binary in memory only: to kill and
//! to delete a container it execs the binary its options name (`BinaryName`, our
//! `<toolkit>/nvidia-container-runtime` for a container of the runtime class), which it
//! writes into the container's bundle, `<state>/io.containerd.runtime.v2.task/<namespace>/<id>/`:
//! `options.json` (containerd's runc `Options` as JSON, the binary under `binary_name`)
//! and, for older shims only, the plain file `runtime`. Remove the binary while such a
//! container exists and it can never be stopped (kubelet: `fork/exec …: no such file or
//! directory`, the pod Terminating for good). So the undo takes the binaries out only
//! once no bundle names one; this module only reads, it never removes anything.
//!
//! CRI-O goes further: it stops a container through the runtime handler the container was
//! created with, looked up in its config by name, so once the undo has removed the handler
//! and restarted CRI-O such a container cannot be stopped either ("failed to find runtime
//! handler nvidia"). Its containers are found by their monitor: each has a `conmon` whose
//! command line names the container (`-c`) and the runtime binary (`-r`); with the host's
//! PIDs (the installer pod has `hostPID`), [`conmon_holders`] reads them from `/proc`.

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cli::configure::under_root;

/// How long the daemon's undo (and `nvshim uninstall`) waits, from its start, for the
/// containers that use the runtime to go before it gives up and leaves the binaries.
/// The chart gives the installer pod `terminationGracePeriodSeconds: 120`
/// (deployments/helm/nvshim/templates/installer.yaml, and the kustomize component's
/// installer.yaml): the files, the engine's restart and this wait get 90 s of it, and the
/// rest is left for removing the binaries before kubelet's SIGKILL. During an uninstall
/// of the chart the other GPU pods stop within seconds once their runtime can run.
pub const DRAIN_BOUND: Duration = Duration::from_secs(90);
/// How often the bundles are looked at again while waiting.
pub const POLL: Duration = Duration::from_millis(500);

/// containerd's task plugin: its state directory holds the shims' bundles.
pub const TASK_PLUGIN: &str = "io.containerd.runtime.v2.task";
/// The task state directories looked at on every host (host paths): containerd's
/// default (containerd 1.x and 2.x, and docker on the system containerd, namespace
/// `moby`), and the one of dockerd's own containerd.
pub const TASK_DIRS: [&str; 2] = [
    "/run/containerd/io.containerd.runtime.v2.task",
    "/run/docker/containerd/daemon/io.containerd.runtime.v2.task",
];
/// The shim's options in a bundle (containerd's `runc.WriteOptions`).
pub const OPTIONS_FILE: &str = "options.json";
/// The binary alone, as a plain string (`runc.WriteRuntime`); shims written before
/// `options.json` existed have only this one.
pub const RUNTIME_FILE: &str = "runtime";
/// containerd's socket in its state directory (`<state>/containerd.sock`).
const CONTAINERD_SOCKET: &str = "containerd.sock";

/// The task directories to look at (host paths): [`TASK_DIRS`], and the one beside each
/// of `sockets` that is a containerd socket (k3s and RKE2 run containerd with the state
/// directory `/run/k3s/containerd`).
pub fn task_dirs<'a>(sockets: impl IntoIterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = TASK_DIRS.iter().map(PathBuf::from).collect();
    for socket in sockets {
        if socket.file_name().is_some_and(|n| n == CONTAINERD_SOCKET)
            && let Some(state) = socket.parent()
        {
            let dir = state.join(TASK_PLUGIN);
            if !dirs.contains(&dir) {
                dirs.push(dir);
            }
        }
    }
    dirs
}

/// The ids of the containers whose shim runs a binary in `toolkit` (a host path: the
/// stable names, `current/…`, `versions/…`), from the bundles under `task_dirs` (host
/// paths) under `host_root`; sorted, each once. A bundle whose options cannot be read
/// (gone meanwhile, or not JSON) counts as gone.
pub fn holders(host_root: &Path, toolkit: &Path, task_dirs: &[PathBuf]) -> Vec<String> {
    let mut ids = Vec::new();
    for dir in task_dirs {
        let here = under_root(host_root, dir);
        for namespace in subdirs(&here) {
            for bundle in subdirs(&namespace) {
                if binary(&bundle).is_some_and(|b| Path::new(&b).starts_with(toolkit))
                    && let Some(id) = bundle.file_name()
                {
                    ids.push(id.to_string_lossy().into_owned());
                }
            }
        }
    }
    ids.sort();
    ids.dedup();
    ids
}

/// The directories in `dir`; none when it cannot be read.
fn subdirs(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .collect()
}

/// The runtime binary the shim of `bundle` runs: `options.json`'s when the file is
/// there (an empty name is the shim's default, runc), else the `runtime` file's.
fn binary(bundle: &Path) -> Option<String> {
    match fs::read(bundle.join(OPTIONS_FILE)) {
        Ok(bytes) => options_binary(&bytes),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let text = fs::read_to_string(bundle.join(RUNTIME_FILE)).ok()?;
            let name = text.trim();
            (!name.is_empty()).then(|| name.to_owned())
        }
        Err(_) => None,
    }
}

/// `binary_name` of the shim's options (Go's JSON of containerd's runc `Options`
/// protobuf: proto field names, empty fields left out); `None` when it is empty or the
/// bytes are not such an object.
pub fn options_binary(bytes: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Options {
        #[serde(default)]
        binary_name: String,
    }
    let options: Options = serde_json::from_slice(bytes).ok()?;
    (!options.binary_name.is_empty()).then_some(options.binary_name)
}

/// The ids of the CRI-O containers whose monitor (`conmon`, under `proc`) runs a binary in
/// `toolkit`; sorted, each once. A process gone meanwhile counts as gone.
pub fn conmon_holders(proc: &Path, toolkit: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(proc) else {
        return Vec::new();
    };
    let mut ids: Vec<String> = entries
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .bytes()
                .all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| fs::read(e.path().join("cmdline")).ok())
        .filter_map(|cmdline| conmon_container(&cmdline))
        .filter(|(_, runtime)| Path::new(runtime).starts_with(toolkit))
        .map(|(id, _)| id)
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// `(container id, runtime binary)` from a process's `cmdline` (NUL-separated) when it is
/// CRI-O's `conmon` (`-c`/`--cid ID`, `-r`/`--runtime PATH`, each also as `--flag=value`).
pub fn conmon_container(cmdline: &[u8]) -> Option<(String, String)> {
    let mut args = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(String::from_utf8_lossy);
    let program = args.next()?;
    if Path::new(program.as_ref()).file_name()? != "conmon" {
        return None;
    }
    let (mut id, mut runtime) = (None, None);
    while let Some(arg) = args.next() {
        let (flag, inline) = match arg.split_once('=') {
            Some((f, v)) if f.starts_with("--") => (f.to_owned(), Some(v.to_owned())),
            _ => (arg.into_owned(), None),
        };
        let slot = match flag.as_str() {
            "-c" | "--cid" => &mut id,
            "-r" | "--runtime" => &mut runtime,
            _ => continue,
        };
        *slot = inline.or_else(|| args.next().map(|v| v.into_owned()));
    }
    Some((id?, runtime?))
}

/// How the wait ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drained {
    /// No container uses the toolkit now; `held`: how many did at the first look (0:
    /// none, no wait), `waited`: for how long.
    Gone { held: usize, waited: Duration },
    /// The deadline came with these containers (ids) still using it.
    Held(Vec<String>),
    /// `taken_over` said so: another install or undo owns the toolkit now.
    TakenOver,
}

/// Looks at the bundles every [`POLL`] until none names a binary in `toolkit`, until
/// `deadline`, or until `taken_over` says another install owns the toolkit now (it is
/// asked before each look). Logs one warning when it starts to wait.
pub fn wait(
    host_root: &Path,
    toolkit: &Path,
    task_dirs: &[PathBuf],
    deadline: Instant,
    taken_over: &mut dyn FnMut() -> bool,
) -> Drained {
    wait_for(
        &mut || holders(host_root, toolkit, task_dirs),
        toolkit,
        deadline,
        taken_over,
    )
}

/// [`wait`] with the holders found by `holders` (containerd's bundles, CRI-O's monitors).
pub fn wait_for(
    holders: &mut dyn FnMut() -> Vec<String>,
    toolkit: &Path,
    deadline: Instant,
    taken_over: &mut dyn FnMut() -> bool,
) -> Drained {
    let start = Instant::now();
    let mut held = 0;
    loop {
        if taken_over() {
            return Drained::TakenOver;
        }
        let ids = holders();
        if ids.is_empty() {
            return Drained::Gone {
                held,
                waited: start.elapsed(),
            };
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Drained::Held(ids);
        }
        if held == 0 {
            held = ids.len();
            // A warning, so that the default filter shows it: the undo is held up.
            tracing::warn!(
                containers = held,
                toolkit = %toolkit.display(),
                "waiting up to {:.0}s for the containers that run through the runtime to go before removing it",
                left.as_secs_f64()
            );
        }
        std::thread::sleep(left.min(POLL));
    }
}

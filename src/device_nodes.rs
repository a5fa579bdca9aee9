//! NVIDIA's device nodes on the host, outside any container: which exist or could
//! exist, creating the control nodes, loading the kernel modules, and the
//! `/dev/char/<major>:<minor>` links that `nvidia-ctk system create-dev-char-symlinks`
//! makes.
//!
//! Why the links: with the systemd cgroup driver, runc hands the container's device
//! rules to systemd as `DeviceAllow=/dev/char/<major>:<minor>` entries, and an entry
//! whose path does not resolve is dropped (runc 1.1.3–1.1.6 skip it, systemd before
//! v240 `stat`s it). udev makes these links for most drivers, but the NVIDIA driver
//! creates its nodes itself, so none exist; on the next `systemctl daemon-reload`
//! systemd rebuilds the cgroup's device list without the GPUs and the container sees
//! "Failed to initialize NVML: Unknown Error" (NVIDIA container toolkit issue 48).
//!
//! Every function takes its roots (the directory holding `dev/`, the one holding
//! `proc/`, the link directory); nothing here assumes the host's `/dev`. The module
//! never prints: callers get what was done (or would be, with `dry_run`) and report it.

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

mod imex;

pub use imex::{IMEX_MAJOR_NAME, create_imex_channels};

use crate::discover::parse_mig_minors;
use crate::discover::table::MIG_MINORS;
use crate::roots::Roots;

/// `/proc/devices` names of the character majors we need.
const GPU_MAJOR_NAMES: &[&str] = &["nvidia-frontend", "nvidia"];
const UVM_MAJOR_NAME: &str = "nvidia-uvm";
const CAPS_MAJOR_NAME: &str = "nvidia-caps";
/// The control minors on the GPU major (the driver's fixed numbers).
pub const NVIDIACTL_MINOR: u32 = 255;
pub const NVIDIA_MODESET_MINOR: u32 = 254;
/// The kernel modules `--load-kernel-modules` loads, in NVIDIA's order.
pub const KERNEL_MODULES: &[&str] = &["nvidia", "nvidia-uvm", "nvidia-modeset"];

/// One character device node: where it is on the host and its numbers.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Node {
    pub path: PathBuf,
    pub major: u32,
    pub minor: u32,
}

impl Node {
    /// `<major>:<minor>`: the node's name under `/dev/char`.
    pub fn dev_char_name(&self) -> String {
        format!("{}:{}", self.major, self.minor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceNodesError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "no NVIDIA character major in {} (looked for {}): is the nvidia kernel module loaded? \
         (--load-kernel-modules loads it)",
        path.display(),
        names.join(", ")
    )]
    NoMajor { path: PathBuf, names: Vec<String> },
    #[error("cannot list the GPUs")]
    Inventory(#[source] crate::inventory::InventoryError),
    #[error("cannot create {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{} exists and is not the character device {expected}", path.display())]
    NotTheNode { path: PathBuf, expected: String },
    #[error("cannot link {} to {}: {source}", link.display(), target.display())]
    Link {
        link: PathBuf,
        target: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("cannot load kernel module {module}: {reason}")]
    Module { module: String, reason: String },
}

fn read_err(path: &Path) -> impl FnOnce(io::Error) -> DeviceNodesError + '_ {
    move |source| DeviceNodesError::Read {
        path: path.to_path_buf(),
        source,
    }
}

/// The character majors of `/proc/devices` text: `(major, name)` pairs.
pub fn parse_proc_devices(text: &str) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let mut in_char = false;
    for line in text.lines() {
        let line = line.trim();
        if line.ends_with(':') {
            in_char = line == "Character devices:";
            continue;
        }
        if !in_char {
            continue;
        }
        if let Some((major, name)) = line.split_once(char::is_whitespace)
            && let Ok(major) = major.parse()
        {
            out.push((major, name.trim().to_owned()));
        }
    }
    out
}

/// The NVIDIA majors a host has, read from `<proc_root>/proc/devices`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Majors {
    pub gpu: u32,
    pub uvm: Option<u32>,
    pub caps: Option<u32>,
}

pub fn majors(proc_root: &Path) -> Result<Majors, DeviceNodesError> {
    let path = proc_root.join("proc/devices");
    let text = crate::files::read_to_string(&path).map_err(read_err(&path))?;
    let table = parse_proc_devices(&text);
    let find = |name: &str| table.iter().find(|(_, n)| n == name).map(|(m, _)| *m);
    let gpu = GPU_MAJOR_NAMES
        .iter()
        .find_map(|name| find(name))
        .ok_or_else(|| DeviceNodesError::NoMajor {
            path: path.clone(),
            names: GPU_MAJOR_NAMES.iter().map(|s| (*s).to_owned()).collect(),
        })?;
    Ok(Majors {
        gpu,
        uvm: find(UVM_MAJOR_NAME),
        caps: find(CAPS_MAJOR_NAME),
    })
}

/// The NVIDIA character devices that exist under `<dev_root>/dev`: `nvidia*` and
/// `nvidia-caps/nvidia-cap*`, numbers from `lstat` (a symlink is not a node).
pub fn existing(dev_root: &Path) -> Result<Vec<Node>, DeviceNodesError> {
    let dev = dev_root.join("dev");
    let mut nodes = Vec::new();
    scan(&dev, "nvidia", &mut nodes)?;
    let caps = dev.join("nvidia-caps");
    if caps.is_dir() {
        scan(&caps, "nvidia-cap", &mut nodes)?;
    }
    nodes.sort();
    Ok(nodes)
}

fn scan(dir: &Path, prefix: &str, out: &mut Vec<Node>) -> Result<(), DeviceNodesError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(read_err(dir)(e)),
    };
    for entry in entries {
        let entry = entry.map_err(read_err(dir))?;
        if !entry.file_name().to_string_lossy().starts_with(prefix) {
            continue;
        }
        let path = entry.path();
        let meta = fs::symlink_metadata(&path).map_err(read_err(&path))?;
        if meta.file_type().is_char_device() {
            out.push(Node {
                major: nix::sys::stat::major(meta.rdev()) as u32,
                minor: nix::sys::stat::minor(meta.rdev()) as u32,
                path,
            });
        }
    }
    Ok(())
}

/// What [`all_possible`] found, and what it had to leave out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Possible {
    pub nodes: Vec<Node>,
    /// Nodes left out, with why (a module whose major `/proc/devices` does not list).
    pub skipped: Vec<String>,
}

/// The control nodes under `<dev_root>/dev`, by the host's majors.
pub fn control_nodes(dev_root: &Path, majors: &Majors) -> (Vec<Node>, Vec<String>) {
    let dev = dev_root.join("dev");
    let node = |name: &str, major, minor| Node {
        path: dev.join(name),
        major,
        minor,
    };
    let mut nodes = vec![
        node("nvidiactl", majors.gpu, NVIDIACTL_MINOR),
        node("nvidia-modeset", majors.gpu, NVIDIA_MODESET_MINOR),
    ];
    let mut skipped = Vec::new();
    match majors.uvm {
        Some(uvm) => {
            nodes.push(node("nvidia-uvm", uvm, 0));
            nodes.push(node("nvidia-uvm-tools", uvm, 1));
        }
        None => skipped.push(format!(
            "nvidia-uvm and nvidia-uvm-tools: no {UVM_MAJOR_NAME} major in /proc/devices \
             (the nvidia-uvm module is not loaded)"
        )),
    }
    (nodes, skipped)
}

/// Every node the driver could create for this host's GPUs, whether it exists yet or
/// not: the control nodes, `nvidia<minor>` for each GPU `/proc/driver/nvidia/gpus`
/// lists, and the MIG capability nodes `mig-minors` lists for those GPUs. (NVIDIA's
/// counts PCI devices and assumes minors 0..n; the driver's own minors are exact.)
pub fn all_possible(dev_root: &Path, proc_root: &Path) -> Result<Possible, DeviceNodesError> {
    let majors = majors(proc_root)?;
    let (mut nodes, mut skipped) = control_nodes(dev_root, &majors);
    let roots = Roots {
        driver: PathBuf::from("/"),
        dev: dev_root.to_path_buf(),
        proc: proc_root.to_path_buf(),
    };
    let inventory = crate::inventory::procfs::load(&roots).map_err(DeviceNodesError::Inventory)?;
    let dev = dev_root.join("dev");
    let minors: Vec<u32> = inventory.gpus.iter().map(|g| g.minor).collect();
    for minor in &minors {
        nodes.push(Node {
            path: dev.join(format!("nvidia{minor}")),
            major: majors.gpu,
            minor: *minor,
        });
    }
    let mig_path = proc_root.join(MIG_MINORS.trim_start_matches('/'));
    match crate::files::read_to_string(&mig_path) {
        Ok(text) => match majors.caps {
            Some(caps) => {
                for (name, minor) in parse_mig_minors(&text) {
                    if is_cap_of(name, &minors) {
                        nodes.push(Node {
                            path: dev.join(format!("nvidia-caps/nvidia-cap{minor}")),
                            major: caps,
                            minor,
                        });
                    }
                }
            }
            None => skipped.push(format!(
                "MIG capability nodes: no {CAPS_MAJOR_NAME} major in /proc/devices"
            )),
        },
        // No MIG support in this driver: no capability nodes.
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(read_err(&mig_path)(e)),
    }
    nodes.sort();
    nodes.dedup();
    Ok(Possible { nodes, skipped })
}

/// `config`, `monitor`, or a `gpu<minor>/…` entry of one of `minors`.
fn is_cap_of(name: &str, minors: &[u32]) -> bool {
    if name == "config" || name == "monitor" {
        return true;
    }
    name.strip_prefix("gpu")
        .and_then(|rest| rest.split('/').next())
        .and_then(|m| m.parse::<u32>().ok())
        .is_some_and(|m| minors.contains(&m))
}

/// What happened to one node or link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Created,
    /// Already there and right.
    Unchanged,
    /// A link that pointed elsewhere, replaced.
    Replaced,
    /// `dry_run`: would be created or replaced.
    WouldCreate,
}

/// `mknod`s each of `nodes` that is missing (mode 0666, as the driver makes them). An
/// existing node with the right numbers is left alone; anything else at the path is an
/// error, never replaced.
pub fn create_nodes(
    nodes: &[Node],
    dry_run: bool,
) -> Result<Vec<(Node, Outcome)>, DeviceNodesError> {
    let mut done = Vec::new();
    for node in nodes {
        let expected = || DeviceNodesError::NotTheNode {
            path: node.path.clone(),
            expected: format!("c {}:{}", node.major, node.minor),
        };
        match fs::symlink_metadata(&node.path) {
            Ok(meta) => {
                let same = meta.file_type().is_char_device()
                    && meta.rdev() == makedev(node.major.into(), node.minor.into());
                if !same {
                    return Err(expected());
                }
                done.push((node.clone(), Outcome::Unchanged));
                continue;
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(read_err(&node.path)(e)),
        }
        if dry_run {
            done.push((node.clone(), Outcome::WouldCreate));
            continue;
        }
        let create = |source| DeviceNodesError::Create {
            path: node.path.clone(),
            source,
        };
        if let Some(parent) = node.path.parent() {
            fs::create_dir_all(parent).map_err(create)?;
        }
        mknod(
            &node.path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(node.major.into(), node.minor.into()),
        )
        .map_err(|e| create(io::Error::from(e)))?;
        // mknod's mode went through the umask.
        fs::set_permissions(&node.path, fs::Permissions::from_mode(0o666)).map_err(create)?;
        done.push((node.clone(), Outcome::Created));
    }
    Ok(done)
}

/// What a link in `dev_char` to `node` points at: `../<path>` when the node is under
/// the link directory's parent (`/dev/char/195:0 -> ../nvidia0`, as udev links other
/// devices), else the node's absolute path.
pub fn link_target(dev_char: &Path, node: &Path) -> PathBuf {
    match dev_char
        .parent()
        .and_then(|base| node.strip_prefix(base).ok())
    {
        Some(rest) if !rest.as_os_str().is_empty() => Path::new("..").join(rest),
        _ => node.to_path_buf(),
    }
}

/// Makes `<dev_char>/<major>:<minor>` a link to each of `nodes`. Idempotent: a link
/// already pointing at the node is left alone; a wrong one (or a dangling one from an
/// old driver) is replaced atomically: a new link under a temporary name, renamed over
/// it. A directory in the way is an error. `dev_char` is created (0755) when missing.
pub fn create_links(
    dev_char: &Path,
    nodes: &[Node],
    dry_run: bool,
) -> Result<Vec<(PathBuf, PathBuf, Outcome)>, DeviceNodesError> {
    if !nodes.is_empty() && !dry_run {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dev_char)
            .map_err(|source| DeviceNodesError::Create {
                path: dev_char.to_path_buf(),
                source,
            })?;
    }
    let mut done = Vec::new();
    for node in nodes {
        let name = node.dev_char_name();
        let link = dev_char.join(&name);
        let target = link_target(dev_char, &node.path);
        let current = match fs::read_link(&link) {
            Ok(current) => Some(current),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            // EINVAL: something that is not a link; the rename below replaces a file
            // and fails on a directory.
            Err(e) if e.raw_os_error() == Some(nix::errno::Errno::EINVAL as i32) => None,
            Err(e) => return Err(read_err(&link)(e)),
        };
        let outcome = match (&current, dry_run) {
            (Some(current), _) if *current == target => Outcome::Unchanged,
            (_, true) => Outcome::WouldCreate,
            (existing, false) => {
                replace_link(dev_char, &name, &link, &target)?;
                if existing.is_some() {
                    Outcome::Replaced
                } else {
                    Outcome::Created
                }
            }
        };
        done.push((link, target, outcome));
    }
    Ok(done)
}

fn replace_link(
    dir: &Path,
    name: &str,
    link: &Path,
    target: &Path,
) -> Result<(), DeviceNodesError> {
    let err = |source| DeviceNodesError::Link {
        link: link.to_path_buf(),
        target: target.to_path_buf(),
        source,
    };
    for temp in crate::files::write::temp_names(name) {
        let temp = dir.join(temp);
        match std::os::unix::fs::symlink(target, &temp) {
            Ok(()) => {
                return fs::rename(&temp, link).map_err(|e| {
                    let _ = fs::remove_file(&temp);
                    err(e)
                });
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(err(e)),
        }
    }
    Err(err(io::Error::new(
        io::ErrorKind::AlreadyExists,
        "no free temporary name",
    )))
}

/// Loads NVIDIA's kernel modules with `modprobe` (found on `PATH`), in order; the first
/// failure stops, with modprobe's own words. `dry_run` returns the commands unrun.
pub fn load_kernel_modules(dry_run: bool) -> Result<Vec<String>, DeviceNodesError> {
    let mut commands = Vec::new();
    for module in KERNEL_MODULES {
        commands.push(format!("modprobe {module}"));
        if dry_run {
            continue;
        }
        let failed = |reason: String| DeviceNodesError::Module {
            module: (*module).to_owned(),
            reason,
        };
        let out = Command::new("modprobe")
            .arg(module)
            .output()
            .map_err(|e| failed(format!("cannot run modprobe: {e}")))?;
        if !out.status.success() {
            let stderr = String::from_utf8_lossy(&out.stderr);
            return Err(failed(format!(
                "modprobe {}: {}",
                out.status,
                stderr.trim()
            )));
        }
    }
    Ok(commands)
}

#[cfg(test)]
#[path = "device_nodes_tests.rs"]
mod tests;

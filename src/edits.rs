//! Turns discovered host resources into CDI-shaped [`ContainerEdits`].
//!
//! Pure and deterministic: the same resources give the same edits, in a stable
//! order (device nodes as discovered, mounts by depth then path, hooks in a fixed
//! order), so `nvshim list --json`, golden tests and generated CDI specs never
//! churn. Decides mount options by file kind and builds the `createContainer`
//! hooks that recreate the driver's symlinks and refresh the linker cache.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::cdi::{ContainerEdits, DeviceNode, Hook, Mount};
use crate::discover::{FileKind, HostResources};

/// Hooks run with exactly this environment, never the container's or runc's: an
/// inherited `LD_PRELOAD` from the image is how CVE-2025-23266 ran code as root.
pub const HOOK_ENV: &[&str] =
    &["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"];

/// Options for read-only driver files. `rprivate` keeps the mounts from
/// propagating back to the host through a shared volume.
pub const RO_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind", "rprivate"];
/// Sockets: read-only works (connect needs no write access to the mount), no exec.
pub const SOCKET_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "noexec", "bind", "rprivate"];
/// The MPS pipe directory: clients write into it.
pub const IPC_DIR_OPTIONS: &[&str] = &["nosuid", "nodev", "noexec", "bind", "rprivate"];

/// Device cgroup access for every node.
pub const DEVICE_ACCESS: &str = "rwm";

/// What the edits need besides the resources.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The binary the `createContainer` hooks run (`nvshim`), as a host path.
    pub hook_binary: PathBuf,
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            hook_binary: PathBuf::from("/usr/bin/nvshim"),
        }
    }
}

/// Builds the edits for `resources`.
pub fn build(resources: &HostResources, settings: &Settings) -> ContainerEdits {
    let device_nodes = resources
        .device_nodes
        .iter()
        .map(|node| DeviceNode {
            path: node.path.display().to_string(),
            host_path: (node.host_path != node.path).then(|| node.host_path.display().to_string()),
            kind: Some("c".into()),
            major: Some(i64::try_from(node.major).unwrap_or(i64::MAX)),
            minor: Some(i64::try_from(node.minor).unwrap_or(i64::MAX)),
            file_mode: Some(node.mode),
            permissions: Some(DEVICE_ACCESS.into()),
            uid: None,
            gid: None,
        })
        .collect();

    let mut mounts: Vec<Mount> = resources
        .files
        .iter()
        .map(|file| Mount {
            host_path: file.host_path.display().to_string(),
            container_path: file.path.display().to_string(),
            kind: Some("bind".into()),
            options: options(file.kind).iter().map(|s| s.to_string()).collect(),
        })
        .collect();
    // Parents before children (as the CDI library does), then by path.
    mounts.sort_by(|a, b| {
        depth(&a.container_path)
            .cmp(&depth(&b.container_path))
            .then_with(|| a.container_path.cmp(&b.container_path))
    });

    ContainerEdits {
        env: Vec::new(),
        device_nodes,
        mounts,
        hooks: hooks(resources, settings),
        additional_gids: Vec::new(),
    }
}

fn options(kind: FileKind) -> &'static [&'static str] {
    match kind {
        FileKind::Library | FileKind::Binary | FileKind::Config | FileKind::Firmware => RO_OPTIONS,
        FileKind::Socket => SOCKET_OPTIONS,
        FileKind::IpcDir => IPC_DIR_OPTIONS,
    }
}

fn depth(path: &str) -> usize {
    Path::new(path).components().count()
}

fn hooks(resources: &HostResources, settings: &Settings) -> Vec<Hook> {
    let binary = settings.hook_binary.display().to_string();
    let hook = |args: Vec<String>| Hook {
        hook_name: "createContainer".into(),
        path: binary.clone(),
        args,
        env: HOOK_ENV.iter().map(|s| s.to_string()).collect(),
        timeout: None,
    };
    let mut out = Vec::new();

    let mut links: Vec<(String, String)> = resources
        .files
        .iter()
        .flat_map(|f| f.links.iter())
        .map(|l| (l.path.display().to_string(), l.target.clone()))
        .collect();
    links.sort();
    links.dedup();
    if !links.is_empty() {
        let mut args = vec!["nvshim".into(), "hook".into(), "create-symlinks".into()];
        for (path, target) in links {
            args.push("--link".into());
            args.push(format!("{target}::{path}"));
        }
        out.push(hook(args));
    }

    let folders: BTreeSet<String> = resources
        .files
        .iter()
        .filter(|f| f.kind == FileKind::Library)
        .filter_map(|f| f.path.parent().map(|p| p.display().to_string()))
        .collect();
    if !folders.is_empty() {
        let mut args = vec!["nvshim".into(), "hook".into(), "update-ldcache".into()];
        for folder in folders {
            args.push("--folder".into());
            args.push(folder);
        }
        out.push(hook(args));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::discover::{DeviceNode as Node, HostFile, SymlinkEdit};

    fn resources() -> HostResources {
        let lib = |name: &str, links: Vec<SymlinkEdit>| HostFile {
            kind: FileKind::Library,
            path: PathBuf::from(format!("/usr/lib/x86_64-linux-gnu/{name}")),
            host_path: PathBuf::from(format!("/drv/usr/lib/x86_64-linux-gnu/{name}")),
            links,
        };
        HostResources {
            device_nodes: vec![Node {
                path: "/dev/nvidiactl".into(),
                host_path: "/dev/nvidiactl".into(),
                major: 195,
                minor: 255,
                mode: 0o666,
                uid: 0,
                gid: 0,
            }],
            files: vec![
                lib(
                    "libcuda.so.550.54.15",
                    vec![SymlinkEdit {
                        path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                        target: "libcuda.so.550.54.15".into(),
                    }],
                ),
                HostFile {
                    kind: FileKind::Binary,
                    path: "/usr/bin/nvidia-smi".into(),
                    host_path: "/drv/usr/bin/nvidia-smi".into(),
                    links: vec![],
                },
                HostFile {
                    kind: FileKind::Socket,
                    path: "/run/nvidia-persistenced/socket".into(),
                    host_path: "/drv/run/nvidia-persistenced/socket".into(),
                    links: vec![],
                },
            ],
            missing: vec![],
        }
    }

    #[test]
    fn edits_carry_nodes_mounts_and_hooks() {
        let edits = build(&resources(), &Settings::default());
        let node = &edits.device_nodes[0];
        assert_eq!(
            (node.major, node.minor, node.host_path.as_deref()),
            (Some(195), Some(255), None)
        );
        assert_eq!(node.permissions.as_deref(), Some("rwm"));
        let paths: Vec<&str> = edits
            .mounts
            .iter()
            .map(|m| m.container_path.as_str())
            .collect();
        assert_eq!(
            paths,
            [
                "/run/nvidia-persistenced/socket",
                "/usr/bin/nvidia-smi",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
            ]
        );
        assert_eq!(edits.mounts[0].options, SOCKET_OPTIONS);
        assert_eq!(edits.mounts[1].options, RO_OPTIONS);
        assert_eq!(edits.hooks.len(), 2);
        assert_eq!(
            edits.hooks[0].args[3..],
            [
                "--link",
                "libcuda.so.550.54.15::/usr/lib/x86_64-linux-gnu/libcuda.so.1"
            ]
        );
        assert_eq!(
            edits.hooks[1].args[2..],
            ["update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]
        );
        for hook in &edits.hooks {
            assert_eq!(hook.hook_name, "createContainer");
            assert!(
                !hook.env.is_empty(),
                "hooks must never inherit an environment"
            );
        }
    }

    #[test]
    fn edits_are_deterministic() {
        let a = build(&resources(), &Settings::default());
        let mut shuffled = resources();
        shuffled.files.reverse();
        let b = build(&shuffled, &Settings::default());
        assert_eq!(a, b);
    }

    #[test]
    fn no_resources_no_edits() {
        assert!(build(&HostResources::default(), &Settings::default()).is_empty());
    }
}

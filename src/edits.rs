//! Turns discovered host resources into CDI-shaped [`ContainerEdits`].
//!
//! Pure and deterministic: the same resources give the same edits, in a stable
//! order (device nodes as discovered, mounts by depth then path), so
//! `nvshim list --json`, golden tests and generated CDI specs never churn. Decides
//! mount options by file kind.
//!
//! No hooks: the driver's symlinks (`libcuda.so.1 -> libcuda.so.550.54.15`,
//! `libcuda.so -> libcuda.so.1`) become extra read-only bind mounts of the real file
//! at each link's path, so nothing has to run inside the container to create them.
//! The linker cache is refreshed on the host side (`rootfs::linker`) from
//! `Plan::ldcache`. NVIDIA's design runs one hook process per job on every start;
//! this one runs none.

use std::path::Path;

use crate::cdi::{ContainerEdits, DeviceNode, Mount};
use crate::discover::{FileKind, HostResources};

/// Options for read-only driver files. `rprivate` keeps the mounts from
/// propagating back to the host through a shared volume.
pub const RO_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind", "rprivate"];
/// Sockets: read-only works (connect needs no write access to the mount), no exec.
pub const SOCKET_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "noexec", "bind", "rprivate"];
/// The MPS pipe directory: clients write into it.
pub const IPC_DIR_OPTIONS: &[&str] = &["nosuid", "nodev", "noexec", "bind", "rprivate"];

/// Device cgroup access for every node.
pub const DEVICE_ACCESS: &str = "rwm";

/// Builds the edits for `resources`.
pub fn build(resources: &HostResources) -> ContainerEdits {
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
        .flat_map(|file| {
            // The file itself, then the same file at each link's path.
            std::iter::once(&file.path)
                .chain(file.links.iter().map(|l| &l.path))
                .map(move |path| Mount {
                    host_path: file.host_path.display().to_string(),
                    container_path: path.display().to_string(),
                    kind: Some("bind".into()),
                    options: options(file.kind).iter().map(|s| s.to_string()).collect(),
                })
        })
        .collect();
    // Parents before children (as the CDI library does), then by path.
    mounts.sort_by(|a, b| {
        depth(&a.container_path)
            .cmp(&depth(&b.container_path))
            .then_with(|| a.container_path.cmp(&b.container_path))
    });
    // Two files never share a path, but a link may name a path that is also a file.
    mounts.dedup_by(|a, b| a.container_path == b.container_path);

    ContainerEdits {
        env: Vec::new(),
        device_nodes,
        mounts,
        hooks: Vec::new(),
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

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::*;
    use crate::discover::{DeviceNode as Node, HostFile, SymlinkEdit};

    fn resources() -> HostResources {
        let lib = |name: &str, links: Vec<SymlinkEdit>| HostFile {
            kind: FileKind::Library,
            path: PathBuf::from(format!("/usr/lib/x86_64-linux-gnu/{name}")),
            host_path: PathBuf::from(format!("/drv/usr/lib/x86_64-linux-gnu/{name}")),
            links,
            ldcache: None,
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
                    ldcache: None,
                },
                HostFile {
                    kind: FileKind::Socket,
                    path: "/run/nvidia-persistenced/socket".into(),
                    host_path: "/drv/run/nvidia-persistenced/socket".into(),
                    links: vec![],
                    ldcache: None,
                },
            ],
            missing: vec![],
        }
    }

    #[test]
    fn edits_carry_nodes_and_mounts_links_included() {
        let edits = build(&resources());
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
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"
            ]
        );
        assert_eq!(edits.mounts[0].options, SOCKET_OPTIONS);
        assert_eq!(edits.mounts[1].options, RO_OPTIONS);
        // The soname link is the real file mounted a second time.
        assert_eq!(edits.mounts[2].host_path, edits.mounts[3].host_path);
        assert_eq!(edits.mounts[2].options, RO_OPTIONS);
        assert!(edits.hooks.is_empty(), "no process runs in the container");
    }

    #[test]
    fn edits_are_deterministic() {
        let a = build(&resources());
        let mut shuffled = resources();
        shuffled.files.reverse();
        let b = build(&shuffled);
        assert_eq!(a, b);
    }

    #[test]
    fn no_resources_no_edits() {
        assert!(build(&HostResources::default()).is_empty());
    }
}

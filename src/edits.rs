//! Turns discovered host resources into CDI-shaped [`ContainerEdits`].
//!
//! Pure and deterministic: the same resources give the same edits, in a stable
//! order (device nodes by path, mounts by depth then path: `ContainerEdits::normalise`), so
//! `nvshim list --json`, golden tests and generated CDI specs never churn. Decides
//! mount options by file kind.
//!
//! No hooks: the driver's symlinks (`libcuda.so.1 -> libcuda.so.550.54.15`,
//! `libcuda.so -> libcuda.so.1`) are listed by [`symlinks`] and created in the rootfs
//! from the host side (`Rootfs::symlink`, which never follows the image's links out of
//! it), and the linker cache is refreshed the same way (`rootfs::linker`) from
//! `Plan::ldcache`. NVIDIA's design runs one hook process per job on every start;
//! this one runs none. A symlink costs the runtime a few microseconds; a bind mount
//! in its place would cost runc two `mount` calls on every start.

use std::collections::HashSet;
use std::ffi::OsStr;

use crate::cdi::{ContainerEdits, DeviceNode, Mount};
use crate::discover::{FileKind, HostResources, SymlinkEdit};

/// Options for read-only driver files. `rprivate` keeps the mounts from
/// propagating back to the host through a shared volume.
pub const RO_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "bind", "rprivate"];
/// Sockets: read-only works (connect needs no write access to the mount), no exec.
pub const SOCKET_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "noexec", "bind", "rprivate"];
/// The MPS pipe directory: clients write into it.
pub const IPC_DIR_OPTIONS: &[&str] = &["nosuid", "nodev", "noexec", "bind", "rprivate"];

/// A device class's host files (GDS): NVIDIA's options for them, `rbind` included.
pub const CLASS_FILE_OPTIONS: &[&str] = &["ro", "nosuid", "nodev", "rbind", "rprivate"];

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

    let mounts: Vec<Mount> = resources
        .files
        .iter()
        .flat_map(|file| {
            std::iter::once(&file.path).map(move |path| Mount {
                host_path: file.host_path.display().to_string(),
                container_path: path.display().to_string(),
                kind: Some("bind".into()),
                options: options(file.kind).iter().map(|s| s.to_string()).collect(),
            })
        })
        .collect();
    let mut edits = ContainerEdits {
        env: Vec::new(),
        device_nodes,
        mounts,
        hooks: Vec::new(),
        additional_gids: Vec::new(),
    };
    // Device nodes by path; mounts parents before children, then by path.
    edits.normalise();
    edits
}

/// The symlinks to create in the container for `resources`, by path, each path once
/// (the first file's link wins), leaving out any path a file is mounted at.
pub fn symlinks(resources: &HostResources) -> Vec<SymlinkEdit> {
    let files: HashSet<&OsStr> = resources.files.iter().map(|f| f.path.as_os_str()).collect();
    let mut seen = HashSet::new();
    let mut links: Vec<SymlinkEdit> = resources
        .files
        .iter()
        .flat_map(|f| &f.links)
        .chain(&resources.links)
        .filter(|l| !files.contains(l.path.as_os_str()) && seen.insert(l.path.as_os_str()))
        .cloned()
        .collect();
    links.sort_by(|a, b| a.path.cmp(&b.path));
    links
}

fn options(kind: FileKind) -> &'static [&'static str] {
    match kind {
        FileKind::Library | FileKind::Binary | FileKind::Config | FileKind::Firmware => RO_OPTIONS,
        FileKind::Socket => SOCKET_OPTIONS,
        FileKind::IpcDir => IPC_DIR_OPTIONS,
        FileKind::ClassFile => CLASS_FILE_OPTIONS,
        FileKind::Directory => RO_OPTIONS,
    }
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
            links: vec![],
        }
    }

    #[test]
    fn edits_carry_nodes_and_mounts_and_links_are_separate() {
        let resources = resources();
        let edits = build(&resources);
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
        assert_eq!(edits.mounts[2].options, RO_OPTIONS);
        assert!(edits.hooks.is_empty(), "no process runs in the container");
        // The soname link is created in the rootfs, not mounted.
        assert_eq!(
            symlinks(&resources),
            [SymlinkEdit {
                path: "/usr/lib/x86_64-linux-gnu/libcuda.so.1".into(),
                target: "libcuda.so.550.54.15".into(),
            }]
        );
    }

    #[test]
    fn a_link_at_a_mounted_path_is_left_out_and_each_path_comes_once() {
        let mut resources = resources();
        let link = |path: &str, target: &str| SymlinkEdit {
            path: path.into(),
            target: target.into(),
        };
        resources.files[1].links = vec![
            link("/usr/bin/nvidia-smi", "elsewhere"),
            link("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "other"),
            link("/usr/bin/smi", "nvidia-smi"),
        ];
        let got: Vec<String> = symlinks(&resources)
            .iter()
            .map(|l| format!("{} -> {}", l.path.display(), l.target))
            .collect();
        assert_eq!(
            got,
            [
                "/usr/bin/smi -> nvidia-smi",
                "/usr/lib/x86_64-linux-gnu/libcuda.so.1 -> libcuda.so.550.54.15"
            ]
        );
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

//! DRM nodes for `graphics` and `display`: `/dev/dri/cardN` and `/dev/dri/renderDN`
//! of exactly the selected GPUs, matched by PCI bus id, and the `by-path` links that
//! name them.
//!
//! A GPU's nodes come from udev's links under the dev root,
//! `/dev/dri/by-path/pci-<bus id>-card` and `-render` (two `readlink`s per GPU); when
//! neither exists (no udev, as in some driver containers) from the kernel's own list,
//! `sys/bus/pci/devices/<bus id>/drm/` under the proc root, which is what NVIDIA's
//! toolkit reads. Each node is `lstat`ed like every other (`nodes::node`), so it gets
//! its real major/minor and a cgroup rule. The links themselves are recreated in the
//! container (`HostResources::links`), as NVIDIA's `create-symlinks` hook does.
//!
//! Only full GPUs get DRM nodes: a MIG device has none of its own (NVIDIA adds them
//! only for MIG profiles with graphics, which this does not model).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::resolve::lexical;
use super::table::{DRI_DIR, SYSFS_PCI_DEVICES};
use super::{DiscoverError, HostResources, Missing, SymlinkEdit, io_err, nodes};
use crate::roots::Roots;
use crate::select::Selection;

/// The two kinds of DRM node, by their `by-path` suffix and node-name prefix.
const KINDS: [(&str, &str); 2] = [("card", "card"), ("render", "renderD")];

pub(super) fn device_nodes(
    roots: &Roots,
    selection: &Selection,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    for gpu in &selection.gpus {
        let why = format!("GPU {} (graphics)", gpu.index);
        let (mut names, links) = by_path(roots, &gpu.bus_id)?;
        if names.is_empty() {
            names = from_sysfs(roots, &gpu.bus_id)?;
        }
        if names.is_empty() {
            out.missing.push(Missing {
                what: format!("{DRI_DIR}/by-path/pci-{}-card", gpu.bus_id),
                needed_for: why,
                required: false,
                detail: Some("no DRM node for this GPU (is nvidia-drm loaded?)".into()),
            });
            continue;
        }
        let before = out.device_nodes.len();
        for name in &names {
            nodes::node(roots, &format!("{DRI_DIR}/{name}"), &why, false, out)?;
        }
        // A link whose node is absent would dangle: only links to nodes found.
        let found: Vec<PathBuf> = out.device_nodes[before..]
            .iter()
            .map(|n| n.path.clone())
            .collect();
        out.links.extend(
            links
                .into_iter()
                .filter(|(node, _)| found.contains(node))
                .map(|(_, link)| link),
        );
    }
    Ok(())
}

/// The node names the dev root's `by-path` links of `bus_id` lead to, and the links
/// (with the node each names).
#[allow(clippy::type_complexity)]
fn by_path(
    roots: &Roots,
    bus_id: &str,
) -> Result<(Vec<String>, Vec<(PathBuf, SymlinkEdit)>), DiscoverError> {
    let mut names = Vec::new();
    let mut links = Vec::new();
    for (suffix, prefix) in KINDS {
        let link = PathBuf::from(format!("{DRI_DIR}/by-path/pci-{bus_id}-{suffix}"));
        let host = roots.dev.join(link.strip_prefix("/").unwrap_or(&link));
        let target = match fs::read_link(&host) {
            Ok(target) => target,
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            // Not a link (EINVAL), or a path component that is no directory.
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOTDIR)) => continue,
            Err(e) => return Err(io_err(&host)(e)),
        };
        let Some(name) = node_name(&link, &target, prefix) else {
            tracing::debug!(link = %host.display(), target = %target.display(), "by-path link does not lead to a DRM node in /dev/dri; ignored");
            continue;
        };
        let node = Path::new(DRI_DIR).join(&name);
        links.push((
            node,
            SymlinkEdit {
                path: link,
                target: target.to_string_lossy().into_owned(),
            },
        ));
        names.push(name);
    }
    Ok((names, links))
}

/// The DRM node `target` (the text of the link at `link`) names: `card<N>` or
/// `renderD<N>` (as `prefix` says) directly in `/dev/dri`, else `None`.
pub(super) fn node_name(link: &Path, target: &Path, prefix: &str) -> Option<String> {
    let dir = link.parent()?;
    let resolved = lexical(&dir.join(target));
    if resolved.parent() != Some(Path::new(DRI_DIR)) {
        return None;
    }
    let name = resolved.file_name()?.to_str()?;
    is_node_name(name, prefix).then(|| name.to_owned())
}

/// `card1` for prefix `card`, `renderD128` for `renderD`; not `card1-DP-1` (a
/// connector) nor `renderD` alone.
pub(super) fn is_node_name(name: &str, prefix: &str) -> bool {
    name.strip_prefix(prefix)
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The DRM minors the kernel lists for `bus_id`, cards first, each by number.
fn from_sysfs(roots: &Roots, bus_id: &str) -> Result<Vec<String>, DiscoverError> {
    let dir = roots.proc.join(SYSFS_PCI_DEVICES).join(bus_id).join("drm");
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(&dir)(e)),
    };
    let mut names: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| e.file_name().to_str().map(str::to_owned))
        .filter(|n| KINDS.iter().any(|(_, prefix)| is_node_name(n, prefix)))
        .collect();
    names.sort_by_key(|n| {
        let render = n.starts_with("renderD");
        let number: u32 = n
            .trim_start_matches(|c: char| !c.is_ascii_digit())
            .parse()
            .unwrap_or(u32::MAX);
        (render, number)
    });
    Ok(names)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::os::unix::fs::symlink;

    use super::*;
    use crate::select::SelectedGpu;

    #[test]
    fn by_path_targets_must_name_a_node_in_dev_dri() {
        let link = Path::new("/dev/dri/by-path/pci-0000:3b:00.0-card");
        let cases = [
            ("../card1", "card", Some("card1")),
            ("/dev/dri/card2", "card", Some("card2")),
            ("../renderD128", "renderD", Some("renderD128")),
            ("../renderD128", "card", None),
            ("../../card1", "card", None),
            ("../card1-DP-1", "card", None),
            ("../card", "card", None),
            ("../../../../etc/card1", "card", None),
            ("card1", "card", None),
        ];
        for (target, prefix, want) in cases {
            assert_eq!(
                node_name(link, Path::new(target), prefix).as_deref(),
                want,
                "case {target} ({prefix})"
            );
        }
    }

    fn gpu(index: u32, bus_id: &str) -> SelectedGpu {
        SelectedGpu {
            index,
            minor: index,
            uuid: format!("GPU-{index}"),
            bus_id: bus_id.to_owned(),
        }
    }

    fn mknod(path: &Path, major: u64, minor: u64) {
        use nix::sys::stat::{Mode, SFlag, makedev};
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        nix::sys::stat::mknod(
            path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o660),
            makedev(major, minor),
        )
        .unwrap();
    }

    /// Two GPUs: the first has udev's links, the second only sysfs. Selecting each
    /// gives exactly its own nodes (and links), never the other's nor card0's.
    #[test]
    fn each_gpu_gets_its_own_nodes_from_by_path_or_sysfs() {
        if !nix::unistd::Uid::effective().is_root() {
            eprintln!("skipped: mknod needs root");
            return;
        }
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        let dri = root.join("dev/dri");
        for (name, minor) in [("card0", 0), ("card1", 1), ("card2", 2)] {
            mknod(&dri.join(name), 226, minor);
        }
        for (name, minor) in [("renderD128", 128), ("renderD129", 129)] {
            mknod(&dri.join(name), 226, minor);
        }
        fs::create_dir_all(dri.join("by-path")).unwrap();
        symlink("../card1", dri.join("by-path/pci-0000:3b:00.0-card")).unwrap();
        symlink("../renderD128", dri.join("by-path/pci-0000:3b:00.0-render")).unwrap();
        symlink("../card0", dri.join("by-path/pci-0000:03:00.0-card")).unwrap();
        let sys = root.join("sys/bus/pci/devices/0000:86:00.0/drm");
        for name in ["renderD129", "card2", "controlD66"] {
            fs::create_dir_all(sys.join(name)).unwrap();
        }
        let roots = Roots {
            driver: root.to_path_buf(),
            dev: root.to_path_buf(),
            proc: root.to_path_buf(),
        };
        let run = |gpus: Vec<SelectedGpu>| {
            let selection = Selection {
                gpus,
                ..Selection::default()
            };
            let mut out = HostResources::default();
            device_nodes(&roots, &selection, &mut out).unwrap();
            out
        };

        let out = run(vec![gpu(0, "0000:3b:00.0")]);
        let nodes = out.node_numbers();
        assert_eq!(
            nodes,
            [
                ("/dev/dri/card1".to_owned(), 226, 1),
                ("/dev/dri/renderD128".to_owned(), 226, 128)
            ]
        );
        let links: Vec<(String, &str)> = out
            .links
            .iter()
            .map(|l| (l.path.display().to_string(), l.target.as_str()))
            .collect();
        assert_eq!(
            links,
            [
                (
                    "/dev/dri/by-path/pci-0000:3b:00.0-card".to_owned(),
                    "../card1"
                ),
                (
                    "/dev/dri/by-path/pci-0000:3b:00.0-render".to_owned(),
                    "../renderD128"
                )
            ]
        );

        let out = run(vec![gpu(1, "0000:86:00.0")]);
        let paths: Vec<String> = out
            .device_nodes
            .iter()
            .map(|n| n.path.display().to_string())
            .collect();
        assert_eq!(paths, ["/dev/dri/card2", "/dev/dri/renderD129"]);
        assert!(out.links.is_empty(), "sysfs gives nodes, no links");

        // A GPU with neither: noted, never required.
        let out = run(vec![gpu(2, "0000:99:00.0")]);
        assert!(out.device_nodes.is_empty());
        assert_eq!(out.missing.len(), 1);
        assert!(!out.missing[0].required);
    }
}

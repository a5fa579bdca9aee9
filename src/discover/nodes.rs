//! Device nodes: the control node, each capability's nodes, one node per selected
//! GPU, and the MIG capability nodes whose minors `mig-minors` lists. Each is
//! `lstat`ed for its real major/minor; one that is absent or not a character device
//! goes into [`HostResources::missing`].

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::PathBuf;

use super::table::{CAPS_DIR, CONTROL_NODE, MIG_MINORS};
use super::{DeviceNode, DiscoverError, HostResources, Missing, Want, active, io_err};
use crate::roots::Roots;
use crate::select::Selection;

pub(super) fn device_nodes(
    roots: &Roots,
    want: Want<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    node(roots, CONTROL_NODE, "the driver", true, out)?;
    for entry in active(want.capabilities) {
        for path in entry.device_nodes {
            node(roots, path, entry.capability.name(), false, out)?;
        }
    }
    let mut minors: Vec<(u32, String)> = want
        .selection
        .gpus
        .iter()
        .map(|g| (g.minor, format!("GPU {}", g.index)))
        .chain(want.selection.mig_devices.iter().map(|m| {
            (
                m.parent.minor,
                format!("MIG device {}:{}", m.parent.index, m.index),
            )
        }))
        .collect();
    minors.sort_by_key(|(minor, _)| *minor);
    minors.dedup_by_key(|(minor, _)| *minor);
    for (minor, why) in minors {
        node(roots, &format!("/dev/nvidia{minor}"), &why, true, out)?;
    }
    if !want.selection.mig_devices.is_empty() {
        mig_caps(roots, want.selection, out)?;
    }
    Ok(())
}

pub(super) fn node(
    roots: &Roots,
    path: &str,
    needed_for: &str,
    required: bool,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    // Two capabilities may name one node (`/dev/nvidia-modeset`: graphics and display).
    if out.device_nodes.iter().any(|n| n.path.as_os_str() == path) {
        return Ok(());
    }
    let host = roots.dev.join(path.trim_start_matches('/'));
    let metadata = match fs::symlink_metadata(&host) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            out.missing.push(Missing {
                what: path.to_string(),
                needed_for: needed_for.to_string(),
                required,
                detail: None,
            });
            return Ok(());
        }
        Err(e) => return Err(io_err(&host)(e)),
    };
    if !metadata.file_type().is_char_device() {
        out.missing.push(Missing {
            what: path.to_string(),
            needed_for: needed_for.to_string(),
            required,
            detail: Some(format!("{} is not a character device", host.display())),
        });
        return Ok(());
    }
    let rdev = metadata.rdev();
    out.device_nodes.push(DeviceNode {
        path: PathBuf::from(path),
        host_path: host,
        major: u64::from(nix::sys::stat::major(rdev) as u32),
        minor: u64::from(nix::sys::stat::minor(rdev) as u32),
        mode: metadata.permissions().mode() & 0o7777,
        uid: metadata.uid(),
        gid: metadata.gid(),
    });
    Ok(())
}

/// MIG devices need the capability nodes of their GPU instance and compute instance,
/// whose minors the driver lists in `mig-minors` (`gpu<minor>/gi<G>/access <m>`).
fn mig_caps(
    roots: &Roots,
    selection: &Selection,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let path = roots.proc.join(MIG_MINORS.trim_start_matches('/'));
    let text = crate::files::read_to_string(&path).map_err(io_err(&path))?;
    let table = parse_mig_minors(&text);
    let mut caps = Vec::new();
    for mig in &selection.mig_devices {
        let gpu = mig.parent.minor;
        let gi = format!("gpu{gpu}/gi{}/access", mig.gpu_instance_id);
        let ci = format!(
            "gpu{gpu}/gi{}/ci{}/access",
            mig.gpu_instance_id, mig.compute_instance_id
        );
        for name in [gi, ci] {
            let minor = table
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, m)| *m)
                .ok_or_else(|| DiscoverError::Parse {
                    path: path.clone(),
                    reason: format!("no entry {name:?} for MIG device {}", mig.uuid),
                })?;
            caps.push((minor, mig.uuid.clone()));
        }
    }
    caps.sort();
    caps.dedup_by_key(|(minor, _)| *minor);
    for (minor, uuid) in caps {
        node(
            roots,
            &format!("{CAPS_DIR}/nvidia-cap{minor}"),
            &format!("MIG device {uuid}"),
            true,
            out,
        )?;
    }
    Ok(())
}

/// `name minor` lines; malformed lines are ignored (the file is the driver's).
pub fn parse_mig_minors(text: &str) -> Vec<(&str, u32)> {
    text.lines()
        .filter_map(|line| {
            let (name, minor) = line.split_once(' ')?;
            Some((name, minor.trim().parse().ok()?))
        })
        .collect()
}

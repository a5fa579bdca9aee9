//! IMEX channel nodes on the host. The driver makes no `channel<n>` node by itself
//! (only `channel0`, and only with `NVreg_CreateImexChannel0=1`); NVIDIA's
//! `nvidia-container-cli` creates a requested channel's node on the host with the
//! `nvidia-caps-imex-channels` major from `/proc/devices` and the channel as its minor,
//! unless `features.disable-imex-channel-creation`. We do the same, so the runtime and
//! the prestart hook then find the node like any other.

use std::fs;
use std::io;

use super::{DeviceNodesError, Node, Outcome, create_nodes, parse_proc_devices, read_err};
use crate::roots::Roots;

/// The driver's name for the IMEX channels' character major in `/proc/devices`.
pub const IMEX_MAJOR_NAME: &str = "nvidia-caps-imex-channels";

/// Creates the nodes of `channels` that are missing under the dev root. Reads
/// `/proc/devices` only when one is missing; when the driver has no IMEX major there,
/// nothing is created (discovery then reports the channel as missing).
pub fn create_imex_channels(
    roots: &Roots,
    channels: &[u32],
) -> Result<Vec<Node>, DeviceNodesError> {
    let path_of = |n: u32| {
        roots
            .dev
            .join(format!("dev/nvidia-caps-imex-channels/channel{n}"))
    };
    let mut missing = Vec::new();
    for &n in channels {
        let path = path_of(n);
        match fs::symlink_metadata(&path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => missing.push(n),
            Err(e) => return Err(read_err(&path)(e)),
        }
    }
    if missing.is_empty() {
        return Ok(Vec::new());
    }
    let devices = roots.proc.join("proc/devices");
    let text = crate::files::read_to_string(&devices).map_err(read_err(&devices))?;
    let Some(major) = parse_proc_devices(&text)
        .into_iter()
        .find(|(_, name)| name == IMEX_MAJOR_NAME)
        .map(|(major, _)| major)
    else {
        tracing::debug!(path = %devices.display(), "no {IMEX_MAJOR_NAME} major: IMEX channels cannot be created");
        return Ok(Vec::new());
    };
    let nodes: Vec<Node> = missing
        .iter()
        .map(|&n| Node {
            path: path_of(n),
            major,
            minor: n,
        })
        .collect();
    let done = match create_nodes(&nodes, false) {
        // Another container made the same node just now: check it is the right one.
        Err(DeviceNodesError::Create { source, .. })
            if source.kind() == io::ErrorKind::AlreadyExists =>
        {
            create_nodes(&nodes, false)?
        }
        other => other?,
    };
    let created: Vec<Node> = done
        .into_iter()
        .filter(|(_, outcome)| *outcome == Outcome::Created)
        .map(|(node, _)| node)
        .collect();
    for node in &created {
        tracing::info!(path = %node.path.display(), major = node.major, minor = node.minor, "created IMEX channel node");
    }
    Ok(created)
}

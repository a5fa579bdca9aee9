//! The device classes besides GPUs (see `request::DeviceClasses`): IMEX channel nodes,
//! and the gated GDS, MOFED, GDRCopy and NVSwitch nodes, with GDS's two host files.
//!
//! Where NVIDIA's discoverers look (`internal/discover/{gds,mofed,gdrcopy,nvswitch}.go`,
//! `pkg/nvcdi/lib-imex.go`): every node under the dev root; GDS's `/etc/cufile.json`
//! and `/run/udev` under the driver root, and only when an `nvidia-fs` node exists.
//! A class nobody asked for reads nothing: no `stat`, no directory listing. A gated
//! class's absent nodes are noted and skipped, as NVIDIA skips them; an IMEX channel
//! that was asked for is required.

use std::fs;
use std::io;
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use super::nodes::node;
use super::resolve::Resolver;
use super::{DiscoverError, FileKind, HostResources, Missing, io_err, push_file};
use crate::request::{DeviceClasses, ENV_GDRCOPY, ENV_GDS, ENV_MOFED, ENV_NVSWITCH};
use crate::roots::Roots;

/// The directory of the IMEX channel nodes (the driver's `nvidia-caps-imex-channels`).
pub const IMEX_CHANNEL_DIR: &str = "/dev/nvidia-caps-imex-channels";
/// GDS's nodes: `/dev/nvidia-fs0`, `/dev/nvidia-fs1`, …
pub const GDS_NODE_PREFIX: &str = "nvidia-fs";
/// GDS's config file and the udev database it reads, under the driver root.
pub const GDS_FILES: [&str; 2] = ["/run/udev", "/etc/cufile.json"];
/// MOFED's nodes live here: `uverbs<n>` and `rdma_cm`.
pub const INFINIBAND_DIR: &str = "/dev/infiniband";
pub const MOFED_UVERBS_PREFIX: &str = "uverbs";
pub const MOFED_RDMA_CM: &str = "rdma_cm";
/// GDRCopy's one node.
pub const GDRCOPY_NODE: &str = "/dev/gdrdrv";
/// NVSwitch's control node and the prefix of its per-switch nodes.
pub const NVSWITCH_CTL: &str = "/dev/nvidia-nvswitchctl";
pub const NVSWITCH_PREFIX: &str = "nvidia-nvswitch";

/// The container path of IMEX channel `n`.
pub fn imex_channel_path(n: u32) -> String {
    format!("{IMEX_CHANNEL_DIR}/channel{n}")
}

/// Adds the nodes and files of `classes` to `out`.
pub(super) fn discover(
    roots: &Roots,
    classes: &DeviceClasses,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    for &n in &classes.imex_channels {
        node(
            roots,
            &imex_channel_path(n),
            &format!("IMEX channel {n}"),
            true,
            out,
        )?;
    }
    if classes.gds {
        let found = matching(roots, "/dev", GDS_NODE_PREFIX, ENV_GDS, out)?;
        if found {
            for path in GDS_FILES {
                gds_file(path, resolver, out)?;
            }
        }
    }
    if classes.mofed {
        matching(roots, INFINIBAND_DIR, MOFED_UVERBS_PREFIX, ENV_MOFED, out)?;
        node(
            roots,
            &format!("{INFINIBAND_DIR}/{MOFED_RDMA_CM}"),
            &gate(ENV_MOFED),
            false,
            out,
        )?;
    }
    if classes.gdrcopy {
        node(roots, GDRCOPY_NODE, &gate(ENV_GDRCOPY), false, out)?;
    }
    if classes.nvswitch {
        node(roots, NVSWITCH_CTL, &gate(ENV_NVSWITCH), false, out)?;
        matching(roots, "/dev", NVSWITCH_PREFIX, ENV_NVSWITCH, out)?;
    }
    Ok(())
}

fn gate(variable: &str) -> String {
    format!("{variable}=enabled")
}

/// Every character device in `dir` (a container path under the dev root) whose name
/// starts with `prefix`, in name order, each once; `false` (and a note) when there is
/// none. NVIDIA's discoverers glob the same way (`/dev/nvidia-fs*`).
fn matching(
    roots: &Roots,
    dir: &str,
    prefix: &str,
    variable: &str,
    out: &mut HostResources,
) -> Result<bool, DiscoverError> {
    let host = roots.dev.join(dir.trim_start_matches('/'));
    let mut names: Vec<String> = match fs::read_dir(&host) {
        Ok(entries) => entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_char_device()))
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with(prefix))
            .collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(io_err(&host)(e)),
    };
    names.sort();
    let before = out.device_nodes.len();
    for name in names {
        let path = format!("{dir}/{name}");
        if out
            .device_nodes
            .iter()
            .any(|n| n.path.as_os_str() == path.as_str())
        {
            continue;
        }
        node(roots, &path, &gate(variable), false, out)?;
    }
    let found = out.device_nodes.len() > before;
    if !found {
        out.missing.push(Missing {
            what: format!("{dir}/{prefix}*"),
            needed_for: gate(variable),
            required: false,
            detail: None,
        });
    }
    Ok(found)
}

/// `/etc/cufile.json` (a file) or `/run/udev` (a directory) under the driver root,
/// mounted as NVIDIA mounts them; noted when absent.
fn gds_file(
    path: &str,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let found = resolver
        .resolve(Path::new(path))
        .map_err(io_err(Path::new(path)))?
        .filter(|real| real.metadata.is_file() || real.metadata.is_dir());
    match found {
        Some(real) => push_file(out, FileKind::ClassFile, real.path, resolver, Vec::new()),
        None => out.missing.push(Missing {
            what: path.to_string(),
            needed_for: gate(ENV_GDS),
            required: false,
            detail: None,
        }),
    }
    Ok(())
}

/// The resources of `classes` alone, for a CDI spec of one class
/// (`nvidia-ctk cdi generate --mode gds|mofed|gdrcopy|nvswitch|imex`).
pub fn discover_classes(
    roots: &Roots,
    classes: &DeviceClasses,
) -> Result<HostResources, DiscoverError> {
    let mut out = HostResources::default();
    let mut resolver = Resolver::new(&roots.driver);
    discover(roots, classes, &mut resolver, &mut out)?;
    Ok(out)
}

/// The IMEX channels whose nodes exist under the dev root, ascending (NVIDIA's
/// `channel*` glob; names that are not `channel<n>` are left out).
pub fn imex_channels_present(roots: &Roots) -> Result<Vec<u32>, DiscoverError> {
    let dir = roots.dev.join(IMEX_CHANNEL_DIR.trim_start_matches('/'));
    let entries = match fs::read_dir(&dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err(&dir)(e)),
    };
    let mut channels: Vec<u32> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_char_device()))
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.starts_with(crate::request::IMEX_CHANNEL_PREFIX)
                .then(|| crate::request::parse_imex_channel(&name).ok())
                .flatten()
        })
        .collect();
    channels.sort_unstable();
    Ok(channels)
}

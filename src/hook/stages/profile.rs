//! `update-application-profile` (NVIDIA v1.20): limits which GPUs EGL and Vulkan see in
//! the container to the ones it was given.
//!
//! The driver reads application profiles from
//! `/etc/nvidia/nvidia-application-profiles-rc.d/`; this writes `10-container.conf`
//! there with `EGLVisibleDGPUDevices` set to a bit mask of the minors of the
//! `/dev/nvidia<N>` character devices in the container's `/dev` (minors 0–63). With no
//! such device nothing is written.

use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::fcntl::AtFlags;
use nix::sys::stat::{self, SFlag};

use crate::rootfs::Rootfs;

use super::StageError;
use super::ldcache::open_dir;

/// Where the profile goes in the container.
pub const PROFILE: &str = "/etc/nvidia/nvidia-application-profiles-rc.d/10-container.conf";

/// Writes the profile; returns the mask written (`None`: no GPU node, nothing written).
pub fn run(rootfs: &Rootfs) -> Result<Option<u64>, StageError> {
    let dev = Path::new("/dev");
    let Some(mut dir) = open_dir(rootfs, dev)? else {
        return Ok(None);
    };
    let mut names = Vec::new();
    for entry in dir.iter() {
        let entry = entry.map_err(|source| StageError::Path {
            root: rootfs.path().to_path_buf(),
            path: dev.to_path_buf(),
            source,
        })?;
        let name = entry.file_name().to_bytes();
        if let Some(digits) = name.strip_prefix(b"nvidia")
            && !digits.is_empty()
            && digits.iter().all(u8::is_ascii_digit)
        {
            names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    let mut mask = 0u64;
    for name in names {
        let Ok(st) = stat::fstatat(&dir, name.as_os_str(), AtFlags::AT_SYMLINK_NOFOLLOW) else {
            continue;
        };
        if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFCHR {
            continue;
        }
        let minor = stat::minor(st.st_rdev);
        if minor < 64 {
            mask |= 1 << minor;
        } else {
            tracing::warn!(minor, "GPU minor out of the profile's range 0-63, left out");
        }
    }
    if mask == 0 {
        return Ok(None);
    }
    rootfs.replace(Path::new(PROFILE), profile(mask).as_bytes(), 0o444)?;
    Ok(Some(mask))
}

/// The profile text for `mask`.
pub fn profile(mask: u64) -> String {
    format!(
        "{{\"profiles\":[{{\"name\":\"_container_\",\"settings\":[\"EGLVisibleDGPUDevices\",{mask:#x}]}}],\
         \"rules\":[{{\"pattern\":[],\"profile\":\"_container_\"}}]}}"
    )
}

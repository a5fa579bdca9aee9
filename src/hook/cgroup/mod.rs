//! The container's device cgroup: let it open the device nodes the hook adds.
//!
//! The runtime path puts every node in `linux.resources.devices` and lets runc do
//! this; a prestart hook comes after runc applied the spec's rules, so it adds its own
//! out of band, as NVIDIA's legacy hook does. The container's cgroup comes from
//! `/proc/<pid>/cgroup` and the hierarchies' mount points from `/proc/self/mountinfo`
//! (both on the host side, before `setns`, both parsed by the `procfs` crate):
//! - v1 (`devices` controller): a `c <major>:<minor> rwm` line per device in
//!   `devices.allow` ([`v1`]);
//! - v2 (the unified hierarchy, pure or hybrid): each attached
//!   `BPF_PROG_TYPE_CGROUP_DEVICE` program is replaced by one that allows our devices
//!   first and then runs the old program's code ([`v2`]). Without an attached program
//!   v2 restricts nothing, so there is nothing to add; a program on an ancestor cgroup
//!   cannot be overridden from the container's cgroup and is left alone.
//!
//! On a hybrid host both apply when both are present. Rules added out of band vanish
//! when the runtime re-applies the spec's resources (`runc update`): that is inherent
//! to hook mode, and why the runtime path is preferred. A systemd reload with the
//! systemd cgroup driver keeps them, through the scope drop-in the hook writes
//! (`super::systemd_scope`). `no-cgroups = true` skips all of this.

pub mod program;
pub mod v1;
pub mod v2;

use std::fmt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use procfs::FromRead;
use procfs::process::{MountInfo, Process};
use procfs::{ProcessCGroup, ProcessCGroups};

/// A character device to grant `rwm` access to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CharDevice {
    pub major: u32,
    pub minor: u32,
}

impl fmt::Display for CharDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "c {}:{}", self.major, self.minor)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: procfs::ProcError,
    },
    #[error("cannot open {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot allow \"{rule}\" in {path}: {source}")]
    V1 {
        path: PathBuf,
        rule: String,
        #[source]
        source: std::io::Error,
    },
    #[error("cgroup {cgroup}: cannot {step}: {source}")]
    Bpf {
        cgroup: PathBuf,
        step: &'static str,
        #[source]
        source: Errno,
    },
    #[error("cgroup {cgroup}: the kernel rejected the new device program ({source}): {log}")]
    Verifier {
        cgroup: PathBuf,
        source: Errno,
        log: String,
    },
    #[error("cgroup {cgroup}: device program {id}: {reason}")]
    Program {
        cgroup: PathBuf,
        id: u32,
        #[source]
        reason: program::ProgramError,
    },
    #[error(
        "cgroup path {path:?} of the container is outside the {what} hierarchy mounted at {mount}"
    )]
    Outside {
        path: String,
        what: &'static str,
        mount: PathBuf,
    },
}

/// What [`grant`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Granted {
    /// The v1 devices cgroup written to.
    pub v1: Option<PathBuf>,
    /// The v2 cgroup looked at, and the programs replaced there.
    pub v2: Option<(PathBuf, v2::Replaced)>,
}

/// Parses `/proc/<pid>/cgroup` (`id:controllers:path` lines, procfs's parser);
/// malformed lines are skipped.
pub fn parse_proc_cgroup(text: &str) -> Vec<ProcessCGroup> {
    text.lines()
        .filter_map(|line| ProcessCGroups::from_read(line.as_bytes()).ok())
        .flat_map(|parsed| parsed.0)
        .collect()
}

/// A cgroup filesystem mounted in this process's mount namespace.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupMount {
    /// The cgroup the mount shows at its mount point (`/` unless bind-mounted or in a
    /// cgroup namespace).
    pub root: String,
    pub mount_point: PathBuf,
    /// `cgroup2`, else a v1 hierarchy.
    pub v2: bool,
    /// The v1 hierarchy's super options (`rw`, `devices`, …).
    pub options: Vec<String>,
}

/// The cgroup and cgroup2 mounts in a `mountinfo` text (procfs's parser); malformed
/// lines are skipped.
pub fn parse_mountinfo(text: &str) -> Vec<CgroupMount> {
    text.lines()
        .filter_map(|line| MountInfo::from_line(line).ok())
        .filter_map(|mount| cgroup_mount(&mount))
        .collect()
}

/// A mount as [`CgroupMount`], if it is a cgroup or cgroup2 filesystem.
fn cgroup_mount(mount: &MountInfo) -> Option<CgroupMount> {
    let v2 = match mount.fs_type.as_str() {
        "cgroup2" => true,
        "cgroup" => false,
        _ => return None,
    };
    let mut options: Vec<String> = mount
        .super_options
        .iter()
        .map(|(key, value)| match value {
            Some(value) => format!("{key}={value}"),
            None => key.clone(),
        })
        .collect();
    options.sort();
    Some(CgroupMount {
        root: unescape(&mount.root),
        // procfs leaves mountinfo's escapes in place.
        mount_point: PathBuf::from(unescape(&mount.mount_point.to_string_lossy())),
        v2,
        options,
    })
}

/// Undoes mountinfo's octal escapes of space, tab, newline and backslash.
fn unescape(field: &str) -> String {
    field
        .replace("\\040", " ")
        .replace("\\011", "\t")
        .replace("\\012", "\n")
        .replace("\\134", "\\")
}

/// The directory of cgroup `path` in the hierarchy mounted at `mount`.
fn dir_in(mount: &CgroupMount, path: &str, what: &'static str) -> Result<PathBuf, CgroupError> {
    let outside = || CgroupError::Outside {
        path: path.to_string(),
        what,
        mount: mount.mount_point.clone(),
    };
    let rel = if mount.root == "/" {
        path.trim_start_matches('/')
    } else {
        path.strip_prefix(mount.root.as_str())
            .filter(|r| r.is_empty() || r.starts_with('/'))
            .ok_or_else(outside)?
            .trim_start_matches('/')
    };
    if Path::new(rel)
        .components()
        .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(outside());
    }
    Ok(mount.mount_point.join(rel))
}

/// The devices cgroup directories of a process, from the texts of its
/// `/proc/<pid>/cgroup` and of a `mountinfo`: see [`locate_in`].
pub fn locate(
    proc_cgroup: &str,
    mountinfo: &str,
) -> Result<(Option<PathBuf>, Option<PathBuf>), CgroupError> {
    locate_in(&parse_proc_cgroup(proc_cgroup), &parse_mountinfo(mountinfo))
}

/// The devices cgroup directories of a process with cgroups `lines`: v1 and v2, as far
/// as each exists among `mounts`.
pub fn locate_in(
    lines: &[ProcessCGroup],
    mounts: &[CgroupMount],
) -> Result<(Option<PathBuf>, Option<PathBuf>), CgroupError> {
    // Prefer a mount that shows the whole hierarchy.
    let pick = |want: &dyn Fn(&CgroupMount) -> bool| {
        let mut found: Vec<&CgroupMount> = mounts.iter().filter(|m| want(m)).collect();
        found.sort_by_key(|m| m.root != "/");
        found.first().copied()
    };
    let v1 = match (
        lines
            .iter()
            .find(|l| l.controllers.iter().any(|c| c == "devices")),
        pick(&|m: &CgroupMount| !m.v2 && m.options.iter().any(|o| o == "devices")),
    ) {
        (Some(line), Some(mount)) => Some(dir_in(mount, &line.pathname, "v1 devices")?),
        _ => None,
    };
    let v2 = match (
        lines
            .iter()
            .find(|l| l.hierarchy == 0 && l.controllers.is_empty()),
        pick(&|m: &CgroupMount| m.v2),
    ) {
        (Some(line), Some(mount)) => Some(dir_in(mount, &line.pathname, "cgroup2")?),
        _ => None,
    };
    Ok((v1, v2))
}

/// Grants the container whose init is `pid` `rwm` access to `devices`.
pub fn grant(pid: i32, devices: &[CharDevice]) -> Result<Granted, CgroupError> {
    let failed = |path: String| {
        move |source| CgroupError::Read {
            path: PathBuf::from(path),
            source,
        }
    };
    let cgroups = Process::new(pid)
        .and_then(|p| p.cgroups())
        .map_err(failed(format!("/proc/{pid}/cgroup")))?;
    let mounts: Vec<CgroupMount> = Process::myself()
        .and_then(|p| p.mountinfo())
        .map_err(failed("/proc/self/mountinfo".to_owned()))?
        .iter()
        .filter_map(cgroup_mount)
        .collect();
    let (v1_dir, v2_dir) = locate_in(&cgroups.0, &mounts)?;
    let mut granted = Granted::default();
    if let Some(dir) = v1_dir {
        v1::grant(&dir, devices)?;
        granted.v1 = Some(dir);
    }
    if let Some(dir) = v2_dir {
        let replaced = v2::grant(&dir, devices)?;
        granted.v2 = Some((dir, replaced));
    }
    Ok(granted)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID_CGROUP: &str = "9:name=systemd:/ctr\n5:devices:/docker/abc\n\
                                 4:memory:/docker/abc\n0::/docker/abc\n";
    const HYBRID_MOUNTS: &str = "\
30 25 0:26 / /sys/fs/cgroup ro,nosuid,nodev,noexec shared:9 - tmpfs tmpfs ro,mode=755
35 30 0:31 / /sys/fs/cgroup/devices rw,nosuid shared:15 - cgroup cgroup rw,devices
36 30 0:32 / /sys/fs/cgroup/unified rw,nosuid shared:16 - cgroup2 cgroup2 rw
37 30 0:33 / /sys/fs/cgroup/cpu,cpuacct rw shared:17 - cgroup cgroup rw,cpu,cpuacct
";

    #[test]
    fn finds_both_hierarchies_on_a_hybrid_host() {
        let (v1, v2) = locate(HYBRID_CGROUP, HYBRID_MOUNTS).unwrap();
        assert_eq!(v1, Some(PathBuf::from("/sys/fs/cgroup/devices/docker/abc")));
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup/unified/docker/abc")));
    }

    #[test]
    fn pure_v2_and_bind_mounted_roots() {
        let mounts = "\
40 1 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate
41 1 0:26 /kubepods /mnt/kube rw - cgroup2 cgroup2 rw
";
        let (v1, v2) = locate("0::/kubepods/pod1/ctr\n", mounts).unwrap();
        assert_eq!(v1, None);
        assert_eq!(v2, Some(PathBuf::from("/sys/fs/cgroup/kubepods/pod1/ctr")));

        let only_bind = "41 1 0:26 /kubepods /mnt/kube rw - cgroup2 cgroup2 rw\n";
        let (_, v2) = locate("0::/kubepods/pod1\n", only_bind).unwrap();
        assert_eq!(v2, Some(PathBuf::from("/mnt/kube/pod1")));
        assert!(matches!(
            locate("0::/other\n", only_bind),
            Err(CgroupError::Outside { .. })
        ));
        assert!(matches!(
            locate("0::/kubepods-x\n", only_bind),
            Err(CgroupError::Outside { .. })
        ));
        assert!(matches!(
            locate("0::/../etc\n", mounts),
            Err(CgroupError::Outside { .. })
        ));
    }

    #[test]
    fn no_device_hierarchy_means_nothing_to_do() {
        let (v1, v2) = locate("3:memory:/x\n", HYBRID_MOUNTS).unwrap();
        assert_eq!((v1, v2), (None, None));
        assert!(parse_proc_cgroup("garbage\n").is_empty());
    }

    proptest::proptest! {
        /// Any text: no panic, and a located directory never climbs out of its mount.
        #[test]
        fn locate_never_panics_or_escapes(cgroup in "\\PC{0,200}", path in "[a-z./]{0,40}") {
            let lines = format!("{cgroup}\n0::{path}\n5:devices:{path}\n");
            if let Ok((v1, v2)) = locate(&lines, HYBRID_MOUNTS) {
                for dir in [v1, v2].into_iter().flatten() {
                    proptest::prop_assert!(dir.starts_with("/sys/fs/cgroup"), "{dir:?}");
                    proptest::prop_assert!(
                        dir.components().all(|c| !matches!(c, std::path::Component::ParentDir)),
                        "{dir:?}"
                    );
                }
            }
            let _ = parse_mountinfo(&cgroup);
        }
    }

    #[test]
    fn mount_points_with_spaces() {
        let mounts = "36 30 0:32 / /sys/fs/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
        assert_eq!(
            parse_mountinfo(mounts)[0].mount_point,
            PathBuf::from("/sys/fs/my cgroup")
        );
    }
}

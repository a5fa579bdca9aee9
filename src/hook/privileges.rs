//! Each hook stage runs with the fewest capabilities it needs.
//!
//! The hooks run as root on the host with every capability the engine had. At stage
//! entry [`restrict`] cuts the thread's effective and permitted sets to the stage's
//! set in [`STAGES`] (and no more than it had), clears the inheritable and ambient
//! sets, and drops everything else from the bounding set, so a process the stage
//! `exec`s (the prestart hook's hand-off to `nvshim runtime-hook` for NVML) cannot get
//! the rest back either. NVIDIA's `nvidia-container-cli` does the same per stage with
//! its own lists; ours follow what each stage's code does:
//! - prestart: `setns` into the container's mount namespace, the new mount API and
//!   remounts (`setns` into a mount namespace also asks for `CAP_SYS_CHROOT`), `bpf`
//!   device programs or v1 `devices.allow` (`CAP_SYS_ADMIN`; the bpf
//!   query also asks for `CAP_NET_ADMIN` on older kernels, loading for `CAP_BPF` on
//!   newer ones), `mknod` (`CAP_MKNOD`), opening `/proc/<pid>/ns/mnt` of `runc init`
//!   (`CAP_SYS_PTRACE` when its credentials differ), `setfsuid`/`setfsgid` for files on
//!   a user-namespaced filesystem (`CAP_SETUID`, `CAP_SETGID`), and files owned by
//!   others in the rootfs and the host's driver files (`CAP_CHOWN`, `CAP_FOWNER`,
//!   `CAP_DAC_OVERRIDE`, `CAP_DAC_READ_SEARCH`);
//! - `link-driver` (symlinks and the linker cache in the rootfs): the file access
//!   capabilities only — no mounts, no device nodes, no namespaces;
//! - `disable-device-node-modification` (a tmpfs copy mounted over the driver's
//!   params): `CAP_SYS_ADMIN` for the mounts and the file access capabilities;
//! - NVIDIA's `create-symlinks`, `update-ldcache`, `update-application-profile`,
//!   `enable-cuda-compat` and `chmod` (`hook::stages`): the file access capabilities
//!   only, like `link-driver`.
//!
//! Capabilities are per thread: this must run on the thread that does the work (the
//! hook is single-threaded), and tests can apply a stage's set on a thread of their
//! own. Not for the library's in-process callers: only the binaries' stage entries
//! call it.

use caps::{CapSet, Capability, CapsHashSet};

/// A hook stage that [`restrict`] can apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `nvidia-container-runtime-hook prestart` (and `nvshim runtime-hook`).
    Prestart,
    /// The `createContainer` hook that makes the driver's symlinks and linker cache.
    LinkDriver,
    /// The `createContainer` hook that covers `/proc/driver/nvidia/params`.
    DisableDeviceNodeModification,
    /// NVIDIA's `create-symlinks`, `update-ldcache`, `update-application-profile` and
    /// `enable-cuda-compat` ([`super::stages`]): files and links in the rootfs.
    RootfsFiles,
    /// NVIDIA's `chmod`: modes of files in the rootfs (`CAP_FOWNER` is among the file
    /// access capabilities).
    Chmod,
}

const FILE_ACCESS: &[Capability] = &[
    Capability::CAP_DAC_OVERRIDE,
    Capability::CAP_DAC_READ_SEARCH,
    Capability::CAP_FOWNER,
];

/// The capabilities each stage keeps, in one place. A stage's set is the union of its
/// rows.
pub const STAGES: &[(Stage, &[Capability])] = &[
    (
        Stage::Prestart,
        &[
            Capability::CAP_SYS_ADMIN,
            Capability::CAP_NET_ADMIN,
            Capability::CAP_BPF,
            Capability::CAP_MKNOD,
            Capability::CAP_SYS_CHROOT,
            Capability::CAP_SYS_PTRACE,
            Capability::CAP_SETUID,
            Capability::CAP_SETGID,
            Capability::CAP_CHOWN,
        ],
    ),
    (Stage::Prestart, FILE_ACCESS),
    (Stage::LinkDriver, FILE_ACCESS),
    (
        Stage::DisableDeviceNodeModification,
        &[Capability::CAP_SYS_ADMIN],
    ),
    (Stage::DisableDeviceNodeModification, FILE_ACCESS),
    (Stage::RootfsFiles, FILE_ACCESS),
    (Stage::Chmod, FILE_ACCESS),
];

#[derive(Debug, thiserror::Error)]
pub enum PrivilegeError {
    #[error("cannot read this thread's {set:?} capabilities: {source}")]
    Read {
        set: CapSet,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("cannot drop {cap} from the bounding set: {source}")]
    Bounding {
        cap: Capability,
        #[source]
        source: caps::errors::CapsError,
    },
    #[error("cannot set this thread's {set:?} capabilities to {wanted}: {source}")]
    Set {
        set: CapSet,
        wanted: String,
        #[source]
        source: caps::errors::CapsError,
    },
}

/// The capabilities `stage` keeps.
pub fn set_of(stage: Stage) -> CapsHashSet {
    STAGES
        .iter()
        .filter(|(s, _)| *s == stage)
        .flat_map(|(_, caps)| caps.iter().copied())
        .collect()
}

/// What [`restrict`] left: the effective and permitted set, and how many capabilities
/// outside it are now out of the bounding set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Restricted {
    pub kept: CapsHashSet,
    pub bounding_dropped: usize,
}

/// Cuts this thread's capabilities to `stage`'s set (see the module docs).
pub fn restrict(stage: Stage) -> Result<Restricted, PrivilegeError> {
    let wanted = set_of(stage);
    let read = |set| caps::read(None, set).map_err(|source| PrivilegeError::Read { set, source });
    let permitted = read(CapSet::Permitted)?;
    let kept: CapsHashSet = wanted.intersection(&permitted).copied().collect();

    // The bounding set first, while CAP_SETPCAP is still effective. Without it (a
    // non-root run, or a second pass after a hand-off) there is nothing it could drop.
    // Every capability outside `wanted` is dropped without reading the set first
    // (dropping one that is not there succeeds; EINVAL: this kernel does not know it):
    // reading it would be one more call per capability.
    let mut bounding_dropped = 0;
    if caps::has_cap(None, CapSet::Effective, Capability::CAP_SETPCAP).unwrap_or(false) {
        let mut extra: Vec<Capability> = caps::all().difference(&wanted).copied().collect();
        extra.sort_by_key(|c| c.index());
        for cap in extra {
            match super::syscalls::capbset_drop(cap.index()) {
                Ok(()) => bounding_dropped += 1,
                Err(nix::errno::Errno::EINVAL) => {}
                Err(errno) => {
                    return Err(PrivilegeError::Bounding {
                        cap,
                        source: format!("PR_CAPBSET_DROP failure: {}", errno.desc()).into(),
                    });
                }
            }
        }
    }
    let set = |set, value: &CapsHashSet| {
        caps::set(None, set, value).map_err(|source| PrivilegeError::Set {
            set,
            wanted: describe(value),
            source,
        })
    };
    let none = CapsHashSet::new();
    // Ambient before inheritable: an ambient capability must stay inheritable.
    if caps::runtime::ambient_set_supported().is_ok() {
        // One PR_CAP_AMBIENT_CLEAR_ALL (`caps::set` would lower each capability in
        // turn after probing which ones the kernel knows: 82 calls).
        caps::clear(None, CapSet::Ambient).map_err(|source| PrivilegeError::Set {
            set: CapSet::Ambient,
            wanted: describe(&none),
            source,
        })?;
    }
    set(CapSet::Inheritable, &none)?;
    set(CapSet::Effective, &kept)?;
    set(CapSet::Permitted, &kept)?;
    Ok(Restricted {
        kept,
        bounding_dropped,
    })
}

/// A capability set as sorted names, for messages and logs.
pub fn describe(set: &CapsHashSet) -> String {
    let mut caps: Vec<&Capability> = set.iter().collect();
    caps.sort_by_key(|c| c.index());
    let names: Vec<String> = caps.iter().map(|c| c.to_string()).collect();
    if names.is_empty() {
        "(none)".to_owned()
    } else {
        names.join(",")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_stage_has_a_set_and_only_prestart_makes_nodes() {
        for (stage, mknod, sys_admin) in [
            (Stage::Prestart, true, true),
            (Stage::LinkDriver, false, false),
            (Stage::DisableDeviceNodeModification, false, true),
            (Stage::RootfsFiles, false, false),
            (Stage::Chmod, false, false),
        ] {
            let set = set_of(stage);
            assert!(
                set.contains(&Capability::CAP_DAC_OVERRIDE),
                "{stage:?}: {set:?}"
            );
            assert_eq!(set.contains(&Capability::CAP_MKNOD), mknod, "{stage:?}");
            // setns into a mount namespace needs CAP_SYS_CHROOT as well.
            assert_eq!(
                set.contains(&Capability::CAP_SYS_CHROOT),
                mknod,
                "{stage:?}"
            );
            assert_eq!(
                set.contains(&Capability::CAP_SYS_ADMIN),
                sys_admin,
                "{stage:?}"
            );
            for never in [
                Capability::CAP_SETPCAP,
                Capability::CAP_SYS_MODULE,
                Capability::CAP_SYS_RAWIO,
                Capability::CAP_NET_RAW,
            ] {
                assert!(!set.contains(&never), "{stage:?} keeps {never}");
            }
        }
    }

    #[test]
    fn describes_sets_in_capability_order() {
        let set: CapsHashSet = [Capability::CAP_SYS_ADMIN, Capability::CAP_CHOWN]
            .into_iter()
            .collect();
        assert_eq!(describe(&set), "CAP_CHOWN,CAP_SYS_ADMIN");
        assert_eq!(describe(&CapsHashSet::new()), "(none)");
    }
}

//! cgroup v2 device access: the `BPF_PROG_TYPE_CGROUP_DEVICE` programs attached to the
//! container's cgroup, through raw `bpf(2)`.
//!
//! Programs attached with `BPF_F_ALLOW_MULTI` must *all* allow an access, so a device
//! cannot be added by attaching one more program: each attached program is read back
//! (`BPF_OBJ_GET_INFO_BY_FD`, `xlated_prog_insns`), an allow block for our devices is
//! put in front of it ([`super::program::prepend`]), the result is loaded and swapped
//! in for the old one atomically (`BPF_F_REPLACE`, Linux 5.6; attach-then-detach on
//! older kernels). This is what NVIDIA's nvcgo does. A cgroup with no device program
//! restricts nothing on v2, so then there is nothing to do.
//!
//! The `bpf_attr` layouts below are the prefixes of the kernel's union that each
//! command reads; the kernel zero-fills the rest.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{self, OFlag};
use nix::sys::stat::Mode;

use super::program::{self, Insn};
use super::{CgroupError, CharDevice};
use crate::hook::syscalls;

const BPF_PROG_TYPE_CGROUP_DEVICE: u32 = 15;
const BPF_CGROUP_DEVICE: u32 = 6;

const BPF_F_ALLOW_MULTI: u32 = 2;
const BPF_F_REPLACE: u32 = 4;

/// Most programs one cgroup can have attached per type (`BPF_CGROUP_MAX_PROGS`).
const MAX_PROGS: usize = 64;
/// Name of the programs we load (`[A-Za-z0-9_.]`, at most 15 bytes).
const PROG_NAME: &[u8] = b"nvshim_devices";
/// The verifier's log on a rejected load.
const LOG_SIZE: usize = 1 << 20;

/// A device program attached to a cgroup, read back.
#[derive(Debug)]
pub struct Attached {
    pub id: u32,
    pub fd: OwnedFd,
    pub insns: Vec<Insn>,
}

/// What [`grant`] did: for each program attached to the cgroup, its id and the id of
/// the program that replaced it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replaced {
    pub programs: Vec<(u32, u32)>,
}

/// Opens a cgroup v2 directory for the bpf commands.
pub fn open_cgroup(dir: &Path) -> Result<OwnedFd, CgroupError> {
    fcntl::open(
        dir,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|source| CgroupError::Bpf {
        cgroup: dir.to_path_buf(),
        step: "open",
        source,
    })
}

/// The attach flags and program ids of the device programs attached directly to
/// `cgroup`.
pub fn query(cgroup: BorrowedFd<'_>) -> Result<(u32, Vec<u32>), Errno> {
    let mut ids = vec![0u32; MAX_PROGS];
    let (flags, count) = syscalls::prog_query(cgroup, BPF_CGROUP_DEVICE, &mut ids)?;
    ids.truncate(count);
    Ok((flags, ids))
}

/// Opens program `id` and reads its instructions back.
pub fn read(id: u32) -> Result<Attached, Errno> {
    let fd = syscalls::prog_get_fd_by_id(id)?;
    let head = syscalls::prog_info(fd.as_fd(), &mut [])?;
    if head.prog_type != BPF_PROG_TYPE_CGROUP_DEVICE {
        return Err(Errno::EINVAL);
    }
    let mut bytes = vec![0u8; usize::try_from(head.xlated_prog_len).unwrap_or(0)];
    let full = syscalls::prog_info(fd.as_fd(), &mut bytes)?;
    bytes.truncate(usize::try_from(full.xlated_prog_len).unwrap_or(0));
    let insns = program::from_bytes(&bytes).map_err(|_| Errno::EINVAL)?;
    Ok(Attached { id, fd, insns })
}

/// The id of a loaded program.
pub fn id_of(prog: BorrowedFd<'_>) -> Result<u32, Errno> {
    Ok(syscalls::prog_info(prog, &mut [])?.id)
}

/// Loads a device program. On rejection the error carries the verifier's log.
pub fn load(insns: &[Insn]) -> Result<OwnedFd, (Errno, String)> {
    let bytes = program::to_bytes(insns);
    let mut name = [0u8; 16];
    name[..PROG_NAME.len()].copy_from_slice(PROG_NAME);
    let attempt = |log: Option<&mut [u8]>| {
        syscalls::prog_load(
            BPF_PROG_TYPE_CGROUP_DEVICE,
            &bytes,
            c"Apache-2.0",
            name,
            log,
        )
    };
    match attempt(None) {
        Ok(fd) => Ok(fd),
        Err(first) => {
            // Again with the verifier's log, which says why.
            let mut log = vec![0u8; LOG_SIZE];
            let result = attempt(Some(&mut log));
            let end = log.iter().position(|b| *b == 0).unwrap_or(log.len());
            let text = String::from_utf8_lossy(&log[..end]).trim().to_string();
            match result {
                Ok(fd) => Ok(fd),
                Err(_) => Err((first, text)),
            }
        }
    }
}

fn attach_raw(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    flags: u32,
    replace: Option<BorrowedFd<'_>>,
) -> Result<(), Errno> {
    syscalls::prog_attach(cgroup, prog, BPF_CGROUP_DEVICE, flags, replace)
}

/// Detaches `prog` from `cgroup`.
pub fn detach(cgroup: BorrowedFd<'_>, prog: BorrowedFd<'_>) -> Result<(), Errno> {
    syscalls::prog_detach(cgroup, prog, BPF_CGROUP_DEVICE)
}

/// Loads `insns` and attaches them to the cgroup `dir` with `BPF_F_ALLOW_MULTI`, next
/// to whatever is attached there: what runc does for a container with a device
/// policy. Returns the new program's id.
pub fn attach_program(dir: &Path, insns: &[Insn]) -> Result<u32, CgroupError> {
    let cgroup = open_cgroup(dir)?;
    let prog = load(insns).map_err(|(source, log)| CgroupError::Verifier {
        cgroup: dir.to_path_buf(),
        source,
        log,
    })?;
    let step = |step| {
        move |source| CgroupError::Bpf {
            cgroup: dir.to_path_buf(),
            step,
            source,
        }
    };
    attach_raw(cgroup.as_fd(), prog.as_fd(), BPF_F_ALLOW_MULTI, None).map_err(step("attach"))?;
    id_of(prog.as_fd()).map_err(step("read the new program's id"))
}

/// Lets the cgroup `dir` access `devices` (`rwm`) in every device program attached to
/// it, keeping each program's own rules.
pub fn grant(dir: &Path, devices: &[CharDevice]) -> Result<Replaced, CgroupError> {
    let cgroup = open_cgroup(dir)?;
    let step = |step| {
        move |source| CgroupError::Bpf {
            cgroup: dir.to_path_buf(),
            step,
            source,
        }
    };
    let (flags, ids) = query(cgroup.as_fd()).map_err(step("query the device programs"))?;
    let mut replaced = Replaced::default();
    for id in ids {
        let old = read(id).map_err(step("read back an attached device program"))?;
        let insns =
            program::prepend(devices, &old.insns).map_err(|reason| CgroupError::Program {
                cgroup: dir.to_path_buf(),
                id,
                reason,
            })?;
        let new = load(&insns).map_err(|(source, log)| CgroupError::Verifier {
            cgroup: dir.to_path_buf(),
            source,
            log,
        })?;
        if flags & BPF_F_ALLOW_MULTI != 0 {
            let swapped = attach_raw(
                cgroup.as_fd(),
                new.as_fd(),
                BPF_F_ALLOW_MULTI | BPF_F_REPLACE,
                Some(old.fd.as_fd()),
            );
            match swapped {
                Ok(()) => {}
                // Before Linux 5.6 there is no atomic replace: attach ours, then detach
                // the old one (for a moment both run, and both must allow).
                Err(Errno::EINVAL) => {
                    attach_raw(cgroup.as_fd(), new.as_fd(), BPF_F_ALLOW_MULTI, None)
                        .map_err(step("attach the new device program"))?;
                    detach(cgroup.as_fd(), old.fd.as_fd())
                        .map_err(step("detach the old device program"))?;
                }
                Err(e) => return Err(step("replace the device program")(e)),
            }
        } else {
            // One program per cgroup: attaching with the same flags replaces it.
            attach_raw(cgroup.as_fd(), new.as_fd(), flags, None)
                .map_err(step("replace the device program"))?;
        }
        let new_id = id_of(new.as_fd()).map_err(step("read the new program's id"))?;
        tracing::debug!(cgroup = %dir.display(), old = id, new = new_id, "device program replaced");
        replaced.programs.push((id, new_id));
    }
    Ok(replaced)
}

//! The hook's raw system calls: the new mount API (`open_tree`, `move_mount`,
//! `fsopen`, `fsconfig`, `fsmount`, Linux 5.2), `bpf(2)`'s cgroup device program
//! commands, none of which nix or libc wrap, and `prctl(PR_CAPBSET_DROP)` with its
//! errno (the `caps` crate's drop keeps only a message).
//!
//! This is the only hook module allowed `unsafe`: each wrapper here is safe to call
//! (it takes fds and slices, never raw pointers, and checks every length it hands the
//! kernel), so the modules that use them ([`super::mounts`], [`super::params`],
//! [`super::cgroup::v2`]) stay free of it. Each unsafe block says why it is sound.

#![allow(unsafe_code)]

use std::ffi::{CStr, c_int, c_long, c_uint};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;

/// An fd the kernel just returned (`ret >= 0`), or the errno of a failed call.
fn owned(ret: c_long) -> Result<OwnedFd, Errno> {
    if ret < 0 {
        return Err(Errno::last());
    }
    let fd = RawFd::try_from(ret).map_err(|_| Errno::EBADF)?;
    // SAFETY: the kernel just returned this fd to us; nothing else owns or closes it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn unit(ret: c_long) -> Result<(), Errno> {
    if ret < 0 { Err(Errno::last()) } else { Ok(()) }
}

/// `prctl(PR_CAPBSET_DROP, cap)`: takes capability number `cap` out of this thread's
/// bounding set (EINVAL: the kernel does not know it; EPERM: no CAP_SETPCAP).
pub fn capbset_drop(cap: u8) -> Result<(), Errno> {
    // SAFETY: PR_CAPBSET_DROP reads only its integer argument and touches no memory.
    let ret = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, libc::c_ulong::from(cap), 0, 0, 0) };
    unit(c_long::from(ret))
}

/// `open_tree(dir, path, flags)`: a detached clone of the mount at `path` relative to
/// `dir` (`AT_EMPTY_PATH` with an empty `path`: `dir` itself).
pub fn open_tree(dir: BorrowedFd<'_>, path: &CStr, flags: c_uint) -> Result<OwnedFd, Errno> {
    // SAFETY: open_tree(2) reads only the fd and the NUL-terminated path, which the
    // caller's borrow keeps alive for the whole call; it returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_open_tree, dir.as_raw_fd(), path.as_ptr(), flags) })
}

/// `move_mount(tree, "", target, "", F_EMPTY_PATH | T_EMPTY_PATH)`: attaches the
/// detached mount `tree` onto the mountpoint fd `target`.
pub fn move_mount(tree: BorrowedFd<'_>, target: BorrowedFd<'_>) -> Result<(), Errno> {
    let flags: c_uint = libc::MOVE_MOUNT_F_EMPTY_PATH | libc::MOVE_MOUNT_T_EMPTY_PATH;
    // SAFETY: move_mount(2) reads only the two fds and the two NUL-terminated empty
    // paths, which are static; it returns 0 or -1 with errno set.
    unit(unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            c"".as_ptr(),
            target.as_raw_fd(),
            c"".as_ptr(),
            flags,
        )
    })
}

/// `fsopen(fs, FSOPEN_CLOEXEC)`: a filesystem context for a new superblock.
pub fn fsopen(fs: &CStr) -> Result<OwnedFd, Errno> {
    const FSOPEN_CLOEXEC: c_uint = 1;
    // SAFETY: fsopen(2) reads the NUL-terminated name, which the borrow keeps alive
    // for the call; it returns a new fd or -1.
    owned(unsafe { libc::syscall(libc::SYS_fsopen, fs.as_ptr(), FSOPEN_CLOEXEC) })
}

/// `fsconfig(context, FSCONFIG_CMD_CREATE)`: creates the superblock.
pub fn fsconfig_create(context: BorrowedFd<'_>) -> Result<(), Errno> {
    const FSCONFIG_CMD_CREATE: c_uint = 6;
    // SAFETY: fsconfig(2) with CMD_CREATE reads no key or value (null pointers, 0
    // length); it reads only the fd.
    unit(unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            context.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    })
}

/// `fsmount(context, FSMOUNT_CLOEXEC, attrs)`: a detached mount of the context's
/// superblock.
pub fn fsmount(context: BorrowedFd<'_>, attrs: c_uint) -> Result<OwnedFd, Errno> {
    const FSMOUNT_CLOEXEC: c_uint = 1;
    // SAFETY: fsmount(2) reads only the fd and two integers; it returns a new fd or -1.
    owned(unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            context.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            attrs,
        )
    })
}

/// `MOUNT_ATTR_*` for [`fsmount`].
pub const MOUNT_ATTR_NOSUID: c_uint = 2;
pub const MOUNT_ATTR_NODEV: c_uint = 4;
pub const MOUNT_ATTR_NOEXEC: c_uint = 8;

// bpf(2): the cgroup device program commands. The `bpf_attr` layouts below are the
// prefixes of the kernel's union that each command reads; the kernel zero-fills the
// rest. Pointers inside them are set here, from slices, never by callers.

const BPF_PROG_LOAD: c_int = 5;
const BPF_PROG_ATTACH: c_int = 8;
const BPF_PROG_DETACH: c_int = 9;
const BPF_PROG_GET_FD_BY_ID: c_int = 13;
const BPF_OBJ_GET_INFO_BY_FD: c_int = 15;
const BPF_PROG_QUERY: c_int = 16;

/// Bytes in one eBPF instruction.
pub const INSN_SIZE: usize = 8;

#[repr(C)]
#[derive(Default)]
struct QueryAttr {
    target_fd: u32,
    attach_type: u32,
    query_flags: u32,
    attach_flags: u32,
    prog_ids: u64,
    prog_cnt: u32,
    _pad: u32,
}

#[repr(C)]
#[derive(Default)]
struct GetFdAttr {
    prog_id: u32,
    next_id: u32,
    open_flags: u32,
}

#[repr(C)]
#[derive(Default)]
struct InfoAttr {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// The head of `struct bpf_prog_info`.
#[repr(C)]
#[derive(Default)]
struct RawProgInfo {
    prog_type: u32,
    id: u32,
    tag: [u8; 8],
    jited_prog_len: u32,
    xlated_prog_len: u32,
    jited_prog_insns: u64,
    xlated_prog_insns: u64,
    load_time: u64,
    created_by_uid: u32,
    nr_map_ids: u32,
    map_ids: u64,
    name: [u8; 16],
}

#[repr(C)]
#[derive(Default)]
struct LoadAttr {
    prog_type: u32,
    insn_cnt: u32,
    insns: u64,
    license: u64,
    log_level: u32,
    log_size: u32,
    log_buf: u64,
    kern_version: u32,
    prog_flags: u32,
    prog_name: [u8; 16],
    prog_ifindex: u32,
    expected_attach_type: u32,
}

#[repr(C)]
#[derive(Default)]
struct AttachAttr {
    target_fd: u32,
    attach_bpf_fd: u32,
    attach_type: u32,
    attach_flags: u32,
    replace_bpf_fd: u32,
    _pad: u32,
}

/// Marks the attr structs: `#[repr(C)]` prefixes of `union bpf_attr`.
trait BpfAttr {}
impl BpfAttr for QueryAttr {}
impl BpfAttr for GetFdAttr {}
impl BpfAttr for InfoAttr {}
impl BpfAttr for LoadAttr {}
impl BpfAttr for AttachAttr {}

/// `bpf(cmd, attr, sizeof attr)`. Private: only the typed commands below build attrs,
/// and each points only into buffers it borrows for the call.
fn bpf<T: BpfAttr>(cmd: c_int, attr: &mut T) -> Result<c_long, Errno> {
    let size = u32::try_from(size_of::<T>()).map_err(|_| Errno::E2BIG)?;
    // SAFETY: `attr` is a live, exclusively borrowed #[repr(C)] struct laid out as the
    // prefix of `union bpf_attr` that `cmd` reads, and `size` is its exact size. Every
    // pointer inside it was set by the command wrappers below from a slice they
    // borrow for this call, with that slice's length in the same struct.
    let ret = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr as *mut T, size) };
    if ret < 0 { Err(Errno::last()) } else { Ok(ret) }
}

fn fd_u32(fd: BorrowedFd<'_>) -> u32 {
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}

fn len_u32(len: usize) -> Result<u32, Errno> {
    u32::try_from(len).map_err(|_| Errno::E2BIG)
}

/// `BPF_PROG_QUERY`: fills `ids` with the ids of the programs of `attach_type`
/// attached directly to `cgroup`; returns the attach flags and how many ids it wrote.
pub fn prog_query(
    cgroup: BorrowedFd<'_>,
    attach_type: u32,
    ids: &mut [u32],
) -> Result<(u32, usize), Errno> {
    let mut attr = QueryAttr {
        target_fd: fd_u32(cgroup),
        attach_type,
        prog_ids: ids.as_mut_ptr() as u64,
        prog_cnt: len_u32(ids.len())?,
        ..QueryAttr::default()
    };
    bpf(BPF_PROG_QUERY, &mut attr)?;
    let count = usize::try_from(attr.prog_cnt).unwrap_or(0).min(ids.len());
    Ok((attr.attach_flags, count))
}

/// `BPF_PROG_GET_FD_BY_ID`.
pub fn prog_get_fd_by_id(id: u32) -> Result<OwnedFd, Errno> {
    let mut attr = GetFdAttr {
        prog_id: id,
        ..GetFdAttr::default()
    };
    owned(bpf(BPF_PROG_GET_FD_BY_ID, &mut attr)?)
}

/// What [`prog_info`] reads of `struct bpf_prog_info`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProgInfo {
    pub prog_type: u32,
    pub id: u32,
    /// The translated program's length in bytes (the kernel's, whatever the buffer).
    pub xlated_prog_len: u32,
}

/// `BPF_OBJ_GET_INFO_BY_FD` on a program; the translated instructions are copied into
/// `xlated` (at most its length; pass an empty slice to learn the length first).
pub fn prog_info(prog: BorrowedFd<'_>, xlated: &mut [u8]) -> Result<ProgInfo, Errno> {
    let mut info = RawProgInfo {
        xlated_prog_len: len_u32(xlated.len())?,
        xlated_prog_insns: if xlated.is_empty() {
            0
        } else {
            xlated.as_mut_ptr() as u64
        },
        ..RawProgInfo::default()
    };
    let mut attr = InfoAttr {
        bpf_fd: fd_u32(prog),
        info_len: len_u32(size_of::<RawProgInfo>())?,
        info: &mut info as *mut RawProgInfo as u64,
    };
    bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr)?;
    Ok(ProgInfo {
        prog_type: info.prog_type,
        id: info.id,
        xlated_prog_len: info.xlated_prog_len,
    })
}

/// `BPF_PROG_LOAD` of `insns` (whole instructions, [`INSN_SIZE`] bytes each) as a
/// program of `prog_type` named `name`; with `log`, the verifier writes its log there.
pub fn prog_load(
    prog_type: u32,
    insns: &[u8],
    license: &CStr,
    name: [u8; 16],
    log: Option<&mut [u8]>,
) -> Result<OwnedFd, Errno> {
    if !insns.len().is_multiple_of(INSN_SIZE) {
        return Err(Errno::EINVAL);
    }
    let mut attr = LoadAttr {
        prog_type,
        insn_cnt: len_u32(insns.len() / INSN_SIZE)?,
        insns: insns.as_ptr() as u64,
        license: license.as_ptr() as u64,
        prog_name: name,
        ..LoadAttr::default()
    };
    if let Some(buf) = log {
        attr.log_level = 1;
        attr.log_size = len_u32(buf.len())?;
        attr.log_buf = buf.as_mut_ptr() as u64;
    }
    owned(bpf(BPF_PROG_LOAD, &mut attr)?)
}

/// `BPF_PROG_ATTACH` of `prog` to `cgroup`, replacing `replace` when given
/// (`BPF_F_REPLACE` in `flags`).
pub fn prog_attach(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    attach_type: u32,
    flags: u32,
    replace: Option<BorrowedFd<'_>>,
) -> Result<(), Errno> {
    let mut attr = AttachAttr {
        target_fd: fd_u32(cgroup),
        attach_bpf_fd: fd_u32(prog),
        attach_type,
        attach_flags: flags,
        replace_bpf_fd: replace.map_or(0, fd_u32),
        _pad: 0,
    };
    bpf(BPF_PROG_ATTACH, &mut attr).map(drop)
}

/// `BPF_PROG_DETACH` of `prog` from `cgroup`.
pub fn prog_detach(
    cgroup: BorrowedFd<'_>,
    prog: BorrowedFd<'_>,
    attach_type: u32,
) -> Result<(), Errno> {
    let mut attr = AttachAttr {
        target_fd: fd_u32(cgroup),
        attach_bpf_fd: fd_u32(prog),
        attach_type,
        ..AttachAttr::default()
    };
    bpf(BPF_PROG_DETACH, &mut attr).map(drop)
}

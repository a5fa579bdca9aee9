//! `BPF_PROG_TYPE_CGROUP_DEVICE` programs as data: a tiny assembler for "allow these
//! character devices" blocks and the check that an existing program can take them in
//! front of its own code.
//!
//! The program gets `r1` = `struct bpf_cgroup_dev_ctx { u32 access_type; u32 major;
//! u32 minor; }` (`access_type` = access bits << 16 | device type) and returns 1 to
//! allow, 0 to deny. Our block only reads the context into `r6` and either returns 1
//! or falls through to the old program's first instruction with `r1` untouched, so the
//! old program runs exactly as before for every other device (the approach of nvcgo;
//! runc's generator writes whole programs and uses `r2`, which is fine only when
//! nothing follows). Pure: no syscalls here.

use super::CharDevice;

/// One eBPF instruction, as the kernel lays it out (`struct bpf_insn`, 8 bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Insn {
    pub code: u8,
    /// `dst_reg` in the low nibble, `src_reg` in the high one.
    pub regs: u8,
    pub off: i16,
    pub imm: i32,
}

/// `BPF_LDX | BPF_MEM | BPF_W`: `dst = *(u32 *)(src + off)`.
const LDX_MEM_W: u8 = 0x61;
/// `BPF_ALU | BPF_AND | BPF_K`: `(u32) dst &= imm`.
const ALU32_AND_K: u8 = 0x54;
/// `BPF_JMP | BPF_JNE | BPF_K`: `if dst != imm goto pc + off`.
const JNE_K: u8 = 0x55;
/// `BPF_ALU64 | BPF_MOV | BPF_K`: `dst = imm`.
const MOV64_K: u8 = 0xb7;
/// `BPF_JMP | BPF_EXIT`.
const EXIT: u8 = 0x95;
/// `BPF_JMP | BPF_CALL`.
const CALL: u8 = 0x85;
/// `BPF_LD | BPF_IMM | BPF_DW`: the first half of a 16-byte load.
const LD_IMM64: u8 = 0x18;

const R0: u8 = 0;
const R1: u8 = 1;
/// Callee-saved and unread by any verified program before it writes it: free for us.
const R6: u8 = 6;

/// `BPF_DEVCG_DEV_CHAR`.
const DEV_CHAR: i32 = 2;
const CTX_ACCESS_TYPE: i16 = 0;
const CTX_MAJOR: i16 = 4;
const CTX_MINOR: i16 = 8;

/// Instructions per device in [`allow_prefix`], after the 3-instruction type check.
const PER_DEVICE: usize = 6;

/// Why an existing program cannot be extended.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProgramError {
    #[error("the attached device program is empty")]
    Empty,
    #[error(
        "the attached device program's length ({0} bytes) is not a whole number of instructions"
    )]
    Truncated(usize),
    #[error(
        "the attached device program calls a helper or loads a map at instruction {0}; \
         a program read back from the kernel cannot be reloaded with those"
    )]
    Relocated(usize),
    #[error("device {0} has a major or minor number beyond what a program can compare")]
    Number(CharDevice),
    #[error("the new device program would have {0} instructions, more than a jump can skip")]
    TooLong(usize),
}

fn insn(code: u8, dst: u8, src: u8, off: i16, imm: i32) -> Insn {
    Insn {
        code,
        regs: (src << 4) | (dst & 0x0f),
        off,
        imm,
    }
}

/// `r0 = verdict; exit`.
fn ret(verdict: i32) -> [Insn; 2] {
    [insn(MOV64_K, R0, 0, 0, verdict), insn(EXIT, 0, 0, 0, 0)]
}

/// Code that returns "allow" for any access to any of `devices` (character devices)
/// and otherwise falls through to whatever follows, with `r1` intact.
pub fn allow_prefix(devices: &[CharDevice]) -> Result<Vec<Insn>, ProgramError> {
    if devices.is_empty() {
        return Ok(Vec::new());
    }
    let body = devices.len() * PER_DEVICE;
    let skip = i16::try_from(body).map_err(|_| ProgramError::TooLong(body + 3))?;
    let mut out = Vec::with_capacity(body + 3);
    out.push(insn(LDX_MEM_W, R6, R1, CTX_ACCESS_TYPE, 0));
    out.push(insn(ALU32_AND_K, R6, 0, 0, 0xffff));
    out.push(insn(JNE_K, R6, 0, skip, DEV_CHAR));
    for device in devices {
        let major = i32::try_from(device.major).map_err(|_| ProgramError::Number(*device))?;
        let minor = i32::try_from(device.minor).map_err(|_| ProgramError::Number(*device))?;
        out.push(insn(LDX_MEM_W, R6, R1, CTX_MAJOR, 0));
        out.push(insn(JNE_K, R6, 0, 4, major));
        out.push(insn(LDX_MEM_W, R6, R1, CTX_MINOR, 0));
        out.push(insn(JNE_K, R6, 0, 2, minor));
        out.extend(ret(1));
    }
    Ok(out)
}

/// A whole program that allows `devices` and denies everything else: what a runtime
/// with a default-deny device policy attaches (used by tests to stand in for runc).
pub fn allow_only(devices: &[CharDevice]) -> Result<Vec<Insn>, ProgramError> {
    let mut out = allow_prefix(devices)?;
    out.extend(ret(0));
    Ok(out)
}

/// `old` (read back from the kernel) with an allow block for `devices` in front.
pub fn prepend(devices: &[CharDevice], old: &[Insn]) -> Result<Vec<Insn>, ProgramError> {
    if old.is_empty() {
        return Err(ProgramError::Empty);
    }
    // Read-back code has helper calls and map loads rewritten to kernel addresses;
    // device programs from runc, systemd and nvcgo use neither.
    if let Some(at) = old
        .iter()
        .position(|i| i.code == CALL || (i.code == LD_IMM64 && i.regs >> 4 != 0))
    {
        return Err(ProgramError::Relocated(at));
    }
    let mut out = allow_prefix(devices)?;
    out.extend_from_slice(old);
    Ok(out)
}

/// Decodes `struct bpf_insn` bytes (native endian).
pub fn from_bytes(bytes: &[u8]) -> Result<Vec<Insn>, ProgramError> {
    if !bytes.len().is_multiple_of(8) {
        return Err(ProgramError::Truncated(bytes.len()));
    }
    Ok(bytes
        .chunks_exact(8)
        .map(|c| Insn {
            code: c[0],
            regs: c[1],
            off: i16::from_ne_bytes([c[2], c[3]]),
            imm: i32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect())
}

/// Encodes instructions as `struct bpf_insn` bytes (native endian).
pub fn to_bytes(insns: &[Insn]) -> Vec<u8> {
    let mut out = Vec::with_capacity(insns.len() * 8);
    for i in insns {
        out.push(i.code);
        out.push(i.regs);
        out.extend_from_slice(&i.off.to_ne_bytes());
        out.extend_from_slice(&i.imm.to_ne_bytes());
    }
    out
}

/// Runs a program over one access, as the kernel would (only the instructions this
/// module emits are understood). For tests of the assembler without a kernel.
#[cfg(test)]
fn run(prog: &[Insn], major: u32, minor: u32) -> Option<i64> {
    let ctx = [(1u32 << 16) | DEV_CHAR as u32, major, minor];
    let mut regs = [0i64; 11];
    let mut pc = 0usize;
    loop {
        let i = prog.get(pc)?;
        let dst = usize::from(i.regs & 0x0f);
        match i.code {
            LDX_MEM_W => regs[dst] = i64::from(ctx[usize::try_from(i.off / 4).ok()?]),
            ALU32_AND_K => regs[dst] = (regs[dst] as u32 & i.imm as u32) as i64,
            JNE_K if regs[dst] != i64::from(i.imm) => {
                pc = usize::try_from(pc as i64 + i64::from(i.off)).ok()?;
            }
            JNE_K => {}
            MOV64_K => regs[dst] = i64::from(i.imm),
            EXIT => return Some(regs[0]),
            _ => return None,
        }
        pc += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dev(major: u32, minor: u32) -> CharDevice {
        CharDevice { major, minor }
    }

    #[test]
    fn allow_only_allows_exactly_its_devices() {
        let prog = allow_only(&[dev(1, 3), dev(195, 1)]).unwrap();
        for (case, major, minor, want) in [
            ("listed", 1, 3, 1),
            ("listed second", 195, 1, 1),
            ("same major", 195, 2, 0),
            ("same minor", 2, 3, 0),
            ("other", 1, 5, 0),
        ] {
            assert_eq!(run(&prog, major, minor), Some(want), "{case}");
        }
    }

    #[test]
    fn prepend_allows_ours_then_runs_the_old_program() {
        let old = allow_only(&[dev(1, 3)]).unwrap();
        let prog = prepend(&[dev(195, 0), dev(195, 255)], &old).unwrap();
        for (case, major, minor, want) in [
            ("ours", 195, 0, 1),
            ("ours too", 195, 255, 1),
            ("kept by the old program", 1, 3, 1),
            ("denied by the old program", 1, 7, 0),
            ("not ours", 195, 1, 0),
        ] {
            assert_eq!(run(&prog, major, minor), Some(want), "{case}");
        }
        assert_eq!(prog.len(), 3 + 2 * PER_DEVICE + old.len());
        // No device to add: the old program unchanged.
        assert_eq!(prepend(&[], &old).unwrap(), old);
    }

    #[test]
    fn only_r6_and_r0_are_written_before_the_old_code() {
        let prefix = allow_prefix(&[dev(195, 0)]).unwrap();
        for i in &prefix {
            let dst = i.regs & 0x0f;
            if i.code != EXIT && i.code != JNE_K {
                assert!(dst == R6 || dst == R0, "{i:?}");
            }
        }
    }

    #[test]
    fn relocated_programs_are_refused() {
        let mut old = allow_only(&[dev(1, 3)]).unwrap();
        old.insert(1, insn(CALL, 0, 0, 0, 42));
        assert_eq!(
            prepend(&[dev(195, 0)], &old),
            Err(ProgramError::Relocated(1))
        );
        let map_load = vec![insn(LD_IMM64, 1, 1, 0, 7), insn(0, 0, 0, 0, 0)];
        assert_eq!(
            prepend(&[dev(195, 0)], &map_load),
            Err(ProgramError::Relocated(0))
        );
        assert_eq!(prepend(&[dev(195, 0)], &[]), Err(ProgramError::Empty));
        assert_eq!(
            allow_prefix(&[dev(u32::MAX, 0)]),
            Err(ProgramError::Number(dev(u32::MAX, 0)))
        );
    }

    #[test]
    fn bytes_round_trip() {
        let prog = allow_only(&[dev(195, 7)]).unwrap();
        let bytes = to_bytes(&prog);
        assert_eq!(bytes.len(), prog.len() * 8);
        assert_eq!(from_bytes(&bytes).unwrap(), prog);
        assert_eq!(from_bytes(&bytes[..5]), Err(ProgramError::Truncated(5)));
    }
}

//! Just enough ELF to do `ldconfig`'s part for one library: its class and machine
//! (the cache entry's flags) and its `DT_SONAME` (the cache key and the link name).
//!
//! The file comes from an image, so every offset and count is checked against the
//! bytes actually read, reads are bounded, and nothing here panics on any input.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// `e_machine` values the cache flags depend on.
const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

const ET_DYN: u16 = 3;
const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_STRTAB: u64 = 5;
const DT_SONAME: u64 = 14;

/// More program headers than any real library has.
const MAX_PHNUM: usize = 512;
/// Bytes of the dynamic section read at most.
const MAX_DYNAMIC: u64 = 64 * 1024;
/// Longest soname read.
const MAX_SONAME: usize = 1024;

/// What [`read`] found in a shared library.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// ELFCLASS64.
    pub class64: bool,
    pub machine: u16,
    /// `DT_SONAME`, if the library has one.
    pub soname: Option<String>,
}

impl Library {
    /// The flags `ldconfig` on this build's architecture gives the library, `None` for
    /// one of another architecture (which `ld.so` would not load).
    pub fn cache_flags(&self) -> Option<i32> {
        use crate::ldcache::{Class, native_flags};
        let (lib64, lib32) = if cfg!(target_arch = "x86_64") {
            (EM_X86_64, Some(EM_386))
        } else if cfg!(target_arch = "aarch64") {
            (EM_AARCH64, None)
        } else {
            return None;
        };
        match (self.class64, self.machine) {
            (true, m) if m == lib64 => native_flags(Class::Lib64),
            (false, m) if Some(m) == lib32 => native_flags(Class::Lib32),
            _ => None,
        }
    }
}

/// Reads `file`'s ELF header, program headers and dynamic section. `None` for
/// anything that is not a well-formed ELF shared object.
pub fn read(file: &File) -> Option<Library> {
    let mut ident = [0u8; 64];
    let n = read_at(file, &mut ident, 0)?;
    if n < 52 || ident[..4] != *b"\x7fELF" {
        return None;
    }
    let class64 = match ident[4] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let big = match ident[5] {
        1 => false,
        2 => true,
        _ => return None,
    };
    let e = Endian { big };
    if class64 && n < 64 {
        return None;
    }
    if e.u16(&ident, 16)? != ET_DYN {
        return None;
    }
    let machine = e.u16(&ident, 18)?;
    let (phoff, phentsize, phnum) = if class64 {
        (e.u64(&ident, 32)?, e.u16(&ident, 54)?, e.u16(&ident, 56)?)
    } else {
        (
            u64::from(e.u32(&ident, 28)?),
            e.u16(&ident, 42)?,
            e.u16(&ident, 44)?,
        )
    };
    let phentsize = usize::from(phentsize);
    let phnum = usize::from(phnum);
    let min_ph = if class64 { 56 } else { 32 };
    // Real entries are exactly 56 or 32 bytes; a little slack, never a large read.
    if !(min_ph..=2 * min_ph).contains(&phentsize) || phnum == 0 || phnum > MAX_PHNUM {
        return None;
    }
    let mut table = vec![0u8; phentsize * phnum];
    if read_at(file, &mut table, phoff)? != table.len() {
        return None;
    }
    let mut loads = Vec::new();
    let mut dynamic = None;
    for ph in table.chunks_exact(phentsize) {
        let kind = e.u32(ph, 0)?;
        // (offset, vaddr, filesz)
        let seg = if class64 {
            (e.u64(ph, 8)?, e.u64(ph, 16)?, e.u64(ph, 32)?)
        } else {
            (
                u64::from(e.u32(ph, 4)?),
                u64::from(e.u32(ph, 8)?),
                u64::from(e.u32(ph, 16)?),
            )
        };
        match kind {
            PT_LOAD => loads.push(seg),
            PT_DYNAMIC => dynamic = Some(seg),
            _ => {}
        }
    }
    let soname =
        dynamic.and_then(|(offset, _, size)| soname(file, e, class64, offset, size, &loads));
    Some(Library {
        class64,
        machine,
        soname,
    })
}

/// `DT_SONAME` from the dynamic section at `offset` (`size` bytes): the string at
/// `DT_STRTAB + d_val`, `DT_STRTAB` being an address mapped by one of `loads`.
fn soname(
    file: &File,
    e: Endian,
    class64: bool,
    offset: u64,
    size: u64,
    loads: &[(u64, u64, u64)],
) -> Option<String> {
    let mut section = vec![0u8; usize::try_from(size.min(MAX_DYNAMIC)).ok()?];
    let n = read_at(file, &mut section, offset)?;
    let entry = if class64 { 16 } else { 8 };
    let (mut strtab, mut name) = (None, None);
    for d in section[..n].chunks_exact(entry) {
        let (tag, val) = if class64 {
            (e.u64(d, 0)?, e.u64(d, 8)?)
        } else {
            (u64::from(e.u32(d, 0)?), u64::from(e.u32(d, 4)?))
        };
        match tag {
            DT_NULL => break,
            DT_STRTAB => strtab = Some(val),
            DT_SONAME => name = Some(val),
            _ => {}
        }
    }
    let (strtab, name) = (strtab?, name?);
    let (seg_off, vaddr, _) = loads
        .iter()
        .copied()
        .find(|&(_, vaddr, filesz)| strtab >= vaddr && strtab - vaddr < filesz)?;
    let at = (strtab - vaddr).checked_add(seg_off)?.checked_add(name)?;
    let mut buf = vec![0u8; MAX_SONAME];
    let n = read_at(file, &mut buf, at)?;
    let end = buf[..n].iter().position(|&b| b == 0)?;
    let text = std::str::from_utf8(&buf[..end]).ok()?;
    let plain = !matches!(text, "" | "." | "..") && !text.contains('/');
    plain.then(|| text.to_owned())
}

/// Reads as much of `buf` as the file has at `offset`.
fn read_at(file: &File, buf: &mut [u8], offset: u64) -> Option<usize> {
    let mut done = 0;
    while done < buf.len() {
        match file.read_at(&mut buf[done..], offset.checked_add(done as u64)?) {
            Ok(0) => break,
            Ok(n) => done += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
    }
    Some(done)
}

#[derive(Clone, Copy)]
struct Endian {
    big: bool,
}

impl Endian {
    fn bytes<const N: usize>(b: &[u8], at: usize) -> Option<[u8; N]> {
        b.get(at..at.checked_add(N)?)?.try_into().ok()
    }

    fn u16(self, b: &[u8], at: usize) -> Option<u16> {
        let raw = Self::bytes::<2>(b, at)?;
        Some(if self.big {
            u16::from_be_bytes(raw)
        } else {
            u16::from_le_bytes(raw)
        })
    }

    fn u32(self, b: &[u8], at: usize) -> Option<u32> {
        let raw = Self::bytes::<4>(b, at)?;
        Some(if self.big {
            u32::from_be_bytes(raw)
        } else {
            u32::from_le_bytes(raw)
        })
    }

    fn u64(self, b: &[u8], at: usize) -> Option<u64> {
        let raw = Self::bytes::<8>(b, at)?;
        Some(if self.big {
            u64::from_be_bytes(raw)
        } else {
            u64::from_le_bytes(raw)
        })
    }
}

/// For tests: a minimal 64-bit little-endian shared object: one PT_LOAD mapping the whole
/// file at address 0x1000, a PT_DYNAMIC with DT_STRTAB and DT_SONAME.
#[cfg(test)]
pub(crate) fn tiny_so(soname: &str, machine: u16) -> Vec<u8> {
    let mut f = vec![0u8; 64 + 2 * 56];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2;
    f[5] = 1;
    f[6] = 1;
    f[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
    f[18..20].copy_from_slice(&machine.to_le_bytes());
    f[32..40].copy_from_slice(&64u64.to_le_bytes());
    f[54..56].copy_from_slice(&56u16.to_le_bytes());
    f[56..58].copy_from_slice(&2u16.to_le_bytes());
    let dyn_off = f.len() as u64;
    let strtab_off = dyn_off + 3 * 16;
    let mut dynamic = Vec::new();
    for (tag, val) in [
        (DT_STRTAB, 0x1000 + strtab_off),
        (DT_SONAME, 1),
        (DT_NULL, 0),
    ] {
        dynamic.extend_from_slice(&tag.to_le_bytes());
        dynamic.extend_from_slice(&val.to_le_bytes());
    }
    let strings = format!("\0{soname}\0").into_bytes();
    let total = strtab_off + strings.len() as u64;
    let ph = |kind: u32, off: u64, vaddr: u64, size: u64| {
        let mut p = vec![0u8; 56];
        p[0..4].copy_from_slice(&kind.to_le_bytes());
        p[8..16].copy_from_slice(&off.to_le_bytes());
        p[16..24].copy_from_slice(&vaddr.to_le_bytes());
        p[32..40].copy_from_slice(&size.to_le_bytes());
        p
    };
    f[64..120].copy_from_slice(&ph(PT_LOAD, 0, 0x1000, total));
    f[120..176].copy_from_slice(&ph(PT_DYNAMIC, dyn_off, 0x1000 + dyn_off, 48));
    f.extend_from_slice(&dynamic);
    f.extend_from_slice(&strings);
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_with(bytes: &[u8]) -> File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f
    }

    #[test]
    fn reads_the_soname_and_class() {
        let lib = read(&file_with(&tiny_so("libcuda.so.1", EM_X86_64))).unwrap();
        assert_eq!(lib.soname.as_deref(), Some("libcuda.so.1"));
        assert!(lib.class64);
        if cfg!(target_arch = "x86_64") {
            assert_eq!(lib.cache_flags(), Some(0x303));
        }
        let arm = read(&file_with(&tiny_so("libx.so.1", 40))).unwrap();
        assert_eq!(arm.cache_flags(), None);
    }

    #[test]
    fn garbage_and_truncations_are_not_libraries() {
        assert_eq!(read(&file_with(b"not an elf file at all")), None);
        let good = tiny_so("libcuda.so.1", EM_X86_64);
        for cut in [0, 4, 20, 63, 64, 100] {
            assert_eq!(read(&file_with(&good[..cut])), None, "cut at {cut}");
        }
        // Cut inside the dynamic section or string: a library without a soname.
        for cut in [180, good.len() - 3] {
            let lib = read(&file_with(&good[..cut])).unwrap();
            assert_eq!(lib.soname, None, "cut at {cut}");
        }
        // A soname with a slash is refused (it becomes a file name).
        let lib = read(&file_with(&tiny_so("../../etc/x", EM_X86_64))).unwrap();
        assert_eq!(lib.soname, None);
    }
}

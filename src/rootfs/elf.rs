//! Just enough ELF to do `ldconfig`'s part for one library: its class and machine
//! (the cache entry's flags) and its `DT_SONAME` (the cache key and the link name).
//!
//! The file comes from an image, so every offset and count is checked against the
//! bytes actually read, reads are bounded, and nothing here panics on any input.

use std::fs::File;
use std::os::unix::fs::FileExt;

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
    /// one of another architecture (which `ld.so` would not load); see
    /// [`crate::ldcache::Arch::elf_flags`].
    pub fn cache_flags(&self) -> Option<i32> {
        crate::ldcache::Arch::NATIVE?.elf_flags(self.class64, self.machine)
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

/// Most section headers read.
const MAX_SHNUM: usize = 4096;
/// Largest section-name table and section read.
const MAX_SECTION: u64 = 1 << 20;

/// A section's bytes, as [`section`] found them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub data: Vec<u8>,
    /// `sh_addralign`.
    pub align: u64,
    /// Big-endian file.
    pub big: bool,
}

/// The section named `wanted` of an ELF file (any type), if there is one and it is at
/// most 1 MiB.
pub fn section(file: &File, wanted: &str) -> Option<Section> {
    let mut ident = [0u8; 64];
    let n = read_at(file, &mut ident, 0)?;
    if n < 52 || ident[..4] != *b"\x7fELF" {
        return None;
    }
    let class64 = match ident[4] {
        1 => false,
        2 if n == 64 => true,
        _ => return None,
    };
    let big = ident[5] == 2;
    let e = Endian { big };
    let (shoff, shentsize, shnum, shstrndx) = if class64 {
        (
            e.u64(&ident, 40)?,
            e.u16(&ident, 58)?,
            e.u16(&ident, 60)?,
            e.u16(&ident, 62)?,
        )
    } else {
        (
            u64::from(e.u32(&ident, 32)?),
            e.u16(&ident, 46)?,
            e.u16(&ident, 48)?,
            e.u16(&ident, 50)?,
        )
    };
    let (entsize, shnum, shstrndx) = (
        usize::from(shentsize),
        usize::from(shnum),
        usize::from(shstrndx),
    );
    let min = if class64 { 64 } else { 40 };
    if !(min..=2 * min).contains(&entsize) || shnum == 0 || shnum > MAX_SHNUM || shstrndx >= shnum {
        return None;
    }
    let mut table = vec![0u8; entsize * shnum];
    if read_at(file, &mut table, shoff)? != table.len() {
        return None;
    }
    // (name offset, offset, size, align)
    let header = |i: usize| -> Option<(u32, u64, u64, u64)> {
        let sh = table.get(i * entsize..(i + 1) * entsize)?;
        Some(if class64 {
            (
                e.u32(sh, 0)?,
                e.u64(sh, 24)?,
                e.u64(sh, 32)?,
                e.u64(sh, 48)?,
            )
        } else {
            (
                e.u32(sh, 0)?,
                u64::from(e.u32(sh, 16)?),
                u64::from(e.u32(sh, 20)?),
                u64::from(e.u32(sh, 32)?),
            )
        })
    };
    let read_section = |offset: u64, size: u64| -> Option<Vec<u8>> {
        if size > MAX_SECTION {
            return None;
        }
        let mut data = vec![0u8; usize::try_from(size).ok()?];
        (read_at(file, &mut data, offset)? == data.len()).then_some(data)
    };
    let (_, names_off, names_size, _) = header(shstrndx)?;
    let names = read_section(names_off, names_size)?;
    for i in 0..shnum {
        let (name, offset, size, align) = header(i)?;
        let start = usize::try_from(name).ok()?;
        let Some(rest) = names.get(start..) else {
            continue;
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        if &rest[..end] == wanted.as_bytes() {
            return Some(Section {
                data: read_section(offset, size)?,
                align,
                big,
            });
        }
    }
    None
}

/// An ELF note in `section` (the first one): its name and descriptor, each without
/// trailing NULs. Names and descriptors are padded to the section's alignment.
pub fn note(section: &Section) -> Option<(String, Vec<u8>)> {
    let e = Endian { big: section.big };
    let data = &section.data;
    let namesz = usize::try_from(e.u32(data, 0)?).ok()?;
    let descsz = usize::try_from(e.u32(data, 4)?).ok()?;
    if namesz == 0 || descsz == 0 {
        return None;
    }
    let align = usize::try_from(section.align.max(1)).ok()?;
    let padded = namesz.checked_next_multiple_of(align)?;
    let name = data.get(12..12usize.checked_add(namesz)?)?;
    let desc_start = 12usize.checked_add(padded)?;
    let desc = data.get(desc_start..desc_start.checked_add(descsz)?)?;
    let trim = |b: &[u8]| -> Vec<u8> {
        let end = b.iter().rposition(|&c| c != 0).map_or(0, |i| i + 1);
        let start = b[..end].iter().position(|&c| c != 0).unwrap_or(end);
        b[start..end].to_vec()
    };
    Some((String::from_utf8(trim(name)).ok()?, trim(desc)))
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

/// For tests: this build's 64-bit `e_machine` (x86-64 62, aarch64 183), for [`tiny_so`].
#[cfg(test)]
pub(crate) const NATIVE_MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    183
} else {
    62
};

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

/// For tests: a 64-bit little-endian file with one note section `name` holding an
/// ELF note `owner` / `desc` (4-byte aligned), plus its section-name table.
#[cfg(test)]
pub(crate) fn tiny_with_note(name: &str, owner: &str, desc: &[u8]) -> Vec<u8> {
    let pad = |v: &mut Vec<u8>| {
        while !v.len().is_multiple_of(4) {
            v.push(0);
        }
    };
    let mut note = Vec::new();
    note.extend_from_slice(&(owner.len() as u32 + 1).to_le_bytes());
    note.extend_from_slice(&(desc.len() as u32).to_le_bytes());
    note.extend_from_slice(&1u32.to_le_bytes());
    note.extend_from_slice(owner.as_bytes());
    note.push(0);
    pad(&mut note);
    note.extend_from_slice(desc);
    pad(&mut note);
    let names = format!("\0{name}\0.shstrtab\0").into_bytes();
    let mut f = vec![0u8; 64];
    f[..4].copy_from_slice(b"\x7fELF");
    f[4] = 2;
    f[5] = 1;
    f[6] = 1;
    f[16..18].copy_from_slice(&ET_DYN.to_le_bytes());
    let note_off = f.len() as u64;
    f.extend_from_slice(&note);
    let names_off = f.len() as u64;
    f.extend_from_slice(&names);
    pad(&mut f);
    let shoff = f.len() as u64;
    let sh = |name: u32, kind: u32, off: u64, size: u64, align: u64| {
        let mut h = vec![0u8; 64];
        h[0..4].copy_from_slice(&name.to_le_bytes());
        h[4..8].copy_from_slice(&kind.to_le_bytes());
        h[24..32].copy_from_slice(&off.to_le_bytes());
        h[32..40].copy_from_slice(&size.to_le_bytes());
        h[48..56].copy_from_slice(&align.to_le_bytes());
        h
    };
    f.extend_from_slice(&sh(0, 0, 0, 0, 0));
    f.extend_from_slice(&sh(1, 7, note_off, note.len() as u64, 4));
    let shstr_name = 1 + name.len() as u32 + 1;
    f.extend_from_slice(&sh(shstr_name, 3, names_off, names.len() as u64, 1));
    f[40..48].copy_from_slice(&shoff.to_le_bytes());
    f[58..60].copy_from_slice(&64u16.to_le_bytes());
    f[60..62].copy_from_slice(&3u16.to_le_bytes());
    f[62..64].copy_from_slice(&2u16.to_le_bytes());
    f
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const EM_X86_64: u16 = 62;
    const EM_AARCH64: u16 = 183;
    const EM_ARM: u16 = 40;

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
        assert_eq!(lib.machine, EM_X86_64);
        let aarch64 = read(&file_with(&tiny_so("libcuda.so.1", EM_AARCH64))).unwrap();
        assert_eq!(aarch64.machine, EM_AARCH64);
        // Each build takes its own machine's libraries only, with its own flags.
        let (native, foreign, flags) = if cfg!(target_arch = "aarch64") {
            (&aarch64, &lib, 0x0a03)
        } else {
            (&lib, &aarch64, 0x0303)
        };
        if cfg!(any(target_arch = "x86_64", target_arch = "aarch64")) {
            assert_eq!(native.cache_flags(), Some(flags));
            let own = read(&file_with(&tiny_so("libx.so.1", NATIVE_MACHINE))).unwrap();
            assert_eq!(own.cache_flags(), Some(flags));
        }
        assert_eq!(foreign.cache_flags(), None);
        let arm = read(&file_with(&tiny_so("libx.so.1", EM_ARM))).unwrap();
        assert_eq!(arm.cache_flags(), None);
    }

    #[test]
    fn reads_a_note_section() {
        let bytes = tiny_with_note(".note.x", "Owner", br#"{"k":1}"#);
        let sec = section(&file_with(&bytes), ".note.x").unwrap();
        assert_eq!(sec.align, 4);
        let (owner, desc) = note(&sec).unwrap();
        assert_eq!(
            (owner.as_str(), desc.as_slice()),
            ("Owner", &br#"{"k":1}"#[..])
        );
        assert_eq!(section(&file_with(&bytes), ".note.y"), None);
        for cut in [10, 70, bytes.len() - 1] {
            assert_eq!(
                section(&file_with(&bytes[..cut]), ".note.x"),
                None,
                "cut at {cut}"
            );
        }
        // A note whose sizes run past the section.
        let mut bad = sec.clone();
        bad.data[4] = 0xff;
        assert_eq!(note(&bad), None);
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

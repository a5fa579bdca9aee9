// SPDX-License-Identifier: Apache-2.0
//! Which machine's `ldconfig` we stand in for: the cache flags an entry gets and which ELF
//! machines belong in the cache, per architecture, as data.
//!
//! The runtime and the hook add the injected driver libraries to a container's
//! `ld.so.cache`, and `ld.so` only takes an entry whose flags are exactly its own ABI's
//! (`_dl_cache_check_flags`). Containers run on the host's architecture, so the flags are
//! this build's ([`Arch::NATIVE`]); every rule is a function of an [`Arch`] value so that
//! the aarch64 rules are tested on an x86-64 machine too (and the x86-64 ones under
//! qemu-user). An entry of another architecture is harmless in a cache (`ld.so` skips it),
//! but we never write one: a library of another machine is left out.

use super::{
    Class, FLAG_AARCH64_LIB64, FLAG_ELF_LIBC6, FLAG_POWERPC_LIB64, FLAG_S390_LIB64,
    FLAG_X8664_LIB64,
};

/// `e_machine` values (elf.h).
const EM_386: u16 = 3;
const EM_X86_64: u16 = 62;
const EM_AARCH64: u16 = 183;

/// An architecture nvshim can be built for whose `ld.so.cache` flags we know.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Arch {
    X86_64,
    Aarch64,
    Powerpc64,
    S390x,
}

impl Arch {
    /// This build's architecture (`None` for one without a 64-bit cache flag here).
    pub const NATIVE: Option<Arch> = if cfg!(target_arch = "x86_64") {
        Some(Arch::X86_64)
    } else if cfg!(target_arch = "aarch64") {
        Some(Arch::Aarch64)
    } else if cfg!(target_arch = "powerpc64") {
        Some(Arch::Powerpc64)
    } else if cfg!(target_arch = "s390x") {
        Some(Arch::S390x)
    } else {
        None
    };

    /// The flags this architecture's `ldconfig` gives a glibc library of `class`, `None`
    /// where there is no such library to inject:
    /// - [`Class::Other`]: never ours (x32, ARM soft/hard float, ...);
    /// - [`Class::Lib32`] on aarch64: 32-bit ARM libraries are `libc6,hard-float` (or
    ///   soft-float) there, never the bare `libc6` of i386 on x86-64, and NVIDIA's arm64
    ///   driver ships no 32-bit libraries, so `compat32` has nothing to add.
    pub fn flags(self, class: Class) -> Option<i32> {
        let lib64 = match self {
            Arch::X86_64 => FLAG_X8664_LIB64,
            Arch::Aarch64 => FLAG_AARCH64_LIB64,
            Arch::Powerpc64 => FLAG_POWERPC_LIB64,
            Arch::S390x => FLAG_S390_LIB64,
        };
        match (class, self) {
            (Class::Lib64, _) => Some(FLAG_ELF_LIBC6 | lib64),
            (Class::Lib32, Arch::Aarch64) => None,
            (Class::Lib32, _) => Some(FLAG_ELF_LIBC6),
            (Class::Other, _) => None,
        }
    }

    /// Whether this architecture has 32-bit NVIDIA libraries for `compat32` to inject.
    pub fn has_lib32(self) -> bool {
        self.flags(Class::Lib32).is_some()
    }

    /// The cache flags of an ELF shared object of class `class64` and machine `machine` on
    /// this architecture: its own 64-bit machine, and i386 on x86-64. `None` for any other
    /// machine (which this `ld.so` would not load) and for architectures whose ELF machines
    /// are not listed here.
    pub fn elf_flags(self, class64: bool, machine: u16) -> Option<i32> {
        let (lib64, lib32) = match self {
            Arch::X86_64 => (EM_X86_64, Some(EM_386)),
            Arch::Aarch64 => (EM_AARCH64, None),
            Arch::Powerpc64 | Arch::S390x => return None,
        };
        match class64 {
            true if machine == lib64 => self.flags(Class::Lib64),
            false if Some(machine) == lib32 => self.flags(Class::Lib32),
            _ => None,
        }
    }

    /// The Debian multiarch tuple of its 64-bit libraries (`/usr/lib/<tuple>`).
    pub fn multiarch(self) -> &'static str {
        match self {
            Arch::X86_64 => "x86_64-linux-gnu",
            Arch::Aarch64 => "aarch64-linux-gnu",
            Arch::Powerpc64 => "powerpc64le-linux-gnu",
            Arch::S390x => "s390x-linux-gnu",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_per_architecture() {
        let cases = [
            ("x86-64 64-bit", Arch::X86_64, Class::Lib64, Some(0x0303)),
            ("x86-64 i386", Arch::X86_64, Class::Lib32, Some(0x0003)),
            ("aarch64 64-bit", Arch::Aarch64, Class::Lib64, Some(0x0a03)),
            (
                "aarch64 has no bare libc6",
                Arch::Aarch64,
                Class::Lib32,
                None,
            ),
            ("ppc64 64-bit", Arch::Powerpc64, Class::Lib64, Some(0x0503)),
            ("s390x 64-bit", Arch::S390x, Class::Lib64, Some(0x0403)),
            ("other", Arch::X86_64, Class::Other, None),
            ("other on aarch64", Arch::Aarch64, Class::Other, None),
        ];
        for (name, arch, class, want) in cases {
            assert_eq!(arch.flags(class), want, "{name}");
        }
        assert!(Arch::X86_64.has_lib32());
        assert!(!Arch::Aarch64.has_lib32());
    }

    /// The flags come back as the class `Entry::class` reads from them, on every architecture.
    #[test]
    fn flags_read_back_as_their_class() {
        for arch in [Arch::X86_64, Arch::Aarch64, Arch::Powerpc64, Arch::S390x] {
            for class in [Class::Lib64, Class::Lib32] {
                if let Some(flags) = arch.flags(class) {
                    let entry = super::super::Entry {
                        key: "libcuda.so.1".into(),
                        value: "/x".into(),
                        flags,
                        hwcap: 0,
                    };
                    assert_eq!(entry.class(), class, "{arch:?} {class}");
                }
            }
        }
    }

    #[test]
    fn elf_machines_per_architecture() {
        const EM_ARM: u16 = 40;
        let cases = [
            (
                "x86-64 library on x86-64",
                Arch::X86_64,
                true,
                EM_X86_64,
                Some(0x0303),
            ),
            (
                "i386 library on x86-64",
                Arch::X86_64,
                false,
                EM_386,
                Some(0x0003),
            ),
            (
                "aarch64 library on x86-64",
                Arch::X86_64,
                true,
                EM_AARCH64,
                None,
            ),
            (
                "aarch64 library on aarch64",
                Arch::Aarch64,
                true,
                EM_AARCH64,
                Some(0x0a03),
            ),
            (
                "x86-64 library on aarch64",
                Arch::Aarch64,
                true,
                EM_X86_64,
                None,
            ),
            (
                "32-bit ARM library on aarch64",
                Arch::Aarch64,
                false,
                EM_ARM,
                None,
            ),
            (
                "i386 library on aarch64",
                Arch::Aarch64,
                false,
                EM_386,
                None,
            ),
            (
                "32-bit aarch64 header",
                Arch::Aarch64,
                false,
                EM_AARCH64,
                None,
            ),
            (
                "ppc64: machines not listed",
                Arch::Powerpc64,
                true,
                21,
                None,
            ),
        ];
        for (name, arch, class64, machine, want) in cases {
            assert_eq!(arch.elf_flags(class64, machine), want, "{name}");
        }
    }

    #[test]
    fn native_is_this_build() {
        let native = Arch::NATIVE;
        if cfg!(target_arch = "x86_64") {
            assert_eq!(native, Some(Arch::X86_64));
        }
        if cfg!(target_arch = "aarch64") {
            assert_eq!(native, Some(Arch::Aarch64));
        }
        if let Some(arch) = native {
            assert_eq!(
                arch.multiarch(),
                format!("{}-linux-gnu", std::env::consts::ARCH),
                "multiarch tuple of {arch:?}"
            );
        }
    }
}

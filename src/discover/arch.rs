// SPDX-License-Identifier: Apache-2.0
//! What library discovery looks for on this machine's architecture: which of the table's
//! directories are searched without an `ld.so.cache`, and whether `compat32` has 32-bit
//! libraries to find at all. Pure functions of an [`Arch`], so the aarch64 answers are
//! tested on an x86-64 build machine too.
//!
//! With a cache, its entries decide (`ldconfig` only lists its own machine's libraries);
//! these rules are for driver roots without one.

use crate::ldcache::{Arch, Class};

use super::Missing;
use super::table::{LIBRARY_DIRS_32, LIBRARY_DIRS_64};

/// The directories searched for `class` libraries on `arch` when the driver root has no
/// `ld.so.cache`, in the table's order, without another architecture's multiarch
/// directories: a multiarch host can hold arm64 libraries in `/usr/lib/aarch64-linux-gnu`
/// beside its amd64 ones (and the other way round), which this machine's `ld.so` cannot
/// load. None for `Lib32` where the architecture has no 32-bit libraries; for an
/// architecture we have no rules for (`None`), the table's lists as they are.
pub fn library_dirs(arch: Option<Arch>, class: Class) -> Vec<&'static str> {
    let Some(arch) = arch else {
        return match class {
            Class::Lib32 => LIBRARY_DIRS_32.to_vec(),
            _ => LIBRARY_DIRS_64.to_vec(),
        };
    };
    match class {
        Class::Lib32 if arch.has_lib32() => LIBRARY_DIRS_32.to_vec(),
        Class::Lib32 | Class::Other => Vec::new(),
        Class::Lib64 => LIBRARY_DIRS_64
            .iter()
            .copied()
            .filter(|dir| foreign_multiarch(dir, arch).is_none())
            .collect(),
    }
}

/// The multiarch tuple of `dir` (`/usr/lib/<tuple>[/...]`) when it is not `arch`'s.
fn foreign_multiarch(dir: &str, arch: Arch) -> Option<&str> {
    let tuple = dir.strip_prefix("/usr/lib/")?.split('/').next()?;
    (tuple.ends_with("-linux-gnu") && tuple != arch.multiarch()).then_some(tuple)
}

/// What `compat32` gets on an architecture without 32-bit NVIDIA libraries (aarch64):
/// nothing to inject, said once as a [`Missing`] that is not required, instead of one
/// "not found" per library.
pub(super) fn compat32_unavailable(arch: Option<Arch>) -> Option<Missing> {
    let arch = arch?;
    (!arch.has_lib32()).then(|| Missing {
        what: "32-bit driver libraries".to_string(),
        needed_for: "compat32".to_string(),
        required: false,
        detail: Some(format!(
            "{} has no 32-bit NVIDIA libraries; compat32 adds nothing here",
            arch.multiarch()
        )),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_architecture_searches_its_own_multiarch_directories() {
        let x86 = library_dirs(Some(Arch::X86_64), Class::Lib64);
        let arm = library_dirs(Some(Arch::Aarch64), Class::Lib64);
        let cases = [
            (
                "x86-64",
                &x86,
                "/usr/lib/x86_64-linux-gnu",
                "aarch64-linux-gnu",
            ),
            (
                "aarch64",
                &arm,
                "/usr/lib/aarch64-linux-gnu",
                "x86_64-linux-gnu",
            ),
        ];
        for (name, dirs, first, foreign) in cases {
            assert_eq!(dirs.first().copied(), Some(first), "{name}");
            assert!(dirs.contains(&format!("{first}/vdpau").as_str()), "{name}");
            assert!(
                !dirs.iter().any(|d| d.contains(foreign)),
                "{name}: {dirs:?}"
            );
            for common in ["/usr/lib64", "/usr/lib64/vdpau", "/lib64", "/usr/lib"] {
                assert!(dirs.contains(&common), "{name}: {common}");
            }
        }
        // Every table directory is searched by one architecture or both.
        for dir in LIBRARY_DIRS_64 {
            assert!(x86.contains(dir) || arm.contains(dir), "{dir}");
        }
        assert_eq!(library_dirs(None, Class::Lib64), LIBRARY_DIRS_64);
        assert_eq!(
            library_dirs(Some(Arch::X86_64), Class::Other),
            Vec::<&str>::new()
        );
    }

    #[test]
    fn compat32_is_for_x86_64_only() {
        assert_eq!(
            library_dirs(Some(Arch::X86_64), Class::Lib32),
            LIBRARY_DIRS_32
        );
        assert_eq!(compat32_unavailable(Some(Arch::X86_64)), None);
        assert!(library_dirs(Some(Arch::Aarch64), Class::Lib32).is_empty());
        let missing = compat32_unavailable(Some(Arch::Aarch64)).unwrap();
        assert_eq!(missing.needed_for, "compat32");
        assert!(!missing.required);
        assert!(
            missing.detail.unwrap().contains("aarch64-linux-gnu"),
            "names the architecture"
        );
        assert_eq!(compat32_unavailable(None), None);
    }
}

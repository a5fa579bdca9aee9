//! Reading whole small files (procfs entries, config.toml, `ld.so.cache`,
//! `config.json`) in as few system calls as a reader can: `openat`, the reads, `close`.
//!
//! std's `File::read_to_end` first asks for the file's size and position (`fstat` and
//! `lseek`) to size its buffer, and musl's `open` follows an `O_CLOEXEC` open with an
//! `fcntl` for kernels that ignored the flag; `openat` does not, and reading through
//! `Read::take` takes the plain read loop. Three calls in six, for each of the dozen
//! files an 8-GPU create reads, on a path where a system call costs 2–3 µs on a VM.
//!
//! [`write`] is the other direction: the atomic replacement of a file others read
//! (engine configs, CDI specs, label files).

pub mod write;

use std::fs::File;
use std::io::{self, Read};
use std::path::Path;

use nix::fcntl::{AT_FDCWD, OFlag, openat};
use nix::sys::stat::Mode;

/// The first read's buffer: every file these callers read fits, most in one read.
const FIRST_READ: usize = 4096;

/// Opens `path` read-only and close-on-exec, with `flags` added (`O_NONBLOCK`, say).
pub fn open(path: &Path, flags: OFlag) -> io::Result<File> {
    let fd = openat(
        AT_FDCWD,
        path,
        OFlag::O_RDONLY | OFlag::O_CLOEXEC | flags,
        Mode::empty(),
    )?;
    Ok(File::from(fd))
}

/// The rest of `file`, read into a buffer of `capacity` bytes first (more if needed).
pub fn read_all(file: &mut File, capacity: usize) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::with_capacity(capacity);
    // Through `take`: the generic read loop, without std's size query for `File`.
    file.take(u64::MAX).read_to_end(&mut bytes)?;
    Ok(bytes)
}

/// The whole file at `path`.
pub fn read(path: &Path) -> io::Result<Vec<u8>> {
    read_all(&mut open(path, OFlag::empty())?, FIRST_READ)
}

/// The whole file at `path`, which must be UTF-8 (`InvalidData` otherwise, as
/// `std::fs::read_to_string`).
pub fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?).map_err(|_| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_small_large_and_missing_files() {
        let dir = tempfile::tempdir().unwrap();
        let small = dir.path().join("small");
        std::fs::write(&small, "NVRM version: 550.54.15\n").unwrap();
        assert_eq!(read_to_string(&small).unwrap(), "NVRM version: 550.54.15\n");
        // Larger than the first read: the rest is read too.
        let large = dir.path().join("large");
        let bytes: Vec<u8> = (0..3 * FIRST_READ + 17).map(|i| (i % 251) as u8).collect();
        std::fs::write(&large, &bytes).unwrap();
        assert_eq!(read(&large).unwrap(), bytes);
        assert!(read_to_string(&large).is_err_and(|e| e.kind() == io::ErrorKind::InvalidData));
        let missing = read(&dir.path().join("missing")).unwrap_err();
        assert_eq!(missing.kind(), io::ErrorKind::NotFound);
        // A directory opens but cannot be read, as with std.
        assert!(read(dir.path()).is_err());
    }

    #[test]
    fn procfs_files_are_read_whole() {
        // procfs reports a size of 0; the reads go on to the end anyway.
        let status = read_to_string(Path::new("/proc/self/status")).unwrap();
        assert!(
            status.starts_with("Name:") && status.contains("\nPid:"),
            "{status}"
        );
    }
}

//! Symlink resolution confined to a root, for reading a driver root that is not `/`.
//!
//! A driver root such as `/run/nvidia/driver` has its own absolute symlinks
//! (`lib -> /usr/lib`); letting the kernel follow them would read the host's files
//! instead. So every component is `lstat`ed under the root and links are followed by
//! hand, with `..` clamped at the root. Resolved directories are remembered, since
//! all of a driver's libraries share one or two.

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

/// Most links followed for one path, as the kernel's limit.
const MAX_LINKS: usize = 40;

/// A symlink met on the way to a file: `path` (container path) points at `target`
/// (the link's text, as `readlink` gives it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    pub path: PathBuf,
    pub target: String,
}

/// A file found under the root.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The real file's path inside the root (no symlinks left).
    pub path: PathBuf,
    /// Links followed in the last component, first to last (`libcuda.so.1 -> …`).
    pub links: Vec<Link>,
    pub metadata: fs::Metadata,
}

pub struct Resolver<'a> {
    root: &'a Path,
    /// Directories by their lexical path: the real path, or `None` when the
    /// directory does not exist (binaries are looked for in several directories, most
    /// of them missing in a driver root). Keyed by bytes: the paths are already
    /// normal (from [`lexical`]), and hashing a `Path` walks its components.
    dirs: HashMap<OsString, Option<PathBuf>>,
}

impl<'a> Resolver<'a> {
    pub fn new(root: &'a Path) -> Self {
        Self {
            root,
            dirs: HashMap::new(),
        }
    }

    /// The host path of an already-resolved in-root path.
    pub fn host(&self, path: &Path) -> PathBuf {
        self.root.join(path.strip_prefix("/").unwrap_or(path))
    }

    /// Resolves `path` (absolute, in the root) to a real file or directory. Returns
    /// `Ok(None)` when something on the way does not exist.
    pub fn resolve(&mut self, path: &Path) -> io::Result<Option<Resolved>> {
        let mut links = Vec::new();
        let mut current = lexical(path);
        for _ in 0..MAX_LINKS {
            let (Some(parent), Some(name)) = (current.parent(), current.file_name()) else {
                // The root itself.
                let metadata = fs::symlink_metadata(self.root)?;
                return Ok(Some(Resolved {
                    path: current,
                    links,
                    metadata,
                }));
            };
            let Some(parent) = self.resolve_dir(parent, 0)? else {
                return Ok(None);
            };
            let candidate = parent.join(name);
            let metadata = match fs::symlink_metadata(self.host(&candidate)) {
                Ok(m) => m,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
                Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(None),
                Err(e) => return Err(e),
            };
            if !metadata.file_type().is_symlink() {
                return Ok(Some(Resolved {
                    path: candidate,
                    links,
                    metadata,
                }));
            }
            let target = fs::read_link(self.host(&candidate))?;
            links.push(Link {
                path: candidate.clone(),
                target: target.to_string_lossy().into_owned(),
            });
            current = lexical(&parent.join(target));
        }
        Err(io::Error::other(format!(
            "too many levels of symbolic links resolving {}",
            path.display()
        )))
    }

    /// Resolves a directory path, following links in every component.
    fn resolve_dir(&mut self, dir: &Path, depth: usize) -> io::Result<Option<PathBuf>> {
        if let Some(done) = self.dirs.get(dir.as_os_str()) {
            return Ok(done.clone());
        }
        let found = self.find_dir(dir, depth)?;
        self.dirs.insert(dir.as_os_str().to_owned(), found.clone());
        Ok(found)
    }

    fn find_dir(&mut self, dir: &Path, depth: usize) -> io::Result<Option<PathBuf>> {
        if depth > MAX_LINKS {
            return Err(io::Error::other(format!(
                "too many levels of symbolic links resolving {}",
                dir.display()
            )));
        }
        let (Some(parent), Some(name)) = (dir.parent(), dir.file_name()) else {
            return Ok(Some(PathBuf::from("/")));
        };
        let Some(parent_real) = self.resolve_dir(parent, depth + 1)? else {
            return Ok(None);
        };
        let candidate = parent_real.join(name);
        let metadata = match fs::symlink_metadata(self.host(&candidate)) {
            Ok(m) => m,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.raw_os_error() == Some(libc::ENOTDIR) => return Ok(None),
            Err(e) => return Err(e),
        };
        let real = if metadata.file_type().is_symlink() {
            let target = fs::read_link(self.host(&candidate))?;
            match self.resolve_dir(&lexical(&parent_real.join(target)), depth + 1)? {
                Some(r) => r,
                None => return Ok(None),
            }
        } else if metadata.is_dir() {
            candidate
        } else {
            return Ok(None);
        };
        Ok(Some(real))
    }
}

/// Makes `path` absolute and free of `.` and `..`, never climbing above `/`.
/// (An absolute link target replaces everything before it, as `join` does.)
pub fn lexical(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::Normal(part) => out.push(part),
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn links_are_followed_inside_the_root() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        let root = tmp.path();
        fs::create_dir_all(root.join("usr/lib/x86_64-linux-gnu"))?;
        // Merged /usr with an absolute link, as on Debian: must stay in the root.
        symlink("/usr/lib", root.join("lib"))?;
        fs::write(
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
            b"elf",
        )?;
        symlink(
            "libcuda.so.550.54.15",
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so.1"),
        )?;
        symlink(
            "libcuda.so.1",
            root.join("usr/lib/x86_64-linux-gnu/libcuda.so"),
        )?;
        // A link that tries to climb out lands on the root's own /etc.
        symlink("../../../../../../etc/passwd", root.join("usr/lib/escape"))?;

        let mut r = Resolver::new(root);
        let found = r.resolve(Path::new("/lib/x86_64-linux-gnu/libcuda.so"))?;
        let found = found.ok_or_else(|| io::Error::other("libcuda.so not found"))?;
        assert_eq!(
            found.path,
            Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15")
        );
        let chain: Vec<(&Path, &str)> = found
            .links
            .iter()
            .map(|l| (l.path.as_path(), l.target.as_str()))
            .collect();
        assert_eq!(
            chain,
            [
                (
                    Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so"),
                    "libcuda.so.1"
                ),
                (
                    Path::new("/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
                    "libcuda.so.550.54.15"
                ),
            ]
        );
        assert!(
            r.resolve(Path::new("/usr/lib/escape"))?.is_none(),
            "escape must not reach the host"
        );
        assert!(r.resolve(Path::new("/nope/x"))?.is_none());
        Ok(())
    }

    #[test]
    fn link_loops_are_an_error() -> io::Result<()> {
        let tmp = tempfile::tempdir()?;
        symlink("b", tmp.path().join("a"))?;
        symlink("a", tmp.path().join("b"))?;
        assert!(Resolver::new(tmp.path()).resolve(Path::new("/a")).is_err());
        Ok(())
    }

    #[test]
    fn lexical_clamps_at_the_root() {
        let cases = [("/a/../../b", "/b"), ("/a/./b/..", "/a"), ("/../..", "/")];
        for (input, want) in cases {
            assert_eq!(lexical(Path::new(input)), Path::new(want), "case {input}");
        }
    }
}

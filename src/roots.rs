//! Where the host's driver, device nodes and `/proc` live, and the two kinds of path.
//!
//! Every stage that touches the host goes through [`Roots`], so a driver container
//! (`/run/nvidia/driver`), a split dev root, or the tests' simulated node all work the
//! same way. A [`ContainerPath`] is where something appears inside the container (the
//! host path with the driver root stripped); a [`HostPath`] is where we read it from.
//! Joins reject `..` so a value from a cache file or a container can never climb out
//! of a root.

use std::fmt;
use std::path::{Component, Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A path on the host, already prefixed with the right root.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct HostPath(PathBuf);

/// An absolute path as the container sees it (no root prefix, no `..`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContainerPath(PathBuf);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RootsError {
    #[error("path {path:?} is not absolute: expected a path starting with '/'")]
    NotAbsolute { path: PathBuf },
    #[error("path {path:?} contains '..': paths under a root must not climb out of it")]
    ParentComponent { path: PathBuf },
}

impl HostPath {
    /// Wraps a host path as is (used for paths we built ourselves from a root).
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl ContainerPath {
    /// Checks that `path` is absolute and free of `..`, then normalises away `.` and
    /// repeated slashes.
    pub fn new(path: impl AsRef<Path>) -> Result<Self, RootsError> {
        let path = path.as_ref();
        if !path.is_absolute() {
            return Err(RootsError::NotAbsolute {
                path: path.to_path_buf(),
            });
        }
        let mut clean = PathBuf::from("/");
        for component in path.components() {
            match component {
                Component::RootDir | Component::CurDir => {}
                Component::Normal(part) => clean.push(part),
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(RootsError::ParentComponent {
                        path: path.to_path_buf(),
                    });
                }
            }
        }
        Ok(Self(clean))
    }
    pub fn as_path(&self) -> &Path {
        &self.0
    }
}

impl fmt::Display for HostPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.display().fmt(f)
    }
}

impl fmt::Display for ContainerPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.display().fmt(f)
    }
}

/// The three host roots. NVIDIA's defaults are all `/`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Roots {
    /// Where the driver's files live (`--driver-root`, NVIDIA's `nvidia-container-cli.root`).
    pub driver: PathBuf,
    /// Where `dev/nvidia*` live (`--dev-root`).
    pub dev: PathBuf,
    /// Where `proc/driver/nvidia` lives (`--proc-root`).
    pub proc: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Self {
            driver: PathBuf::from("/"),
            dev: PathBuf::from("/"),
            proc: PathBuf::from("/"),
        }
    }
}

/// Joins an absolute in-root path onto a root.
pub fn join(root: &Path, path: &ContainerPath) -> HostPath {
    let rel = path.as_path().strip_prefix("/").unwrap_or(path.as_path());
    HostPath(root.join(rel))
}

impl Roots {
    /// `<driver root>/<path>`.
    pub fn driver_path(&self, path: &ContainerPath) -> HostPath {
        join(&self.driver, path)
    }
    /// `<dev root>/<path>`, where `path` is a container path such as `/dev/nvidia0`.
    pub fn dev_path(&self, path: &ContainerPath) -> HostPath {
        join(&self.dev, path)
    }
    /// `<proc root>/<path>`, where `path` is such as `/proc/driver/nvidia/version`.
    pub fn proc_path(&self, path: &ContainerPath) -> HostPath {
        join(&self.proc, path)
    }
    /// The container path of a host path under the driver root (the root stripped), or
    /// `None` when the host path is not under it.
    pub fn strip_driver(&self, host: &Path) -> Option<ContainerPath> {
        let rel = host.strip_prefix(&self.driver).ok()?;
        ContainerPath::new(Path::new("/").join(rel)).ok()
    }
}

/// `name` in the directory of the running binary (`/usr/bin` if that cannot be read):
/// packages install the runtime, the hook and `nvshim` side by side, and each hands
/// work to the others there, never through `PATH`.
pub fn beside_self(name: &str) -> PathBuf {
    std::fs::read_link("/proc/self/exe")
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from("/usr/bin").join(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_paths_are_absolute_and_never_climb() {
        let cases: &[(&str, Result<&str, ()>)] = &[
            ("/usr/lib/x.so", Ok("/usr/lib/x.so")),
            ("//usr/./lib//x.so", Ok("/usr/lib/x.so")),
            ("/", Ok("/")),
            ("usr/lib", Err(())),
            ("/usr/../etc/shadow", Err(())),
            ("/..", Err(())),
        ];
        for (input, want) in cases {
            let got = ContainerPath::new(input);
            match want {
                Ok(w) => assert_eq!(
                    got.as_ref().map(|p| p.as_path().to_path_buf()),
                    Ok(PathBuf::from(w)),
                    "case {input}"
                ),
                Err(()) => assert!(got.is_err(), "case {input} should be rejected"),
            }
        }
    }

    #[test]
    fn joins_and_strips_the_driver_root() -> Result<(), RootsError> {
        let roots = Roots {
            driver: PathBuf::from("/run/nvidia/driver"),
            ..Roots::default()
        };
        let p = ContainerPath::new("/usr/bin/nvidia-smi")?;
        let host = roots.driver_path(&p);
        assert_eq!(
            host.as_path(),
            Path::new("/run/nvidia/driver/usr/bin/nvidia-smi")
        );
        assert_eq!(roots.strip_driver(host.as_path()), Some(p));
        assert_eq!(roots.strip_driver(Path::new("/etc/passwd")), None);
        Ok(())
    }
}

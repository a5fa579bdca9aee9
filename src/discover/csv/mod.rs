//! Jetson / Tegra: the host files NVIDIA's CSV mount specs name, found under the
//! driver root and the dev root.
//!
//! On Tegra boards the GPU is part of the SoC: there is no `/proc/driver/nvidia/gpus`,
//! no NVML and no version-suffixed driver libraries to find. Instead the board support
//! package lists what a container needs in `*.csv` files under
//! `modes.csv.mount-spec-path` (`/etc/nvidia-container-runtime/host-files-for-container.d`),
//! one `<type>, <path>` per line ([`parse`]). As NVIDIA's `csv` mode does
//! (`internal/platform-support/tegra`), only `devices.csv`, `drivers.csv` and `l4t.csv`
//! are read unless the container sets `NVIDIA_REQUIRE_JETPACK=csv-mounts=all`
//! (`Request::csv_mounts_all`); `dev`
//! lines become device nodes, `lib` lines bind mounts of the real file, `sym` lines a
//! recreated symlink chain plus a mount of its final target, and `dir` lines directory
//! mounts. A listed path that does not exist is skipped (NVIDIA logs and skips it too):
//! it goes into [`HostResources::missing`], never fatal.
//!
//! The CSV files are host configuration (trusted), but every path in them is looked up
//! with the confined [`Resolver`], so no symlink under the driver root leads out of
//! it. Linker-cache entries are not made here: they need each library's `DT_SONAME`,
//! which `pipeline` reads (see `pipeline::csv`).

mod glob;
mod parse;

pub use glob::{Pattern, PatternError, has_meta};
pub use parse::{LineError, MountSpec, SpecKind, parse, parse_line};

use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use super::resolve::{Resolved, Resolver, lexical};
use super::{DeviceNode, FileKind, HostFile, HostResources, Missing, SymlinkEdit};
use crate::roots::Roots;

/// The only files read unless the container asks for all
/// (`NVIDIA_REQUIRE_JETPACK=csv-mounts=all`).
pub const BASE_FILES: [&str; 3] = ["devices.csv", "drivers.csv", "l4t.csv"];
/// Present on every L4T release; mounted into the container as NVIDIA does.
pub const TEGRA_RELEASE: &str = "/etc/nv_tegra_release";
/// The SoC family (`tegra`), NVIDIA's second Tegra sign.
pub const SOC_FAMILY: &str = "/sys/devices/soc0/family";
/// Where the dGPU driver lists its GPUs; its presence rules Tegra out cheaply.
const PROC_GPUS: &str = "proc/driver/nvidia/gpus";
/// Longest CSV file read.
const MAX_CSV: u64 = 1 << 20;

/// Which CSV files to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CsvFiles {
    /// The `*.csv` files of a directory, by name: only [`BASE_FILES`] unless `all`.
    Dir { path: PathBuf, all: bool },
    /// These files (`nvidia-ctk cdi generate --csv.file`).
    Listed(Vec<PathBuf>),
}

/// What CSV mode reads and leaves out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvSource {
    pub files: CsvFiles,
    /// `sym` lines whose path matches one of these are left out (NVIDIA's
    /// `--csv.ignore-pattern`: the whole path, or the file name for `**/<pattern>`).
    pub ignore: Vec<Pattern>,
}

#[derive(Debug, thiserror::Error)]
pub enum CsvError {
    #[error("cannot read the CSV mount specs {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{path}:{line}: {source}")]
    Line {
        path: PathBuf,
        line: usize,
        #[source]
        source: LineError,
    },
    #[error("cannot look up {path} from the CSV mount specs: {source}")]
    Lookup {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// One parsed CSV file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsvFile {
    pub path: PathBuf,
    pub specs: Vec<MountSpec>,
}

/// Whether the host is a Tegra board without a dGPU driver, as far as `auto` needs
/// to know: NVIDIA's sign (`/etc/nv_tegra_release`, or a `/sys/devices/soc0/family`
/// starting with `tegra`, under the driver root) checked only when the driver lists
/// no GPUs in `/proc/driver/nvidia/gpus`. On a dGPU host that is one `stat` of a
/// directory the procfs inventory reads next anyway.
pub fn is_tegra(roots: &Roots) -> bool {
    if roots.proc.join(PROC_GPUS).exists() {
        return false;
    }
    has_tegra_files(&roots.driver)
}

/// NVIDIA's `HasTegraFiles` (go-nvlib), under `root`.
pub fn has_tegra_files(root: &Path) -> bool {
    let under = |p: &str| root.join(p.trim_start_matches('/'));
    if fs::metadata(under(TEGRA_RELEASE)).is_ok_and(|m| !m.is_dir()) {
        return true;
    }
    crate::files::read_to_string(&under(SOC_FAMILY))
        .is_ok_and(|family| family.to_ascii_lowercase().starts_with("tegra"))
}

/// Reads and parses the CSV files `files` names. A directory that does not exist has
/// none (as NVIDIA's); a listed file that does not exist is an error.
pub fn load(files: &CsvFiles) -> Result<Vec<CsvFile>, CsvError> {
    let paths = match files {
        CsvFiles::Listed(paths) => paths.clone(),
        CsvFiles::Dir { path, all } => list(path, *all)?,
    };
    paths
        .into_iter()
        .map(|path| {
            let text = read_limited(&path).map_err(|source| CsvError::Read {
                path: path.clone(),
                source,
            })?;
            let specs = parse(&text).map_err(|(line, source)| CsvError::Line {
                path: path.clone(),
                line,
                source,
            })?;
            Ok(CsvFile { path, specs })
        })
        .collect()
}

/// The `*.csv` files (any case of the extension, not a bare `.csv`) of `dir`, by name.
fn list(dir: &Path, all: bool) -> Result<Vec<PathBuf>, CsvError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            tracing::debug!(dir = %dir.display(), "no CSV mount spec directory");
            return Ok(Vec::new());
        }
        Err(source) => {
            return Err(CsvError::Read {
                path: dir.to_path_buf(),
                source,
            });
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| CsvError::Read {
            path: dir.to_path_buf(),
            source,
        })?;
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        let is_csv = name.len() > 4
            && name.is_char_boundary(name.len() - 4)
            && name[name.len() - 4..].eq_ignore_ascii_case(".csv");
        if is_csv && (all || BASE_FILES.contains(&name.as_str())) {
            names.push(name);
        }
    }
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

fn read_limited(path: &Path) -> io::Result<String> {
    use std::io::Read;
    let mut text = String::new();
    fs::File::open(path)?
        .take(MAX_CSV)
        .read_to_string(&mut text)?;
    Ok(text)
}

/// Finds what `files` name: device nodes under `roots.dev`, everything else under
/// `roots.driver`, in NVIDIA's order (devices, directories, libraries, symlinks).
pub fn discover(
    roots: &Roots,
    files: &[CsvFile],
    ignore: &[Pattern],
) -> Result<HostResources, CsvError> {
    let mut out = HostResources::default();
    let mut dev = Resolver::new(&roots.dev);
    let mut driver = Resolver::new(&roots.driver);
    for kind in [SpecKind::Dev, SpecKind::Dir, SpecKind::Lib, SpecKind::Sym] {
        for file in files {
            let needed_for = file
                .path
                .file_name()
                .map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            for spec in file.specs.iter().filter(|s| s.kind == kind) {
                if kind == SpecKind::Sym && ignored(&spec.path, ignore) {
                    tracing::debug!(path = %spec.path.display(), "symlink left out by an ignore pattern");
                    continue;
                }
                let resolver = if kind == SpecKind::Dev {
                    &mut dev
                } else {
                    &mut driver
                };
                let paths = expand(resolver, &spec.path)?;
                if paths.is_empty() {
                    missing(&mut out, &spec.path, &needed_for, None);
                }
                for path in paths {
                    one(resolver, kind, &path, &needed_for, &mut out)?;
                }
            }
        }
    }
    if let Some(real) = driver
        .resolve(Path::new(TEGRA_RELEASE))
        .map_err(lookup_err(Path::new(TEGRA_RELEASE)))?
        && real.metadata.is_file()
    {
        push(
            &mut out,
            FileKind::Config,
            real.path.clone(),
            &driver,
            &real,
            Vec::new(),
        );
    }
    Ok(out)
}

fn ignored(path: &Path, patterns: &[Pattern]) -> bool {
    let full = path.to_string_lossy();
    let name = path.file_name().map(|n| n.to_string_lossy());
    patterns
        .iter()
        .any(|p| match p.as_str().strip_prefix("**/") {
            Some(base) => {
                Pattern::new(base).is_ok_and(|b| name.as_deref().is_some_and(|n| b.matches(n)))
            }
            None => p.matches(&full),
        })
}

/// The paths a spec stands for: itself, or the matches of a glob in its last
/// component (sorted), looked up in the real parent directory.
fn expand(resolver: &mut Resolver<'_>, path: &Path) -> Result<Vec<PathBuf>, CsvError> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Ok(vec![path.to_path_buf()]);
    };
    let name = name.to_string_lossy();
    if !has_meta(&name) {
        return Ok(vec![path.to_path_buf()]);
    }
    // Checked by the parser; a pattern that fails here matches nothing.
    let Ok(pattern) = Pattern::new(&name) else {
        return Ok(Vec::new());
    };
    let Some(real) = resolver.resolve(dir).map_err(lookup_err(dir))? else {
        return Ok(Vec::new());
    };
    if !real.metadata.is_dir() {
        return Ok(Vec::new());
    }
    let host = resolver.host(&real.path);
    let mut names: Vec<String> = fs::read_dir(&host)
        .map_err(lookup_err(&host))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| pattern.matches(n))
        .collect();
    names.sort();
    Ok(names.into_iter().map(|n| dir.join(n)).collect())
}

fn one(
    resolver: &mut Resolver<'_>,
    kind: SpecKind,
    path: &Path,
    needed_for: &str,
    out: &mut HostResources,
) -> Result<(), CsvError> {
    let Some(real) = resolver.resolve(path).map_err(lookup_err(path))? else {
        missing(out, path, needed_for, None);
        return Ok(());
    };
    let links = || {
        real.links
            .iter()
            .map(|l| SymlinkEdit {
                path: l.path.clone(),
                target: l.target.clone(),
            })
            .collect::<Vec<_>>()
    };
    let file_type = real.metadata.file_type();
    match kind {
        SpecKind::Dev if file_type.is_char_device() => {
            let rdev = real.metadata.rdev();
            let node = DeviceNode {
                // The container gets the listed name (NVIDIA's too), the host's real
                // node behind it.
                path: lexical(path),
                host_path: resolver.host(&real.path),
                major: u64::from(nix::sys::stat::major(rdev) as u32),
                minor: u64::from(nix::sys::stat::minor(rdev) as u32),
                mode: real.metadata.permissions().mode() & 0o7777,
                uid: real.metadata.uid(),
                gid: real.metadata.gid(),
            };
            if !out.device_nodes.iter().any(|n| n.path == node.path) {
                out.device_nodes.push(node);
            }
        }
        // Mounted where the spec says, as NVIDIA's directory locator does.
        SpecKind::Dir if file_type.is_dir() => push(
            out,
            FileKind::Directory,
            lexical(path),
            resolver,
            &real,
            Vec::new(),
        ),
        // Mounted at the real file's path; the links that lead to it are recreated.
        SpecKind::Lib | SpecKind::Sym if file_type.is_file() => push(
            out,
            FileKind::Library,
            real.path.clone(),
            resolver,
            &real,
            links(),
        ),
        SpecKind::Sym if file_type.is_dir() => push(
            out,
            FileKind::Directory,
            real.path.clone(),
            resolver,
            &real,
            links(),
        ),
        _ => missing(
            out,
            path,
            needed_for,
            Some(format!(
                "{} is not {}",
                resolver.host(&real.path).display(),
                match kind {
                    SpecKind::Dev => "a character device",
                    SpecKind::Dir => "a directory",
                    SpecKind::Lib => "a regular file",
                    SpecKind::Sym => "a regular file or directory",
                }
            )),
        ),
    }
    Ok(())
}

fn push(
    out: &mut HostResources,
    kind: FileKind,
    path: PathBuf,
    resolver: &Resolver<'_>,
    real: &Resolved,
    links: Vec<SymlinkEdit>,
) {
    if let Some(file) = out.files.iter_mut().find(|f| f.path == path) {
        // A `sym` line leading to a file a `lib` line mounted: keep its links too.
        for link in links {
            if !file.links.contains(&link) {
                file.links.push(link);
            }
        }
        return;
    }
    out.files.push(HostFile {
        kind,
        host_path: resolver.host(&real.path),
        path,
        links,
        ldcache: None,
    });
}

fn missing(out: &mut HostResources, path: &Path, needed_for: &str, detail: Option<String>) {
    tracing::debug!(path = %path.display(), csv = needed_for, ?detail, "CSV entry not on this host; skipped");
    out.missing.push(Missing {
        what: path.display().to_string(),
        needed_for: needed_for.to_owned(),
        required: false,
        detail,
    });
}

fn lookup_err(path: &Path) -> impl FnOnce(io::Error) -> CsvError + '_ {
    move |source| CsvError::Lookup {
        path: path.to_path_buf(),
        source,
    }
}

#[cfg(test)]
mod tests;

// SPDX-License-Identifier: Apache-2.0
//! Minimal container root filesystems that can run the host's dynamically linked glibc programs,
//! plus helpers to pack one for `docker import` and to wrap one in a `runc` bundle.
//!
//! A rootfs holds a static busybox with applet links, the host's static `ldconfig`, and real
//! copies of the host's glibc loader and libraries at the same paths they have on the host,
//! behind the same top-level symlinks (`lib -> usr/lib` on merged-/usr hosts). Its
//! `/etc/ld.so.cache` is written by the host's `ldconfig -r`, so a program finds its libraries
//! inside the container exactly as it would on the host.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::fs;
use std::io;
use std::os::unix::fs::symlink;
use std::path::{Component, Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{TestkitError, io_err};
use crate::files;

/// The busybox applets linked into `/bin`.
pub const BUSYBOX_APPLETS: &[&str] = &[
    "sh", "ls", "cat", "grep", "echo", "sleep", "true", "false", "wc", "readlink", "test", "find",
    "env", "head", "mkdir", "stat", "id",
];

/// Libraries copied into every rootfs when the host has them, whether or not a program needs them.
pub const BASE_LIBRARIES: &[&str] = &[
    "libc.so.6",
    "libgcc_s.so.1",
    "libm.so.6",
    "libpthread.so.0",
    "libdl.so.2",
    "librt.so.1",
];

/// Top-level entries that merged-/usr hosts make symlinks; mirrored as they are on the host.
const TOP_LEVEL: &[&str] = &["bin", "sbin", "lib", "lib64", "lib32", "libx32"];
/// Empty directories every rootfs has.
const EMPTY_DIRS: &str = "dev proc sys run root etc/ld.so.conf.d usr/bin usr/sbin usr/local/lib";
/// Symlink chains longer than this are treated as loops.
const MAX_SYMLINK_DEPTH: u32 = 40;
/// `sun_path` is 108 bytes including the terminating NUL.
pub(crate) const MAX_SOCKET_PATH: usize = 107;

/// The Debian multiarch triple of this machine, e.g. `x86_64-linux-gnu`.
fn multiarch() -> String {
    format!("{}-linux-gnu", std::env::consts::ARCH)
}

/// Builds a glibc rootfs; see the module docs. Add programs with [`GlibcRootfs::install`] and
/// library-only requirements with [`GlibcRootfs::libraries_for`], then call [`GlibcRootfs::build`].
#[derive(Debug, Clone, Default)]
pub struct GlibcRootfs {
    needs: Vec<PathBuf>,
    installs: Vec<(PathBuf, PathBuf)>,
}

impl GlibcRootfs {
    pub fn new() -> GlibcRootfs {
        GlibcRootfs::default()
    }

    /// Copies the libraries that the host ELF file `elf` links against (not `elf` itself): use it
    /// for programs that reach the container some other way, such as a driver's `nvidia-smi`
    /// mounted in by a runtime hook.
    pub fn libraries_for(mut self, elf: impl Into<PathBuf>) -> GlibcRootfs {
        self.needs.push(elf.into());
        self
    }

    /// Copies the host file `host` to the absolute path `inside` in the rootfs (replacing anything
    /// there, e.g. a busybox applet link), along with the libraries it links against.
    pub fn install(mut self, host: impl Into<PathBuf>, inside: impl Into<PathBuf>) -> GlibcRootfs {
        self.installs.push((host.into(), inside.into()));
        self
    }

    /// Writes the rootfs into `dir`, which must be missing or empty. Needs the host's `ldd`,
    /// `ldconfig` and a static `busybox`; `ldconfig -r` chroots, so this needs root.
    pub fn build(&self, dir: &Path) -> Result<(), TestkitError> {
        files::mkdir_all(dir)?;
        if fs::read_dir(dir)
            .map_err(io_err("listing", dir))?
            .next()
            .is_some()
        {
            return Err(TestkitError::DirNotEmpty {
                path: dir.to_path_buf(),
            });
        }
        mirror_top_level(dir)?;
        for sub in EMPTY_DIRS.split(' ') {
            resolve_in(dir, Path::new(sub))?;
        }
        let triple = multiarch();
        for sub in ["usr/lib", "usr/local/lib"] {
            resolve_in(dir, &Path::new(sub).join(&triple))?;
        }
        let tmp = resolve_in(dir, Path::new("tmp"))?;
        files::chmod(&dir.join(tmp), 0o1777)?;

        let busybox = find_program("busybox", &["/usr/bin/busybox", "/bin/busybox"])?;
        place(dir, &busybox, Path::new("/bin/busybox"))?;
        let bin = dir.join(resolve_in(dir, Path::new("bin"))?);
        for applet in BUSYBOX_APPLETS {
            files::link("busybox", &bin.join(applet))?;
        }
        let ldconfig = crate::driver::ldconfig()?;
        if !linked_libraries(&ldconfig)?.is_empty() {
            return Err(TestkitError::Elf {
                path: ldconfig,
                what: "is dynamically linked; the rootfs needs a static ldconfig".to_owned(),
            });
        }
        place(dir, &ldconfig, Path::new("/sbin/ldconfig"))?;

        let mut elves: Vec<PathBuf> = vec![busybox];
        elves.extend(
            BASE_LIBRARIES
                .iter()
                .filter_map(|l| host_library(l, &triple)),
        );
        if !elves.iter().any(|p| p.ends_with("libc.so.6")) {
            return Err(TestkitError::ProgramMissing {
                program: "libc.so.6",
                tried: library_dirs(&triple)
                    .iter()
                    .map(|d| d.join("libc.so.6"))
                    .collect(),
            });
        }
        for (host, inside) in &self.installs {
            place(dir, host, inside)?;
            elves.push(host.clone());
        }
        elves.extend(self.needs.iter().cloned());
        let mut copied = BTreeSet::new();
        for elf in &elves {
            for lib in linked_libraries(elf)? {
                if copied.insert(lib.clone()) {
                    mirror_host_path(dir, &lib, 0)?;
                }
            }
        }
        for lib in elves
            .iter()
            .filter(|p| BASE_LIBRARIES.iter().any(|l| p.ends_with(l)))
        {
            mirror_host_path(dir, lib, 0)?;
        }
        write_etc(dir, &triple)?;
        let mut cmd = Command::new(crate::driver::ldconfig()?);
        cmd.arg("-r").arg(dir);
        output(&mut cmd)?;
        Ok(())
    }
}

/// Builds a rootfs in `dir` holding busybox, `ldconfig`, glibc and the libraries each of
/// `extra_elves` links against (the files themselves are not copied; see [`GlibcRootfs`]).
pub fn glibc_rootfs(dir: &Path, extra_elves: &[&Path]) -> Result<(), TestkitError> {
    extra_elves
        .iter()
        .fold(GlibcRootfs::new(), |b, elf| b.libraries_for(*elf))
        .build(dir)
}

/// Packs `rootfs` into the tar file `out` (`tar -C rootfs -cf out .`), the input `docker import`
/// takes.
pub fn tar_rootfs(rootfs: &Path, out: &Path) -> Result<(), TestkitError> {
    let mut cmd = Command::new(which("tar")?);
    cmd.arg("-C")
        .arg(rootfs)
        .arg("--numeric-owner")
        .arg("-cf")
        .arg(out)
        .arg(".");
    output(&mut cmd).map(drop)
}

/// Writes an OCI bundle for `runc run --bundle` into `bundle`: a private copy of `rootfs_src`
/// (`cp -a`, so parallel tests never share a writable rootfs) as `bundle/rootfs`, and the
/// `config.json` of `runc spec` with no terminal, `args` as the process, `env` appended to the
/// default environment and a writable root. Returns `bundle`.
pub fn runc_bundle(
    bundle: &Path,
    rootfs_src: &Path,
    args: &[&str],
    env: &[&str],
) -> Result<PathBuf, TestkitError> {
    files::mkdir_all(bundle)?;
    let mut cp = Command::new(which("cp")?);
    cp.arg("-a").arg(rootfs_src).arg(bundle.join("rootfs"));
    output(&mut cp)?;
    let mut spec = Command::new(which("runc")?);
    spec.arg("spec").arg("--bundle").arg(bundle);
    output(&mut spec)?;

    let path = bundle.join("config.json");
    let text = fs::read_to_string(&path).map_err(io_err("reading", &path))?;
    let mut config: serde_json::Value =
        serde_json::from_str(&text).map_err(|source| TestkitError::JsonFile {
            action: "parsing",
            path: path.clone(),
            source,
        })?;
    config["process"]["terminal"] = false.into();
    config["process"]["args"] = args.into();
    if let Some(vars) = config["process"]["env"].as_array_mut() {
        vars.extend(env.iter().map(|e| serde_json::Value::from(*e)));
    } else {
        config["process"]["env"] = env.into();
    }
    config["root"]["readonly"] = false.into();
    files::write(&path, format!("{config:#}\n"), 0o644)?;
    Ok(bundle.to_path_buf())
}

/// Recreates the host's top-level layout: a symlink where the host has one (made relative, so
/// writing through it from the host never leaves the rootfs), a directory otherwise.
fn mirror_top_level(root: &Path) -> Result<(), TestkitError> {
    for name in TOP_LEVEL {
        let host = Path::new("/").join(name);
        let Ok(meta) = fs::symlink_metadata(&host) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            let target = fs::read_link(&host).map_err(io_err("reading symlink", &host))?;
            let target = target.strip_prefix("/").unwrap_or(&target).to_path_buf();
            resolve_in(root, &target)?;
            let link = root.join(name);
            symlink(&target, &link).map_err(io_err("creating symlink", &link))?;
        } else if meta.is_dir() && matches!(*name, "bin" | "sbin" | "lib") {
            resolve_in(root, Path::new(name))?;
        }
    }
    Ok(())
}

/// Resolves the absolute or relative directory path `inside` within `root` as if `root` were
/// `/` (symlinks, absolute ones included, never lead out), creating missing directories.
/// Returns the symlink-free path relative to `root`.
fn resolve_in(root: &Path, inside: &Path) -> Result<PathBuf, TestkitError> {
    resolve_from(root, PathBuf::new(), inside, 0)
}

fn resolve_from(
    root: &Path,
    mut real: PathBuf,
    inside: &Path,
    depth: u32,
) -> Result<PathBuf, TestkitError> {
    if depth > MAX_SYMLINK_DEPTH {
        return Err(symlink_loop(&root.join(inside)));
    }
    for comp in inside.components() {
        match comp {
            Component::RootDir => real = PathBuf::new(),
            Component::ParentDir => {
                real.pop();
            }
            Component::Normal(name) => {
                let candidate = real.join(name);
                let host = root.join(&candidate);
                match fs::symlink_metadata(&host) {
                    Ok(m) if m.file_type().is_symlink() => {
                        let target =
                            fs::read_link(&host).map_err(io_err("reading symlink", &host))?;
                        real = resolve_from(root, real, &target, depth + 1)?;
                    }
                    Ok(m) if m.is_dir() => real = candidate,
                    Ok(_) => {
                        return Err(io_err("entering", &host)(
                            io::ErrorKind::NotADirectory.into(),
                        ));
                    }
                    Err(e) if e.kind() == io::ErrorKind::NotFound => {
                        files::mkdir_all(&host)?;
                        real = candidate;
                    }
                    Err(e) => return Err(io_err("inspecting", &host)(e)),
                }
            }
            Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(real)
}

/// Copies the host file `host` (following symlinks) to the absolute path `inside` in `root`,
/// keeping its permissions.
fn place(root: &Path, host: &Path, inside: &Path) -> Result<(), TestkitError> {
    let name = inside
        .file_name()
        .ok_or_else(|| io_err("placing", inside)(io::ErrorKind::InvalidInput.into()))?;
    let parent = inside.parent().unwrap_or(Path::new("/"));
    let to = root.join(resolve_in(root, parent)?).join(name);
    if fs::symlink_metadata(&to).is_ok() {
        fs::remove_file(&to).map_err(io_err("replacing", &to))?;
    }
    fs::copy(host, &to).map_err(io_err("copying", host))?;
    Ok(())
}

/// Copies the host path `path` into `root` at the same path, recreating every symlink met on the
/// way (with its original target) and copying the regular file at the end. Directories along the
/// way become plain directories; nothing in `root` is ever written through a symlink.
fn mirror_host_path(root: &Path, path: &Path, depth: u32) -> Result<PathBuf, TestkitError> {
    if depth > MAX_SYMLINK_DEPTH {
        return Err(symlink_loop(path));
    }
    let mut real = PathBuf::from("/");
    for comp in path.components() {
        match comp {
            Component::ParentDir => {
                real.pop();
            }
            Component::Normal(name) => {
                let candidate = real.join(name);
                let rel = candidate.strip_prefix("/").unwrap_or(&candidate);
                let inside = root.join(rel);
                let meta =
                    fs::symlink_metadata(&candidate).map_err(io_err("inspecting", &candidate))?;
                if meta.file_type().is_symlink() {
                    let target =
                        fs::read_link(&candidate).map_err(io_err("reading symlink", &candidate))?;
                    if fs::symlink_metadata(&inside).is_err() {
                        symlink(&target, &inside).map_err(io_err("creating symlink", &inside))?;
                    }
                    real = mirror_host_path(root, &real.join(&target), depth + 1)?;
                } else if meta.is_dir() {
                    if !inside.is_dir() {
                        files::mkdir_all(&inside)?;
                    }
                    real = candidate;
                } else {
                    if fs::symlink_metadata(&inside).is_err() {
                        fs::copy(&candidate, &inside).map_err(io_err("copying", &candidate))?;
                    }
                    real = candidate;
                }
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    Ok(real)
}

fn symlink_loop(path: &Path) -> TestkitError {
    io_err("resolving", path)(io::Error::other("too many levels of symbolic links"))
}

fn write_etc(root: &Path, triple: &str) -> Result<(), TestkitError> {
    let etc = root.join(resolve_in(root, Path::new("etc"))?);
    files::write(
        &etc.join("ld.so.conf"),
        "include /etc/ld.so.conf.d/*.conf\n",
        0o644,
    )?;
    files::write(
        &etc.join("ld.so.conf.d/libc.conf"),
        "# libc default configuration\n/usr/local/lib\n",
        0o644,
    )?;
    files::write(
        &etc.join(format!("ld.so.conf.d/{triple}.conf")),
        format!("# Multiarch support\n/usr/local/lib/{triple}\n/lib/{triple}\n/usr/lib/{triple}\n"),
        0o644,
    )?;
    files::write(
        &etc.join("passwd"),
        "root:x:0:0:root:/root:/bin/sh\n",
        0o644,
    )?;
    files::write(&etc.join("group"), "root:x:0:\n", 0o644)
}

fn library_dirs(triple: &str) -> Vec<PathBuf> {
    let mut dirs = vec![
        Path::new("/lib").join(triple),
        Path::new("/usr/lib").join(triple),
    ];
    dirs.extend(["/lib64", "/usr/lib64", "/lib", "/usr/lib"].map(PathBuf::from));
    dirs
}

fn host_library(name: &str, triple: &str) -> Option<PathBuf> {
    library_dirs(triple)
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.exists())
}

/// The absolute paths of the libraries and loader that `elf` loads, as the host's `ldd` resolves
/// them; empty for a static file.
fn linked_libraries(elf: &Path) -> Result<Vec<PathBuf>, TestkitError> {
    let mut cmd = Command::new(which("ldd")?);
    cmd.arg(elf)
        .env_remove("LD_LIBRARY_PATH")
        .env_remove("LD_PRELOAD");
    let line = describe(&cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| TestkitError::Spawn {
            command: line.clone(),
            source,
        })?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        if stdout.contains("not a dynamic executable")
            || stderr.contains("not a dynamic executable")
        {
            return Ok(Vec::new());
        }
        return Err(TestkitError::CommandFailed {
            command: line,
            status: out.status.to_string(),
            stderr: stderr.trim().to_owned(),
        });
    }
    let mut libs = Vec::new();
    for entry in stdout.lines().map(str::trim) {
        let (name, resolved) = match entry.split_once(" => ") {
            Some((name, rest)) => (name, rest),
            None => (entry, entry),
        };
        if resolved.starts_with("not found") {
            return Err(TestkitError::LibraryNotFound {
                elf: elf.to_path_buf(),
                library: name.to_owned(),
            });
        }
        let path = resolved.split(" (").next().unwrap_or_default();
        if path.starts_with('/') {
            libs.push(PathBuf::from(path));
        }
    }
    Ok(libs)
}

/// Finds `program` on `$PATH`; a missing tool is an error naming it, never a reason to skip.
pub(crate) fn which(program: &'static str) -> Result<PathBuf, TestkitError> {
    find_program(program, &[])
}

/// `program` at the first of `preferred` that exists, else on `$PATH`, else on the usual sbin
/// directories (which a non-login root shell may lack).
fn find_program(program: &'static str, preferred: &[&str]) -> Result<PathBuf, TestkitError> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut tried: Vec<PathBuf> = preferred.iter().map(PathBuf::from).collect();
    tried.extend(std::env::split_paths(&path).map(|d| d.join(program)));
    tried.extend(["/usr/sbin", "/sbin"].map(|d| Path::new(d).join(program)));
    match tried.iter().find(|p| p.is_file()) {
        Some(found) => Ok(found.clone()),
        None => Err(TestkitError::ProgramMissing { program, tried }),
    }
}

/// `cmd` as one shell-like line, for error messages.
pub(crate) fn describe(cmd: &Command) -> String {
    let args = cmd.get_args().map(OsStr::to_string_lossy);
    std::iter::once(cmd.get_program().to_string_lossy())
        .chain(args)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Runs `cmd` to completion with no stdin and returns its stdout; a non-zero exit becomes
/// [`TestkitError::CommandFailed`] carrying stderr.
pub(crate) fn output(cmd: &mut Command) -> Result<String, TestkitError> {
    let command = describe(cmd);
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|source| TestkitError::Spawn {
            command: command.clone(),
            source,
        })?;
    if !out.status.success() {
        return Err(TestkitError::CommandFailed {
            command,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

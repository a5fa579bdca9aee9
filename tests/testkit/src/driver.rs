// SPDX-License-Identifier: Apache-2.0
//! The fake driver root: ELF library stubs, the mock NVML, an `ld.so.cache` written by the system
//! `ldconfig -r`, driver binaries, GSP firmware and the IPC endpoints.
//!
//! The layout follows what NVIDIA's `.run` installer leaves on a Debian-style host, so discovery
//! code sees the same shapes it meets in the field: `lib<X>.so.<V>` files, soname links, the
//! `vdpau/` subdirectory, a stale library from an older driver and an unrelated library.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::artifacts::Artifacts;
use crate::error::{TestkitError, io_err};
use crate::files;

/// Where the libraries go, relative to the driver root.
pub const LIB_DIR: &str = "usr/lib/x86_64-linux-gnu";
/// A library from an older driver with no current counterpart: version filtering must skip it.
pub const STALE_LIBRARY: &str = "libnvidia-fatbinaryloader.so.470.82.01";
/// A non-NVIDIA library in the same directory (soname `libfoo.so.1`).
pub const FOREIGN_LIBRARY: &str = "libfoo.so.1.0.0";
/// The driver binaries placed in `usr/bin` (`nvidia-smi` is the fake one, `nvidia-cuda-mps-control`
/// the fake of [`crate::mps`], the rest are scripts that print their name).
pub const BINARIES: [&str; 5] = [
    "nvidia-smi",
    "nvidia-debugdump",
    "nvidia-persistenced",
    "nvidia-cuda-mps-control",
    "nvidia-cuda-mps-server",
];
/// The persistenced socket, relative to the driver root.
pub const PERSISTENCED_SOCKET: &str = "run/nvidia-persistenced/socket";
/// The MPS pipe directory, relative to the driver root.
pub const MPS_PIPE_DIR: &str = "tmp/nvidia-mps";
/// GSP firmware files in `lib/firmware/nvidia/<V>/`.
pub const FIRMWARE: [&str; 2] = ["gsp_ga10x.bin", "gsp_tu10x.bin"];

/// A library's soname, as the real driver sets it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Soname {
    /// `lib<X>.so.<n>`, with a `lib<X>.so.<n> → lib<X>.so.<V>` link.
    Major(&'static str),
    /// The file name itself (`lib<X>.so.<V>`): NVIDIA's internal libraries, no link.
    Full,
}

/// One driver library: file stem, soname, capability, subdirectory of [`LIB_DIR`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Library {
    pub stem: &'static str,
    pub soname: Soname,
    pub capability: &'static str,
    pub subdir: Option<&'static str>,
}

const fn lib(stem: &'static str, soname: Soname, capability: &'static str) -> Library {
    Library {
        stem,
        soname,
        capability,
        subdir: None,
    }
}

use Soname::{Full, Major};

/// Every driver library the node holds, by capability (NVIDIA's lists). `libnvidia-ml` is the
/// mock NVML, copied in rather than linked from the stub.
pub const LIBRARIES: &[Library] = &[
    lib("libnvidia-ml", Major("1"), "utility"),
    lib("libnvidia-cfg", Major("1"), "utility"),
    lib("libnvidia-nscq", Major("1"), "utility"),
    lib("libcuda", Major("1"), "compute"),
    lib("libcudadebugger", Major("1"), "compute"),
    lib("libnvidia-opencl", Major("1"), "compute"),
    lib("libnvidia-gpucomp", Full, "compute"),
    lib("libnvidia-ptxjitcompiler", Major("1"), "compute"),
    lib("libnvidia-allocator", Major("1"), "compute"),
    lib("libnvidia-pkcs11", Full, "compute"),
    lib("libnvidia-pkcs11-openssl3", Full, "compute"),
    lib("libnvidia-nvvm", Major("4"), "compute"),
    Library {
        stem: "libvdpau_nvidia",
        soname: Major("1"),
        capability: "video",
        subdir: Some("vdpau"),
    },
    lib("libnvidia-encode", Major("1"), "video"),
    lib("libnvidia-opticalflow", Major("1"), "video"),
    lib("libnvcuvid", Major("1"), "video"),
    lib("libnvidia-eglcore", Full, "graphics"),
    lib("libnvidia-glcore", Full, "graphics"),
    lib("libnvidia-tls", Full, "graphics"),
    lib("libnvidia-glsi", Full, "graphics"),
    lib("libnvidia-fbc", Major("1"), "graphics"),
    lib("libnvidia-rtcore", Full, "graphics"),
    lib("libnvoptix", Major("1"), "graphics"),
    lib("libGLX_nvidia", Major("0"), "graphics"),
    lib("libEGL_nvidia", Major("0"), "graphics"),
    lib("libGLESv2_nvidia", Major("2"), "graphics"),
    lib("libGLESv1_CM_nvidia", Major("1"), "graphics"),
    lib("libnvidia-glvkspirv", Full, "graphics"),
    lib("libnvidia-cbl", Full, "graphics"),
    lib("libnvidia-ngx", Major("1"), "ngx"),
];

const MOCK_NVML_STEM: &str = "libnvidia-ml";
const STUB_SOURCE: &str = "/* nvshim-testkit: stands in for an NVIDIA driver library; never called */\n\
     int nvshim_testkit_stub(void) { return 0; }\n";
const LD_SO_CONF: &str = "include /etc/ld.so.conf.d/*.conf\n/usr/lib/x86_64-linux-gnu\n";
const LDCONFIG_CANDIDATES: [&str; 2] = ["/usr/sbin/ldconfig", "/sbin/ldconfig"];

impl Library {
    pub fn file_name(&self, version: &str) -> String {
        format!("{}.so.{version}", self.stem)
    }

    pub fn soname(&self, version: &str) -> String {
        match self.soname {
            Major(n) => format!("{}.so.{n}", self.stem),
            Full => self.file_name(version),
        }
    }
}

/// Builds the driver root at `root` for driver `version`. `scratch` is a directory outside the
/// root for the stub's source and object.
pub(crate) fn build(
    root: &Path,
    version: &str,
    artifacts: &Artifacts,
    scratch: &Path,
) -> Result<(), TestkitError> {
    let lib_dir = root.join(LIB_DIR);
    files::mkdir_all(&lib_dir.join("vdpau"))?;
    build_libraries(&lib_dir, version, artifacts, scratch)?;
    crate::graphics::build_driver(root, version)?;
    files::write(&root.join("etc/ld.so.conf"), LD_SO_CONF, 0o644)?;
    files::mkdir_all(&root.join("etc/ld.so.conf.d"))?;
    run_ldconfig(root)?;
    build_binaries(&root.join("usr/bin"), artifacts)?;
    for name in FIRMWARE {
        let path = root.join(format!("lib/firmware/nvidia/{version}/{name}"));
        files::write(&path, b"GSPFW\0\0\0", 0o644)?;
    }
    bind_socket(&root.join(PERSISTENCED_SOCKET))?;
    files::mkdir_all(&root.join(MPS_PIPE_DIR))
}

fn build_libraries(
    lib_dir: &Path,
    version: &str,
    artifacts: &Artifacts,
    scratch: &Path,
) -> Result<(), TestkitError> {
    let object = compile_stub(scratch)?;
    // (output, soname) for every stub; linked in parallel, which keeps a node build well under
    // a second even on two cores.
    let mut stubs: Vec<(PathBuf, String)> = Vec::new();
    for library in LIBRARIES.iter().filter(|l| l.stem != MOCK_NVML_STEM) {
        let dir = library
            .subdir
            .map_or_else(|| lib_dir.to_path_buf(), |s| lib_dir.join(s));
        stubs.push((
            dir.join(library.file_name(version)),
            library.soname(version),
        ));
    }
    stubs.push((lib_dir.join(STALE_LIBRARY), STALE_LIBRARY.to_owned()));
    stubs.push((lib_dir.join(FOREIGN_LIBRARY), "libfoo.so.1".to_owned()));
    stubs.extend(crate::graphics::stubs(lib_dir));
    link_stubs(&object, &stubs)?;

    files::copy(
        &artifacts.mock_nvml,
        &lib_dir.join(format!("{MOCK_NVML_STEM}.so.{version}")),
        0o755,
    )?;

    for library in LIBRARIES {
        if library.soname == Full {
            continue;
        }
        let dir = library
            .subdir
            .map_or_else(|| lib_dir.to_path_buf(), |s| lib_dir.join(s));
        files::link(
            &library.file_name(version),
            &dir.join(library.soname(version)),
        )?;
    }
    files::link(FOREIGN_LIBRARY, &lib_dir.join("libfoo.so.1"))?;
    // The installer's development links.
    files::link("libcuda.so.1", &lib_dir.join("libcuda.so"))?;
    files::link("libnvidia-ml.so.1", &lib_dir.join("libnvidia-ml.so"))
}

fn compiler() -> String {
    std::env::var("CC")
        .ok()
        .filter(|cc| !cc.is_empty())
        .unwrap_or_else(|| "cc".to_owned())
}

pub(crate) fn compile_stub(scratch: &Path) -> Result<PathBuf, TestkitError> {
    let source = scratch.join("stub.c");
    let object = scratch.join("stub.o");
    files::write(&source, STUB_SOURCE, 0o644)?;
    let mut cmd = Command::new(compiler());
    cmd.args(["-c", "-fPIC", "-o"]).arg(&object).arg(&source);
    run(&mut cmd)?;
    Ok(object)
}

pub(crate) fn link_stubs(object: &Path, stubs: &[(PathBuf, String)]) -> Result<(), TestkitError> {
    let mut children = Vec::with_capacity(stubs.len());
    for (output, soname) in stubs {
        let mut cmd = Command::new(compiler());
        cmd.arg("-shared")
            .arg("-o")
            .arg(output)
            .arg(format!("-Wl,-soname,{soname}"))
            .arg(object)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let line = crate::rootfs::describe(&cmd);
        let child = cmd.spawn().map_err(|source| TestkitError::Spawn {
            command: line.clone(),
            source,
        })?;
        children.push((line, child));
    }
    // Wait for every child before reporting the first failure, so none is left running.
    let mut first_error = None;
    for (line, child) in children {
        let result = child.wait_with_output();
        if first_error.is_some() {
            continue;
        }
        first_error = match result {
            Err(source) => Some(TestkitError::Spawn {
                command: line,
                source,
            }),
            Ok(out) if !out.status.success() => Some(TestkitError::CommandFailed {
                command: line,
                status: out.status.to_string(),
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_owned(),
            }),
            Ok(_) => None,
        };
    }
    first_error.map_or(Ok(()), Err)
}

/// The system `ldconfig` (Debian's, in `/usr/sbin` or `/sbin`).
pub fn ldconfig() -> Result<PathBuf, TestkitError> {
    LDCONFIG_CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
        .ok_or_else(|| TestkitError::ProgramMissing {
            program: "ldconfig",
            tried: LDCONFIG_CANDIDATES.iter().map(PathBuf::from).collect(),
        })
}

/// `ldconfig -r <root>`: reads `<root>/etc/ld.so.conf`, refreshes soname links and writes
/// `<root>/etc/ld.so.cache`. Always with `-r`: without it, it would rewrite the host's cache.
pub(crate) fn run_ldconfig(root: &Path) -> Result<(), TestkitError> {
    let mut cmd = Command::new(ldconfig()?);
    cmd.arg("-r").arg(root);
    run(&mut cmd)
}

fn build_binaries(bin_dir: &Path, artifacts: &Artifacts) -> Result<(), TestkitError> {
    files::mkdir_all(bin_dir)?;
    for name in BINARIES {
        let path = bin_dir.join(name);
        if name == "nvidia-smi" {
            files::copy(&artifacts.nvidia_smi, &path, 0o755)?;
        } else if name == "nvidia-cuda-mps-control" {
            files::write(&path, crate::mps::FAKE_MPS_CONTROL, 0o755)?;
        } else {
            files::write(&path, format!("#!/bin/sh\necho {name}\n"), 0o755)?;
        }
    }
    Ok(())
}

/// Leaves a unix socket file at `path` (bound, then closed: the file stays).
fn bind_socket(path: &Path) -> Result<(), TestkitError> {
    let dir = path
        .parent()
        .ok_or_else(|| io_err("binding socket", path)(std::io::ErrorKind::InvalidInput.into()))?;
    files::mkdir_all(dir)?;
    // sun_path holds 107 bytes; deep temp dirs exceed that, so bind through /proc/self/fd.
    if path.as_os_str().len() < 100 {
        UnixListener::bind(path).map_err(io_err("binding socket", path))?;
        return Ok(());
    }
    let handle = File::open(dir).map_err(io_err("opening", dir))?;
    let name = path.file_name().map(PathBuf::from).unwrap_or_default();
    let short = PathBuf::from(format!("/proc/self/fd/{}", handle.as_raw_fd())).join(name);
    UnixListener::bind(&short).map_err(io_err("binding socket", path))?;
    Ok(())
}

/// Runs `cmd` to completion; a non-zero exit becomes [`TestkitError::CommandFailed`] with stderr.
pub(crate) fn run(cmd: &mut Command) -> Result<(), TestkitError> {
    crate::rootfs::output(cmd).map(drop)
}

// SPDX-License-Identifier: Apache-2.0
//! [`SimNode`]: builds a whole simulated node from a [`NodeSpec`] and says how to point nvshim and
//! the mock NVML at it.

use std::fs;
use std::path::{Path, PathBuf};

use crate::artifacts::Artifacts;
use crate::error::{TestkitError, io_err};
use crate::mock_config::MockConfig;
use crate::spec::NodeSpec;
use crate::{devices, driver, files, procfs};

/// The env variable naming the mock NVML's config file.
pub const MOCK_NVML_CONFIG_ENV: &str = "MOCK_NVML_CONFIG";
/// The env variable naming the file the mock NVML appends its calls to.
pub const MOCK_NVML_CALL_LOG_ENV: &str = "MOCK_NVML_CALL_LOG";
/// The mock NVML's config, in the node directory.
pub const MOCK_CONFIG_FILE: &str = "mock-nvml.json";
/// Scratch space for the stub's source and object while building; removed afterwards.
pub(crate) const SCRATCH_DIR: &str = ".testkit-build";

/// A simulated GPU node on disk. Paths are absolute.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimNode {
    /// The node directory `D`.
    pub dir: PathBuf,
    /// `D/driver`: libraries, `ld.so.cache`, binaries, firmware, IPC.
    pub driver_root: PathBuf,
    /// `D/dev`: character device nodes.
    pub dev_root: PathBuf,
    /// `D/proc`: `driver/nvidia/...` and `driver/nvidia-caps/...`.
    pub proc_root: PathBuf,
    /// `D/mock-nvml.json`.
    pub mock_config: PathBuf,
    /// `D/nvml-calls.log`; the mock creates it on its first call.
    pub call_log: PathBuf,
    pub spec: NodeSpec,
}

impl SimNode {
    /// Checks `spec`, makes `dir` (empty or absent) ready and names the node's paths in it;
    /// creates nothing else.
    pub(crate) fn layout(spec: &NodeSpec, dir: &Path) -> Result<SimNode, TestkitError> {
        spec.validate()?;
        prepare_dir(dir)?;
        let dir = fs::canonicalize(dir).map_err(io_err("resolving", dir))?;
        Ok(SimNode {
            driver_root: dir.join("driver"),
            dev_root: dir.join("dev"),
            proc_root: dir.join("proc"),
            mock_config: dir.join(MOCK_CONFIG_FILE),
            call_log: dir.join("nvml-calls.log"),
            spec: spec.clone(),
            dir,
        })
    }

    /// Builds the node described by `spec` in `dir`, which must be empty or absent.
    pub fn build(
        spec: &NodeSpec,
        dir: &Path,
        artifacts: &Artifacts,
    ) -> Result<SimNode, TestkitError> {
        let node = SimNode::layout(spec, dir)?;
        // Device nodes first: without CAP_MKNOD the build fails before doing the slow parts.
        devices::build(&node.dev_root, spec)?;
        let scratch = node.dir.join(SCRATCH_DIR);
        files::mkdir_all(&scratch)?;
        driver::build(&node.driver_root, &spec.driver_version, artifacts, &scratch)?;
        fs::remove_dir_all(&scratch).map_err(io_err("removing", &scratch))?;
        procfs::build(&node.proc_root, spec)?;
        crate::graphics::build_sysfs(&node.dir, spec)?;
        crate::pci::build(&node.dir, spec)?;

        let event_file = node.dir.join("xid-events");
        files::write(&event_file, "", 0o644)?;
        let config = MockConfig::new(spec, &node.dev_root, &event_file);
        let mut json =
            serde_json::to_string_pretty(&config).map_err(|source| TestkitError::Json {
                path: node.mock_config.clone(),
                source,
            })?;
        json.push('\n');
        files::write(&node.mock_config, json, 0o644)?;
        Ok(node)
    }

    /// The env a process needs to use the mock NVML with this node.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                MOCK_NVML_CONFIG_ENV.to_owned(),
                self.mock_config.display().to_string(),
            ),
            (
                MOCK_NVML_CALL_LOG_ENV.to_owned(),
                self.call_log.display().to_string(),
            ),
        ]
    }

    /// nvshim's root flags for this node.
    pub fn root_args(&self) -> Vec<String> {
        vec![
            "--driver-root".to_owned(),
            self.driver_root.display().to_string(),
            // Like NVIDIA's `--dev-root`, nvshim's dev and proc roots are directories
            // that contain `dev/` and `proc/`, i.e. the node directory itself.
            "--dev-root".to_owned(),
            self.dir.display().to_string(),
            "--proc-root".to_owned(),
            self.dir.display().to_string(),
        ]
    }

    /// The `<V>` of every current `lib*.so.<V>`: the driver version.
    pub fn library_version(&self) -> &str {
        &self.spec.driver_version
    }

    /// The driver's library directory (`D/driver/usr/lib/x86_64-linux-gnu`).
    pub fn lib_dir(&self) -> PathBuf {
        self.driver_root.join(driver::LIB_DIR)
    }

    /// The text of an `nvidia-container-runtime` config.toml pointing at this node: the driver
    /// root, dev root and proc root, `runtime` as the low-level runtime, and a debug log to
    /// `debug_log` when given.
    pub fn runtime_config(&self, runtime: &str, debug_log: Option<&Path>) -> String {
        let d = self.dir.display();
        let log = debug_log.map_or(String::new(), |p| {
            format!("debug = \"{}\"\nlog-level = \"debug\"\n", p.display())
        });
        format!(
            "[nvidia-container-cli]\nroot = \"{d}/driver\"\ndev-root = \"{d}\"\n\n\
             [nvidia-container-runtime]\nruntimes = [\"{runtime}\"]\n{log}\n\
             [nvshim]\nproc-root = \"{d}\"\n"
        )
    }

    /// A rootfs builder whose result can run this node's `nvidia-smi` and mock NVML once a
    /// runtime mounts them in: it carries the glibc libraries both link against.
    pub fn container_rootfs(&self) -> crate::GlibcRootfs {
        crate::GlibcRootfs::new()
            .libraries_for(self.driver_root.join("usr/bin/nvidia-smi"))
            .libraries_for(
                self.lib_dir()
                    .join(format!("libnvidia-ml.so.{}", self.library_version())),
            )
    }
}

pub(crate) fn prepare_dir(dir: &Path) -> Result<(), TestkitError> {
    match fs::read_dir(dir) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(TestkitError::DirNotEmpty {
                    path: dir.to_path_buf(),
                });
            }
            Ok(())
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => files::mkdir_all(dir),
        Err(e) => Err(io_err("reading directory", dir)(e)),
    }
}

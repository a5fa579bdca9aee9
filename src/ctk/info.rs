//! `nvidia-ctk info`: NVIDIA's prints nothing of use; ours prints what a bug report
//! needs, cheaply (no NVML): our version, the config file in effect, and the driver
//! version and GPU count from `/proc/driver/nvidia` under the config's proc root.
//! Problems are printed in place of the value, so the command itself only fails when
//! it cannot write.

use std::io::Write;

use clap::Args;

use super::GlobalArgs;
use crate::config::{self as nvconfig, Config};
use crate::roots::Roots;

#[derive(Debug, Args)]
pub struct InfoArgs {}

#[derive(Debug, thiserror::Error)]
pub enum InfoError {
    #[error("cannot write output: {0}")]
    Output(#[from] std::io::Error),
}

pub fn run(global: &GlobalArgs, _args: &InfoArgs, out: &mut dyn Write) -> Result<(), InfoError> {
    let env = |name: &str| std::env::var(name).ok();
    writeln!(
        out,
        "{} (nvshim) version {}",
        super::CTK_BINARY,
        env!("CARGO_PKG_VERSION")
    )?;
    // `--config` names the file as NVIDIA_CTK_CONFIG_FILE_PATH would, except that a
    // missing one means the defaults here: `info` reports, it does not insist.
    let loaded = match &global.config {
        Some(path) if !path.exists() => Ok(nvconfig::Loaded {
            config: Config::default(),
            path: path.clone(),
            from_file: false,
            unknown_keys: Vec::new(),
        }),
        Some(path) => {
            let path = path.clone();
            nvconfig::load(move |name| {
                (name == nvconfig::ENV_CONFIG_FILE_PATH).then(|| path.display().to_string())
            })
        }
        None => nvconfig::load(env),
    };
    let config = match loaded {
        Ok(loaded) => {
            let state = if loaded.from_file {
                "in use"
            } else {
                "not found; defaults apply"
            };
            writeln!(out, "config file: {} ({state})", loaded.path.display())?;
            for key in &loaded.unknown_keys {
                writeln!(out, "config file: unknown key {key} (ignored)")?;
            }
            loaded.config
        }
        Err(e) => {
            writeln!(out, "config file: error: {e}; showing defaults")?;
            Config::default()
        }
    };
    let roots = Roots {
        driver: config.driver_root(),
        dev: config.dev_root(),
        proc: config.nvshim.proc_root.clone(),
    };
    writeln!(out, "driver root: {}", roots.driver.display())?;
    match crate::inventory::procfs::load(&roots) {
        Ok(inventory) => {
            writeln!(out, "driver version: {}", inventory.driver.version)?;
            writeln!(out, "GPUs: {}", inventory.gpus.len())?;
        }
        Err(e) => writeln!(out, "driver: {}", chain(&e))?,
    }
    Ok(())
}

/// An error and its sources, `: `-joined.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(&format!(": {s}"));
        source = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn prints_version_config_and_driver_from_the_configs_proc_root() {
        let tmp = tempfile::tempdir().unwrap();
        let nvidia = tmp.path().join("proc/driver/nvidia");
        std::fs::create_dir_all(nvidia.join("gpus")).unwrap();
        std::fs::write(
            nvidia.join("version"),
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 UTC 2024\n",
        )
        .unwrap();
        let config = tmp.path().join("config.toml");
        std::fs::write(
            &config,
            format!(
                "[nvshim]\nproc-root = \"{}\"\n[mystery]\nx = 1\n",
                tmp.path().display()
            ),
        )
        .unwrap();
        let global = GlobalArgs {
            debug: false,
            quiet: false,
            config: Some(config.clone()),
        };
        let mut out = Vec::new();
        run(&global, &InfoArgs {}, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        for want in [
            format!("version {}", env!("CARGO_PKG_VERSION")),
            format!("config file: {} (in use)", config.display()),
            "unknown key mystery".to_owned(),
            "driver version: 550.54.15".to_owned(),
            "GPUs: 0".to_owned(),
        ] {
            assert!(text.contains(&want), "{text} lacks {want}");
        }

        std::fs::write(&config, "[nvshim]\nproc-root = \"/nonexistent-nvshim\"\n").unwrap();
        let mut out = Vec::new();
        run(&global, &InfoArgs {}, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("driver: "), "{text}");
        assert!(text.contains("/nonexistent-nvshim"), "{text}");
    }
}

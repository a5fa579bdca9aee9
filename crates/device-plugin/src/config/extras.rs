// SPDX-License-Identifier: Apache-2.0
//! NVIDIA's extra device classes a container gets with its GPUs: GPUDirect Storage,
//! MOFED, GDRCopy (`--gds-enabled`, `--mofed-enabled`, `--gdrcopy-enabled`, their env
//! vars and `flags.*Enabled`), and the IMEX channels (`--imex-channel-ids`,
//! `--imex-required`, `imex.*`). Each resolved flag > env > file > default, as every
//! setting is.
//!
//! `Allocate` passes them on as NVIDIA's plugin does (`NVIDIA_GDS=enabled`, …,
//! `NVIDIA_IMEX_CHANNELS`); the runtime on the node does the injecting.

use serde::Serialize;

use super::resolve::Env;
use super::{
    DeviceListStrategy, ENV_GDRCOPY_ENABLED, ENV_GDS_ENABLED, ENV_IMEX_CHANNEL_IDS,
    ENV_IMEX_REQUIRED, ENV_MOFED_ENABLED, FileSettings, PluginArgs, PluginConfigError,
};

/// `--gdrcopy-enabled`, `--gds-enabled`, `--mofed-enabled`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct DeviceClasses {
    pub gdrcopy: bool,
    pub gds: bool,
    pub mofed: bool,
}

/// `--imex-channel-ids` and `--imex-required`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Imex {
    /// No channel, or channel 0 (NVIDIA's rule). At start-up the plugin keeps only the
    /// channels whose device node exists (see `imex`).
    pub channel_ids: Vec<u32>,
    /// A listed channel that does not exist fails the start instead of being left out.
    pub required: bool,
}

/// The device classes and IMEX channels `args`, the environment and the file ask for.
pub(super) fn resolve(
    args: &PluginArgs,
    env: &Env<'_>,
    file: &FileSettings,
) -> Result<(DeviceClasses, Imex), PluginConfigError> {
    let switch = |given: Option<bool>, name: &'static str, in_file: Option<bool>| {
        // The env var is checked for a bad value even when a flag overrides it.
        let from_env = env.bool(name)?;
        Ok::<bool, PluginConfigError>(given.or(from_env).or(in_file).unwrap_or(false))
    };
    let classes = DeviceClasses {
        gdrcopy: switch(
            args.gdrcopy_enabled,
            ENV_GDRCOPY_ENABLED,
            file.gdrcopy_enabled,
        )?,
        gds: switch(args.gds_enabled, ENV_GDS_ENABLED, file.gds_enabled)?,
        mofed: switch(args.mofed_enabled, ENV_MOFED_ENABLED, file.mofed_enabled)?,
    };
    let required = switch(args.imex_required, ENV_IMEX_REQUIRED, file.imex_required)?;
    let env_ids = env.ints(ENV_IMEX_CHANNEL_IDS)?;
    let (origin, ids) = match (&args.imex_channel_ids, env_ids) {
        (Some(ids), _) => ("--imex-channel-ids", ids.clone()),
        (None, Some(ids)) => (ENV_IMEX_CHANNEL_IDS, ids),
        (None, None) => ("imex.channelIDs", Vec::new()),
    };
    let channel_ids = match ids.as_slice() {
        [] => file.imex_channel_ids.clone().unwrap_or_default(),
        [0] => vec![0],
        _ => {
            // NVIDIA's own rule: the list is [] or [0].
            return Err(PluginConfigError::Invalid {
                origin: origin.to_owned(),
                value: ids.iter().map(i64::to_string).collect::<Vec<_>>().join(","),
                valid: "no channel, or 0",
            });
        }
    };
    Ok((
        classes,
        Imex {
            channel_ids,
            required,
        },
    ))
}

/// IMEX channels travel as `NVIDIA_IMEX_CHANNELS` (envvar) or `imex/<id>` mounts
/// (volume-mounts); NVIDIA's `cdi-*` strategies name `imex-channel=<id>` devices from a
/// CDI spec this plugin does not write yet. With only `cdi-*` strategies the channels
/// would reach no container, so that is refused rather than ignored.
pub(super) fn check_imex_transport(
    imex: &Imex,
    strategies: &[DeviceListStrategy],
) -> Result<(), PluginConfigError> {
    let carried = strategies.iter().any(|s| {
        matches!(
            s,
            DeviceListStrategy::Envvar | DeviceListStrategy::VolumeMounts
        )
    });
    if imex.channel_ids.is_empty() || carried {
        return Ok(());
    }
    Err(PluginConfigError::Unsupported {
        origin: "--imex-channel-ids with only cdi-* device list strategies".to_owned(),
        value: imex
            .channel_ids
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join(","),
        feature: "IMEX channels as CDI devices (add the envvar or volume-mounts strategy)",
    })
}

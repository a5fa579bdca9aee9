//! CDI names of the device classes (`nvidia.com/gds=all`, `nvidia.com/imex-channel=3`,
//! also under NVIDIA's JIT vendor `runtime.nvidia.com`) that no spec file defines,
//! planned in memory from this host, as NVIDIA's `jit-cdi` mode generates their specs.
//! Their edits join the spec files' ones; the rest of the request goes on to the host
//! planning as before. In `cdi` mode every name comes from a file, so this never runs.

use super::{Context, PipelineError};
use crate::cdi::ContainerEdits;
use crate::discover::classes::discover_classes;
use crate::edits;
use crate::request::{DeviceClasses, DeviceId, Request, add_cdi_name};

/// The class names of `ids`, planned: their edits, their names, the ids left.
pub(super) struct InMemory {
    pub edits: ContainerEdits,
    pub names: Vec<String>,
    pub rest: Vec<DeviceId>,
}

/// Plans the class names among `ids`; `None` when there is none (then nothing was
/// read).
pub(super) fn plan_names(
    ctx: &Context,
    request: &Request,
    ids: &[DeviceId],
) -> Result<Option<InMemory>, PipelineError> {
    let mut classes = DeviceClasses::default();
    let mut names = Vec::new();
    let mut rest = Vec::new();
    for id in ids {
        let DeviceId::Cdi { kind, name } = id else {
            rest.push(id.clone());
            continue;
        };
        match add_cdi_name(&mut classes, kind, name) {
            None => rest.push(id.clone()),
            Some(Err(e)) => return Err(PipelineError::ClassName(e)),
            Some(Ok(())) => names.push(format!("{kind}={name}")),
        }
    }
    if names.is_empty() {
        return Ok(None);
    }
    if rest.is_empty() {
        // Nothing goes on to the host planning, which would add the env's classes.
        let env = &request.classes;
        classes.gds |= env.gds;
        classes.mofed |= env.mofed;
        classes.gdrcopy |= env.gdrcopy;
        classes.nvswitch |= env.nvswitch;
        classes.imex_channels.extend(&env.imex_channels);
        classes.imex_channels.sort_unstable();
        classes.imex_channels.dedup();
    }
    if request.classes.create_imex_channels && !classes.imex_channels.is_empty() {
        crate::device_nodes::create_imex_channels(&ctx.roots, &classes.imex_channels)
            .map_err(PipelineError::ImexChannels)?;
    }
    let resources = discover_classes(&ctx.roots, &classes)?;
    super::require_all(&resources.missing)?;
    tracing::debug!(devices = ?names, "device-class CDI names planned in memory");
    Ok(Some(InMemory {
        edits: edits::build(&resources),
        names,
        rest,
    }))
}

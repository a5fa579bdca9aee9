//! `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES` in a plan: the covered GPUs
//! (selected here, or named by CDI spec files whose edits carry their `/dev/nvidia<N>`),
//! their capability nodes, merged into the plan's edits. Only procfs and the dev root
//! are read, so such a request never needs NVML for this part.

use super::{PipelineError, Plan};
use crate::discover::{self, HostResources};
use crate::{edits, select};

/// Adds what `plan.request.mig_access` asks for to `plan` (nothing when it asks for
/// nothing: then nothing is read).
pub(super) fn add(roots: &crate::roots::Roots, plan: &mut Plan) -> Result<(), PipelineError> {
    let access = plan.request.mig_access;
    if access.is_none() {
        return Ok(());
    }
    let mut minors: Vec<u32> =
        select::mig_access_gpus(&plan.request.devices, access, &plan.selection)?
            .iter()
            .map(|g| g.minor)
            .collect();
    for node in &plan.edits.device_nodes {
        if let Some(minor) = node
            .path
            .strip_prefix("/dev/nvidia")
            .and_then(|n| n.parse::<u32>().ok())
            && !minors.contains(&minor)
        {
            minors.push(minor);
        }
    }
    let mut resources = HostResources::default();
    discover::mig_access::discover(roots, access, &minors, &mut resources)?;
    super::require_all(&resources.missing)?;
    plan.edits.merge(&edits::build(&resources));
    plan.missing.extend(resources.missing);
    Ok(())
}

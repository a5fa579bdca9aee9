//! The CDI spec of a Tegra board (`nvidia-ctk cdi generate --mode csv`): NVIDIA's shape
//! (`pkg/nvcdi/lib-csv.go`). The integrated GPU is one device, named by the strategies
//! for index 0 (`0`, `gpu0`; a UUID strategy names nothing, as NVIDIA ignores it here),
//! plus `all`; each carries the whole CSV plan, its symlinks and linker-cache entries
//! as hooks. The spec-level edits only set `NVIDIA_VISIBLE_DEVICES=void`.

use super::{
    GenerateError, NameStrategy, NvidiaHooks, Options, Shape, check, device, nvidia_shape,
};
use crate::cdi::{self, Spec};
use crate::discover::csv::CsvSource;
use crate::pipeline::{self, Context};
use crate::request::{DeviceList, ENV_VISIBLE_DEVICES, Request};

/// Generates the spec from the CSV files `source` names.
pub fn generate(
    ctx: &Context,
    options: &Options,
    nvidia: &NvidiaHooks,
    source: &CsvSource,
) -> Result<Spec, GenerateError> {
    check(options)?;
    let request = Request::new(DeviceList::All, options.capabilities);
    let plan = pipeline::csv::plan(ctx, &request, source)?;
    if plan.edits.is_empty() && plan.symlinks.is_empty() {
        return Err(GenerateError::NoCsvEntries);
    }
    let shape = Shape {
        options,
        nvidia: nvidia_shape(&options.hook_path).then_some(nvidia),
        driver_version: "",
    };
    let mut edits = plan.edits.clone();
    edits
        .hooks
        .extend(shape.hooks(&plan.symlinks, &plan.ldcache, false)?);
    edits.normalise();
    let wanted = |name: &str| options.only.as_ref().is_none_or(|only| only.contains(name));
    let mut devices: Vec<cdi::Device> = options
        .strategies
        .iter()
        .filter_map(|strategy| match strategy {
            NameStrategy::Index => Some("0".to_owned()),
            NameStrategy::TypeIndex => Some("gpu0".to_owned()),
            NameStrategy::Uuid => None,
        })
        .filter(|name| wanted(name))
        .map(|name| device(name, &edits))
        .collect();
    devices.dedup_by(|a, b| a.name == b.name);
    let only_all = options.strategies.is_empty() && options.all_device;
    if devices.is_empty() && !only_all {
        return Err(GenerateError::NoneWanted {
            wanted: options.only.iter().flatten().cloned().collect(),
        });
    }
    if options.all_device {
        devices.push(device("all".to_owned(), &edits));
    }
    let mut spec = Spec {
        cdi_version: String::new(),
        kind: options.kind.clone(),
        annotations: Default::default(),
        devices,
        container_edits: cdi::ContainerEdits {
            env: vec![format!("{ENV_VISIBLE_DEVICES}=void")],
            ..Default::default()
        },
    };
    spec.cdi_version = cdi::minimum_version(&spec).to_owned();
    cdi::spec::validate(&spec)?;
    Ok(spec)
}

#[cfg(test)]
mod tests;

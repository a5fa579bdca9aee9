//! Resolves a [`DeviceList`] against the [`Inventory`]: which GPUs and MIG devices the
//! container gets.
//!
//! Pure: values in, values out. Every id must name something that exists; an unknown
//! one is an error that quotes it and lists what the node has. The same device named
//! twice (`0,GPU-<uuid of 0>`) is folded to one, keeping the first mention's place.
//! [`check`] then holds the container's `NVIDIA_REQUIRE_*` constraints against the
//! driver and the selected GPUs.

use std::fmt::Write as _;

use serde::Serialize;

use crate::inventory::{Gpu, Inventory, MigDevice};
use crate::request::{
    Condition, DeviceId, DeviceList, Op, Quoted, RequireKey, Requirement, shown_name,
};

/// CDI kinds whose device names we resolve ourselves (the JIT-CDI vocabulary).
pub const NVIDIA_CDI_KINDS: [&str; 2] = ["nvidia.com/gpu", "runtime.nvidia.com/gpu"];

/// A full GPU the container gets.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelectedGpu {
    pub index: u32,
    pub minor: u32,
    pub uuid: String,
    pub bus_id: String,
}

/// A MIG device the container gets, with the parent whose node it also needs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SelectedMig {
    pub parent: SelectedGpu,
    /// The `M` of `N:M`.
    pub index: u32,
    pub gpu_instance_id: u32,
    pub compute_instance_id: u32,
    pub uuid: String,
}

/// What the container gets. Empty lists with a non-void request mean "driver only".
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Selection {
    pub gpus: Vec<SelectedGpu>,
    pub mig_devices: Vec<SelectedMig>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SelectError {
    #[error("unknown GPU {id} (this node has: {known})")]
    UnknownGpu { id: Quoted, known: String },
    #[error("unknown MIG device {id} (this node has: {known})")]
    UnknownMig { id: Quoted, known: String },
    #[error(
        "unsupported CDI device kind {kind} in {id}: nvshim resolves {} itself; \
         other vendors' devices need a CDI spec file",
        NVIDIA_CDI_KINDS.join(" and ")
    )]
    ForeignCdiKind { kind: Quoted, id: Quoted },
    #[error("invalid CDI device name {id}: {source}")]
    BadCdiName {
        id: Quoted,
        #[source]
        source: crate::request::RequestError,
    },
    /// A requirement that does not hold; `reasons` says why each alternative fails.
    #[error("unsatisfied {variable} {requirement}: {reasons}")]
    Unsatisfied {
        variable: String,
        requirement: Quoted,
        reasons: String,
    },
    /// A requirement that cannot be decided because a fact it needs is unknown.
    #[error("cannot check {variable} {requirement}: {missing}")]
    UnknownFact {
        variable: String,
        requirement: Quoted,
        missing: String,
    },
}

/// Resolves `list` against `inventory`. `Void` and `None` select nothing.
pub fn resolve(list: &DeviceList, inventory: &Inventory) -> Result<Selection, SelectError> {
    let mut selection = Selection::default();
    match list {
        DeviceList::Void | DeviceList::None => {}
        DeviceList::All => add_all(&mut selection, inventory),
        DeviceList::Ids(ids) => {
            for id in ids {
                add(&mut selection, id, inventory)?;
            }
        }
    }
    Ok(selection)
}

fn add_all(selection: &mut Selection, inventory: &Inventory) {
    for gpu in &inventory.gpus {
        push_gpu(selection, gpu);
        for mig in &gpu.mig_devices {
            push_mig(selection, gpu, mig);
        }
    }
}

fn add(selection: &mut Selection, id: &DeviceId, inventory: &Inventory) -> Result<(), SelectError> {
    let gpus = &inventory.gpus;
    let unknown_gpu = || SelectError::UnknownGpu {
        id: Quoted::new(&id.to_string()),
        known: known_gpus(inventory),
    };
    let unknown_mig = || SelectError::UnknownMig {
        id: Quoted::new(&id.to_string()),
        known: known_migs(inventory),
    };
    match id {
        DeviceId::Index(i) => {
            let gpu = gpus
                .iter()
                .find(|g| g.index == *i)
                .ok_or_else(unknown_gpu)?;
            push_gpu(selection, gpu);
        }
        DeviceId::GpuUuid(uuid) => {
            let gpu = gpus
                .iter()
                .find(|g| g.uuid.eq_ignore_ascii_case(uuid))
                .ok_or_else(unknown_gpu)?;
            push_gpu(selection, gpu);
        }
        DeviceId::BusId(bus) => {
            let gpu = gpus
                .iter()
                .find(|g| g.bus_id == *bus)
                .ok_or_else(unknown_gpu)?;
            push_gpu(selection, gpu);
        }
        DeviceId::MigIndex { gpu, mig } => {
            let (g, m) = gpus
                .iter()
                .find(|g| g.index == *gpu)
                .and_then(|g| {
                    g.mig_devices
                        .iter()
                        .find(|m| m.index == *mig)
                        .map(|m| (g, m))
                })
                .ok_or_else(unknown_mig)?;
            push_mig(selection, g, m);
        }
        DeviceId::MigUuid(uuid) => {
            let (g, m) = gpus
                .iter()
                .find_map(|g| {
                    g.mig_devices
                        .iter()
                        .find(|m| m.uuid.eq_ignore_ascii_case(uuid))
                        .map(|m| (g, m))
                })
                .ok_or_else(unknown_mig)?;
            push_mig(selection, g, m);
        }
        DeviceId::MigLegacy {
            gpu_uuid,
            gpu_instance_id,
            compute_instance_id,
        } => {
            let (g, m) = gpus
                .iter()
                .find(|g| g.uuid.eq_ignore_ascii_case(gpu_uuid))
                .and_then(|g| {
                    g.mig_devices
                        .iter()
                        .find(|m| {
                            m.gpu_instance_id == *gpu_instance_id
                                && m.compute_instance_id == *compute_instance_id
                        })
                        .map(|m| (g, m))
                })
                .ok_or_else(unknown_mig)?;
            push_mig(selection, g, m);
        }
        DeviceId::Cdi { kind, name } => {
            if !NVIDIA_CDI_KINDS.contains(&kind.as_str()) {
                return Err(SelectError::ForeignCdiKind {
                    kind: Quoted::new(kind),
                    id: Quoted::new(&id.to_string()),
                });
            }
            let inner: DeviceList = name.parse().map_err(|source| SelectError::BadCdiName {
                id: Quoted::new(&id.to_string()),
                source,
            })?;
            // A CDI name is one device (or `all`), never a list or another CDI name.
            match inner {
                DeviceList::All => add_all(selection, inventory),
                DeviceList::Ids(ids)
                    if ids.len() == 1 && !matches!(ids[0], DeviceId::Cdi { .. }) =>
                {
                    // Errors quote the name the user wrote, not the inner id.
                    add(selection, &ids[0], inventory).map_err(|e| match e {
                        SelectError::UnknownGpu { known, .. } => SelectError::UnknownGpu {
                            id: Quoted::new(&id.to_string()),
                            known,
                        },
                        SelectError::UnknownMig { known, .. } => SelectError::UnknownMig {
                            id: Quoted::new(&id.to_string()),
                            known,
                        },
                        other => other,
                    })?;
                }
                _ => return Err(unknown_gpu()),
            }
        }
    }
    Ok(())
}

fn selected(gpu: &Gpu) -> SelectedGpu {
    SelectedGpu {
        index: gpu.index,
        minor: gpu.minor,
        uuid: gpu.uuid.clone(),
        bus_id: gpu.bus_id.clone(),
    }
}

fn push_gpu(selection: &mut Selection, gpu: &Gpu) {
    if !selection.gpus.iter().any(|g| g.uuid == gpu.uuid) {
        selection.gpus.push(selected(gpu));
    }
}

fn push_mig(selection: &mut Selection, gpu: &Gpu, mig: &MigDevice) {
    if !selection.mig_devices.iter().any(|m| m.uuid == mig.uuid) {
        selection.mig_devices.push(SelectedMig {
            parent: selected(gpu),
            index: mig.index,
            gpu_instance_id: mig.gpu_instance_id,
            compute_instance_id: mig.compute_instance_id,
            uuid: mig.uuid.clone(),
        });
    }
}

/// At most this many devices are listed in an error.
const KNOWN_MAX: usize = 16;

fn known_gpus(inventory: &Inventory) -> String {
    if inventory.gpus.is_empty() {
        return "no GPUs".into();
    }
    let mut out = String::new();
    for (n, gpu) in inventory.gpus.iter().enumerate() {
        if n == KNOWN_MAX {
            let _ = write!(out, ", … {} more", inventory.gpus.len() - KNOWN_MAX);
            break;
        }
        let sep = if n == 0 { "" } else { ", " };
        let _ = write!(out, "{sep}{} {} {}", gpu.index, gpu.uuid, gpu.bus_id);
    }
    out
}

fn known_migs(inventory: &Inventory) -> String {
    let migs: Vec<String> = inventory
        .gpus
        .iter()
        .flat_map(|g| {
            g.mig_devices
                .iter()
                .map(move |m| format!("{}:{} {}", g.index, m.index, m.uuid))
        })
        .collect();
    if migs.is_empty() {
        if inventory.gpus.iter().all(|g| g.mig_enabled.is_none()) {
            return "no MIG devices known; only the NVML backend lists MIG devices".into();
        }
        return "no MIG devices".into();
    }
    let mut shown: Vec<String> = migs.iter().take(KNOWN_MAX).cloned().collect();
    if migs.len() > KNOWN_MAX {
        shown.push(format!("… {} more", migs.len() - KNOWN_MAX));
    }
    shown.join(", ")
}

/// What [`check`] holds requirements against: the driver, and the GPUs the container
/// gets (a MIG device counts as its parent GPU, as in libnvidia-container).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    /// The CUDA driver API version (`12.4`); `None` when the inventory backend does not
    /// know it (procfs).
    pub cuda_version: Option<String>,
    /// The kernel driver version (`550.54.15`).
    pub driver_version: String,
    /// One entry per selected GPU, in selection order.
    pub gpus: Vec<GpuFacts>,
}

/// What requirements may ask about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GpuFacts {
    /// How messages name this GPU (its index or UUID).
    pub id: String,
    /// Compute capability `major.minor` (`8.0`); `None` when unknown (procfs).
    pub arch: Option<String>,
    /// NVML's brand (`tesla`, `geforce`, …); `None` when unknown.
    pub brand: Option<String>,
}

/// Checks every requirement, as libnvidia-container does: once per selected GPU, or
/// once with no GPU when none is selected. With no GPU, `arch` and `brand` conditions
/// hold (there is nothing to compare; NVIDIA does the same). Unlike NVIDIA, a fact the
/// inventory does not know never passes silently: a requirement that can only be
/// decided with it is an [`SelectError::UnknownFact`]. One that holds through another
/// alternative is fine (`cuda>=12 brand=tesla` holds on a known CUDA 12 with the brand
/// unknown).
pub fn check(requirements: &[Requirement], facts: &Facts) -> Result<(), SelectError> {
    requirements.iter().try_for_each(|r| check_one(r, facts))
}

/// Three-valued logic: AND is false if any part is false, else unknown if any part is
/// unknown; OR is true if any part is true, else unknown if any part is unknown.
enum Truth {
    True,
    /// Why it fails.
    False(String),
    /// Which fact is missing.
    Unknown(String),
}

fn check_one(requirement: &Requirement, facts: &Facts) -> Result<(), SelectError> {
    let gpus: Vec<Option<&GpuFacts>> = if facts.gpus.is_empty() {
        vec![None]
    } else {
        facts.gpus.iter().map(Some).collect()
    };
    let mut unknown = None;
    for gpu in gpus {
        match eval_requirement(requirement, facts, gpu) {
            Truth::True => {}
            Truth::False(mut reasons) => {
                if fails_on_cuda_minimum(requirement, facts) {
                    reasons
                        .push_str(" (update the driver, or use an image built for an older CUDA)");
                }
                return Err(SelectError::Unsatisfied {
                    variable: shown_name(&requirement.variable),
                    requirement: Quoted::new(&requirement.to_string()),
                    reasons,
                });
            }
            Truth::Unknown(missing) => {
                unknown.get_or_insert(missing);
            }
        }
    }
    match unknown {
        None => Ok(()),
        Some(missing) => Err(SelectError::UnknownFact {
            variable: shown_name(&requirement.variable),
            requirement: Quoted::new(&requirement.to_string()),
            missing,
        }),
    }
}

/// At most this many failing alternatives are described in an error.
const REASONS_MAX: usize = 8;

fn eval_requirement(requirement: &Requirement, facts: &Facts, gpu: Option<&GpuFacts>) -> Truth {
    if requirement.alternatives.is_empty() {
        return Truth::True;
    }
    let mut reasons: Vec<String> = Vec::new();
    let mut missing: Vec<String> = Vec::new();
    for alternative in &requirement.alternatives {
        match eval_alternative(alternative, facts, gpu) {
            Truth::True => return Truth::True,
            Truth::False(r) => reasons.push(r),
            Truth::Unknown(m) => {
                if !missing.contains(&m) {
                    missing.push(m);
                }
            }
        }
    }
    if missing.is_empty() {
        let more = reasons.len().saturating_sub(REASONS_MAX);
        reasons.truncate(REASONS_MAX);
        if more > 0 {
            reasons.push(format!("… {more} more"));
        }
        Truth::False(reasons.join("; "))
    } else {
        Truth::Unknown(missing.join("; "))
    }
}

fn eval_alternative(alternative: &[Condition], facts: &Facts, gpu: Option<&GpuFacts>) -> Truth {
    let mut missing = None;
    for condition in alternative {
        match eval_condition(condition, facts, gpu) {
            Truth::True => {}
            Truth::False(reason) => return Truth::False(reason),
            Truth::Unknown(m) => {
                missing.get_or_insert(m);
            }
        }
    }
    missing.map_or(Truth::True, Truth::Unknown)
}

fn eval_condition(condition: &Condition, facts: &Facts, gpu: Option<&GpuFacts>) -> Truth {
    let (subject, actual, unknown) = match (condition.key, gpu) {
        (RequireKey::Cuda, _) => (
            "cuda".to_string(),
            facts.cuda_version.as_deref(),
            "the driver's CUDA version is unknown (the procfs inventory does not report it; \
             the NVML backend does)"
                .to_string(),
        ),
        (RequireKey::Driver, _) => (
            "driver".to_string(),
            Some(facts.driver_version.as_str()).filter(|v| !v.is_empty()),
            "the driver version is unknown".to_string(),
        ),
        // No GPU selected: nothing to compare a per-GPU fact with.
        (RequireKey::Arch | RequireKey::Brand, None) => return Truth::True,
        (RequireKey::Arch, Some(g)) => (
            format!("GPU {} arch", g.id),
            g.arch.as_deref(),
            format!(
                "the compute capability of GPU {} is unknown (only the NVML inventory \
                 backend reports it)",
                g.id
            ),
        ),
        (RequireKey::Brand, Some(g)) => (
            format!("GPU {} brand", g.id),
            g.brand.as_deref(),
            format!("the brand of GPU {} is unknown", g.id),
        ),
    };
    let Some(actual) = actual else {
        return Truth::Unknown(unknown);
    };
    match condition.holds_for(actual) {
        Some(true) => Truth::True,
        Some(false) => Truth::False(format!(
            "{subject} {actual} is not {} {}",
            condition.op, condition.value
        )),
        None => Truth::Unknown(format!(
            "{subject} {} is not a dotted number",
            Quoted::new(actual)
        )),
    }
}

/// Whether a `cuda>=`/`cuda>` condition fails: the usual "driver too old for the
/// image" case, where NVIDIA adds advice to the message.
fn fails_on_cuda_minimum(requirement: &Requirement, facts: &Facts) -> bool {
    requirement.alternatives.iter().flatten().any(|c| {
        c.key == RequireKey::Cuda
            && matches!(c.op, Op::Ge | Op::Gt)
            && facts.cuda_version.as_deref().and_then(|v| c.holds_for(v)) == Some(false)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::inventory::DriverInfo;

    fn uuid(i: u32) -> String {
        format!("GPU-4e1f0000-0000-4000-8000-{i:012x}")
    }

    fn inventory() -> Inventory {
        let gpus = (0..4)
            .map(|i| Gpu {
                index: i,
                minor: 3 - i,
                uuid: uuid(i),
                bus_id: format!("0000:{:02x}:00.0", 0x10 + i),
                name: "NVIDIA A100-SXM4-80GB".into(),
                memory_bytes: None,
                compute_capability: None,
                mig_enabled: Some(i == 0),
                mig_devices: if i == 0 {
                    vec![
                        MigDevice {
                            index: 0,
                            gpu_instance_id: 1,
                            compute_instance_id: 0,
                            uuid: "MIG-aaaaaaaa-0000-4000-8000-000000000000".into(),
                            memory_bytes: None,
                            profile: "1g.10gb".into(),
                        },
                        MigDevice {
                            index: 1,
                            gpu_instance_id: 2,
                            compute_instance_id: 0,
                            uuid: "MIG-aaaaaaaa-0000-4000-8000-000000000001".into(),
                            memory_bytes: None,
                            profile: "2g.20gb".into(),
                        },
                    ]
                } else {
                    vec![]
                },
            })
            .collect();
        Inventory {
            driver: DriverInfo {
                version: "550.54.15".into(),
                cuda_version: None,
            },
            gpus,
        }
    }

    fn pick(list: &str) -> Result<Selection, String> {
        let list: DeviceList = list.parse().map_err(|e| format!("parse: {e}"))?;
        resolve(&list, &inventory()).map_err(|e| e.to_string())
    }

    #[test]
    fn lists_resolve_to_devices() {
        let u3 = uuid(3);
        let cases: Vec<(&str, String, Vec<u32>, Vec<&str>)> = vec![
            (
                "indices keep request order",
                "2,0".into(),
                vec![2, 0],
                vec![],
            ),
            (
                "uuid folds with index",
                format!("3,{}", u3.to_uppercase()),
                vec![3],
                vec![],
            ),
            ("bus id", "0000:11:00.0".into(), vec![1], vec![]),
            ("none", "none".into(), vec![], vec![]),
            ("void", "void".into(), vec![], vec![]),
            (
                "all",
                "all".into(),
                vec![0, 1, 2, 3],
                vec!["1g.10gb", "2g.20gb"],
            ),
            ("mig by index", "0:1".into(), vec![], vec!["2g.20gb"]),
            (
                "mig by uuid",
                "MIG-aaaaaaaa-0000-4000-8000-000000000000".into(),
                vec![],
                vec!["1g.10gb"],
            ),
            (
                "mig legacy",
                format!("MIG-{}/2/0", uuid(0)),
                vec![],
                vec!["2g.20gb"],
            ),
            ("cdi index", "nvidia.com/gpu=1".into(), vec![1], vec![]),
            (
                "cdi mig",
                "nvidia.com/gpu=0:0".into(),
                vec![],
                vec!["1g.10gb"],
            ),
            (
                "cdi all",
                "runtime.nvidia.com/gpu=all".into(),
                vec![0, 1, 2, 3],
                vec!["1g.10gb", "2g.20gb"],
            ),
            ("duplicates", "1,1,nvidia.com/gpu=1".into(), vec![1], vec![]),
        ];
        let inv = inventory();
        for (name, list, want_gpus, want_migs) in cases {
            let sel = match pick(&list) {
                Ok(s) => s,
                Err(e) => panic!("case {name}: {e}"),
            };
            let gpus: Vec<u32> = sel.gpus.iter().map(|g| g.index).collect();
            assert_eq!(gpus, want_gpus, "case {name}");
            let profiles: Vec<&str> = sel
                .mig_devices
                .iter()
                .map(|m| {
                    inv.gpus[m.parent.index as usize].mig_devices[m.index as usize]
                        .profile
                        .as_str()
                })
                .collect();
            assert_eq!(profiles, want_migs, "case {name}");
        }
    }

    #[test]
    fn unknown_devices_are_named_with_what_exists() {
        let cases = [
            ("index", "9", "\"9\"", "0 GPU-4e1f0000"),
            (
                "uuid",
                "GPU-4e1f0000-0000-4000-8000-0000000000ff",
                "0000000000ff",
                "3 GPU-",
            ),
            ("mig index", "1:0", "\"1:0\"", "0:0 MIG-"),
            (
                "cdi foreign",
                "example.com/gpu=0",
                "\"example.com/gpu\"",
                "nvidia.com/gpu",
            ),
            (
                "cdi unknown",
                "nvidia.com/gpu=7",
                "\"nvidia.com/gpu=7\"",
                "0 GPU-",
            ),
            (
                "cdi junk",
                "nvidia.com/gpu=x",
                "\"nvidia.com/gpu=x\"",
                "expected an index",
            ),
        ];
        for (name, list, quoted, known) in cases {
            match pick(list) {
                Ok(sel) => panic!("case {name}: selected {sel:?}"),
                Err(e) => {
                    assert!(e.contains(quoted), "case {name}: {e}");
                    assert!(e.contains(known), "case {name}: {e}");
                }
            }
        }
    }

    #[test]
    fn procfs_inventories_explain_missing_mig_devices() {
        let mut inv = inventory();
        for g in &mut inv.gpus {
            g.mig_enabled = None;
            g.mig_devices.clear();
        }
        let list: DeviceList = "0:0".parse().unwrap_or(DeviceList::Void);
        let err = resolve(&list, &inv).map(|_| ()).map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(e) if e.contains("only the NVML backend")),
            "{err:?}"
        );
    }
}

#[cfg(test)]
mod check_tests {
    use super::*;

    fn facts(cuda: Option<&str>, driver: &str, gpus: &[(Option<&str>, Option<&str>)]) -> Facts {
        Facts {
            cuda_version: cuda.map(str::to_string),
            driver_version: driver.to_string(),
            gpus: gpus
                .iter()
                .enumerate()
                .map(|(i, (arch, brand))| GpuFacts {
                    id: i.to_string(),
                    arch: arch.map(str::to_string),
                    brand: brand.map(str::to_string),
                })
                .collect(),
        }
    }

    fn run(value: &str, facts: &Facts) -> Result<(), String> {
        let r = Requirement::parse("NVIDIA_REQUIRE_CUDA", value).map_err(|e| e.to_string())?;
        check(&[r], facts).map_err(|e| e.to_string())
    }

    /// (case, requirement, facts, Ok or substrings of the error).
    type CheckCase = (
        &'static str,
        &'static str,
        Facts,
        Result<(), Vec<&'static str>>,
    );

    const CUDA_IMAGE: &str =
        "cuda>=12.4 brand=tesla,driver>=470,driver<471 brand=nvidia,driver>=535,driver<536";

    #[test]
    fn requirements_hold_or_say_why_not() {
        let a100 = [(Some("8.0"), Some("Tesla"))];
        let rtx = [(Some("8.6"), Some("GeForce"))];
        let cases: Vec<CheckCase> = vec![
            ("empty", "", facts(None, "", &[]), Ok(())),
            (
                "cuda equal, fewer parts",
                "cuda>=12.0",
                facts(Some("12"), "550.54.15", &a100),
                Ok(()),
            ),
            (
                "cuda 12.0 < 12.0.1",
                "cuda>=12.0.1",
                facts(Some("12.0"), "550.54.15", &a100),
                Err(vec![
                    "unsatisfied NVIDIA_REQUIRE_CUDA \"cuda>=12.0.1\"",
                    "cuda 12.0 is not >= 12.0.1",
                    "update the driver",
                ]),
            ),
            (
                "cuda = with padding",
                "cuda=12",
                facts(Some("12.0.0"), "1", &[]),
                Ok(()),
            ),
            (
                "cuda != ",
                "cuda!=12.0",
                facts(Some("12"), "1", &[]),
                Err(vec!["cuda 12 is not != 12.0"]),
            ),
            (
                "OR: first alternative",
                CUDA_IMAGE,
                facts(Some("12.4"), "550.54.15", &rtx),
                Ok(()),
            ),
            (
                "OR: a later alternative",
                CUDA_IMAGE,
                facts(Some("12.2"), "535.104.05", &[(Some("9.0"), Some("NVIDIA"))]),
                Ok(()),
            ),
            (
                "OR: none holds",
                CUDA_IMAGE,
                facts(Some("12.2"), "535.104.05", &rtx),
                Err(vec![
                    "cuda 12.2 is not >= 12.4",
                    "GPU 0 brand GeForce is not = tesla",
                    "GPU 0 brand GeForce is not = nvidia",
                ]),
            ),
            (
                "AND: one fails",
                "driver>=470,driver<471",
                facts(None, "471.0", &[]),
                Err(vec!["driver 471.0 is not < 471"]),
            ),
            (
                "brand case-insensitive",
                "brand=TESLA",
                facts(None, "1", &a100),
                Ok(()),
            ),
            (
                "arch as a version",
                "arch>=8",
                facts(None, "1", &a100),
                Ok(()),
            ),
            (
                "arch too old",
                "arch>=8.6",
                facts(None, "1", &a100),
                Err(vec!["GPU 0 arch 8.0 is not >= 8.6"]),
            ),
            (
                "every GPU must pass",
                "brand=tesla",
                facts(None, "1", &[(None, Some("tesla")), (None, Some("geforce"))]),
                Err(vec!["GPU 1 brand geforce is not = tesla"]),
            ),
            (
                "no GPU: arch and brand hold",
                "arch>=9.0,brand=tesla,driver>=500",
                facts(None, "550", &[]),
                Ok(()),
            ),
            (
                "no GPU: driver still checked",
                "arch>=9.0,driver>=560",
                facts(None, "550", &[]),
                Err(vec!["driver 550 is not >= 560"]),
            ),
            (
                "cuda unknown",
                "cuda>=12.0",
                facts(None, "550", &a100),
                Err(vec![
                    "cannot check NVIDIA_REQUIRE_CUDA \"cuda>=12.0\"",
                    "CUDA version is unknown",
                    "procfs",
                ]),
            ),
            (
                "cuda unknown but another alternative holds",
                "cuda>=12.0 driver>=500",
                facts(None, "550", &a100),
                Ok(()),
            ),
            (
                "false beats unknown in AND",
                "cuda>=12.0,driver>=600",
                facts(None, "550", &[]),
                Err(vec!["unsatisfied", "driver 550 is not >= 600"]),
            ),
            (
                "arch unknown",
                "arch>=8.0",
                facts(Some("12.4"), "550", &[(None, Some("tesla"))]),
                Err(vec![
                    "cannot check",
                    "compute capability of GPU 0 is unknown",
                ]),
            ),
            (
                "brand unknown",
                "brand=tesla",
                facts(Some("12.4"), "550", &[(Some("8.0"), None)]),
                Err(vec!["cannot check", "brand of GPU 0 is unknown"]),
            ),
            (
                "fact not a version",
                "driver>=500",
                facts(None, "550-beta", &[]),
                Err(vec![
                    "cannot check",
                    "driver \"550-beta\" is not a dotted number",
                ]),
            ),
            (
                "unsatisfied beats unknown across GPUs",
                "arch>=8.0",
                facts(None, "1", &[(None, None), (Some("7.5"), None)]),
                Err(vec!["unsatisfied", "GPU 1 arch 7.5 is not >= 8.0"]),
            ),
        ];
        for (name, value, facts, want) in cases {
            match (run(value, &facts), want) {
                (Ok(()), Ok(())) => {}
                (Err(e), Err(needles)) => {
                    for needle in needles {
                        assert!(e.contains(needle), "case {name}: {e:?} lacks {needle:?}");
                    }
                }
                (got, want) => panic!("case {name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn long_requirements_give_bounded_messages() {
        let value = (0..40)
            .map(|i| format!("brand=b{i},driver>=1"))
            .collect::<Vec<_>>()
            .join(" ");
        let err = run(&value, &facts(None, "550", &[(None, Some("tesla"))]));
        assert!(
            matches!(&err, Err(e) if e.contains("… 32 more") && e.len() < 600),
            "{err:?}"
        );
    }

    #[test]
    fn every_requirement_must_hold() {
        let reqs: Vec<Requirement> = [
            ("NVIDIA_REQUIRE_A", "driver>=500"),
            ("NVIDIA_REQUIRE_B", "driver>=600"),
        ]
        .into_iter()
        .filter_map(|(n, v)| Requirement::parse(n, v).ok())
        .collect();
        let err = check(&reqs, &facts(None, "550", &[])).map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(e) if e.starts_with("unsatisfied NVIDIA_REQUIRE_B")),
            "{err:?}"
        );
        assert_eq!(check(&reqs[..1], &facts(None, "550", &[])), Ok(()));
    }
}

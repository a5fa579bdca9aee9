//! Holds a container's `NVIDIA_REQUIRE_*` requirements against the driver and the GPUs
//! that [`resolve`](super::resolve) selected, as libnvidia-container does.
//!
//! Pure: values in, values out. Whether to check at all (`disable-require`) is decided
//! before this; a requirement that fails, or that needs a fact the inventory does not
//! know, is a [`SelectError`].

use super::SelectError;
use crate::request::{Condition, Op, Quoted, RequireKey, Requirement, shown_name};

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

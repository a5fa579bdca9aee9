//! The `NVIDIA_REQUIRE_*` grammar, as libnvidia-container's `dsl.c` reads it.
//!
//! A value is alternatives separated by whitespace (any one may hold: OR); an
//! alternative is conditions separated by commas (all must hold: AND); a condition is
//! `key op value` with no spaces: keys `cuda`, `driver`, `arch`, `brand` (any case),
//! operators `=`, `!=`, `<`, `<=`, `>`, `>=`. Like `dsl.c`, runs of separators are
//! skipped, so `"cuda>=12  brand=tesla,"` is two alternatives. Versions compare as
//! dotted numbers with missing parts read as 0 (`12` = `12.0` < `12.0.1`); `brand`
//! compares case-insensitively and only with `=` or `!=`. Unlike `dsl.c`, which fails
//! only when it reaches a bad condition, every condition is checked up front.

use std::cmp::Ordering;
use std::fmt;

use serde::ser::SerializeStruct;
use serde::{Serialize, Serializer};

use super::{Quoted, RequestError, shown_name};

/// The characters operators are made of.
const OPERATOR_CHARS: &[char] = &['<', '>', '=', '!'];

/// What a condition constrains.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RequireKey {
    /// The CUDA driver API version (`12.4`).
    Cuda,
    /// The kernel driver version (`550.54.15`).
    Driver,
    /// A GPU's compute capability (`8.0`).
    Arch,
    /// A GPU's brand (`tesla`, `geforce`, …), compared case-insensitively.
    Brand,
}

impl RequireKey {
    pub const ALL: [RequireKey; 4] = [Self::Cuda, Self::Driver, Self::Arch, Self::Brand];

    pub fn name(self) -> &'static str {
        match self {
            Self::Cuda => "cuda",
            Self::Driver => "driver",
            Self::Arch => "arch",
            Self::Brand => "brand",
        }
    }

    /// Whether values compare as dotted version numbers (all but `brand`).
    pub fn is_version(self) -> bool {
        self != Self::Brand
    }

    /// Whether the fact lives on a GPU (`arch`, `brand`) rather than the driver.
    pub fn is_per_gpu(self) -> bool {
        matches!(self, Self::Arch | Self::Brand)
    }
}

impl fmt::Display for RequireKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A comparison operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

impl Op {
    pub const ALL: [Op; 6] = [Self::Eq, Self::Ne, Self::Lt, Self::Le, Self::Gt, Self::Ge];

    pub fn symbol(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "!=",
            Self::Lt => "<",
            Self::Le => "<=",
            Self::Gt => ">",
            Self::Ge => ">=",
        }
    }

    /// Whether `actual.cmp(wanted)` satisfies this operator.
    pub fn accepts(self, ordering: Ordering) -> bool {
        match self {
            Self::Eq => ordering.is_eq(),
            Self::Ne => ordering.is_ne(),
            Self::Lt => ordering.is_lt(),
            Self::Le => ordering.is_le(),
            Self::Gt => ordering.is_gt(),
            Self::Ge => ordering.is_ge(),
        }
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.symbol())
    }
}

/// Why one condition does not parse.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum ConditionError {
    #[error(
        "no operator (expected key op value with op one of =, !=, <, <=, >, >=, \
         and no spaces inside a condition)"
    )]
    MissingOperator,
    #[error("no key before the operator (valid keys: cuda, driver, arch, brand)")]
    MissingKey,
    #[error("unknown key {0} (valid: cuda, driver, arch, brand)")]
    UnknownKey(Quoted),
    #[error("unknown operator {0} (valid: =, !=, <, <=, >, >=)")]
    UnknownOperator(Quoted),
    #[error("no value after the operator")]
    MissingValue,
    #[error("operator characters (<, >, =, !) inside the value {0}")]
    OperatorInValue(Quoted),
    #[error("{key} compares versions, and {value} is not a dotted number such as 12.4")]
    NotAVersion { key: RequireKey, value: Quoted },
    #[error("brand compares only with = or != (not {0})")]
    BrandOrder(Op),
}

/// One `key op value` term.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Condition {
    pub key: RequireKey,
    pub op: Op,
    /// As written (a version for every key but `brand`).
    pub value: String,
}

impl Condition {
    /// Parses one comma-free, space-free term.
    pub fn parse(term: &str) -> Result<Self, ConditionError> {
        let start = term
            .find(OPERATOR_CHARS)
            .ok_or(ConditionError::MissingOperator)?;
        let (key, rest) = term.split_at(start);
        if key.is_empty() {
            return Err(ConditionError::MissingKey);
        }
        let key = RequireKey::ALL
            .into_iter()
            .find(|k| k.name().eq_ignore_ascii_case(key))
            .ok_or_else(|| ConditionError::UnknownKey(Quoted::new(key)))?;
        // The operator is the whole run of operator characters (`==` is not `=`).
        let end = rest
            .find(|c: char| !OPERATOR_CHARS.contains(&c))
            .unwrap_or(rest.len());
        let (op, value) = rest.split_at(end);
        let op = Op::ALL
            .into_iter()
            .find(|o| o.symbol() == op)
            .ok_or_else(|| ConditionError::UnknownOperator(Quoted::new(op)))?;
        if value.is_empty() {
            return Err(ConditionError::MissingValue);
        }
        if value.contains(OPERATOR_CHARS) {
            return Err(ConditionError::OperatorInValue(Quoted::new(value)));
        }
        if key.is_version() && !is_version(value) {
            return Err(ConditionError::NotAVersion {
                key,
                value: Quoted::new(value),
            });
        }
        if key == RequireKey::Brand && !matches!(op, Op::Eq | Op::Ne) {
            return Err(ConditionError::BrandOrder(op));
        }
        Ok(Self {
            key,
            op,
            value: value.to_string(),
        })
    }

    /// Whether the fact `actual` satisfies this condition; `None` when `actual` cannot
    /// be compared (a version fact that is not a dotted number).
    pub fn holds_for(&self, actual: &str) -> Option<bool> {
        if self.key.is_version() {
            return compare_versions(actual, &self.value).map(|o| self.op.accepts(o));
        }
        let same = actual.eq_ignore_ascii_case(&self.value);
        Some(if self.op == Op::Ne { !same } else { same })
    }
}

impl fmt::Display for Condition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}{}", self.key, self.op, self.value)
    }
}

/// One `NVIDIA_REQUIRE_*` variable: it holds when any alternative holds, and an
/// alternative holds when all its conditions do. No alternatives: always holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Requirement {
    /// The env var it came from (`CUDA_VERSION` for a legacy image's implied one).
    pub variable: String,
    pub alternatives: Vec<Vec<Condition>>,
}

impl Requirement {
    /// Parses `value`, the contents of env var `variable`.
    pub fn parse(variable: &str, value: &str) -> Result<Self, RequestError> {
        let mut alternatives = Vec::new();
        for alternative in value.split_ascii_whitespace() {
            let mut conditions = Vec::new();
            for term in alternative.split(',').filter(|t| !t.is_empty()) {
                let condition =
                    Condition::parse(term).map_err(|problem| RequestError::InvalidRequirement {
                        variable: shown_name(variable),
                        value: Quoted::new(value),
                        condition: Quoted::new(term),
                        problem: Box::new(problem),
                    })?;
                conditions.push(condition);
            }
            if !conditions.is_empty() {
                alternatives.push(conditions);
            }
        }
        Ok(Self {
            variable: variable.to_string(),
            alternatives,
        })
    }
}

/// Prints the expression (not the variable), in a form [`Requirement::parse`] reads back.
impl fmt::Display for Requirement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, alternative) in self.alternatives.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            for (j, condition) in alternative.iter().enumerate() {
                if j > 0 {
                    f.write_str(",")?;
                }
                write!(f, "{condition}")?;
            }
        }
        Ok(())
    }
}

/// `{"variable": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=12.0 brand=tesla,driver>=535"}`.
impl Serialize for Requirement {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut st = s.serialize_struct("Requirement", 2)?;
        st.serialize_field("variable", &self.variable)?;
        st.serialize_field("value", &self.to_string())?;
        st.end()
    }
}

/// Digits separated by single dots: `12`, `12.4`, `550.54.15`.
fn is_version(s: &str) -> bool {
    !s.is_empty()
        && s.split('.')
            .all(|part| !part.is_empty() && part.bytes().all(|b| b.is_ascii_digit()))
}

/// Compares two dotted numbers part by part, a missing part reading as 0 (so
/// `12` = `12.0` and `12.0` < `12.0.1`); parts of any length (no overflow). `None`
/// when either is not a dotted number.
pub fn compare_versions(a: &str, b: &str) -> Option<Ordering> {
    if !is_version(a) || !is_version(b) {
        return None;
    }
    let mut left = a.split('.');
    let mut right = b.split('.');
    loop {
        match (left.next(), right.next()) {
            (None, None) => return Some(Ordering::Equal),
            (l, r) => {
                let ordering = compare_numbers(l.unwrap_or("0"), r.unwrap_or("0"));
                if ordering.is_ne() {
                    return Some(ordering);
                }
            }
        }
    }
}

/// Compares two digit strings as numbers.
fn compare_numbers(a: &str, b: &str) -> Ordering {
    let a = a.trim_start_matches('0');
    let b = b.trim_start_matches('0');
    a.len().cmp(&b.len()).then_with(|| a.cmp(b))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn cond(key: RequireKey, op: Op, value: &str) -> Condition {
        Condition {
            key,
            op,
            value: value.into(),
        }
    }

    #[test]
    fn requirements_parse() {
        use Op::*;
        use RequireKey::*;
        let cases: Vec<(&str, &str, Vec<Vec<Condition>>)> = vec![
            ("empty", "", vec![]),
            ("blank", "  \t ", vec![]),
            ("one", "cuda>=12.0", vec![vec![cond(Cuda, Ge, "12.0")]]),
            (
                "cuda image",
                "cuda>=12.4 brand=tesla,driver>=470,driver<471",
                vec![
                    vec![cond(Cuda, Ge, "12.4")],
                    vec![
                        cond(Brand, Eq, "tesla"),
                        cond(Driver, Ge, "470"),
                        cond(Driver, Lt, "471"),
                    ],
                ],
            ),
            (
                "every operator",
                "arch=8.0,arch!=7,arch<9,arch<=9.0,arch>1,arch>=1.0",
                vec![vec![
                    cond(Arch, Eq, "8.0"),
                    cond(Arch, Ne, "7"),
                    cond(Arch, Lt, "9"),
                    cond(Arch, Le, "9.0"),
                    cond(Arch, Gt, "1"),
                    cond(Arch, Ge, "1.0"),
                ]],
            ),
            (
                "keys in any case",
                "CUDA>=11 Brand!=GeForce",
                vec![vec![cond(Cuda, Ge, "11")], vec![cond(Brand, Ne, "GeForce")]],
            ),
            (
                "runs of separators are skipped",
                "  cuda>=11,,driver>=450,   brand=tesla ,",
                vec![
                    vec![cond(Cuda, Ge, "11"), cond(Driver, Ge, "450")],
                    vec![cond(Brand, Eq, "tesla")],
                ],
            ),
        ];
        for (name, value, want) in cases {
            match Requirement::parse("NVIDIA_REQUIRE_X", value) {
                Ok(r) => assert_eq!(r.alternatives, want, "case {name}"),
                Err(e) => panic!("case {name}: {e}"),
            }
        }
    }

    #[test]
    fn bad_requirements_name_variable_condition_and_fix() {
        let cases = [
            (
                "unknown key",
                "cuda>=12 gpu=1",
                "\"gpu=1\"",
                "valid: cuda, driver",
            ),
            (
                "spaces inside",
                "cuda >= 12",
                "\"cuda\"",
                "no spaces inside",
            ),
            ("no key", ">=12", "\">=12\"", "no key"),
            ("double equals", "cuda==12", "\"==\"", "valid: =, !="),
            ("arrow", "cuda=>12", "\"=>\"", "valid: =, !="),
            ("no value", "driver>=", "\"driver>=\"", "no value"),
            (
                "word version",
                "cuda>=twelve",
                "\"twelve\"",
                "dotted number",
            ),
            ("trailing dot", "cuda>=12.", "\"12.\"", "dotted number"),
            ("negative", "arch>=-1", "\"-1\"", "dotted number"),
            (
                "brand order",
                "brand>tesla",
                "\"brand>tesla\"",
                "only with = or !=",
            ),
            (
                "op in value",
                "cuda>=12<13",
                "\"12<13\"",
                "inside the value",
            ),
        ];
        for (name, value, needle, hint) in cases {
            let err = match Requirement::parse("NVIDIA_REQUIRE_CUDA", value) {
                Ok(r) => panic!("case {name}: parsed as {r:?}"),
                Err(e) => e.to_string(),
            };
            assert!(err.contains("NVIDIA_REQUIRE_CUDA"), "case {name}: {err}");
            assert!(err.contains(&format!("{value:?}")), "case {name}: {err}");
            assert!(err.contains(needle), "case {name}: {err}");
            assert!(err.contains(hint), "case {name}: {err}");
        }
    }

    #[test]
    fn strange_variable_names_are_quoted() {
        let err = Requirement::parse("NVIDIA_REQUIRE_\u{1b}[31m", "x").map_err(|e| e.to_string());
        assert!(
            matches!(&err, Err(e) if e.contains("\"NVIDIA_REQUIRE_\\u{1b}[31m\"")),
            "{err:?}"
        );
    }

    #[test]
    fn versions_compare_as_dotted_numbers() {
        use Ordering::*;
        let cases = [
            ("12", "12.0", Some(Equal)),
            ("12.0", "12.0.0", Some(Equal)),
            ("12.0", "12.0.1", Some(Less)),
            ("12", "12.0.1", Some(Less)),
            ("12.10", "12.9", Some(Greater)),
            ("550.54.15", "535", Some(Greater)),
            ("007", "7", Some(Equal)),
            ("99999999999999999999999", "1", Some(Greater)),
            ("12.x", "12", None),
            ("", "1", None),
        ];
        for (a, b, want) in cases {
            assert_eq!(compare_versions(a, b), want, "case {a} vs {b}");
        }
    }

    #[test]
    fn conditions_hold() {
        use Op::*;
        use RequireKey::*;
        let cases = [
            (cond(Cuda, Ge, "12.0"), "12", Some(true)),
            (cond(Cuda, Gt, "12.0"), "12", Some(false)),
            (cond(Cuda, Lt, "12.0.1"), "12.0", Some(true)),
            (cond(Driver, Eq, "535"), "535.0.0", Some(true)),
            (cond(Driver, Ne, "535"), "535.1", Some(true)),
            (cond(Brand, Eq, "Tesla"), "TESLA", Some(true)),
            (cond(Brand, Ne, "tesla"), "Tesla", Some(false)),
            (cond(Arch, Ge, "8.0"), "7.5", Some(false)),
            (cond(Arch, Ge, "8.0"), "sm_80", None),
        ];
        for (c, actual, want) in cases {
            assert_eq!(c.holds_for(actual), want, "case {c} with {actual}");
        }
    }

    #[test]
    fn requirements_print_back_and_serialize() {
        let value = "cuda>=12.4 brand=tesla,driver>=470,driver<471";
        let r = Requirement::parse("NVIDIA_REQUIRE_CUDA", value).map_err(|e| e.to_string());
        let r = match r {
            Ok(r) => r,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(r.to_string(), value);
        assert_eq!(
            serde_json::to_value(&r).ok(),
            Some(serde_json::json!({"variable": "NVIDIA_REQUIRE_CUDA", "value": value}))
        );
    }

    proptest! {
        #[test]
        fn requirement_parsing_never_panics(s in ".{0,300}") {
            let _ = Requirement::parse("NVIDIA_REQUIRE_X", &s);
        }

        #[test]
        fn parsed_requirements_print_back_to_themselves(
            s in "((cuda|Driver|ARCH|brand|x)(=|!=|<|<=|>|>=|==)([0-9]{1,3}(\\.[0-9]{1,3}){0,2}|tesla|GeForce)[, ]{0,2}){0,5}"
        ) {
            if let Ok(r) = Requirement::parse("NVIDIA_REQUIRE_X", &s) {
                let again = Requirement::parse("NVIDIA_REQUIRE_X", &r.to_string())
                    .map_err(|e| TestCaseError::fail(format!("{r} did not re-parse: {e}")))?;
                prop_assert_eq!(again, r);
            }
        }

        #[test]
        fn version_order_is_consistent(
            a in "[0-9]{1,3}(\\.[0-9]{1,3}){0,3}",
            b in "[0-9]{1,3}(\\.[0-9]{1,3}){0,3}",
        ) {
            let ab = compare_versions(&a, &b);
            let ba = compare_versions(&b, &a);
            prop_assert_eq!(ab.map(Ordering::reverse), ba);
        }
    }
}

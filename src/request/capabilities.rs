//! Driver capabilities: `NVIDIA_DRIVER_CAPABILITIES` and `supported-driver-capabilities`.

use std::fmt;
use std::str::FromStr;

use serde::{Serialize, Serializer};

use super::{Quoted, RequestError};

/// One of NVIDIA's driver capabilities.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Capability {
    Compat32,
    Compute,
    Display,
    Graphics,
    Ngx,
    Utility,
    Video,
}

impl Capability {
    /// Every capability, in the canonical (alphabetical) order.
    pub const ALL: [Capability; 7] = [
        Self::Compat32,
        Self::Compute,
        Self::Display,
        Self::Graphics,
        Self::Ngx,
        Self::Utility,
        Self::Video,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Compat32 => "compat32",
            Self::Compute => "compute",
            Self::Display => "display",
            Self::Graphics => "graphics",
            Self::Ngx => "ngx",
            Self::Utility => "utility",
            Self::Video => "video",
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

/// A set of driver capabilities (`NVIDIA_DRIVER_CAPABILITIES`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DriverCapabilities(u8);

impl DriverCapabilities {
    pub const EMPTY: Self = Self(0);

    /// NVIDIA's default when the variable is unset or empty: `compute,utility`.
    pub fn default_set() -> Self {
        Self::EMPTY
            .with(Capability::Compute)
            .with(Capability::Utility)
    }

    pub fn all() -> Self {
        Capability::ALL.into_iter().fold(Self::EMPTY, Self::with)
    }

    pub fn with(self, cap: Capability) -> Self {
        Self(self.0 | cap.bit())
    }

    pub fn contains(self, cap: Capability) -> bool {
        self.0 & cap.bit() != 0
    }

    /// The capabilities in both sets.
    pub fn intersection(self, other: Self) -> Self {
        Self(self.0 & other.0)
    }

    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Capability> {
        Capability::ALL
            .into_iter()
            .filter(move |c| self.contains(*c))
    }
}

impl Default for DriverCapabilities {
    fn default() -> Self {
        Self::default_set()
    }
}

impl FromStr for DriverCapabilities {
    type Err = RequestError;

    /// Empty means the default; `all` anywhere means every capability.
    fn from_str(list: &str) -> Result<Self, Self::Err> {
        if list.trim().is_empty() {
            return Ok(Self::default_set());
        }
        let mut set = Self::EMPTY;
        for word in list.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            if word == "all" {
                set = Self::all();
                continue;
            }
            let cap = Capability::ALL
                .into_iter()
                .find(|c| c.name() == word)
                .ok_or_else(|| RequestError::UnknownCapability {
                    capability: Quoted::new(word),
                    list: Quoted::new(list),
                })?;
            set = set.with(cap);
        }
        Ok(set)
    }
}

impl fmt::Display for DriverCapabilities {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(Capability::name).collect();
        f.write_str(&names.join(","))
    }
}

impl Serialize for DriverCapabilities {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn capabilities_parse() {
        let cases: Vec<(&str, Result<&str, &str>)> = vec![
            ("", Ok("compute,utility")),
            ("utility", Ok("utility")),
            ("video, compute", Ok("compute,video")),
            (
                "all",
                Ok("compat32,compute,display,graphics,ngx,utility,video"),
            ),
            (
                "compute,all",
                Ok("compat32,compute,display,graphics,ngx,utility,video"),
            ),
            ("bogus,compute", Err("\"bogus\"")),
            ("Compute", Err("\"Compute\"")),
        ];
        for (input, want) in cases {
            match (input.parse::<DriverCapabilities>(), want) {
                (Ok(caps), Ok(w)) => assert_eq!(caps.to_string(), w, "case {input:?}"),
                (Err(e), Err(needle)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(needle), "case {input:?}: {msg}");
                    assert!(msg.contains("valid: compat32"), "case {input:?}: {msg}");
                }
                (got, _) => panic!("case {input:?}: unexpected {got:?}"),
            }
        }
    }

    proptest! {
        #[test]
        fn capability_parsing_never_panics(s in ".{0,200}") {
            let _ = s.parse::<DriverCapabilities>();
        }
    }
}

//! `NVIDIA_MIG_CONFIG_DEVICES` and `NVIDIA_MIG_MONITOR_DEVICES`: a privileged container
//! asks to configure MIG (create and destroy GPU and compute instances) or to monitor
//! every MIG device of its GPUs.
//!
//! NVIDIA's rules (its hook's `getNvidiaConfig`, libnvidia-container's
//! `select_mig_{config,monitor}_devices`): the variables are read only in a GPU
//! container (one that asked for devices); a non-empty value in an unprivileged one is
//! refused; the only value is `all` (case-insensitive, empty list entries skipped),
//! meaning every GPU the container sees. NVIDIA ignores whatever follows `all`
//! (`all,junk` passes there); here every entry must be `all`.
//!
//! Pure: which GPUs and which capability nodes follow is `select`'s and `discover`'s.

use serde::Serialize;

use super::{Quoted, RequestError};

/// `NVIDIA_MIG_CONFIG_DEVICES`: the GPUs whose MIG configuration the container may change.
pub const ENV_MIG_CONFIG_DEVICES: &str = "NVIDIA_MIG_CONFIG_DEVICES";
/// `NVIDIA_MIG_MONITOR_DEVICES`: the GPUs whose MIG devices the container may monitor.
pub const ENV_MIG_MONITOR_DEVICES: &str = "NVIDIA_MIG_MONITOR_DEVICES";

/// Which MIG-wide capabilities a container asks for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct MigAccess {
    /// `NVIDIA_MIG_CONFIG_DEVICES=all`.
    pub config: bool,
    /// `NVIDIA_MIG_MONITOR_DEVICES=all`.
    pub monitor: bool,
}

impl MigAccess {
    /// `NVIDIA_MIG_CONFIG_DEVICES` alone.
    pub const CONFIG: Self = Self {
        config: true,
        monitor: false,
    };
    /// `NVIDIA_MIG_MONITOR_DEVICES` alone.
    pub const MONITOR: Self = Self {
        config: false,
        monitor: true,
    };

    /// Neither capability asked for.
    pub fn is_none(&self) -> bool {
        !self.config && !self.monitor
    }
}

/// What the two variables ask for (`None`: unset), in a container that is or is not
/// privileged (`CAP_SYS_ADMIN` in its bounding set).
pub fn build(
    config: Option<&str>,
    monitor: Option<&str>,
    privileged: bool,
) -> Result<MigAccess, RequestError> {
    Ok(MigAccess {
        config: one(ENV_MIG_CONFIG_DEVICES, config, privileged)?,
        monitor: one(ENV_MIG_MONITOR_DEVICES, monitor, privileged)?,
    })
}

/// A `nvidia-container-cli --mig-config` / `--mig-monitor` value (`flag` names it in
/// errors): whether it asks for the capability. The tool runs as root, so privilege is
/// not the question there.
pub fn parse_flag(flag: &'static str, value: &str) -> Result<bool, RequestError> {
    one(flag, Some(value), true)
}

fn one(
    variable: &'static str,
    value: Option<&str>,
    privileged: bool,
) -> Result<bool, RequestError> {
    let Some(value) = value else {
        return Ok(false);
    };
    let mut entries = value.split(',').map(str::trim).filter(|e| !e.is_empty());
    let Some(first) = entries.next() else {
        return Ok(false);
    };
    if !privileged {
        return Err(RequestError::MigAccessUnprivileged { variable });
    }
    if let Some(bad) = std::iter::once(first)
        .chain(entries)
        .find(|e| !e.eq_ignore_ascii_case("all"))
    {
        return Err(RequestError::InvalidMigAccess {
            variable,
            element: Quoted::new(bad),
            value: Quoted::new(value),
        });
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_privilege_and_errors() {
        // (case, config, monitor, privileged, Ok((config, monitor)) or Err(message part))
        type Case = (
            &'static str,
            Option<&'static str>,
            Option<&'static str>,
            bool,
            Result<(bool, bool), &'static str>,
        );
        let cases: [Case; 11] = [
            ("unset", None, None, false, Ok((false, false))),
            ("config all", Some("all"), None, true, Ok((true, false))),
            ("monitor ALL", None, Some("ALL"), true, Ok((false, true))),
            ("both", Some("all"), Some("all"), true, Ok((true, true))),
            (
                "empty entries",
                Some(",all,"),
                None,
                true,
                Ok((true, false)),
            ),
            (
                "empty unprivileged",
                Some(""),
                Some(" , "),
                false,
                Ok((false, false)),
            ),
            (
                "unprivileged config",
                Some("all"),
                None,
                false,
                Err("cannot set NVIDIA_MIG_CONFIG_DEVICES in a non-privileged container"),
            ),
            (
                "unprivileged monitor",
                None,
                Some("all"),
                false,
                Err("cannot set NVIDIA_MIG_MONITOR_DEVICES in a non-privileged container"),
            ),
            (
                "an index",
                Some("0"),
                None,
                true,
                Err("invalid NVIDIA_MIG_CONFIG_DEVICES \"0\": \"0\" is not supported"),
            ),
            (
                "junk after all",
                None,
                Some("all,GPU-1"),
                true,
                Err("\"GPU-1\" is not supported (the only value is all"),
            ),
            (
                "unprivileged junk is refused for privilege first",
                Some("junk"),
                None,
                false,
                Err("non-privileged"),
            ),
        ];
        for (name, config, monitor, privileged, want) in cases {
            let got = build(config, monitor, privileged);
            match (got, want) {
                (Ok(access), Ok((c, m))) => {
                    assert_eq!((access.config, access.monitor), (c, m), "case {name}");
                }
                (Err(e), Err(part)) => {
                    let text = e.to_string();
                    assert!(text.contains(part), "case {name}: {text}");
                }
                (got, want) => panic!("case {name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn read_only_in_gpu_containers() {
        use crate::request::{ContainerInputs, RequestPolicy};
        let request = |env: &[&str], privileged: bool| {
            let inputs = ContainerInputs {
                env: env.iter().map(|e| e.to_string()).collect(),
                privileged,
                ..ContainerInputs::default()
            };
            crate::request::build(&inputs, &RequestPolicy::default())
        };
        let void = request(&["NVIDIA_MIG_CONFIG_DEVICES=all"], false).unwrap();
        assert!(void.mig_access.is_none(), "no devices: not read");
        let err = request(
            &[
                "NVIDIA_VISIBLE_DEVICES=all",
                "NVIDIA_MIG_MONITOR_DEVICES=all",
            ],
            false,
        )
        .unwrap_err();
        assert!(err.to_string().contains("non-privileged"), "{err}");
        let ok = request(
            &[
                "NVIDIA_VISIBLE_DEVICES=none",
                "NVIDIA_MIG_CONFIG_DEVICES=all",
            ],
            true,
        )
        .unwrap();
        assert_eq!(
            ok.mig_access,
            MigAccess {
                config: true,
                monitor: false
            }
        );
        let json = serde_json::to_value(&ok).unwrap();
        assert_eq!(json["mig_access"]["config"], true, "{json}");
        let plain = request(&["NVIDIA_VISIBLE_DEVICES=0"], false).unwrap();
        let json = serde_json::to_value(&plain).unwrap();
        assert!(
            json.get("mig_access").is_none(),
            "left out when unset: {json}"
        );
    }
}

//! Are the node's CDI specs for `nvidia.com/gpu` still current? A spec is a snapshot
//! of the driver taken by `nvshim cdi generate`: a driver upgrade renames every
//! `lib*.so.<version>` it mounts, and a GPU added, removed or renumbered leaves it
//! naming devices that no longer match. podman and containerd apply a stale spec
//! without complaint until the container fails to start, so doctor compares each spec
//! with the host.
//!
//! CDI is optional: no spec is a passing line, not a failure. The paths a spec holds
//! are host paths already (the generator joined the driver and dev roots), so they
//! are checked as they are. Reads files only.

use std::collections::HashSet;
use std::fmt;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::{Check, Status};
use crate::cdi::{NVIDIA_GPU_KIND, Registry, Spec};
use crate::cli::HostArgs;
use crate::inventory::Gpu;

/// The name of every line this check reports.
const NAME: &str = "CDI spec";

/// How many problems a stale spec's line lists before it counts the rest.
const LISTED: usize = 3;

/// One line per unreadable spec file and per `nvidia.com/gpu` spec, or one passing
/// line when there is no such spec.
pub fn specs(host: &HostArgs, dirs: &[PathBuf], gpus: &[Gpu]) -> Vec<Check> {
    let registry = Registry::load(dirs);
    let mut out = Vec::new();
    for (path, error) in registry.errors() {
        let fix = if path.is_dir() {
            format!(
                "make {} listable by root (CDI consumers read every spec in it)",
                path.display()
            )
        } else {
            regenerate(host, path)
        };
        out.push(Check::bad(
            Status::Fail,
            &line_name(path),
            error.clone(),
            fix,
        ));
    }
    let ids: Vec<(u32, &str)> = gpus.iter().map(|g| (g.index, g.uuid.as_str())).collect();
    let mut found = false;
    for (path, spec) in registry.specs().filter(|(_, s)| s.kind == NVIDIA_GPU_KIND) {
        found = true;
        let problems = problems(spec, &ids, &probe);
        if problems.is_empty() {
            out.push(Check::ok(
                &line_name(path),
                format!("{} devices, current", spec.devices.len()),
            ));
        } else {
            out.push(Check::bad(
                Status::Fail,
                &line_name(path),
                summary(&problems),
                regenerate(host, path),
            ));
        }
    }
    if !found {
        out.push(Check::ok(
            NAME,
            format!(
                "no CDI spec for {NVIDIA_GPU_KIND} (podman/containerd CDI users: \
                 nvshim cdi generate --output /var/run/cdi/nvidia.yaml)"
            ),
        ));
    }
    out
}

fn line_name(path: &Path) -> String {
    format!("{NAME} {}", path.display())
}

/// The first [`LISTED`] problems, then how many more.
fn summary(problems: &[Problem]) -> String {
    let mut text = problems
        .iter()
        .take(LISTED)
        .map(Problem::to_string)
        .collect::<Vec<_>>()
        .join("; ");
    if problems.len() > LISTED {
        text.push_str(&format!("; and {} more", problems.len() - LISTED));
    }
    text
}

/// `nvshim cdi generate --output <file>` with the host flags doctor was given, so the
/// spec is regenerated from the same driver it was checked against.
fn regenerate(host: &HostArgs, file: &Path) -> String {
    let mut cmd = format!("nvshim cdi generate --output {}", shell_word(file));
    let roots = host.roots();
    for (flag, root) in [
        ("--driver-root", &roots.driver),
        ("--dev-root", &roots.dev),
        ("--proc-root", &roots.proc),
    ] {
        if root.as_path() != Path::new("/") {
            cmd.push_str(&format!(" {flag} {}", shell_word(root)));
        }
    }
    if let Some(lib) = &host.nvml_lib {
        cmd.push_str(&format!(" --nvml-lib {}", shell_word(lib)));
    }
    cmd
}

/// `path` as one shell word: as is when plain, else single-quoted.
fn shell_word(path: &Path) -> String {
    let text = path.display().to_string();
    let plain = !text.is_empty()
        && text
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "/._-+:,=@%".contains(c));
    if plain {
        text
    } else {
        format!("'{}'", text.replace('\'', r"'\''"))
    }
}

/// What a path of a spec is on the host.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Found {
    Missing,
    /// Exists, but is not an executable file.
    Present,
    Executable,
}

/// Follows symlinks, as the bind mount and runc's exec of a hook do: a dangling link
/// is as gone as its target.
fn probe(path: &Path) -> Found {
    match fs::metadata(path) {
        Err(_) => Found::Missing,
        Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => Found::Executable,
        Ok(_) => Found::Present,
    }
}

/// Why a spec is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Problem {
    /// A mount's host path is gone.
    Mount { path: String },
    /// A device node's host path is gone.
    DeviceNode { path: String },
    /// A hook's binary is gone or cannot be run.
    Hook { path: String, found: Found },
    /// A GPU of the node that no device of the spec names.
    Uncovered { index: u32, uuid: String },
    /// A device named for a GPU the node does not have.
    Unknown { name: String },
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // A versioned library is the usual casualty of a driver upgrade; a socket
            // or firmware directory can go for other reasons.
            Problem::Mount { path } if path.contains(".so") => {
                write!(f, "{path} is gone (driver upgraded?)")
            }
            Problem::Mount { path } | Problem::DeviceNode { path } => write!(f, "{path} is gone"),
            Problem::Hook {
                path,
                found: Found::Missing,
            } => write!(f, "hook {path} is gone"),
            Problem::Hook { path, .. } => write!(f, "hook {path} is not executable"),
            Problem::Uncovered { index, uuid } => write!(f, "GPU {index} ({uuid}) has no device"),
            Problem::Unknown { name } => write!(f, "device \"{name}\" is not a GPU of this node"),
        }
    }
}

/// Everything that makes `spec` stale on a node with `gpus` (index, UUID), with
/// `probe` telling what each host path is. Each path is reported once, in the order
/// the spec first uses it; then the hooks, then the GPUs.
pub(super) fn problems(
    spec: &Spec,
    gpus: &[(u32, &str)],
    probe: &dyn Fn(&Path) -> Found,
) -> Vec<Problem> {
    let edits: Vec<_> = std::iter::once(&spec.container_edits)
        .chain(spec.devices.iter().map(|d| &d.container_edits))
        .collect();
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    for e in &edits {
        for m in &e.mounts {
            if seen.insert(m.host_path.as_str()) && probe(Path::new(&m.host_path)) == Found::Missing
            {
                out.push(Problem::Mount {
                    path: m.host_path.clone(),
                });
            }
        }
        for n in &e.device_nodes {
            let path = n.host_path.as_deref().unwrap_or(&n.path);
            if seen.insert(path) && probe(Path::new(path)) == Found::Missing {
                out.push(Problem::DeviceNode { path: path.into() });
            }
        }
    }
    let mut hooks = HashSet::new();
    for h in edits.iter().flat_map(|e| &e.hooks) {
        if hooks.insert(h.path.as_str()) {
            let found = probe(Path::new(&h.path));
            if found != Found::Executable {
                out.push(Problem::Hook {
                    path: h.path.clone(),
                    found,
                });
            }
        }
    }
    let names: HashSet<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    for (index, uuid) in gpus {
        // Any of the generator's name strategies covers it: index, uuid, type-index.
        let covered = names.contains(index.to_string().as_str())
            || names.contains(uuid)
            || names.contains(format!("gpu{index}").as_str());
        if !covered {
            out.push(Problem::Uncovered {
                index: *index,
                uuid: (*uuid).to_owned(),
            });
        }
    }
    for d in &spec.devices {
        if names_missing_gpu(&d.name, gpus) {
            out.push(Problem::Unknown {
                name: d.name.clone(),
            });
        }
    }
    out
}

/// Whether `name` is a whole-GPU name (index, `GPU-…` or `gpuN`) of no GPU in `gpus`.
/// MIG names are left alone: the procfs inventory doctor reads does not list them.
fn names_missing_gpu(name: &str, gpus: &[(u32, &str)]) -> bool {
    let index = name.strip_prefix("gpu").unwrap_or(name).parse::<u32>().ok();
    match index {
        Some(i) => !gpus.iter().any(|(index, _)| *index == i),
        None if name.starts_with("GPU-") => !gpus.iter().any(|(_, uuid)| *uuid == name),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::cdi::{ContainerEdits, Device, DeviceNode, Hook, Mount};

    const LIB: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15";
    const SMI: &str = "/usr/bin/nvidia-smi";
    const HOOK: &str = "/usr/bin/nvshim";
    const UUID0: &str = "GPU-00000000-0000-4000-8000-000000000000";
    const UUID1: &str = "GPU-00000000-0000-4000-8000-000000000001";

    fn mount(path: &str) -> Mount {
        Mount {
            host_path: path.into(),
            container_path: path.into(),
            kind: None,
            options: vec![],
        }
    }

    fn node(path: &str, host_path: Option<&str>) -> DeviceNode {
        DeviceNode {
            path: path.into(),
            host_path: host_path.map(Into::into),
            kind: Some("c".into()),
            major: None,
            minor: None,
            file_mode: None,
            permissions: None,
            uid: None,
            gid: None,
        }
    }

    fn device(name: &str, nodes: Vec<DeviceNode>) -> Device {
        Device {
            name: name.into(),
            annotations: Default::default(),
            container_edits: ContainerEdits {
                device_nodes: nodes,
                ..Default::default()
            },
        }
    }

    /// What `generate` writes for two GPUs (index and uuid names, plus all).
    fn spec() -> Spec {
        let n0 = || node("/dev/nvidia0", Some("/node/dev/nvidia0"));
        let n1 = || node("/dev/nvidia1", None);
        Spec {
            cdi_version: "0.5.0".into(),
            kind: NVIDIA_GPU_KIND.into(),
            annotations: Default::default(),
            devices: vec![
                device("0", vec![n0()]),
                device(UUID0, vec![n0()]),
                device("1", vec![n1()]),
                device(UUID1, vec![n1()]),
                device("all", vec![n0(), n1()]),
            ],
            container_edits: ContainerEdits {
                mounts: vec![mount(LIB), mount(SMI)],
                device_nodes: vec![node("/dev/nvidiactl", None)],
                hooks: vec![Hook {
                    hook_name: "createContainer".into(),
                    path: HOOK.into(),
                    args: vec![],
                    env: vec![],
                    timeout: None,
                }],
                ..Default::default()
            },
        }
    }

    /// A host where every path is there except those in `changed`.
    fn host(changed: &[(&str, Found)]) -> impl Fn(&Path) -> Found {
        let changed: HashMap<String, Found> =
            changed.iter().map(|(p, f)| ((*p).to_owned(), *f)).collect();
        move |p: &Path| {
            let p = p.display().to_string();
            changed.get(&p).copied().unwrap_or(if p == HOOK {
                Found::Executable
            } else {
                Found::Present
            })
        }
    }

    /// Name, spec, the node's GPUs, paths that differ from a healthy host, problems.
    type Case = (
        &'static str,
        Spec,
        Vec<(u32, &'static str)>,
        Vec<(&'static str, Found)>,
        Vec<Problem>,
    );

    #[test]
    fn staleness_table() {
        let two = [(0, UUID0), (1, UUID1)];
        let cases: Vec<Case> = vec![
            ("current", spec(), two.to_vec(), vec![], vec![]),
            (
                "library gone",
                spec(),
                two.to_vec(),
                vec![(LIB, Found::Missing)],
                vec![Problem::Mount { path: LIB.into() }],
            ),
            (
                "host path of a node is what is checked",
                spec(),
                two.to_vec(),
                vec![
                    ("/dev/nvidia0", Found::Missing),
                    ("/node/dev/nvidia0", Found::Missing),
                ],
                vec![Problem::DeviceNode {
                    path: "/node/dev/nvidia0".into(),
                }],
            ),
            (
                "path when no host path, reported once",
                spec(),
                two.to_vec(),
                vec![("/dev/nvidia1", Found::Missing)],
                vec![Problem::DeviceNode {
                    path: "/dev/nvidia1".into(),
                }],
            ),
            (
                "hook not executable",
                spec(),
                two.to_vec(),
                vec![(HOOK, Found::Present)],
                vec![Problem::Hook {
                    path: HOOK.into(),
                    found: Found::Present,
                }],
            ),
            (
                "hook gone",
                spec(),
                two.to_vec(),
                vec![(HOOK, Found::Missing)],
                vec![Problem::Hook {
                    path: HOOK.into(),
                    found: Found::Missing,
                }],
            ),
            (
                "a GPU added",
                spec(),
                vec![(0, UUID0), (1, UUID1), (2, "GPU-new")],
                vec![],
                vec![Problem::Uncovered {
                    index: 2,
                    uuid: "GPU-new".into(),
                }],
            ),
            (
                "a GPU removed",
                spec(),
                vec![(0, UUID0)],
                vec![],
                vec![
                    Problem::Unknown { name: "1".into() },
                    Problem::Unknown { name: UUID1.into() },
                ],
            ),
            (
                "uuid names alone cover",
                Spec {
                    devices: spec()
                        .devices
                        .into_iter()
                        .filter(|d| d.name.starts_with("GPU-"))
                        .collect(),
                    ..spec()
                },
                two.to_vec(),
                vec![],
                vec![],
            ),
            (
                "type-index names cover",
                Spec {
                    devices: vec![device("gpu0", vec![]), device("gpu1", vec![])],
                    ..spec()
                },
                two.to_vec(),
                vec![],
                vec![],
            ),
            (
                "MIG names are left alone",
                Spec {
                    devices: vec![
                        device("0", vec![]),
                        device("1", vec![]),
                        device("0:1", vec![]),
                        device("MIG-x", vec![]),
                        device("mig0:1", vec![]),
                    ],
                    ..spec()
                },
                two.to_vec(),
                vec![],
                vec![],
            ),
        ];
        for (name, spec, gpus, changed, want) in cases {
            let got = problems(&spec, &gpus, &host(&changed));
            assert_eq!(got, want, "case {name}");
        }
    }

    #[test]
    fn problems_read_as_the_fix_needs() {
        let cases = [
            (
                Problem::Mount { path: LIB.into() },
                format!("{LIB} is gone (driver upgraded?)"),
            ),
            (
                Problem::Mount {
                    path: "/run/nvidia-persistenced/socket".into(),
                },
                "/run/nvidia-persistenced/socket is gone".to_owned(),
            ),
            (
                Problem::Uncovered {
                    index: 3,
                    uuid: "GPU-3".into(),
                },
                "GPU 3 (GPU-3) has no device".to_owned(),
            ),
        ];
        for (problem, want) in cases {
            assert_eq!(problem.to_string(), want, "case {want}");
        }
        let many: Vec<Problem> = (0..5)
            .map(|i| Problem::DeviceNode {
                path: format!("/dev/nvidia{i}"),
            })
            .collect();
        assert_eq!(
            summary(&many),
            "/dev/nvidia0 is gone; /dev/nvidia1 is gone; /dev/nvidia2 is gone; and 2 more"
        );
    }

    #[test]
    fn the_fix_repeats_the_roots_doctor_was_given() {
        let mut host = HostArgs {
            driver_root: Some("/".into()),
            dev_root: None,
            proc_root: Some("/".into()),
            backend: Default::default(),
            nvml_lib: None,
        };
        let file = Path::new("/etc/cdi/nvidia.yaml");
        assert_eq!(
            regenerate(&host, file),
            "nvshim cdi generate --output /etc/cdi/nvidia.yaml"
        );
        host.driver_root = Some("/run/nvidia/driver".into());
        host.dev_root = Some("/my node".into());
        assert_eq!(
            regenerate(&host, file),
            "nvshim cdi generate --output /etc/cdi/nvidia.yaml \
             --driver-root /run/nvidia/driver --dev-root '/my node'"
        );
    }
}

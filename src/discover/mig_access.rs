//! The capability nodes of `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES`:
//! the MIG `config` or `monitor` node (`/dev/nvidia-caps/nvidia-cap<N>`, its minor from
//! `mig-minors`), required, and every GPU instance and compute instance access node of
//! each covered GPU (`gpu<minor>/gi<G>[/ci<C>]/access` in `mig-minors`) that exists
//! under the dev root, as libnvidia-container's `nvc_mig_{config,monitor}_global_caps_mount`
//! and `nvc_device_mig_caps_mount` allow them.
//!
//! NVIDIA bind-mounts the whole `/dev/nvidia-caps` directory and allows every listed
//! minor of the GPU in the device cgroup, nodes or not; CDI edits carry device nodes,
//! each with its cgroup rule, so here the container gets the nodes that exist when it
//! starts. Reads `mig-minors` and lists `/dev/nvidia-caps` once; only for a request
//! that sets one of the variables.

use std::collections::HashSet;
use std::fs;
use std::io;

use super::nodes::node;
use super::table::{CAPS_DIR, MIG_MINORS};
use super::{DiscoverError, HostResources, io_err, parse_mig_minors};
use crate::request::{ENV_MIG_CONFIG_DEVICES, ENV_MIG_MONITOR_DEVICES, MigAccess};
use crate::roots::Roots;

/// Adds to `out` the nodes `access` needs for the GPUs of device minors `gpus`
/// (nothing when either is empty, as NVIDIA's tool does with no GPU).
pub fn discover(
    roots: &Roots,
    access: MigAccess,
    gpus: &[u32],
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    if access.is_none() || gpus.is_empty() {
        return Ok(());
    }
    let path = roots.proc.join(MIG_MINORS.trim_start_matches('/'));
    let text = crate::files::read_to_string(&path).map_err(io_err(&path))?;
    let table = parse_mig_minors(&text);
    let wanted = [
        (access.config, "config", ENV_MIG_CONFIG_DEVICES),
        (access.monitor, "monitor", ENV_MIG_MONITOR_DEVICES),
    ];
    let mut variables = Vec::new();
    for (_, name, variable) in wanted.iter().filter(|(on, _, _)| *on) {
        let minor = table
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, m)| *m)
            .ok_or_else(|| DiscoverError::Parse {
                path: path.clone(),
                reason: format!("no entry {name:?}, which {variable} needs"),
            })?;
        add(roots, minor, variable, true, out)?;
        variables.push(*variable);
    }
    let present = cap_nodes(roots)?;
    let needed_for = variables.join(", ");
    for gpu in gpus {
        let prefix = format!("gpu{gpu}/");
        let mut minors: Vec<u32> = table
            .iter()
            .filter(|(n, _)| n.starts_with(&prefix))
            .map(|(_, m)| *m)
            .filter(|m| present.contains(&format!("nvidia-cap{m}")))
            .collect();
        minors.sort_unstable();
        minors.dedup();
        for minor in minors {
            add(
                roots,
                minor,
                &format!("{needed_for} (/dev/nvidia{gpu})"),
                false,
                out,
            )?;
        }
    }
    Ok(())
}

fn add(
    roots: &Roots,
    minor: u32,
    needed_for: &str,
    required: bool,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let path = format!("{CAPS_DIR}/nvidia-cap{minor}");
    if out
        .device_nodes
        .iter()
        .any(|n| n.path.as_os_str() == path.as_str())
    {
        return Ok(());
    }
    node(roots, &path, needed_for, required, out)
}

/// The names in the dev root's `nvidia-caps` directory (none when it is absent).
fn cap_nodes(roots: &Roots) -> Result<HashSet<String>, DiscoverError> {
    let dir = roots.dev.join(CAPS_DIR.trim_start_matches('/'));
    match fs::read_dir(&dir) {
        Ok(entries) => Ok(entries
            .filter_map(Result::ok)
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(HashSet::new()),
        Err(e) => Err(io_err(&dir)(e)),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use nix::sys::stat::{Mode, SFlag, makedev, mknod};

    use super::*;

    /// A dev root with the given `nvidia-caps` minors (major 511) and a proc root whose
    /// `mig-minors` lists GPUs 0 and 3 (tests run as root, for `mknod`).
    fn host(root: &Path, caps: &[u32]) -> Roots {
        let dir = root.join("dev/nvidia-caps");
        fs::create_dir_all(&dir).unwrap();
        for minor in caps {
            let dev = makedev(511, u64::from(*minor));
            mknod(
                &dir.join(format!("nvidia-cap{minor}")),
                SFlag::S_IFCHR,
                Mode::from_bits_truncate(0o444),
                dev,
            )
            .unwrap();
        }
        let proc = root.join("proc/driver/nvidia-caps");
        fs::create_dir_all(&proc).unwrap();
        fs::write(
            proc.join("mig-minors"),
            "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\n\
             gpu0/gi2/access 21\ngpu3/gi1/access 66\n",
        )
        .unwrap();
        Roots {
            driver: root.to_path_buf(),
            dev: root.to_path_buf(),
            proc: root.to_path_buf(),
        }
    }

    #[test]
    fn nodes_for_each_capability_and_gpu() {
        let config = MigAccess::CONFIG;
        let monitor = MigAccess::MONITOR;
        let both = MigAccess {
            config: true,
            monitor: true,
        };
        // (case, access, GPU minors, nodes present, nodes wanted, required missing)
        type Case = (
            &'static str,
            MigAccess,
            Vec<u32>,
            Vec<u32>,
            Vec<u32>,
            Vec<&'static str>,
        );
        let cases: Vec<Case> = vec![
            (
                "nothing asked",
                MigAccess::default(),
                vec![0],
                vec![1, 12],
                vec![],
                vec![],
            ),
            ("no GPU", config, vec![], vec![1, 12], vec![], vec![]),
            (
                "config, GPU 0",
                config,
                vec![0],
                vec![1, 2, 12, 13, 66],
                vec![1, 12, 13],
                vec![],
            ),
            (
                "monitor, GPU 3",
                monitor,
                vec![3],
                vec![1, 2, 12, 13, 66],
                vec![2, 66],
                vec![],
            ),
            (
                "both, absent instance nodes",
                both,
                vec![0, 3],
                vec![1, 2, 13],
                vec![1, 2, 13],
                vec![],
            ),
            (
                "config node absent",
                config,
                vec![0],
                vec![2, 12],
                vec![12],
                vec!["/dev/nvidia-caps/nvidia-cap1"],
            ),
        ];
        for (name, access, gpus, present, want, want_missing) in cases {
            let tmp = tempfile::tempdir().unwrap();
            let roots = host(tmp.path(), &present);
            let mut out = HostResources::default();
            discover(&roots, access, &gpus, &mut out).unwrap();
            let mut got: Vec<u64> = out.device_nodes.iter().map(|n| n.minor).collect();
            got.sort_unstable();
            let want: Vec<u64> = want.into_iter().map(u64::from).collect();
            assert_eq!(got, want, "case {name}");
            assert!(
                out.device_nodes.iter().all(|n| n.major == 511),
                "case {name}"
            );
            let missing: Vec<&str> = out
                .missing
                .iter()
                .filter(|m| m.required)
                .map(|m| m.what.as_str())
                .collect();
            assert_eq!(missing, want_missing, "case {name}");
        }
    }

    #[test]
    fn an_unlisted_capability_is_an_error_naming_the_variable() {
        let tmp = tempfile::tempdir().unwrap();
        let roots = host(tmp.path(), &[1]);
        fs::write(
            tmp.path().join("proc/driver/nvidia-caps/mig-minors"),
            "config 1\n",
        )
        .unwrap();
        let access = MigAccess::MONITOR;
        let err = discover(&roots, access, &[0], &mut HostResources::default()).unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("no entry \"monitor\", which NVIDIA_MIG_MONITOR_DEVICES needs"),
            "{text}"
        );
    }
}

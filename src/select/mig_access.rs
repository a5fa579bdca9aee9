//! The GPUs `NVIDIA_MIG_CONFIG_DEVICES` / `NVIDIA_MIG_MONITOR_DEVICES` cover: every GPU
//! the container gets, and the parent of every MIG device it gets, as
//! libnvidia-container's `select_mig_{config,monitor}_devices` pick them. NVIDIA keeps
//! only the MIG-capable ones, which only NVML knows; here every one is kept and
//! discovery finds the capability nodes a GPU has (a GPU without MIG has none).

use super::{SelectError, SelectedGpu, Selection};
use crate::request::{DeviceId, DeviceList, MigAccess};

/// The GPUs `access` covers in `selection` (made from `devices`); none when `access`
/// asks for nothing. As NVIDIA's, MIG access goes with `all` devices or full GPUs only:
/// a request naming particular MIG devices is refused.
pub fn mig_access_gpus(
    devices: &DeviceList,
    access: MigAccess,
    selection: &Selection,
) -> Result<Vec<SelectedGpu>, SelectError> {
    if access.is_none() {
        return Ok(Vec::new());
    }
    if !selection.mig_devices.is_empty() && !asks_for_all(devices) {
        return Err(SelectError::MigAccessWithMigDevices {
            variable: if access.config {
                crate::request::ENV_MIG_CONFIG_DEVICES
            } else {
                crate::request::ENV_MIG_MONITOR_DEVICES
            },
        });
    }
    let mut gpus: Vec<SelectedGpu> = Vec::new();
    let parents = selection.mig_devices.iter().map(|m| &m.parent);
    for gpu in selection.gpus.iter().chain(parents) {
        if !gpus.iter().any(|g| g.minor == gpu.minor) {
            gpus.push(gpu.clone());
        }
    }
    Ok(gpus)
}

/// `all`, or a CDI name for all (`nvidia.com/gpu=all`).
fn asks_for_all(devices: &DeviceList) -> bool {
    match devices {
        DeviceList::All => true,
        DeviceList::Ids(ids) => ids
            .iter()
            .any(|id| matches!(id, DeviceId::Cdi { name, .. } if name == "all")),
        DeviceList::None | DeviceList::Void => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::select::SelectedMig;

    fn gpu(minor: u32) -> SelectedGpu {
        SelectedGpu {
            index: minor,
            minor,
            uuid: format!("GPU-{minor}"),
            bus_id: format!("0000:{minor:02x}:00.0"),
        }
    }

    fn mig(parent: u32) -> SelectedMig {
        SelectedMig {
            parent: gpu(parent),
            index: 0,
            gpu_instance_id: 1,
            compute_instance_id: 0,
            uuid: format!("MIG-{parent}"),
        }
    }

    #[test]
    fn gpus_covered_and_refusals() {
        let config = MigAccess::CONFIG;
        let monitor = MigAccess::MONITOR;
        let full = Selection {
            gpus: vec![gpu(1), gpu(0)],
            mig_devices: vec![],
        };
        let with_mig = Selection {
            gpus: vec![gpu(0), gpu(1)],
            mig_devices: vec![mig(0), mig(2)],
        };
        let ids = |s: &str| s.parse::<DeviceList>().unwrap();
        // (case, devices, access, selection, Ok(minors) or Err(message part))
        type Case<'a> = (
            &'a str,
            DeviceList,
            MigAccess,
            &'a Selection,
            Result<Vec<u32>, &'a str>,
        );
        let cases: [Case; 6] = [
            (
                "nothing asked",
                ids("0"),
                MigAccess::default(),
                &with_mig,
                Ok(vec![]),
            ),
            ("full GPUs", ids("1,0"), config, &full, Ok(vec![1, 0])),
            (
                "all with MIG parents",
                DeviceList::All,
                monitor,
                &with_mig,
                Ok(vec![0, 1, 2]),
            ),
            (
                "CDI all",
                ids("nvidia.com/gpu=all"),
                config,
                &with_mig,
                Ok(vec![0, 1, 2]),
            ),
            (
                "named MIG device",
                ids("0:0"),
                monitor,
                &with_mig,
                Err("NVIDIA_MIG_MONITOR_DEVICES cannot be combined with particular MIG devices"),
            ),
            (
                "driver only",
                DeviceList::None,
                config,
                &Selection::default(),
                Ok(vec![]),
            ),
        ];
        for (name, devices, access, selection, want) in cases {
            let got = mig_access_gpus(&devices, access, selection)
                .map(|gpus| gpus.iter().map(|g| g.minor).collect::<Vec<_>>())
                .map_err(|e| e.to_string());
            match (&got, &want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "case {name}"),
                (Err(got), Err(part)) => assert!(got.contains(part), "case {name}: {got}"),
                _ => panic!("case {name}: got {got:?}, want {want:?}"),
            }
        }
    }
}

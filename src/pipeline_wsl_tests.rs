// SPDX-License-Identifier: Apache-2.0
//! WSL2 in the pipeline: no `/proc/driver/nvidia` plus `/dev/dxg` means NVML lists the GPUs.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;
use crate::request::DriverCapabilities;

fn ctx(dir: &std::path::Path) -> Context {
    Context {
        roots: Roots {
            driver: dir.join("driver"),
            dev: dir.to_path_buf(),
            proc: dir.to_path_buf(),
        },
        nvml: NvmlAccess::Elsewhere,
        ..Context::default()
    }
}

#[test]
fn a_wsl_node_hands_the_request_to_nvml_and_a_node_without_a_driver_fails() {
    let dir = tempfile::tempdir().unwrap();
    let ctx = ctx(dir.path());
    let request = Request::new(DeviceList::All, DriverCapabilities::default());
    // Neither the module nor /dev/dxg: no driver, as before.
    assert!(
        matches!(
            stage(&ctx, &request),
            Err(PipelineError::Inventory(
                inventory::InventoryError::NoDriver { .. }
            ))
        ),
        "no driver at all"
    );
    fs::create_dir_all(dir.path().join("dev")).unwrap();
    nix::sys::stat::mknod(
        &dir.path().join("dev/dxg"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(10, 63),
    )
    .unwrap();
    let staged = stage(&ctx, &request).unwrap();
    assert_eq!(staged.needs_nvml(), Some(WSL_REASON));
    assert!(
        matches!(finish(&ctx, staged), Err(PipelineError::NeedsNvml { .. })),
        "a process without NVML never plans it"
    );
}

#[test]
fn a_partial_selection_on_wsl_names_the_rule() {
    let err = PipelineError::WslPartial {
        devices: "0".into(),
        selected: 1,
        total: 2,
    };
    let text = err.to_string();
    for part in ["/dev/dxg", "all 2 GPUs", "0 selects 1"] {
        assert!(text.contains(part), "{text:?} lacks {part:?}");
    }
}

fn wsl_node(dir: &std::path::Path) {
    fs::create_dir_all(dir.join("dev")).unwrap();
    nix::sys::stat::mknod(
        &dir.join("dev/dxg"),
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(0o666),
        nix::sys::stat::makedev(10, 63),
    )
    .unwrap();
    let store = dir.join("driver/usr/lib/wsl/drivers/nv_dispi.inf_amd64_1234");
    fs::create_dir_all(&store).unwrap();
    for name in ["libcuda.so.1.1", "libnvidia-ml.so.1", "nvidia-smi"] {
        fs::write(store.join(name), name).unwrap();
    }
}

fn inventory(gpus: u32) -> Inventory {
    let gpu = |index: u32| inventory::Gpu {
        index,
        minor: index,
        uuid: format!("GPU-{index}"),
        bus_id: format!("0000:0{index}:00.0"),
        name: "NVIDIA RTX 4090".into(),
        memory_bytes: None,
        compute_capability: Some("8.9".into()),
        brand: None,
        mig_enabled: None,
        mig_devices: Vec::new(),
    };
    Inventory {
        driver: DriverInfo {
            version: "560.94".into(),
            cuda_version: Some("12.6".into()),
        },
        gpus: (0..gpus).map(gpu).collect(),
    }
}

#[test]
fn on_wsl_all_gpus_get_dxg_none_gets_the_driver_and_a_part_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    wsl_node(dir.path());
    let ctx = ctx(dir.path());
    let plan = |devices: DeviceList| {
        let request = Request::new(devices, DriverCapabilities::default());
        plan_on(&ctx, &request, Backend::Nvml, inventory(2))
    };
    let all = plan(DeviceList::All).unwrap();
    let nodes: Vec<&str> = all
        .edits
        .device_nodes
        .iter()
        .map(|n| n.path.as_str())
        .collect();
    assert_eq!(nodes, ["/dev/dxg"], "all");
    assert!(
        all.ldcache.iter().any(|e| e.key == "libcuda.so.1"
            && e.value == "/usr/lib/wsl/drivers/nv_dispi.inf_amd64_1234/libcuda.so.1"),
        "{:?}",
        all.ldcache
    );
    let every = DeviceList::Ids(vec![DeviceId::Index(0), DeviceId::Index(1)]);
    assert_eq!(plan(every).unwrap().edits, all.edits, "every GPU by index");

    let none = plan(DeviceList::None).unwrap();
    assert!(none.edits.device_nodes.is_empty(), "none: no /dev/dxg");
    assert_eq!(
        none.edits.mounts, all.edits.mounts,
        "none: the driver files"
    );

    let part = plan(DeviceList::Ids(vec![DeviceId::Index(1)]));
    assert!(
        matches!(
            part,
            Err(PipelineError::WslPartial {
                selected: 1,
                total: 2,
                ..
            })
        ),
        "{part:?}"
    );
    // The procfs backend is a host with the NVIDIA module: never WSL's discovery.
    assert!(
        plan_on(
            &ctx,
            &Request::new(DeviceList::All, DriverCapabilities::default()),
            Backend::Procfs,
            inventory(2)
        )
        .is_err(),
        "procfs on this node looks for /dev/nvidiactl, which is not there"
    );
}

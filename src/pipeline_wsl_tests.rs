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

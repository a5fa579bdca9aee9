// SPDX-License-Identifier: Apache-2.0
//! The mock's devices through `nvshim::nvml`: enumeration in PCI order, GPUs hidden by a
//! missing device node, MIG devices, lookup by UUID, and NVML's text in call errors.

use super::*;

#[test]
fn gpus_enumerate_in_pci_order() -> TestResult {
    check_mock(
        &test_name!("gpus_enumerate_in_pci_order"),
        Node::standard,
        |nvml, _| {
            assert_eq!(nvml.driver_version()?, DRIVER_VERSION);
            assert_eq!(nvml.cuda_driver_version()?, 12040);
            assert_eq!(nvml.device_count()?, 3);
            // ((uuid, NVML bus id, (domain, bus, device), minor), (name, memory, capability))
            let want = [
                (
                    (UUID_07, "00000000:07:00.0", (0, 0x07, 0), 1),
                    (A100, (80 * GIB, 79 * GIB, GIB), (8, 0)),
                ),
                (
                    (UUID_0A, "00000000:0A:00.0", (0, 0x0a, 0), 2),
                    (T4, (16 * GIB, 16 * GIB, 0), (7, 5)),
                ),
                (
                    (UUID_B1, "00000000:B1:00.0", (0, 0xb1, 0), 0),
                    (A100, (80 * GIB, 80 * GIB, 0), (8, 0)),
                ),
            ];
            for (index, ((uuid, bus_id, location, minor), (name, memory, cc))) in
                want.into_iter().enumerate()
            {
                let case = format!("GPU {index} ({uuid})");
                let gpu = nvml.device_by_index(index as u32)?;
                assert_eq!(gpu.uuid()?, uuid, "case {case}");
                let pci = gpu.pci_info()?;
                assert_eq!(pci.bus_id, bus_id, "case {case}");
                assert_eq!((pci.domain, pci.bus, pci.device), location, "case {case}");
                assert_eq!(pci.pci_device_id & 0xffff, 0x10de, "case {case}: vendor id");
                assert_eq!(gpu.minor_number()?, minor, "case {case}");
                assert_eq!(gpu.name()?, name, "case {case}");
                let m = gpu.memory_info()?;
                assert_eq!((m.total, m.free, m.used), memory, "case {case}");
                assert_eq!(gpu.cuda_compute_capability()?, cc, "case {case}");
                assert!(!gpu.is_mig_device()?, "case {case}");
            }
            Ok(())
        },
    )
}

#[test]
fn gpus_without_a_device_node_are_hidden() -> TestResult {
    let test = &test_name!("gpus_without_a_device_node_are_hidden");
    if child(test).is_some() {
        let want = std::env::var(CASE_ENV)?;
        let want: Vec<&str> = want.split(',').filter(|u| !u.is_empty()).collect();
        let nvml = load_mock()?;
        let mut got = Vec::new();
        for index in 0..nvml.device_count()? {
            got.push(nvml.device_by_index(index)?.uuid()?);
        }
        assert_eq!(got, want);
        for hidden in [UUID_07, UUID_0A, UUID_B1]
            .iter()
            .filter(|u| !want.contains(u))
        {
            let code = failure_code(nvml.device_by_uuid(hidden))?;
            assert_eq!(code, Return::NotFound, "hidden {hidden}");
        }
        return Ok(());
    }
    // (case, minors under the config's dev_root, minors under $MOCK_NVML_DEV_ROOT, visible)
    type Case<'a> = (&'a str, &'a [u32], Option<&'a [u32]>, &'a [&'a str]);
    let cases: &[Case] = &[
        ("all nodes", &[0, 1, 2], None, &[UUID_07, UUID_0A, UUID_B1]),
        ("minor 1 missing", &[0, 2], None, &[UUID_0A, UUID_B1]),
        ("no nodes", &[], None, &[]),
        ("env dev root wins", &[0, 1, 2], Some(&[1]), &[UUID_07]),
    ];
    for (case, minors, env_minors, visible) in cases {
        let node = Node::new(minors)?;
        node.write_config(&standard_config(&node))?;
        let env_dev = node.path("other-dev");
        std::fs::create_dir(&env_dev)?;
        write_device_nodes(&env_dev, env_minors.unwrap_or_default())?;
        let visible = visible.join(",");
        let mut env = vec![(CASE_ENV, Some(OsStr::new(&visible)))];
        if env_minors.is_some() {
            env.push(("MOCK_NVML_DEV_ROOT", Some(env_dev.as_os_str())));
        }
        node.run_child(test, &env)
            .map_err(|e| ChildFailed(format!("case {case}: {e}")))?;
    }
    Ok(())
}

#[test]
fn mig_devices_enumerate() -> TestResult {
    check_mock(
        &test_name!("mig_devices_enumerate"),
        Node::standard,
        |nvml, _| {
            let a100_mig = nvml.device_by_uuid(UUID_B1)?;
            let a100 = nvml.device_by_uuid(UUID_07)?;
            let t4 = nvml.device_by_uuid(UUID_0A)?;

            // (case, device, MIG mode or error, max MIG devices or error)
            let modes = [
                ("A100 in MIG mode", a100_mig, Ok((true, true)), Ok(7)),
                ("A100 with MIG off", a100, Ok((false, false)), Ok(0)),
                ("T4 without MIG", t4, Err(Return::NotSupported), Ok(0)),
            ];
            for (case, device, mode, max) in modes {
                assert_eq!(
                    device.mig_mode().map_err(|e| e.code()),
                    mode.map_err(Some),
                    "case {case}"
                );
                assert_eq!(
                    device.max_mig_device_count().map_err(|e| e.code()),
                    max.map_err(Some),
                    "case {case}"
                );
            }

            // (slot, gpu instance, compute instance, uuid, name, memory)
            let want = [
                (0, 1, 0, MIG_B1_1, format!("{A100} MIG 1g.10gb"), 10 * GIB),
                (1, 2, 0, MIG_B1_2, format!("{A100} MIG 2g.20gb"), 20 * GIB),
            ];
            for (slot, gi, ci, uuid, name, memory) in want {
                let case = format!("slot {slot}");
                let mig = a100_mig.mig_device_by_index(slot)?;
                assert!(mig.is_mig_device()?, "case {case}");
                assert_eq!(mig.gpu_instance_id()?, gi, "case {case}");
                assert_eq!(mig.compute_instance_id()?, ci, "case {case}");
                assert_eq!(mig.uuid()?, uuid, "case {case}");
                assert_eq!(mig.name()?, name, "case {case}");
                assert_eq!(mig.memory_info()?.total, memory, "case {case}");
                assert_eq!(mig.parent()?, a100_mig, "case {case}");
                assert_eq!(mig.parent()?.uuid()?, UUID_B1, "case {case}");
                assert_eq!(mig.pci_info()?.bus_id, "00000000:B1:00.0", "case {case}");
            }

            let slot = |device: Device, slot| failure_code(device.mig_device_by_index(slot));
            // (case, result code, want)
            let failures = [
                ("empty slot", slot(a100_mig, 2)?, Return::NotFound),
                (
                    "slot past the maximum",
                    slot(a100_mig, 7)?,
                    Return::InvalidArgument,
                ),
                ("MIG off", slot(a100, 0)?, Return::InvalidArgument),
                ("no MIG support", slot(t4, 0)?, Return::NotSupported),
                (
                    "GPU instance id of a GPU",
                    failure_code(a100.gpu_instance_id())?,
                    Return::NotSupported,
                ),
                (
                    "compute instance id of a GPU",
                    failure_code(a100.compute_instance_id())?,
                    Return::NotSupported,
                ),
                (
                    "parent of a GPU",
                    failure_code(a100.parent())?,
                    Return::InvalidArgument,
                ),
            ];
            for (case, got, want) in failures {
                assert_eq!(got, want, "case {case}");
            }
            Ok(())
        },
    )
}

#[test]
fn devices_are_found_by_uuid() -> TestResult {
    check_mock(
        &test_name!("devices_are_found_by_uuid"),
        Node::standard,
        |nvml, _| {
            // (case, uuid, Ok(is MIG) or the error code)
            let cases = [
                ("GPU", UUID_0A, Ok(false)),
                ("MIG device", MIG_B1_2, Ok(true)),
                (
                    "unknown GPU",
                    "GPU-00000000-0000-0000-0000-000000000000",
                    Err(Some(Return::NotFound)),
                ),
                ("interior NUL", "GPU-\0", Err(None)),
            ];
            for (case, uuid, want) in cases {
                match (nvml.device_by_uuid(uuid), want) {
                    (Ok(device), Ok(is_mig)) => {
                        assert_eq!(device.uuid()?, uuid, "case {case}");
                        assert_eq!(device.is_mig_device()?, is_mig, "case {case}");
                    }
                    (Err(error), Err(code)) => {
                        assert_eq!(error.code(), code, "case {case}: {error}")
                    }
                    (got, want) => panic!("case {case}: got {got:?}, want {want:?}"),
                }
            }
            Ok(())
        },
    )
}

#[test]
fn call_errors_carry_nvml_text() -> TestResult {
    check_mock(
        &test_name!("call_errors_carry_nvml_text"),
        Node::standard,
        |nvml, _| {
            let t4 = nvml.device_by_uuid(UUID_0A)?;
            let cases = [
                (
                    "index out of range",
                    call_failure(nvml.device_by_index(99))?,
                    (
                        "nvmlDeviceGetHandleByIndex_v2",
                        Return::InvalidArgument,
                        "Invalid Argument",
                    ),
                ),
                (
                    "unknown UUID",
                    call_failure(nvml.device_by_uuid("GPU-nope"))?,
                    ("nvmlDeviceGetHandleByUUID", Return::NotFound, "Not Found"),
                ),
                (
                    "MIG mode of a T4",
                    call_failure(t4.mig_mode())?,
                    (
                        "nvmlDeviceGetMigMode",
                        Return::NotSupported,
                        "Not Supported",
                    ),
                ),
            ];
            for (case, got, (function, code, message)) in cases {
                assert_eq!(got, (function, code, message.to_string()), "case {case}");
            }
            let error = nvml
                .device_by_index(99)
                .err()
                .ok_or("index 99 should fail")?;
            assert_eq!(
                error.to_string(),
                "nvmlDeviceGetHandleByIndex_v2 failed: Invalid Argument (NVML_ERROR_INVALID_ARGUMENT)"
            );
            Ok(())
        },
    )
}

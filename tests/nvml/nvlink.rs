// SPDX-License-Identifier: Apache-2.0
//! NVLink topology from NVML (`Device::nvlink_*`, `inventory::nvlink::nvlink_matrix`)
//! against the mock NVML on a simulated 4-GPU node whose mock config declares NVLinks.
//!
//! As in `mock`, the mock reads its config from the environment at `nvmlInit`, so
//! each test builds its node and re-runs this binary, filtered to itself, as a child with
//! the node's env.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use nvshim::inventory::{self, Inventory, normalize_bus_id};
use nvshim::nvml::{NVLINK_MAX_LINKS, Nvml, Return};
use nvshim_testkit::{Artifacts, MockConfig, NodeSpec, SimNode};

type Error = Box<dyn std::error::Error>;
type TestResult = Result<(), Error>;

/// Set in a child to the name of the test it runs.
const CHILD_ENV: &str = "NVSHIM_NVML_NVLINK_TEST";
/// Set in a child to the mock NVML library of its node.
const NVML_ENV: &str = "NVSHIM_NVML_NVLINK_NVML";
/// Set in a child to its node's event file.
const EVENTS_ENV: &str = "NVSHIM_NVML_NVLINK_EVENTS";

/// A PCI address no GPU of the node has: an NVSwitch's.
const NVSWITCH_BUS_ID: &str = "00000000:FF:00.0";

/// The parent builds a 4-GPU node, lets `links` rewrite its mock config and runs the
/// child; the child loads the mock and runs `checks` with the inventory and event file.
fn in_child(
    test: &str,
    links: impl FnOnce(MockConfig) -> Result<MockConfig, Error>,
    checks: impl FnOnce(&Nvml, &Inventory, &Path) -> TestResult,
) -> TestResult {
    let test = crate::test_path(module_path!(), test);
    let test = test.as_str();
    if std::env::var(CHILD_ENV).as_deref() == Ok(test) {
        let nvml = Nvml::load(Path::new(&std::env::var(NVML_ENV)?))?;
        let inventory = inventory::nvml::from_nvml(&nvml)?;
        let events = PathBuf::from(std::env::var(EVENTS_ENV)?);
        return checks(&nvml, &inventory, &events);
    }
    let dir = tempfile::tempdir()?;
    let sim = SimNode::build(
        &NodeSpec::standard(4),
        &dir.path().join("node"),
        &Artifacts::locate()?,
    )?;
    let events = sim.dir.join("xid-events");
    links(MockConfig::new(&sim.spec, &sim.dev_root, &events))?.write(&sim.mock_config)?;
    let mut env = crate::child_env_on(&sim, test, CHILD_ENV, NVML_ENV);
    env.push((EVENTS_ENV.to_owned(), events.into_os_string()));
    crate::run_test_in_child(test, env)
}

/// GPUs 0–1 by two links, 2–3 by four, 0–3 by one; GPU 1 also has six links to an NVSwitch
/// and GPU 2 a link to GPU 0 that is down.
fn linked(config: MockConfig) -> Result<MockConfig, Error> {
    let mut config = config.with_nvlinks(&[(0, 1, 2), (2, 3, 4), (0, 3, 1)])?;
    let mut to_switch = config.gpus[1].nvlinks[0].clone();
    to_switch.remote_bus_id = NVSWITCH_BUS_ID.to_string();
    to_switch.count = 6;
    config.gpus[1].nvlinks.push(to_switch);
    let mut down = config.gpus[2].nvlinks[0].clone();
    down.remote_bus_id = config.gpus[0].bus_id.clone();
    down.count = 1;
    down.active = false;
    config.gpus[2].nvlinks.push(down);
    Ok(config)
}

#[test]
fn nvlinks_are_counted_between_gpu_pairs() -> TestResult {
    in_child(
        "nvlinks_are_counted_between_gpu_pairs",
        linked,
        |nvml, inventory, events| {
            let want = BTreeMap::from([((0, 1), 2), ((0, 3), 1), ((2, 3), 4)]);
            assert_eq!(
                inventory::nvlink::nvlink_matrix(nvml, inventory),
                want,
                "case all GPUs present"
            );

            // GPU 2 falls off the bus: its own links cannot be read, but GPU 3 still sees
            // its four links to it, and nothing fails.
            let mut file = std::fs::OpenOptions::new().append(true).open(events)?;
            file.write_all(format!("{} gone\n", inventory.gpus[2].uuid).as_bytes())?;
            assert_eq!(
                inventory::nvlink::nvlink_matrix(nvml, inventory),
                want,
                "case GPU 2 lost"
            );
            Ok(())
        },
    )
}

#[test]
fn nvlink_queries_follow_nvml() -> TestResult {
    in_child(
        "nvlink_queries_follow_nvml",
        linked,
        |nvml, inventory, _| {
            let gpu0 = nvml.device_by_index(0)?;
            let gpu1_bus_id = inventory.gpus[1].bus_id.as_str();
            let remote = |link| -> Result<Option<String>, Error> {
                Ok(normalize_bus_id(&gpu0.nvlink_remote_pci_info(link)?.bus_id))
            };
            assert!(gpu0.nvlink_state(0)?, "case link 0 up");
            assert_eq!(
                remote(0)?.as_deref(),
                Some(gpu1_bus_id),
                "case link 0 remote"
            );
            assert_eq!(
                remote(1)?.as_deref(),
                Some(gpu1_bus_id),
                "case link 1 remote"
            );
            // Links 0-1 go to GPU 1, link 2 to GPU 3; 3..12 exist but are not wired.
            assert!(!gpu0.nvlink_state(3)?, "case unwired link");
            let code = |link| gpu0.nvlink_state(link).err().and_then(|e| e.code());
            assert_eq!(
                code(12),
                Some(Return::InvalidArgument),
                "case past the last link"
            );
            assert_eq!(
                code(NVLINK_MAX_LINKS),
                Some(Return::InvalidArgument),
                "case NVML_NVLINK_MAX_LINKS"
            );
            // GPU 2: links 0-3 to GPU 3, link 4 to GPU 0 but down.
            let gpu2 = nvml.device_by_index(2)?;
            assert!(gpu2.nvlink_state(3)?, "case GPU 2 link 3 up");
            assert!(!gpu2.nvlink_state(4)?, "case a link that is down");
            Ok(())
        },
    )
}

#[test]
fn gpus_without_nvlink_have_no_links() -> TestResult {
    in_child(
        "gpus_without_nvlink_have_no_links",
        Ok,
        |nvml, inventory, _| {
            let gpu = nvml.device_by_index(0)?;
            assert_eq!(
                gpu.nvlink_state(0).err().and_then(|e| e.code()),
                Some(Return::NotSupported)
            );
            assert_eq!(
                inventory::nvlink::nvlink_matrix(nvml, inventory),
                BTreeMap::new()
            );
            Ok(())
        },
    )
}

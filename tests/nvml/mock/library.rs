// SPDX-License-Identifier: Apache-2.0
//! Loading the mock: `nvmlInit` without a usable config, missing or wrong libraries, XID
//! events, the call log, the NVML inventory backend, and the library found through the
//! driver root's ld.so.cache.

use super::*;

#[test]
fn init_fails_without_a_usable_config() -> TestResult {
    const TEST: &str = "library::init_fails_without_a_usable_config";
    if child(TEST).is_some() {
        let failure = call_failure(Nvml::load(&mock_library()?))?;
        assert_eq!(
            failure,
            (
                "nvmlInit_v2",
                Return::DriverNotLoaded,
                "Driver Not Loaded".to_string()
            )
        );
        return Ok(());
    }
    let node = Node::new(&[0])?;
    let mut unknown_field = standard_config(&node);
    unknown_field["gpus"][1]["colour"] = json!("green");
    let mut bad_bus_id = standard_config(&node);
    bad_bus_id["gpus"][1]["bus_id"] = json!("slot 7");
    let mut missing_field = standard_config(&node);
    missing_field
        .as_object_mut()
        .map(|c| c.remove("driver_version"));
    // (case, config file contents or None for no file, the reason the mock gives on stderr)
    let cases = [
        (
            "config file missing",
            None,
            "cannot read MOCK_NVML_CONFIG file",
        ),
        (
            "unknown field",
            Some(unknown_field),
            "unknown field `colour`",
        ),
        (
            "missing field",
            Some(missing_field),
            "missing field `driver_version`",
        ),
        ("bad bus id", Some(bad_bus_id), "\"slot 7\""),
    ];
    for (case, config, reason) in cases {
        match &config {
            Some(config) => node.write_config(config)?,
            None => {
                let _ = std::fs::remove_file(node.path("config.json"));
            }
        }
        let stderr = node
            .run_child(TEST, &[])
            .map_err(|e| ChildFailed(format!("case {case}: {e}")))?;
        assert!(stderr.contains(reason), "case {case}: stderr {stderr:?}");
    }
    let stderr = node.run_child(TEST, &[("MOCK_NVML_CONFIG", None)])?;
    assert!(
        stderr.contains("MOCK_NVML_CONFIG is not set"),
        "case env unset: {stderr:?}"
    );
    Ok(())
}

#[test]
fn missing_or_wrong_libraries_are_errors_naming_them() {
    // In process: neither library is the mock.
    let cases = [
        (
            "absolute path",
            "/nonexistent/nvshim/libnvidia-ml.so.1",
            "/nonexistent/nvshim/libnvidia-ml.so.1: cannot open shared object file",
        ),
        (
            "bare name",
            "libnvshim-no-such-library.so.1",
            "libnvshim-no-such-library.so.1: cannot open shared object file",
        ),
        ("not NVML", "libc.so.6", "has no function nvmlInit_v2"),
    ];
    for (case, library, want) in cases {
        let error = match Nvml::load(Path::new(library)) {
            Ok(nvml) => panic!("case {case}: loading {library} succeeded: {nvml:?}"),
            Err(error) => error.to_string(),
        };
        assert!(error.contains(library), "case {case}: {error}");
        assert!(error.contains(want), "case {case}: {error}");
    }
    let error = inventory::nvml::load(
        &Roots::default(),
        Some(Path::new("/nonexistent/nvshim/libnvidia-ml.so.1")),
    )
    .err();
    assert!(
        matches!(
            error,
            Some(inventory::InventoryError::Nvml(NvmlError::Open { .. }))
        ),
        "inventory: {error:?}"
    );
}

#[test]
fn xid_events_are_delivered() -> TestResult {
    let node = || {
        let node = Node::new(&[0, 1, 2])?;
        let event_file = node.path("xid-events");
        std::fs::write(&event_file, "")?;
        let mut config = standard_config(&node);
        config["xid_events"] = json!([
            { "gpu_uuid": UUID_07, "xid": 79, "delay_ms": 0 },
            { "gpu_uuid": UUID_0A, "xid": 43, "delay_ms": 0 },
        ]);
        config["event_file"] = json!(event_file);
        node.write_config(&config)?;
        Ok(node)
    };
    check_mock("library::xid_events_are_delivered", node, |nvml, dir| {
        let a100 = nvml.device_by_uuid(UUID_07)?;
        let a100_mig = nvml.device_by_uuid(UUID_B1)?;
        assert_ne!(
            a100.supported_event_types()? & EVENT_TYPE_XID_CRITICAL_ERROR,
            0
        );
        let events = nvml.event_set()?;
        // The T4 (UUID_0A) is left unregistered: its configured XID must never arrive.
        events.register(&a100, EVENT_TYPE_XID_CRITICAL_ERROR)?;
        events.register(&a100_mig, EVENT_TYPE_XID_CRITICAL_ERROR)?;
        let mig = a100_mig.mig_device_by_index(1)?;
        assert_eq!(
            events
                .register(&mig, EVENT_TYPE_XID_CRITICAL_ERROR)
                .err()
                .and_then(|e| e.code()),
            Some(Return::NotSupported),
            "case register a MIG device"
        );

        // The XID event each case waits for, as (GPU uuid, XID, GPU instance, compute
        // instance), or None for none.
        type Want<'a> = Option<(&'a str, u64, u32, u32)>;
        let expect = |cases: &[(&str, Want)]| -> TestResult {
            for &(case, want) in cases {
                let timeout = if case.starts_with("nothing") {
                    50
                } else {
                    5_000
                };
                let got = match events.wait(timeout)? {
                    None => None,
                    Some(e) => Some((
                        e.device.uuid()?,
                        e.event_type,
                        e.event_data,
                        e.gpu_instance_id,
                        e.compute_instance_id,
                    )),
                };
                let xid = EVENT_TYPE_XID_CRITICAL_ERROR;
                let want = want.map(|(uuid, data, gi, ci)| (uuid.to_string(), xid, data, gi, ci));
                assert_eq!(got, want, "case {case}");
            }
            Ok(())
        };
        let none = INSTANCE_ID_NONE;
        expect(&[
            ("configured xid", Some((UUID_07, 79, none, none))),
            ("nothing due", None),
        ])?;
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.join("xid-events"))?;
        file.write_all(format!("{UUID_07} 48\n{MIG_B1_2} 31\n{UUID_0A} 13\n").as_bytes())?;
        expect(&[
            ("appended GPU line", Some((UUID_07, 48, none, none))),
            ("appended MIG line", Some((UUID_B1, 31, 2, 0))),
            ("nothing for the unregistered GPU", None),
        ])
    })
}

#[test]
fn the_call_log_records_loading_and_calls() -> TestResult {
    const TEST: &str = "library::the_call_log_records_loading_and_calls";
    if child(TEST).is_some() {
        assert_eq!(load_mock()?.device_count()?, 3);
        return Ok(());
    }
    let node = Node::standard()?;
    node.run_child(TEST, &[])?;
    let log = std::fs::read_to_string(node.path("calls.log"))?;
    let lines: Vec<&str> = log.lines().collect();
    assert_eq!(lines.first(), Some(&"loaded"), "log {lines:?}");
    // In this order, possibly with other calls between them.
    let want = [
        "loaded",
        "nvmlInit_v2",
        "nvmlDeviceGetCount_v2",
        "nvmlShutdown",
    ];
    let mut rest = lines.iter();
    for call in want {
        assert!(rest.any(|line| *line == call), "case {call}: log {lines:?}");
    }
    Ok(())
}

fn expected_inventory() -> Inventory {
    let gpu = |index, minor, uuid: &str, bus_id: &str, name: &str, gib, cc: &str| Gpu {
        index,
        minor,
        uuid: uuid.to_string(),
        bus_id: bus_id.to_string(),
        name: name.to_string(),
        memory_bytes: Some(gib * GIB),
        compute_capability: Some(cc.to_string()),
        // nvmlDeviceGetBrand: the mock's Tesla (2) for `Tesla T4`, NVIDIA (14) otherwise.
        brand: Some(if name == T4 { 2 } else { 14 }),
        mig_enabled: None,
        mig_devices: vec![],
    };
    let mig = |index, gpu_instance_id, uuid: &str, gib, profile: &str| MigDevice {
        index,
        gpu_instance_id,
        compute_instance_id: 0,
        uuid: uuid.to_string(),
        memory_bytes: Some(gib * GIB),
        profile: profile.to_string(),
    };
    Inventory {
        driver: DriverInfo {
            version: DRIVER_VERSION.to_string(),
            cuda_version: Some("12.4".to_string()),
        },
        gpus: vec![
            Gpu {
                mig_enabled: Some(false),
                ..gpu(0, 1, UUID_07, "0000:07:00.0", A100, 80, "8.0")
            },
            gpu(1, 2, UUID_0A, "0000:0a:00.0", T4, 16, "7.5"),
            Gpu {
                mig_enabled: Some(true),
                mig_devices: vec![
                    mig(0, 1, MIG_B1_1, 10, "1g.10gb"),
                    mig(1, 2, MIG_B1_2, 20, "2g.20gb"),
                ],
                ..gpu(2, 0, UUID_B1, "0000:b1:00.0", A100, 80, "8.0")
            },
        ],
    }
}

#[test]
fn the_nvml_inventory_matches_the_node() -> TestResult {
    let node = || {
        let node = Node::standard()?;
        let lib_dir = node.path("driver/usr/lib/nvshim-test");
        std::fs::create_dir_all(&lib_dir)?;
        std::os::unix::fs::symlink(mock_library()?, lib_dir.join("libnvidia-ml.so.550.54.15"))?;
        let real = "/usr/lib/nvshim-test/libnvidia-ml.so.550.54.15";
        let cache = ld_cache(&[("libnvidia-ml.so.1", real, LIB64, 0)]);
        write_ld_cache(&node.path("driver"), &cache)?;
        Ok(node)
    };
    in_child(
        "library::the_nvml_inventory_matches_the_node",
        node,
        |dir| {
            let library = mock_library()?;
            let want = expected_inventory();
            // Explicit library; then found through the driver root's ld.so.cache.
            let explicit = inventory::nvml::load(&Roots::default(), Some(&library))?;
            assert_eq!(explicit, want, "case explicit library");
            let through_cache = inventory::nvml::load(&driver_roots(&dir.join("driver")), None)?;
            assert_eq!(through_cache, want, "case driver root ld.so.cache");
            Ok(())
        },
    )
}

/// This host's 64-bit glibc flags.
#[cfg(target_arch = "aarch64")]
const LIB64: i32 = ldcache::FLAG_ELF_LIBC6 | ldcache::FLAG_AARCH64_LIB64;
#[cfg(not(target_arch = "aarch64"))]
const LIB64: i32 = ldcache::FLAG_ELF_LIBC6 | ldcache::FLAG_X8664_LIB64;

/// An `ld.so.cache` entry: `(key, value, flags, hwcap)`.
type CacheEntry<'a> = (&'a str, &'a str, i32, u64);

/// An `ld.so.cache` holding `entries`.
fn ld_cache(entries: &[CacheEntry]) -> Vec<u8> {
    let entries: Vec<Entry> = entries
        .iter()
        .map(|&(key, value, flags, hwcap)| Entry {
            key: key.to_string(),
            value: value.to_string(),
            flags,
            hwcap,
        })
        .collect();
    ldcache::write_new(&entries)
}

/// Writes `contents` to `<root>/etc/ld.so.cache`.
fn write_ld_cache(root: &Path, contents: &[u8]) -> TestResult {
    std::fs::create_dir_all(root.join("etc"))?;
    std::fs::write(root.join("etc/ld.so.cache"), contents)?;
    Ok(())
}

#[test]
fn the_library_comes_from_the_driver_roots_ld_cache() -> TestResult {
    const SONAME: &str = "libnvidia-ml.so.1";
    const REAL: &str = "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.550.54.15";
    let hwcaps = ldcache::HWCAP_EXTENSION;
    // (case, cache file contents or None for no cache, want: Some(path under the root) or
    // None for the bare soname)
    type Case<'a> = (&'a str, Option<Vec<u8>>, Option<&'a str>);
    let cases: [Case; 7] = [
        ("no cache", None, None),
        (
            "64-bit entry",
            Some(ld_cache(&[(SONAME, REAL, LIB64, 0)])),
            Some(REAL),
        ),
        (
            "32-bit entry only",
            Some(ld_cache(&[(
                SONAME,
                "/usr/lib32/libnvidia-ml.so.1",
                ldcache::FLAG_ELF_LIBC6,
                0,
            )])),
            None,
        ),
        (
            "other libraries only",
            Some(ld_cache(&[(
                "libcuda.so.1",
                "/usr/lib/libcuda.so.1",
                LIB64,
                0,
            )])),
            None,
        ),
        (
            "entry climbing out",
            Some(ld_cache(&[(
                SONAME,
                "/usr/../../etc/libnvidia-ml.so.1",
                LIB64,
                0,
            )])),
            None,
        ),
        (
            "hwcaps variant listed first",
            Some(ld_cache(&[
                (
                    SONAME,
                    "/usr/lib/glibc-hwcaps/x86-64-v3/libnvidia-ml.so.1",
                    LIB64,
                    hwcaps,
                ),
                (SONAME, REAL, LIB64, 0),
            ])),
            Some(REAL),
        ),
        ("garbage cache", Some(b"not a cache".to_vec()), None),
    ];
    for (case, cache, want) in cases {
        let root = tempfile::tempdir()?;
        if let Some(cache) = cache {
            write_ld_cache(root.path(), &cache)?;
        }
        let want = match want {
            Some(path) => root.path().join(path.trim_start_matches('/')),
            None => PathBuf::from(SONAME),
        };
        let got = inventory::nvml::library_path(&driver_roots(root.path()));
        assert_eq!(got, want, "case {case}");
    }
    Ok(())
}

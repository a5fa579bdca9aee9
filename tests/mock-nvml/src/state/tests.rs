//! The mock's state: events, lines, node building.

use super::*;

fn gpu(uuid: &str, bus_id: &str, minor: u32) -> GpuConfig {
    GpuConfig {
        name: "NVIDIA A100-SXM4-80GB".into(),
        uuid: uuid.into(),
        bus_id: bus_id.into(),
        minor,
        memory_total_bytes: 80 << 30,
        memory_used_bytes: 0,
        compute_capability: (8, 0),
        brand: None,
        mig_mode: false,
        mig_devices: Vec::new(),
        nvlinks: Vec::new(),
        utilization_gpu_percent: Some(0),
        utilization_memory_percent: Some(0),
        temperature_celsius: Some(35),
        power_milliwatts: Some(60_000),
        sm_clock_mhz: Some(1410),
        telemetry: None,
        gfd: None,
    }
}

#[test]
fn bus_ids_parse_and_print_like_nvml() {
    let cases = [
        (
            "00000000:07:00.0",
            Some(("00000000:07:00.0", "0000:07:00.0")),
        ),
        ("0000:b1:00.1", Some(("00000000:B1:00.1", "0000:B1:00.1"))),
        ("0001:0a:1f.7", Some(("00000001:0A:1F.7", "0001:0A:1F.7"))),
        ("0000:07:20.0", None),
        ("garbage", None),
    ];
    for (raw, want) in cases {
        let got = BusId::parse(raw).map(|b| (b.nvml(), b.legacy()));
        let want = want.map(|(n, l)| (n.to_string(), l.to_string()));
        assert_eq!(got, want, "case {raw}");
    }
}

#[test]
fn config_rejects_unknown_fields() {
    let cases = [
        (
            "top level",
            r#"{"driver_version":"1","cuda_driver_version":1,"gpus":[],"extra":1}"#,
        ),
        (
            "gpu",
            r#"{"driver_version":"1","cuda_driver_version":1,"gpus":[{"name":"x","uuid":"GPU-1","bus_id":"0:1:0.0","minor":0,"memory_total_bytes":1,"compute_capability":[8,0],"mig_mode":false,"colour":"green"}]}"#,
        ),
    ];
    for (name, json) in cases {
        let error = serde_json::from_str::<Config>(json).err();
        assert!(
            error
                .as_ref()
                .is_some_and(|e| e.to_string().contains("unknown field")),
            "case {name}: {error:?}"
        );
    }
}

#[test]
fn only_gpus_with_device_nodes_are_visible_in_bus_order() -> Result<(), Box<dyn std::error::Error>>
{
    let dev = tempfile::tempdir()?;
    for minor in [0, 2] {
        std::fs::write(dev.path().join(format!("nvidia{minor}")), "")?;
    }
    let config = Config {
        driver_version: "550.54.15".into(),
        cuda_driver_version: 12040,
        dev_root: None,
        gpus: vec![
            gpu("GPU-b1", "00000000:B1:00.0", 0),
            gpu("GPU-07", "00000000:07:00.0", 1),
            gpu("GPU-0a", "00000000:0A:00.0", 2),
        ],
        xid_events: Vec::new(),
        event_file: None,
        wsl: false,
    };
    let node = Node::new(config, dev.path())?;
    let uuids: Vec<_> = node.gpus.iter().map(|g| g.config.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-0a", "GPU-b1"]);
    Ok(())
}

#[test]
fn a_wsl_node_shows_every_gpu_while_dxg_exists() -> Result<(), Box<dyn std::error::Error>> {
    let dev = tempfile::tempdir()?;
    let config = || Config {
        driver_version: "560.94".into(),
        cuda_driver_version: 12060,
        dev_root: None,
        gpus: vec![
            gpu("GPU-b1", "00000000:B1:00.0", 0),
            gpu("GPU-07", "00000000:07:00.0", 1),
        ],
        xid_events: Vec::new(),
        event_file: None,
        wsl: true,
    };
    assert!(Node::new(config(), dev.path())?.gpus.is_empty(), "no dxg");
    std::fs::write(dev.path().join("dxg"), "")?;
    let node = Node::new(config(), dev.path())?;
    let uuids: Vec<_> = node.gpus.iter().map(|g| g.config.uuid.as_str()).collect();
    assert_eq!(uuids, ["GPU-07", "GPU-b1"]);
    assert!(node.wsl);
    Ok(())
}

#[test]
fn handles_round_trip_and_reject_strangers() -> Result<(), Box<dyn std::error::Error>> {
    let dev = tempfile::tempdir()?;
    std::fs::write(dev.path().join("nvidia0"), "")?;
    let mut with_mig = gpu("GPU-0", "0:7:0.0", 0);
    with_mig.mig_mode = true;
    with_mig.mig_devices = vec![MigConfig {
        gpu_instance_id: 1,
        compute_instance_id: 0,
        uuid: "MIG-0".into(),
        memory_total_bytes: 10 << 30,
        profile: "1g.10gb".into(),
        telemetry: None,
    }];
    let config = Config {
        driver_version: "1".into(),
        cuda_driver_version: 12040,
        dev_root: None,
        gpus: vec![with_mig],
        xid_events: Vec::new(),
        event_file: None,
        wsl: false,
    };
    let mut node = Node::new(config, dev.path())?;
    for dev in [Dev::Gpu(0), Dev::Mig(0, 0)] {
        assert_eq!(node.device(dev.handle()), Ok(dev), "case {dev:?}");
    }
    for (name, handle) in [
        ("null", 0),
        ("stray pointer", 0x7fff_0000_1000),
        ("second GPU", Dev::Gpu(1).handle()),
        ("second MIG device", Dev::Mig(0, 1).handle()),
    ] {
        assert_eq!(
            node.device(handle),
            Err(code::INVALID_ARGUMENT),
            "case {name}"
        );
    }
    assert_eq!(
        node.name(Dev::Mig(0, 0)),
        "NVIDIA A100-SXM4-80GB MIG 1g.10gb"
    );
    assert_eq!(node.by_uuid("MIG-0"), Some(Dev::Mig(0, 0)));
    node.lost[0] = true;
    for (case, got) in [
        ("GPU handle", node.device(Dev::Gpu(0).handle())),
        ("MIG handle", node.device(Dev::Mig(0, 0).handle())),
        ("GPU by index", node.by_index(0)),
        ("MIG by UUID", node.lookup_uuid("MIG-0")),
    ] {
        assert_eq!(got, Err(code::GPU_IS_LOST), "case lost {case}");
    }
    assert_eq!(node.lookup_uuid("GPU-x"), Err(code::NOT_FOUND));
    Ok(())
}

#[test]
fn event_file_lines_are_read_once_and_only_when_complete() -> Result<(), Box<dyn std::error::Error>>
{
    use std::io::Write;
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("events");
    let mut file = std::fs::File::create(&path)?;
    let mut offset = 0;
    file.write_all(b"GPU-1 79\nGPU-2 4")?;
    assert_eq!(
        read_new_lines(&path, &mut offset),
        [Ok(Line::Xid("GPU-1".to_string(), 79))]
    );
    file.write_all(b"8\nnot a line\n")?;
    assert_eq!(
        read_new_lines(&path, &mut offset),
        [
            Ok(Line::Xid("GPU-2".to_string(), 48)),
            Err("not a line".to_string())
        ]
    );
    assert_eq!(read_new_lines(&path, &mut offset), []);
    Ok(())
}

#[test]
fn event_file_lines_parse() {
    let cases = [
        ("GPU-1 79", Some(Line::Xid("GPU-1".into(), 79))),
        ("  MIG-1   94 ", Some(Line::Xid("MIG-1".into(), 94))),
        ("GPU-1 dbe", Some(Line::DoubleBitEcc("GPU-1".into()))),
        ("GPU-1 gone", Some(Line::Gone("GPU-1".into()))),
        ("wait-error 999", Some(Line::WaitError(999))),
        ("wait-error soon", None),
        ("GPU-1", None),
        ("GPU-1 79 80", None),
        ("GPU-1 -1", None),
    ];
    for (line, want) in cases {
        assert_eq!(Line::parse(line), want, "case {line:?}");
    }
}

#[test]
fn nvlinks_expand_and_bound_link_numbers() -> Result<(), Box<dyn std::error::Error>> {
    let dev = tempfile::tempdir()?;
    for minor in [0, 1] {
        std::fs::write(dev.path().join(format!("nvidia{minor}")), "")?;
    }
    let mut linked = gpu("GPU-0", "0:7:0.0", 0);
    linked.nvlinks = vec![
        NvLinkConfig {
            remote_bus_id: "0000:0f:00.0".into(),
            count: 2,
            active: true,
        },
        NvLinkConfig {
            remote_bus_id: "0000:47:00.0".into(),
            count: 1,
            active: false,
        },
    ];
    let config = Config {
        driver_version: "1".into(),
        cuda_driver_version: 12040,
        dev_root: None,
        gpus: vec![linked, gpu("GPU-1", "0:f:0.0", 1)],
        xid_events: Vec::new(),
        event_file: None,
        wsl: false,
    };
    let node = Node::new(config, dev.path())?;
    let link = |bus: &str, active| BusId::parse(bus).map(|remote| NvLink { remote, active });
    let cases = [
        ("first link", 0, 0, Ok(link("0:f:0.0", true))),
        ("second link", 0, 1, Ok(link("0:f:0.0", true))),
        ("inactive link", 0, 2, Ok(link("0:47:0.0", false))),
        ("unwired link", 0, 11, Ok(None)),
        ("past the GPU's links", 0, 12, Err(code::INVALID_ARGUMENT)),
        ("no NVLink", 1, 0, Err(code::NOT_SUPPORTED)),
    ];
    for (case, gpu, link, want) in cases {
        assert_eq!(node.gpus[gpu].nvlink(link), want, "case {case}");
    }
    Ok(())
}

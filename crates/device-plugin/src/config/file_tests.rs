// SPDX-License-Identifier: Apache-2.0
//! Table tests for the config file: every key nvshim reads, the keys it accepts and
//! ignores, and every key or value it refuses, with the message.

use super::tests::{assert_error, from_file, settings};
use super::*;

use DeviceListStrategy::{CdiAnnotations, CdiCri, Envvar, VolumeMounts};

fn gpu(replicas: u32) -> SharedResource {
    SharedResource {
        name: GPU_RESOURCE.to_owned(),
        replicas,
    }
}

#[test]
fn nvidias_example_config() {
    // ../shared/research/device-plugin.md §1b, verbatim.
    let yaml = "\
version: v1
flags: {migStrategy: none, failOnInitError: true, nvidiaDriverRoot: /, plugin: {passDeviceSpecs: false, deviceListStrategy: [envvar], deviceIDStrategy: uuid}}
sharing: {timeSlicing: {renameByDefault: false, failRequestsGreaterThanOne: true, resources: [{name: nvidia.com/gpu, replicas: 4}]}}
imex: {channelIDs: [], required: false}
";
    let want = from_file(|s| {
        s.sharing = Some(Sharing {
            strategy: SharingStrategy::TimeSlicing,
            rename_by_default: false,
            fail_requests_greater_than_one: true,
            resources: vec![gpu(4)],
        });
    });
    assert_eq!(settings(&[], &[], Some(yaml)).expect("example"), want);
}

#[test]
fn file_keys() {
    let cases: Vec<(&str, &str, Settings)> = vec![
        ("empty", "", from_file(|_| {})),
        ("comments only", "# nothing here\n", from_file(|_| {})),
        ("version only", "version: v1", from_file(|_| {})),
        ("empty version", "version: ''", from_file(|_| {})),
        (
            "migStrategy",
            "flags: {migStrategy: mixed}",
            from_file(|s| s.mig_strategy = MigStrategy::Mixed),
        ),
        (
            "failOnInitError",
            "flags: {failOnInitError: false}",
            from_file(|s| s.fail_on_init_error = false),
        ),
        (
            "yaml 1.1 bool",
            "flags:\n  failOnInitError: no\n",
            from_file(|s| s.fail_on_init_error = false),
        ),
        (
            "nvidiaDriverRoot",
            "flags: {nvidiaDriverRoot: /run/nvidia/driver}",
            from_file(|s| {
                s.driver_root = "/run/nvidia/driver".into();
                s.dev_root = "/run/nvidia/driver".into();
            }),
        ),
        (
            "nvidiaDevRoot",
            "flags: {nvidiaDevRoot: /dev-root}",
            from_file(|s| s.dev_root = "/dev-root".into()),
        ),
        (
            "empty nvidiaDevRoot",
            "flags: {nvidiaDriverRoot: /d, nvidiaDevRoot: ''}",
            from_file(|s| {
                s.driver_root = "/d".into();
                s.dev_root = "/d".into();
            }),
        ),
        (
            "features off",
            "flags: {gdrcopyEnabled: false, gdsEnabled: false, mofedEnabled: false}",
            from_file(|_| {}),
        ),
        (
            "discovery auto",
            "flags: {deviceDiscoveryStrategy: auto}",
            from_file(|_| {}),
        ),
        (
            "discovery nvml",
            "flags: {deviceDiscoveryStrategy: nvml}",
            from_file(|_| {}),
        ),
        (
            "ignored flags, mps root",
            "flags: {mpsRoot: /run/nvidia/mps, useNodeFeatureAPI: true}",
            from_file(|s| s.mps_root = Some("/run/nvidia/mps".into())),
        ),
        (
            "gfd keys",
            "flags:\n  gfd:\n    oneshot: true\n    noTimestamp: false\n    sleepInterval: 60s\n    outputFile: /etc/kubernetes/node-feature-discovery/features.d/gfd\n    machineTypeFile: /sys/class/dmi/id/product_name\n",
            from_file(|_| {}),
        ),
        (
            "gfd numeric interval",
            "flags: {gfd: {sleepInterval: 60000000000}}",
            from_file(|_| {}),
        ),
        (
            "passDeviceSpecs",
            "flags: {plugin: {passDeviceSpecs: true}}",
            from_file(|s| s.pass_device_specs = true),
        ),
        (
            "strategy string",
            "flags: {plugin: {deviceListStrategy: volume-mounts}}",
            from_file(|s| s.device_list_strategies = vec![VolumeMounts]),
        ),
        (
            "strategy comma string",
            "flags: {plugin: {deviceListStrategy: 'cdi-cri, envvar'}}",
            from_file(|s| s.device_list_strategies = vec![CdiCri, Envvar]),
        ),
        (
            "strategy list with repeats",
            "flags:\n  plugin:\n    deviceListStrategy:\n    - cdi-annotations\n    - envvar\n    - cdi-annotations\n",
            from_file(|s| s.device_list_strategies = vec![CdiAnnotations, Envvar]),
        ),
        (
            "deviceIDStrategy",
            "flags: {plugin: {deviceIDStrategy: index}}",
            from_file(|s| s.device_id_strategy = DeviceIdStrategy::Index),
        ),
        (
            "cdiAnnotationPrefix",
            "flags: {plugin: {cdiAnnotationPrefix: x.io/}}",
            from_file(|s| s.cdi_annotation_prefix = "x.io/".into()),
        ),
        (
            "ignored plugin keys, containerDriverRoot",
            "flags: {plugin: {nvidiaCTKPath: /usr/bin/nvidia-ctk, containerDriverRoot: /drv, sharedDevicesAllocationPolicy: distributed}}",
            from_file(|s| s.container_driver_root = Some("/drv".into())),
        ),
        (
            "empty resources",
            "resources: {gpus: [], mig: []}",
            from_file(|_| {}),
        ),
        ("null mps", "sharing: {mps: null}", from_file(|_| {})),
        (
            "mps defaults",
            "flags: {mpsRoot: /run/nvidia/mps}\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
            from_file(|s| {
                s.mps_root = Some("/run/nvidia/mps".into());
                s.sharing = Some(Sharing {
                    strategy: SharingStrategy::Mps,
                    rename_by_default: false,
                    // NVIDIA's default for MPS, unlike time-slicing's.
                    fail_requests_greater_than_one: true,
                    resources: vec![gpu(2)],
                });
            }),
        ),
        (
            "mps full, single strategy",
            "flags: {migStrategy: single, mpsRoot: /mps}\nsharing: {mps: {renameByDefault: true, failRequestsGreaterThanOne: false, resources: [{name: nvidia.com/gpu, replicas: 10, devices: all}]}}",
            from_file(|s| {
                s.mig_strategy = MigStrategy::Single;
                s.mps_root = Some("/mps".into());
                s.sharing = Some(Sharing {
                    strategy: SharingStrategy::Mps,
                    rename_by_default: true,
                    fail_requests_greater_than_one: false,
                    resources: vec![gpu(10)],
                });
            }),
        ),
        (
            "imex off, required",
            "imex: {channelIDs: [], required: true}",
            from_file(|s| s.imex.required = true),
        ),
        (
            "imex channel 0",
            "imex: {channelIDs: [0]}",
            from_file(|s| s.imex.channel_ids = vec![0]),
        ),
        (
            "features on",
            "flags: {gdrcopyEnabled: true, gdsEnabled: true, mofedEnabled: yes}",
            from_file(|s| {
                s.device_classes = DeviceClasses {
                    gdrcopy: true,
                    gds: true,
                    mofed: true,
                }
            }),
        ),
        (
            "time-slicing defaults",
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n",
            from_file(|s| {
                s.sharing = Some(Sharing {
                    strategy: SharingStrategy::TimeSlicing,
                    rename_by_default: false,
                    fail_requests_greater_than_one: false,
                    resources: vec![gpu(2)],
                });
            }),
        ),
        (
            "time-slicing full",
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n    failRequestsGreaterThanOne: true\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 10\n      devices: all\n      rename: ''\n    - name: nvidia.com/mig-1g.10gb.me\n      replicas: 3\n",
            from_file(|s| {
                s.sharing = Some(Sharing {
                    strategy: SharingStrategy::TimeSlicing,
                    rename_by_default: true,
                    fail_requests_greater_than_one: true,
                    resources: vec![
                        gpu(10),
                        SharedResource {
                            name: "nvidia.com/mig-1g.10gb.me".into(),
                            replicas: 3,
                        },
                    ],
                });
            }),
        ),
        (
            "json",
            r#"{"version": "v1", "flags": {"migStrategy": "single", "plugin": {"deviceListStrategy": ["cdi-cri"]}}}"#,
            from_file(|s| {
                s.mig_strategy = MigStrategy::Single;
                s.device_list_strategies = vec![CdiCri];
            }),
        ),
    ];
    for (case, yaml, want) in cases {
        let got = settings(&[], &[], Some(yaml)).unwrap_or_else(|e| panic!("{case}: {e}"));
        assert_eq!(got, want, "{case}");
    }
}

#[test]
fn file_errors() {
    const F: &str = super::tests::FILE;
    let at = |line: u32| format!("{F}:{line}: ");
    let cases: Vec<(&str, &str, Vec<String>)> = vec![
        (
            "unknown top key",
            "version: v1\nflag: {}\n",
            vec![F.into(), "unknown field `flag`".into(), "line 2".into()],
        ),
        (
            "misspelt key",
            "flags:\n  migStratgy: mixed\n",
            vec![
                F.into(),
                "`migStratgy`".into(),
                "line 2".into(),
                "migStrategy".into(),
            ],
        ),
        (
            "unknown plugin key",
            "flags:\n  plugin:\n    deviceIdStrategy: uuid\n",
            vec![
                "`deviceIdStrategy`".into(),
                "deviceIDStrategy".into(),
                "line 3".into(),
            ],
        ),
        (
            "unknown gfd key",
            "flags: {gfd: {interval: 1}}",
            vec!["`interval`".into()],
        ),
        (
            "unknown resource key",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, count: 1}]}}",
            vec!["`count`".into()],
        ),
        ("not yaml", "flags: [", vec![F.into()]),
        ("not a mapping", "- a\n- b\n", vec![F.into()]),
        (
            "wrong type",
            "flags: {failOnInitError: maybe}",
            vec![F.into(), "line 1".into()],
        ),
        (
            "two documents",
            "version: v1\n---\nversion: v1\n",
            vec![F.into()],
        ),
        (
            "duplicate key",
            "version: v1\nversion: v1\n",
            vec![F.into(), "duplicate".into()],
        ),
        (
            "version",
            "version: v2\n",
            vec![
                at(1),
                "unsupported config version \"v2\" (valid: v1)".into(),
            ],
        ),
        (
            "mig",
            "flags:\n  migStrategy: all\n",
            vec![
                at(2),
                "flags.migStrategy: unknown MIG strategy \"all\" (valid: none, single, mixed)"
                    .into(),
            ],
        ),
        (
            "id strategy",
            "flags: {plugin: {deviceIDStrategy: serial}}",
            vec![
                at(1),
                "flags.plugin.deviceIDStrategy".into(),
                "uuid, index".into(),
            ],
        ),
        (
            "strategy",
            "flags: {plugin: {deviceListStrategy: [envvar, nope]}}",
            vec![
                at(1),
                "flags.plugin.deviceListStrategy".into(),
                "\"nope\"".into(),
                "cdi-cri".into(),
            ],
        ),
        (
            "empty strategies",
            "flags:\n  plugin:\n    deviceListStrategy: []\n",
            vec![at(3), "empty device list strategy".into()],
        ),
        (
            "strategy number",
            "flags: {plugin: {deviceListStrategy: 1}}",
            vec![F.into(), "device list strategy".into()],
        ),
        (
            "gds not a boolean",
            "flags:\n  gdsEnabled: sometimes\n",
            vec!["invalid boolean at line 2".into()],
        ),
        (
            "tegra",
            "flags: {deviceDiscoveryStrategy: tegra}",
            vec![
                at(1),
                "flags.deviceDiscoveryStrategy".into(),
                "\"tegra\"".into(),
                "auto, nvml".into(),
            ],
        ),
        (
            "packed",
            "flags: {plugin: {sharedDevicesAllocationPolicy: packed}}",
            vec![
                at(1),
                "\"packed\" is not supported".into(),
                "distributed".into(),
            ],
        ),
        (
            "imex channels NVIDIA refuses too",
            "imex:\n  channelIDs: [0, 1]\n",
            vec![
                at(2),
                "imex.channelIDs: [0, 1] is not a valid channel list".into(),
                "[] or [0]".into(),
            ],
        ),
        (
            "resource naming",
            "resources:\n  gpus:\n  - pattern: '*'\n    name: gpu\n",
            vec![
                at(2),
                "resources: resource renaming is not supported".into(),
            ],
        ),
        (
            "mps without a root",
            "sharing:\n  mps:\n    resources: [{name: nvidia.com/gpu, replicas: 2}]\n",
            vec![
                at(3),
                "sharing.mps needs an MPS root: set --mps-root, MPS_ROOT or flags.mpsRoot".into(),
            ],
        ),
        (
            "mps with an empty root",
            "flags: {mpsRoot: ''}\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}}",
            vec![at(2), "sharing.mps needs an MPS root".into()],
        ),
        (
            "mps root relative",
            "flags:\n  mpsRoot: run/mps\n",
            vec![at(2), "flags.mpsRoot: \"run/mps\" is not an absolute path".into()],
        ),
        (
            "mps and time-slicing",
            "sharing:\n  timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
            vec![
                at(2),
                format!("sharing.timeSlicing and sharing.mps ({F}:3) are both set"),
                "NVIDIA's plugin silently uses sharing.mps".into(),
            ],
        ),
        (
            "mps with mixed MIG",
            "flags: {migStrategy: mixed, mpsRoot: /mps}\nsharing:\n  mps: {resources: [{name: nvidia.com/gpu, replicas: 2}]}\n",
            vec![
                at(3),
                "sharing.mps cannot be used with mig-strategy=mixed".into(),
            ],
        ),
        (
            "mps replicas 1",
            "flags: {mpsRoot: /mps}\nsharing:\n  mps:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
            vec![
                at(6),
                "sharing.mps.resources: \"nvidia.com/gpu\": replicas 1 is out of range (valid: 2 to 4294967295)".into(),
            ],
        ),
        (
            "mps no resources",
            "flags: {mpsRoot: /mps}\nsharing:\n  mps: {renameByDefault: true}\n",
            vec![at(3), "sharing.mps.resources is empty".into()],
        ),
        (
            "mps resource name",
            "flags: {mpsRoot: /mps}\nsharing: {mps: {resources: [{name: nvidia.com/gpus, replicas: 2}]}}",
            vec!["sharing.mps.resources: cannot share \"nvidia.com/gpus\"".into()],
        ),
        (
            "mps of a MIG profile",
            "flags: {mpsRoot: /mps}\nsharing:\n  mps:\n    resources:\n    - {name: nvidia.com/mig-1g.10gb, replicas: 2}\n",
            vec![
                at(5),
                "sharing.mps.resources: cannot share \"nvidia.com/mig-1g.10gb\" (valid: nvidia.com/gpu)".into(),
            ],
        ),
        (
            "mps unknown key",
            "flags: {mpsRoot: /mps}\nsharing: {mps: {resources: [{name: nvidia.com/gpu, replicas: 2}], replicas: 2}}",
            vec![F.into(), "unknown field `replicas`".into()],
        ),
        (
            "no resources",
            "sharing:\n  timeSlicing:\n    renameByDefault: true\n",
            vec![at(3), "sharing.timeSlicing.resources is empty".into()],
        ),
        (
            "empty resources",
            "sharing: {timeSlicing: {resources: []}}",
            vec![at(1), "sharing.timeSlicing.resources is empty".into()],
        ),
        (
            "replicas 1",
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 1\n",
            vec![
                at(5),
                "\"nvidia.com/gpu\": replicas 1 is out of range (valid: 2 to 4294967295)".into(),
            ],
        ),
        (
            "replicas negative",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: -3}]}}",
            vec!["replicas -3 is out of range".into()],
        ),
        (
            "replicas too many",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 4294967296}]}}",
            vec!["replicas 4294967296".into()],
        ),
        (
            "replicas missing",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu}]}}",
            vec![F.into(), "replicas".into()],
        ),
        (
            "resource name",
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpus\n      replicas: 2\n",
            vec![
                at(4),
                "cannot share \"nvidia.com/gpus\"".into(),
                "nvidia.com/gpu, nvidia.com/mig-<profile>".into(),
            ],
        ),
        (
            "empty mig profile",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/mig-, replicas: 2}]}}",
            vec!["cannot share \"nvidia.com/mig-\"".into()],
        ),
        (
            "other vendor",
            "sharing: {timeSlicing: {resources: [{name: amd.com/gpu, replicas: 2}]}}",
            vec!["cannot share \"amd.com/gpu\"".into()],
        ),
        (
            "duplicate resource",
            "sharing:\n  timeSlicing:\n    resources:\n    - {name: nvidia.com/gpu, replicas: 2}\n    - {name: nvidia.com/gpu, replicas: 3}\n",
            vec![at(5), "\"nvidia.com/gpu\" is listed twice".into()],
        ),
        (
            "devices count",
            "sharing:\n  timeSlicing:\n    resources:\n    - name: nvidia.com/gpu\n      replicas: 2\n      devices: 2\n",
            vec![at(6), "nvshim supports only `devices: all`".into()],
        ),
        (
            "devices list",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: [0, '1:2', GPU-1]}]}}",
            vec!["only `devices: all`".into()],
        ),
        (
            "devices word",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, devices: some}]}}",
            vec!["only `devices: all`".into()],
        ),
        (
            "rename",
            "sharing: {timeSlicing: {resources: [{name: nvidia.com/gpu, replicas: 2, rename: gpu-shared}]}}",
            vec![
                at(1),
                "rename \"gpu-shared\" is not supported by nvshim".into(),
                "no per-resource rename".into(),
            ],
        ),
    ];
    for (case, yaml, want) in cases {
        let want: Vec<&str> = want.iter().map(String::as_str).collect();
        assert_error(case, settings(&[], &[], Some(yaml)), &want);
    }
}

#[test]
fn file_errors_are_single_line() {
    let message = parse_file(
        b"flags:\n  migStratgy: mixed\n",
        std::path::Path::new("/c.yaml"),
    )
    .expect_err("unknown key")
    .to_string();
    assert!(!message.contains('\n'), "{message:?}");
}

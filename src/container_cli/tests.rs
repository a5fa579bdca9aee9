#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use clap::Parser;

use super::list::{self, ListArgs, Selected};
use super::*;
use crate::discover::{DeviceNode, FileKind, HostFile, HostResources};

fn parse(args: &str) -> Result<ContainerCli, clap::Error> {
    ContainerCli::try_parse_from(std::iter::once(BINARY).chain(args.split_whitespace()))
}

#[test]
fn nvidia_global_options_parse_as_argp_takes_them() {
    // (case, argv, check)
    type Check = fn(&ContainerCli) -> bool;
    let cases: [(&str, &str, Check); 7] = [
        (
            "hook's line",
            "--load-kmods --debug=/dev/stderr --ldcache=/etc/ld.so.cache --user=0:0 --root=/run/nvidia/driver --no-pivot --no-create-imex-channels info",
            |c| {
                c.load_kmods
                    && c.no_pivot
                    && c.no_create_imex_channels
                    && c.debug == Some(PathBuf::from("/dev/stderr"))
                    && c.user.as_deref() == Some("0:0")
                    && c.root == Some(PathBuf::from("/run/nvidia/driver"))
                    && matches!(c.command, Some(Command::Info(_)))
            },
        ),
        (
            "short forms",
            "-k -n -r /d -l /etc/ld.so.cache -d /tmp/log list",
            |c| {
                c.load_kmods
                    && c.no_pivot
                    && c.root == Some(PathBuf::from("/d"))
                    && matches!(c.command, Some(Command::List(_)))
            },
        ),
        ("--user without a value", "--user info", |c| {
            c.user.as_deref() == Some("")
        }),
        ("-V", "-V", |c| c.version && c.command.is_none()),
        (
            "info --csv",
            "info --csv",
            |c| matches!(&c.command, Some(Command::Info(a)) if a.csv),
        ),
        (
            "list flags",
            "list -d 0 --device=GPU-1 -l -b -i -f --compat32 --imex-channel=1,2 --no-persistenced --no-fabricmanager",
            |c| {
                matches!(&c.command, Some(Command::List(a)) if a.device == ["0", "GPU-1"]
                && a.libraries && a.binaries && a.ipcs && a.firmwares && a.compat32
                && a.imex_channel == ["1,2"] && a.no_persistenced && a.no_fabricmanager)
            },
        ),
        (
            "configure takes anything",
            "--load-kmods configure --ldconfig=@/sbin/ldconfig --device=0 --compute --pid=1 /rootfs",
            |c| matches!(&c.command, Some(Command::Configure(a)) if a.args.len() == 5),
        ),
    ];
    for (name, argv, check) in cases {
        let cli = parse(argv).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(check(&cli), "{name}: {cli:?}");
    }
}

#[test]
fn bad_options_are_rejected_with_the_valid_form() {
    let mut out = Vec::new();
    let cases = [
        ("bad user", "--user=root info", "invalid --user \"root\""),
        (
            "other ldcache",
            "--ldcache=/tmp/ld.so.cache info",
            "--ldcache /tmp/ld.so.cache is not supported",
        ),
        (
            "configure",
            "configure --pid=1 /r",
            "configure is not part of nvshim",
        ),
        (
            "no command",
            "-k",
            "missing command (valid: info, list, configure",
        ),
        (
            "mig-config",
            "list --mig-config=0",
            "invalid --mig-config \"0\": \"0\" is not supported (the only value is all",
        ),
        (
            "imex",
            "list --imex-channel=x",
            "invalid --imex-channel \"x\"",
        ),
    ];
    for (name, argv, want) in cases {
        let cli = parse(argv).unwrap_or_else(|e| panic!("{name}: {e}"));
        let err = run(&cli, &mut out).expect_err(name).to_string();
        assert!(err.contains(want), "{name}: {err}");
    }
    assert!(parse("--frobnicate info").is_err(), "unknown option");
    assert!(out.is_empty());
}

#[test]
fn version_lines_are_nvidias_keys() {
    let mut out = Vec::new();
    run(&parse("--version").unwrap(), &mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        text.starts_with(&format!("cli-version: {version}\nlib-version: {version}\n")),
        "{text}"
    );
    assert!(text.contains("build platform: "), "{text}");
}

#[test]
fn bus_location_has_nvidias_eight_digit_domain() {
    for (name, ours, nvidia) in [
        ("sysfs form", "0000:07:00.0", "00000000:07:00.0"),
        ("upper case", "0001:3B:00.0", "00000001:3b:00.0"),
        ("not a bus id", "weird", "weird"),
    ] {
        assert_eq!(info::bus_location(ours), nvidia, "{name}");
    }
}

#[test]
fn no_option_lists_everything_as_nvidia_does() {
    let all = Selected {
        devices: Some("all".into()),
        libraries: true,
        binaries: true,
        ipcs: true,
        firmwares: true,
        compat32: true,
    };
    let none = Selected {
        devices: None,
        libraries: false,
        binaries: false,
        ipcs: false,
        firmwares: false,
        compat32: false,
    };
    let cases = [
        ("nothing", ListArgs::default(), all.clone()),
        (
            "imex only",
            ListArgs {
                imex_channel: vec!["0".into()],
                ..Default::default()
            },
            all,
        ),
        (
            "libraries only",
            ListArgs {
                libraries: true,
                ..Default::default()
            },
            Selected {
                libraries: true,
                ..none.clone()
            },
        ),
        (
            "devices joined",
            ListArgs {
                device: vec!["0".into(), "1".into()],
                ..Default::default()
            },
            Selected {
                devices: Some("0,1".into()),
                ..none
            },
        ),
    ];
    for (name, args, want) in cases {
        assert_eq!(list::selected(&args), want, "{name}");
    }
}

fn file(kind: FileKind, path: &str) -> HostFile {
    HostFile {
        kind,
        path: PathBuf::from(path),
        host_path: PathBuf::from(format!("/drv{path}")),
        links: Vec::new(),
        ldcache: None,
    }
}

#[test]
fn list_prints_nvidias_sections_in_nvidias_order() {
    let resources = HostResources {
        device_nodes: vec![DeviceNode {
            path: "/dev/nvidiactl".into(),
            host_path: "/node/dev/nvidiactl".into(),
            major: 195,
            minor: 255,
            mode: 0o666,
            uid: 0,
            gid: 0,
        }],
        files: vec![
            file(FileKind::Library, "/usr/lib/libcuda.so.1.2"),
            file(FileKind::Binary, "/usr/bin/nvidia-smi"),
            file(FileKind::Config, "/etc/vulkan/icd.d/nvidia_icd.json"),
            file(FileKind::Socket, "/run/nvidia-persistenced/socket"),
            file(FileKind::IpcDir, "/tmp/nvidia-mps"),
            file(FileKind::Firmware, "/lib/firmware/nvidia/1.2/gsp.bin"),
        ],
        missing: Vec::new(),
        links: Vec::new(),
    };
    let args = ListArgs {
        no_persistenced: true,
        ..Default::default()
    };
    let mut what = list::selected(&ListArgs::default());
    let mut out = Vec::new();
    list::write(&what, &[3], &args, &resources, &mut out).unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "/dev/nvidiactl\n/dev/nvidia-caps-imex-channels/channel3\n/drv/usr/bin/nvidia-smi\n\
         /drv/usr/lib/libcuda.so.1.2\n/drv/tmp/nvidia-mps\n/drv/lib/firmware/nvidia/1.2/gsp.bin\n"
    );
    what.devices = None;
    what.binaries = false;
    let mut out = Vec::new();
    list::write(&what, &[], &ListArgs::default(), &resources, &mut out).unwrap();
    assert!(
        String::from_utf8(out)
            .unwrap()
            .starts_with("/drv/usr/lib/libcuda.so.1.2\n/drv/run/nvidia-persistenced/socket\n"),
        "no devices, no binaries, persistenced kept"
    );
}

#[test]
fn mig_access_lists_the_proc_file_then_new_nodes() {
    let node = |minor: u64| DeviceNode {
        path: format!("/dev/nvidia-caps/nvidia-cap{minor}").into(),
        host_path: format!("/node/dev/nvidia-caps/nvidia-cap{minor}").into(),
        major: 511,
        minor,
        mode: 0o444,
        uid: 0,
        gid: 0,
    };
    let printed = HostResources {
        device_nodes: vec![node(12)],
        ..HostResources::default()
    };
    let config = HostResources {
        device_nodes: vec![node(1), node(12), node(13)],
        ..HostResources::default()
    };
    let monitor = HostResources {
        device_nodes: vec![node(2), node(13)],
        ..HostResources::default()
    };
    let mut out = Vec::new();
    list::write_mig_access(
        &[("config", config), ("monitor", monitor)],
        &printed,
        &mut out,
    )
    .unwrap();
    assert_eq!(
        String::from_utf8(out).unwrap(),
        "/proc/driver/nvidia/capabilities/mig/config\n/dev/nvidia-caps/nvidia-cap1\n\
         /dev/nvidia-caps/nvidia-cap13\n/proc/driver/nvidia/capabilities/mig/monitor\n\
         /dev/nvidia-caps/nvidia-cap2\n",
        "each node once, the --device section's nodes not again"
    );
}

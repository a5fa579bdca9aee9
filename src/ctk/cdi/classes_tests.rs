//! Class-mode specs on a host built in a tempdir (`mknod` needs root, as the tests run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs;
use std::path::Path;

use nix::sys::stat::{Mode, SFlag, makedev, mknod};

use super::*;

fn node(root: &Path, path: &str, major: u64, minor: u64) {
    let path = root.join(path);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    mknod(
        &path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(major, minor),
    )
    .unwrap();
    fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o666)).unwrap();
}

/// A host with every class: the dev root and the driver root in one directory.
fn host() -> (tempfile::TempDir, Roots) {
    let dir = tempfile::tempdir().unwrap();
    let r = dir.path();
    node(r, "dev/nvidia-fs0", 243, 0);
    node(r, "dev/nvidia-fs1", 243, 1);
    node(r, "dev/infiniband/uverbs0", 231, 192);
    node(r, "dev/infiniband/rdma_cm", 10, 58);
    node(r, "dev/gdrdrv", 236, 0);
    node(r, "dev/nvidia-nvswitchctl", 507, 255);
    node(r, "dev/nvidia-nvswitch0", 507, 0);
    node(r, "dev/nvidia-caps-imex-channels/channel0", 506, 0);
    node(r, "dev/nvidia-caps-imex-channels/channel3", 506, 3);
    fs::write(r.join("dev/nvidia-caps-imex-channels/README"), "").unwrap();
    fs::create_dir_all(r.join("etc")).unwrap();
    fs::write(r.join("etc/cufile.json"), "{}\n").unwrap();
    fs::create_dir_all(r.join("run/udev/data")).unwrap();
    let roots = Roots {
        driver: r.to_path_buf(),
        dev: r.to_path_buf(),
        proc: r.to_path_buf(),
    };
    (dir, roots)
}

fn spec(mode: &str, roots: &Roots, all: bool, ids: &[&str]) -> Result<Spec, ClassSpecError> {
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    generate(
        ClassMode::parse(mode).unwrap(),
        roots,
        "nvidia.com",
        "gpu",
        all,
        &ids,
    )
}

/// (kind, each device as "name: node paths | mount paths").
fn shape(spec: &Spec) -> (String, Vec<String>) {
    let devices = spec
        .devices
        .iter()
        .map(|d| {
            let nodes: Vec<&str> = d
                .container_edits
                .device_nodes
                .iter()
                .map(|n| n.path.as_str())
                .collect();
            let mounts: Vec<&str> = d
                .container_edits
                .mounts
                .iter()
                .map(|m| m.container_path.as_str())
                .collect();
            format!("{}: {} | {}", d.name, nodes.join(" "), mounts.join(" "))
        })
        .collect();
    (spec.kind.clone(), devices)
}

/// mode, `all` device, `--device-id`, kind, devices.
type Case = (
    &'static str,
    bool,
    &'static [&'static str],
    &'static str,
    &'static [&'static str],
);

#[test]
fn each_mode_has_nvidias_kind_and_devices() {
    let (_dir, roots) = host();
    let cases: [Case; 7] = [
        (
            "gds",
            true,
            &[],
            "nvidia.com/gds",
            &["all: /dev/nvidia-fs0 /dev/nvidia-fs1 | /etc/cufile.json /run/udev"],
        ),
        (
            "mofed",
            true,
            &[],
            "nvidia.com/mofed",
            &["all: /dev/infiniband/rdma_cm /dev/infiniband/uverbs0 | "],
        ),
        (
            "gdrcopy",
            true,
            &[],
            "nvidia.com/gdrcopy",
            &["all: /dev/gdrdrv | "],
        ),
        (
            "nvswitch",
            true,
            &[],
            "nvidia.com/nvswitch",
            &["all: /dev/nvidia-nvswitch0 /dev/nvidia-nvswitchctl | "],
        ),
        (
            "imex",
            true,
            &[],
            "nvidia.com/imex-channel",
            &[
                "0: /dev/nvidia-caps-imex-channels/channel0 | ",
                "3: /dev/nvidia-caps-imex-channels/channel3 | ",
                "all: /dev/nvidia-caps-imex-channels/channel0 /dev/nvidia-caps-imex-channels/channel3 | ",
            ],
        ),
        (
            "imex",
            false,
            &["channel3"],
            "nvidia.com/imex-channel",
            &["3: /dev/nvidia-caps-imex-channels/channel3 | "],
        ),
        (
            "gds",
            false,
            &["all"],
            "nvidia.com/gds",
            &["all: /dev/nvidia-fs0 /dev/nvidia-fs1 | /etc/cufile.json /run/udev"],
        ),
    ];
    for (mode, all, ids, kind, devices) in cases {
        let spec =
            spec(mode, &roots, all, ids).unwrap_or_else(|e| panic!("case {mode} {ids:?}: {e}"));
        let (got_kind, got) = shape(&spec);
        assert_eq!(got_kind, kind, "case {mode} {ids:?}");
        assert_eq!(got, devices, "case {mode} {ids:?}");
    }
}

/// The GDS spec in full: nodes with the host's numbers and a cgroup permission, the
/// two files mounted as NVIDIA mounts them (in our stable order: by depth, then path).
#[test]
fn gds_spec_golden() {
    let (dir, roots) = host();
    let spec = spec("gds", &roots, true, &[]).unwrap();
    let json = serde_json::to_string_pretty(&spec)
        .unwrap()
        .replace(&dir.path().display().to_string(), "<root>");
    let want = r#"{
  "cdiVersion": "0.5.0",
  "kind": "nvidia.com/gds",
  "devices": [
    {
      "name": "all",
      "containerEdits": {
        "deviceNodes": [
          {
            "path": "/dev/nvidia-fs0",
            "hostPath": "<root>/dev/nvidia-fs0",
            "type": "c",
            "major": 243,
            "minor": 0,
            "fileMode": 438,
            "permissions": "rwm"
          },
          {
            "path": "/dev/nvidia-fs1",
            "hostPath": "<root>/dev/nvidia-fs1",
            "type": "c",
            "major": 243,
            "minor": 1,
            "fileMode": 438,
            "permissions": "rwm"
          }
        ],
        "mounts": [
          {
            "hostPath": "<root>/etc/cufile.json",
            "containerPath": "/etc/cufile.json",
            "type": "bind",
            "options": [
              "ro",
              "nosuid",
              "nodev",
              "rbind",
              "rprivate"
            ]
          },
          {
            "hostPath": "<root>/run/udev",
            "containerPath": "/run/udev",
            "type": "bind",
            "options": [
              "ro",
              "nosuid",
              "nodev",
              "rbind",
              "rprivate"
            ]
          }
        ]
      }
    }
  ]
}"#;
    assert_eq!(json, want);
}

#[test]
fn failures_name_what_was_looked_for() {
    let (_dir, roots) = host();
    let empty = tempfile::tempdir().unwrap();
    let bare = Roots {
        driver: empty.path().to_path_buf(),
        dev: empty.path().to_path_buf(),
        proc: empty.path().to_path_buf(),
    };
    let cases: [(&str, &Roots, &[&str], &[&str]); 6] = [
        ("gds", &bare, &[], &["/dev/nvidia-fs*", "--mode gds"]),
        ("imex", &bare, &[], &["channel*"]),
        ("nvswitch", &bare, &[], &["nvidia-nvswitchctl"]),
        ("imex", &roots, &["7"], &["IMEX channel 7", "channel7"]),
        ("imex", &roots, &["x"], &["\"x\"", "0-1048575"]),
        ("gdrcopy", &roots, &["0"], &["\"0\"", "all"]),
    ];
    for (mode, roots, ids, parts) in cases {
        let err = spec(mode, roots, true, ids).expect_err(mode).to_string();
        for part in parts {
            assert!(
                err.contains(part),
                "case {mode} {ids:?}: {err:?} lacks {part:?}"
            );
        }
    }
    // Without an nvidia-fs node GDS's files are not mounted, as NVIDIA's discoverer has it.
    let partial = tempfile::tempdir().unwrap();
    fs::create_dir_all(partial.path().join("etc")).unwrap();
    fs::write(partial.path().join("etc/cufile.json"), "{}").unwrap();
    node(partial.path(), "dev/gdrdrv", 236, 0);
    let roots = Roots {
        driver: partial.path().to_path_buf(),
        dev: partial.path().to_path_buf(),
        proc: partial.path().to_path_buf(),
    };
    assert!(matches!(
        spec("gds", &roots, true, &[]),
        Err(ClassSpecError::Nothing { .. })
    ));
}

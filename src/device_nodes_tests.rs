// SPDX-License-Identifier: Apache-2.0
//! Device nodes and `/dev/char` links in a tempdir (mknod needs root, as the tests run).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

const PROC_DEVICES: &str = "Character devices:\n  1 mem\n195 nvidia-frontend\n\
    508 nvidia-caps\n511 nvidia-uvm\n\nBlock devices:\n  7 loop\n195 notachar\n";

fn mk(dir: &Path, name: &str, major: u32, minor: u32) -> PathBuf {
    let path = dir.join(name);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    mknod(
        &path,
        SFlag::S_IFCHR,
        Mode::from_bits_truncate(0o666),
        makedev(major.into(), minor.into()),
    )
    .unwrap();
    path
}

fn node(path: PathBuf, major: u32, minor: u32) -> Node {
    Node { path, major, minor }
}

#[test]
fn proc_devices_character_section_only() {
    assert_eq!(
        parse_proc_devices(PROC_DEVICES),
        [
            (1, "mem".to_owned()),
            (195, "nvidia-frontend".to_owned()),
            (508, "nvidia-caps".to_owned()),
            (511, "nvidia-uvm".to_owned()),
        ]
    );
}

#[test]
fn majors_need_the_gpu_major_and_say_where_they_looked() {
    let tmp = tempfile::tempdir().unwrap();
    fs::create_dir(tmp.path().join("proc")).unwrap();
    let missing = majors(tmp.path()).unwrap_err().to_string();
    assert!(missing.contains("proc/devices"), "{missing}");
    fs::write(
        tmp.path().join("proc/devices"),
        "Character devices:\n  1 mem\n",
    )
    .unwrap();
    let none = majors(tmp.path()).unwrap_err().to_string();
    assert!(
        none.contains("nvidia-frontend, nvidia") && none.contains("--load-kernel-modules"),
        "{none}"
    );
    fs::write(
        tmp.path().join("proc/devices"),
        "Character devices:\n195 nvidia\n",
    )
    .unwrap();
    assert_eq!(
        majors(tmp.path()).unwrap(),
        Majors {
            gpu: 195,
            uvm: None,
            caps: None
        }
    );
}

#[test]
fn existing_lists_only_nvidia_character_devices() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    let ctl = mk(&dev, "nvidiactl", 195, 255);
    let gpu = mk(&dev, "nvidia0", 195, 0);
    let cap = mk(&dev, "nvidia-caps/nvidia-cap1", 508, 1);
    mk(&dev, "null", 1, 3);
    fs::write(dev.join("nvidia-notanode"), "").unwrap();
    std::os::unix::fs::symlink(&gpu, dev.join("nvidia-link")).unwrap();
    assert_eq!(
        existing(tmp.path()).unwrap(),
        [node(cap, 508, 1), node(gpu, 195, 0), node(ctl, 195, 255)]
    );
    let empty = tempfile::tempdir().unwrap();
    assert_eq!(existing(empty.path()).unwrap(), []);
}

#[test]
fn links_are_relative_under_the_same_dev_and_absolute_elsewhere() {
    let cases = [
        ("/dev/char", "/dev/nvidia0", "../nvidia0"),
        (
            "/dev/char",
            "/dev/nvidia-caps/nvidia-cap1",
            "../nvidia-caps/nvidia-cap1",
        ),
        (
            "/host/dev/char",
            "/run/nvidia/driver/dev/nvidia0",
            "/run/nvidia/driver/dev/nvidia0",
        ),
    ];
    for (dir, node, want) in cases {
        assert_eq!(
            link_target(Path::new(dir), Path::new(node)),
            PathBuf::from(want),
            "{dir} {node}"
        );
    }
}

#[test]
fn create_links_is_idempotent_and_fixes_wrong_links() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    mk(&dev, "nvidia0", 195, 0);
    let ctl = mk(&dev, "nvidiactl", 195, 255);
    let nodes = existing(tmp.path()).unwrap();
    let dev_char = dev.join("char");

    let dry = create_links(&dev_char, &nodes, true).unwrap();
    assert!(
        dry.iter().all(|(_, _, o)| *o == Outcome::WouldCreate),
        "{dry:?}"
    );
    assert!(!dev_char.exists(), "dry run creates nothing");

    let first = create_links(&dev_char, &nodes, false).unwrap();
    assert!(
        first.iter().all(|(_, _, o)| *o == Outcome::Created),
        "{first:?}"
    );
    assert_eq!(
        fs::read_link(dev_char.join("195:0")).unwrap(),
        Path::new("../nvidia0")
    );
    let resolved = fs::metadata(dev_char.join("195:255")).unwrap();
    assert_eq!(resolved.rdev(), fs::metadata(&ctl).unwrap().rdev());

    let again = create_links(&dev_char, &nodes, false).unwrap();
    assert!(
        again.iter().all(|(_, _, o)| *o == Outcome::Unchanged),
        "{again:?}"
    );

    fs::remove_file(dev_char.join("195:0")).unwrap();
    std::os::unix::fs::symlink("../elsewhere", dev_char.join("195:0")).unwrap();
    let fixed = create_links(&dev_char, &nodes[..1], false).unwrap();
    assert_eq!(fixed[0].2, Outcome::Replaced, "{fixed:?}");
    assert_eq!(
        fs::read_link(dev_char.join("195:0")).unwrap(),
        Path::new("../nvidia0")
    );
    let leftovers: Vec<_> = fs::read_dir(&dev_char)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "temp links left: {leftovers:?}");

    fs::create_dir(dev_char.join("195:255.d")).unwrap();
    fs::remove_file(dev_char.join("195:255")).unwrap();
    fs::rename(dev_char.join("195:255.d"), dev_char.join("195:255")).unwrap();
    fs::write(dev_char.join("195:255/x"), "").unwrap();
    let blocked = create_links(&dev_char, &nodes, false)
        .unwrap_err()
        .to_string();
    assert!(blocked.contains("195:255"), "{blocked}");
}

fn proc_tree(root: &Path, minors: &[u32]) {
    let nvidia = root.join("proc/driver/nvidia");
    fs::create_dir_all(nvidia.join("gpus")).unwrap();
    fs::write(root.join("proc/devices"), PROC_DEVICES).unwrap();
    fs::write(
        nvidia.join("version"),
        "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  Tue Mar  5 22:23:56 UTC 2024\n",
    )
    .unwrap();
    for (i, minor) in minors.iter().enumerate() {
        let dir = nvidia.join(format!("gpus/0000:0{i}:00.0"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("information"),
            format!(
                "Model: \t\t NVIDIA A100\nGPU UUID: \t GPU-{i}0000000-0000-0000-0000-000000000000\n\
                 Bus Location: \t 0000:0{i}:00.0\nDevice Minor: \t {minor}\n"
            ),
        )
        .unwrap();
    }
    fs::create_dir_all(root.join("proc/driver/nvidia-caps")).unwrap();
    fs::write(
        root.join("proc/driver/nvidia-caps/mig-minors"),
        "config 1\nmonitor 2\ngpu0/gi1/access 12\ngpu0/gi1/ci0/access 13\ngpu3/gi1/access 66\n",
    )
    .unwrap();
}

#[test]
fn all_possible_uses_the_drivers_minors_and_majors() {
    let tmp = tempfile::tempdir().unwrap();
    proc_tree(tmp.path(), &[0, 2]);
    let possible = all_possible(tmp.path(), tmp.path()).unwrap();
    let dev = tmp.path().join("dev");
    let names: Vec<(String, String)> = possible
        .nodes
        .iter()
        .map(|n| {
            (
                n.path.strip_prefix(&dev).unwrap().display().to_string(),
                n.dev_char_name(),
            )
        })
        .collect();
    let want = [
        ("nvidia-caps/nvidia-cap1", "508:1"),
        ("nvidia-caps/nvidia-cap12", "508:12"),
        ("nvidia-caps/nvidia-cap13", "508:13"),
        ("nvidia-caps/nvidia-cap2", "508:2"),
        ("nvidia-modeset", "195:254"),
        ("nvidia-uvm", "511:0"),
        ("nvidia-uvm-tools", "511:1"),
        ("nvidia0", "195:0"),
        ("nvidia2", "195:2"),
        ("nvidiactl", "195:255"),
    ];
    let mut got = names.clone();
    got.sort();
    let mut want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| ((*a).to_owned(), (*b).to_owned()))
        .collect();
    want.sort();
    assert_eq!(got, want, "GPU 3's capability is not this host's");
    assert!(possible.skipped.is_empty(), "{:?}", possible.skipped);

    fs::write(
        tmp.path().join("proc/devices"),
        "Character devices:\n195 nvidia\n",
    )
    .unwrap();
    let without_uvm = all_possible(tmp.path(), tmp.path()).unwrap();
    assert!(
        without_uvm.nodes.iter().all(|n| n.major == 195),
        "{without_uvm:?}"
    );
    assert_eq!(without_uvm.skipped.len(), 2, "{:?}", without_uvm.skipped);
}

#[test]
fn create_nodes_makes_missing_ones_and_refuses_impostors() {
    let tmp = tempfile::tempdir().unwrap();
    let dev = tmp.path().join("dev");
    mk(&dev, "nvidiactl", 195, 255);
    let majors = Majors {
        gpu: 195,
        uvm: Some(511),
        caps: None,
    };
    let (nodes, skipped) = control_nodes(tmp.path(), &majors);
    assert!(skipped.is_empty());
    let dry = create_nodes(&nodes, true).unwrap();
    assert_eq!(
        dry.iter().map(|(_, o)| *o).collect::<Vec<_>>(),
        [
            Outcome::Unchanged,
            Outcome::WouldCreate,
            Outcome::WouldCreate,
            Outcome::WouldCreate
        ]
    );
    assert!(!dev.join("nvidia-uvm").exists());
    create_nodes(&nodes, false).unwrap();
    let uvm = fs::symlink_metadata(dev.join("nvidia-uvm-tools")).unwrap();
    assert!(uvm.file_type().is_char_device());
    assert_eq!(uvm.rdev(), makedev(511, 1));
    assert_eq!(uvm.permissions().mode() & 0o777, 0o666);
    assert!(
        create_nodes(&nodes, false)
            .unwrap()
            .iter()
            .all(|(_, o)| *o == Outcome::Unchanged)
    );

    fs::remove_file(dev.join("nvidia-modeset")).unwrap();
    fs::write(dev.join("nvidia-modeset"), "").unwrap();
    let err = create_nodes(&nodes, false).unwrap_err().to_string();
    assert!(
        err.contains("nvidia-modeset") && err.contains("c 195:254"),
        "{err}"
    );
}

#[test]
fn dry_run_module_loading_runs_nothing() {
    assert_eq!(
        load_kernel_modules(true).unwrap(),
        [
            "modprobe nvidia",
            "modprobe nvidia-uvm",
            "modprobe nvidia-modeset"
        ]
    );
}

use std::fs;
use std::path::Path;

use super::*;
use crate::discover::csv::CsvFiles;
use crate::rootfs::elf;
use crate::roots::Roots;

const MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    183
} else {
    62
};

fn node(root: &Path) -> (Context, CsvSource) {
    let tegra = root.join("usr/lib/tegra");
    fs::create_dir_all(&tegra).unwrap();
    fs::write(
        tegra.join("libcuda.so.1.1"),
        elf::tiny_so("libcuda.so.1", MACHINE),
    )
    .unwrap();
    let csv = root.join("drivers.csv");
    fs::write(&csv, "lib, /usr/lib/tegra/libcuda.so.1.1\ndev, /dev/null\n").unwrap();
    let ctx = Context {
        roots: Roots {
            driver: root.to_path_buf(),
            dev: "/".into(),
            proc: root.to_path_buf(),
        },
        ..Context::default()
    };
    let source = CsvSource {
        files: CsvFiles::Listed(vec![csv]),
        ignore: Vec::new(),
    };
    (ctx, source)
}

fn hooks(spec: &Spec, device: usize) -> Vec<String> {
    spec.devices[device]
        .container_edits
        .hooks
        .iter()
        .map(|h| h.args.join(" "))
        .collect()
}

#[test]
fn one_device_and_all_in_nvidias_shape() {
    let tmp = tempfile::tempdir().unwrap();
    let (ctx, source) = node(tmp.path());
    let options = Options {
        hook_path: "/usr/bin/nvidia-cdi-hook".into(),
        ..Options::default()
    };
    let spec = generate(&ctx, &options, &NvidiaHooks::default(), &source).unwrap();
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["0", "all"], "no UUID name for the iGPU");
    assert_eq!(
        spec.devices[0].container_edits,
        spec.devices[1].container_edits
    );
    let edits = &spec.devices[0].container_edits;
    assert_eq!(edits.device_nodes[0].path, "/dev/null");
    assert_eq!(
        edits.mounts[0].container_path,
        "/usr/lib/tegra/libcuda.so.1.1"
    );
    assert_eq!(
        hooks(&spec, 0),
        [
            "nvidia-cdi-hook create-symlinks --link libcuda.so.1::/usr/lib/tegra/libcuda.so \
             --link libcuda.so.1.1::/usr/lib/tegra/libcuda.so.1",
            "nvidia-cdi-hook update-ldcache --folder /usr/lib/tegra",
        ]
    );
    assert_eq!(spec.container_edits.env, ["NVIDIA_VISIBLE_DEVICES=void"]);
    assert!(spec.container_edits.hooks.is_empty());

    // type-index names gpu0; --device-id keeps only what it names; no-all-device.
    let options = Options {
        strategies: vec![NameStrategy::Uuid, NameStrategy::TypeIndex],
        all_device: false,
        ..Options::default()
    };
    let spec = generate(&ctx, &options, &NvidiaHooks::default(), &source).unwrap();
    let names: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
    assert_eq!(names, ["gpu0"]);
    assert!(
        hooks(&spec, 0)[0].contains(" link-driver "),
        "ours: {:?}",
        hooks(&spec, 0)
    );
    let options = Options {
        only: Some(["1".to_owned()].into()),
        all_device: false,
        ..Options::default()
    };
    assert!(generate(&ctx, &options, &NvidiaHooks::default(), &source).is_err());
}

#[test]
fn nothing_on_the_host_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let csv = tmp.path().join("drivers.csv");
    fs::write(&csv, "lib, /usr/lib/tegra/absent.so\n").unwrap();
    let ctx = Context {
        roots: Roots {
            driver: tmp.path().to_path_buf(),
            dev: tmp.path().to_path_buf(),
            proc: tmp.path().to_path_buf(),
        },
        ..Context::default()
    };
    let source = CsvSource {
        files: CsvFiles::Listed(vec![csv]),
        ignore: Vec::new(),
    };
    let err = generate(&ctx, &Options::default(), &NvidiaHooks::default(), &source).unwrap_err();
    assert!(
        err.to_string().contains("list nothing this host has"),
        "{err}"
    );
}

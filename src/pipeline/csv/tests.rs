use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::*;
use crate::discover::csv::CsvFiles;
use crate::request::DriverCapabilities;
use crate::roots::Roots;

/// This build's ELF machine, so the stubs get cache flags on x86_64 and aarch64 alike.
const MACHINE: u16 = if cfg!(target_arch = "aarch64") {
    183
} else {
    62
};
const TEGRA: &str = "usr/lib/aarch64-linux-gnu/tegra";

fn node(root: &Path) -> CsvSource {
    let tegra = root.join(TEGRA);
    fs::create_dir_all(&tegra).unwrap();
    fs::write(
        tegra.join("libcuda.so.1.1"),
        elf::tiny_so("libcuda.so.1", MACHINE),
    )
    .unwrap();
    fs::write(
        tegra.join("libnvrm_gpu.so"),
        elf::tiny_so("libnvrm_gpu.so", MACHINE),
    )
    .unwrap();
    fs::write(
        tegra.join("libextra.so.2.0"),
        elf::tiny_so("libextra.so.2", MACHINE),
    )
    .unwrap();
    fs::write(tegra.join("nvidia_icd.json"), "{}").unwrap();
    symlink(
        "tegra/libnvrm_gpu.so",
        root.join("usr/lib/aarch64-linux-gnu/libnvrm_gpu.so"),
    )
    .unwrap();
    let specs = root.join("etc/nvidia-container-runtime/host-files-for-container.d");
    fs::create_dir_all(&specs).unwrap();
    fs::write(
        specs.join("drivers.csv"),
        format!(
            "lib, /{TEGRA}/libcuda.so.1.1\nsym, /usr/lib/aarch64-linux-gnu/libnvrm_gpu.so\n\
             lib, /{TEGRA}/nvidia_icd.json\n"
        ),
    )
    .unwrap();
    fs::write(
        specs.join("extra.csv"),
        format!("lib, /{TEGRA}/libextra.so.2.0\n"),
    )
    .unwrap();
    CsvSource {
        files: CsvFiles::Dir {
            path: specs,
            all: false,
        },
        ignore: Vec::new(),
    }
}

fn ctx(root: &Path) -> Context {
    Context {
        roots: Roots {
            driver: root.to_path_buf(),
            dev: root.to_path_buf(),
            proc: root.to_path_buf(),
        },
        ..Context::default()
    }
}

fn request(devices: DeviceList) -> Request {
    Request::new(devices, DriverCapabilities::default_set())
}

#[test]
fn libraries_get_cache_entries_and_soname_links() {
    let tmp = tempfile::tempdir().unwrap();
    let source = node(tmp.path());
    let plan = plan(&ctx(tmp.path()), &request(DeviceList::All), &source).unwrap();
    let mounts: Vec<&str> = plan
        .edits
        .mounts
        .iter()
        .map(|m| m.container_path.as_str())
        .collect();
    let t = format!("/{TEGRA}");
    assert_eq!(
        mounts,
        [
            format!("{t}/libcuda.so.1.1"),
            format!("{t}/libnvrm_gpu.so"),
            format!("{t}/nvidia_icd.json"),
        ],
        "extra.csv is not a base file"
    );
    let keys: Vec<(&str, &str)> = plan
        .ldcache
        .iter()
        .map(|e| (e.key.as_str(), e.value.as_str()))
        .collect();
    let (cuda1, nvrm) = (format!("{t}/libcuda.so.1"), format!("{t}/libnvrm_gpu.so"));
    assert_eq!(
        keys,
        [
            ("libcuda.so.1", cuda1.as_str()),
            ("libnvrm_gpu.so", nvrm.as_str())
        ],
        "the JSON file gets no entry"
    );
    let links: Vec<String> = plan
        .symlinks
        .iter()
        .map(|l| format!("{} -> {}", l.path.display(), l.target))
        .collect();
    assert_eq!(
        links,
        [
            "/usr/lib/aarch64-linux-gnu/libnvrm_gpu.so -> tegra/libnvrm_gpu.so".to_owned(),
            format!("{t}/libcuda.so -> libcuda.so.1"),
            format!("{t}/libcuda.so.1 -> libcuda.so.1.1"),
        ]
    );
    assert!(plan.backend.is_none() && plan.driver.is_none());
}

#[test]
fn csv_mounts_all_reads_every_file_and_void_reads_none() {
    let tmp = tempfile::tempdir().unwrap();
    let mut source = node(tmp.path());
    if let CsvFiles::Dir { all, .. } = &mut source.files {
        *all = true;
    }
    let ctx = ctx(tmp.path());
    let plan = plan(&ctx, &request(DeviceList::None), &source).unwrap();
    assert_eq!(plan.edits.mounts.len(), 4, "{:?}", plan.edits.mounts);
    assert!(plan.ldcache.iter().any(|e| e.key == "libextra.so.2"));

    // A void request reads nothing: not even a broken spec directory.
    let broken = CsvSource {
        files: CsvFiles::Listed(vec![PathBuf::from("/nonexistent/x.csv")]),
        ignore: Vec::new(),
    };
    let plan = super::plan(&ctx, &request(DeviceList::Void), &broken).unwrap();
    assert!(plan.edits.is_empty() && plan.symlinks.is_empty());
    assert!(super::plan(&ctx, &request(DeviceList::All), &broken).is_err());
}

#[test]
fn no_link_is_made_inside_a_mounted_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let source = node(tmp.path());
    let specs = tmp
        .path()
        .join("etc/nvidia-container-runtime/host-files-for-container.d");
    fs::write(specs.join("l4t.csv"), format!("dir, /{TEGRA}\n")).unwrap();
    let plan = plan(&ctx(tmp.path()), &request(DeviceList::All), &source).unwrap();
    let links: Vec<String> = plan
        .symlinks
        .iter()
        .map(|l| l.path.display().to_string())
        .collect();
    assert_eq!(links, ["/usr/lib/aarch64-linux-gnu/libnvrm_gpu.so"]);
    let values: Vec<&str> = plan.ldcache.iter().map(|e| e.value.as_str()).collect();
    let (cuda, nvrm) = (
        format!("/{TEGRA}/libcuda.so.1.1"),
        format!("/{TEGRA}/libnvrm_gpu.so"),
    );
    assert_eq!(
        values,
        [cuda.as_str(), nvrm.as_str()],
        "the host directory has no libcuda.so.1 link: the entry names the file"
    );
}

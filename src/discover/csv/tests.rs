use std::os::unix::fs::symlink;

use super::*;

fn write(path: &Path, text: &str) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(path, text).unwrap();
}

#[test]
fn only_the_base_files_unless_all() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    for name in [
        "l4t.csv",
        "drivers.csv",
        "devices.CSV",
        "extra.csv",
        ".csv",
        "notes.txt",
    ] {
        write(&dir.join(name), "dev, /dev/nvmap\n");
    }
    fs::create_dir(dir.join("sub.csv")).unwrap();
    let names = |all| -> Vec<String> {
        list(dir, all)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    };
    // `devices.CSV` is a CSV file but not the base `devices.csv` (NVIDIA compares names exactly).
    assert_eq!(names(false), ["drivers.csv", "l4t.csv"], "base files");
    assert_eq!(
        names(true),
        ["devices.CSV", "drivers.csv", "extra.csv", "l4t.csv"],
        "csv-mounts=all"
    );
    assert!(
        list(&dir.join("absent"), true).unwrap().is_empty(),
        "no directory, no files"
    );
}

#[test]
fn a_bad_line_names_file_and_line() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("drivers.csv");
    write(&path, "lib, /usr/lib/a.so\nlbi, /usr/lib/b.so\n");
    let err = load(&CsvFiles::Listed(vec![path.clone()]))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!("{}:2: unknown mount type \"lbi\"", path.display())),
        "{err}"
    );
    let err = load(&CsvFiles::Listed(vec![tmp.path().join("nope.csv")])).unwrap_err();
    assert!(err.to_string().contains("nope.csv"), "{err}");
}

/// A Tegra-shaped driver root: a library with a two-link chain to it, a directory,
/// a link that tries to leave the root, the release file.
fn driver_root(root: &Path) {
    let tegra = root.join("usr/lib/aarch64-linux-gnu/tegra");
    write(&tegra.join("libcuda.so.1.1"), "elf");
    write(&tegra.join("libnvrm_gpu.so"), "elf");
    symlink("libcuda.so.1.1", tegra.join("libcuda.so")).unwrap();
    symlink(
        "tegra/libcuda.so",
        root.join("usr/lib/aarch64-linux-gnu/libcuda.so"),
    )
    .unwrap();
    symlink("../../../../../../etc/shadow", tegra.join("libescape.so")).unwrap();
    write(&root.join("usr/share/nvidia-tegra/README"), "x");
    write(
        &root.join("etc/nv_tegra_release"),
        "# R36 (release), REVISION: 4.0\n",
    );
}

fn specs(text: &str) -> CsvFile {
    CsvFile {
        path: PathBuf::from("/etc/x/drivers.csv"),
        specs: parse(text).unwrap(),
    }
}

#[test]
fn every_kind_is_found_under_its_root_and_absent_ones_are_noted() {
    let tmp = tempfile::tempdir().unwrap();
    driver_root(tmp.path());
    let roots = Roots {
        driver: tmp.path().to_path_buf(),
        dev: PathBuf::from("/"),
        proc: tmp.path().to_path_buf(),
    };
    let file = specs(
        "dev, /dev/null\n\
         dev, /dev/nvhost-absent\n\
         dev, /dev/zer?\n\
         lib, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1\n\
         lib, /usr/lib/aarch64-linux-gnu/tegra/libmissing.so\n\
         sym, /usr/lib/aarch64-linux-gnu/libcuda.so\n\
         sym, /usr/lib/aarch64-linux-gnu/tegra/libescape.so\n\
         lib, /usr/lib/aarch64-linux-gnu/tegra/libnvrm_*.so\n\
         dir, /usr/share/nvidia-tegra\n\
         lib, /usr/share/nvidia-tegra\n",
    );
    let got = discover(&roots, &[file], &[]).unwrap();
    let nodes = got.node_numbers();
    assert_eq!(
        nodes,
        [("/dev/null".into(), 1, 3), ("/dev/zero".into(), 1, 5)]
    );
    let files: Vec<(FileKind, String)> = got
        .files
        .iter()
        .map(|f| (f.kind, f.path.display().to_string()))
        .collect();
    assert_eq!(
        files,
        [
            (FileKind::Directory, "/usr/share/nvidia-tegra".into()),
            (
                FileKind::Library,
                "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1".into()
            ),
            (
                FileKind::Library,
                "/usr/lib/aarch64-linux-gnu/tegra/libnvrm_gpu.so".into()
            ),
            (FileKind::Config, "/etc/nv_tegra_release".into()),
        ]
    );
    for f in &got.files {
        assert!(
            f.host_path.starts_with(tmp.path()),
            "{} stays in the driver root",
            f.host_path.display()
        );
    }
    // The sym line's chain is kept on the file it leads to.
    let links: Vec<String> = got.files[1]
        .links
        .iter()
        .map(|l| format!("{} -> {}", l.path.display(), l.target))
        .collect();
    assert_eq!(
        links,
        [
            "/usr/lib/aarch64-linux-gnu/libcuda.so -> tegra/libcuda.so",
            "/usr/lib/aarch64-linux-gnu/tegra/libcuda.so -> libcuda.so.1.1",
        ]
    );
    let missing: Vec<(&str, Option<&str>)> = got
        .missing
        .iter()
        .map(|m| (m.what.as_str(), m.detail.as_deref()))
        .collect();
    assert_eq!(missing.len(), 4, "{missing:?}");
    assert_eq!(missing[0], ("/dev/nvhost-absent", None));
    assert_eq!(
        missing[1].0,
        "/usr/lib/aarch64-linux-gnu/tegra/libmissing.so"
    );
    assert!(
        missing[2].1.unwrap().ends_with("is not a regular file"),
        "{missing:?}"
    );
    assert_eq!(
        missing[3],
        ("/usr/lib/aarch64-linux-gnu/tegra/libescape.so", None),
        "the escape finds nothing"
    );
    assert!(
        got.missing
            .iter()
            .all(|m| !m.required && m.needed_for == "drivers.csv")
    );
}

#[test]
fn ignore_patterns_drop_sym_lines_only() {
    let tmp = tempfile::tempdir().unwrap();
    driver_root(tmp.path());
    let roots = Roots {
        driver: tmp.path().to_path_buf(),
        dev: tmp.path().to_path_buf(),
        proc: tmp.path().to_path_buf(),
    };
    let file = specs(
        "sym, /usr/lib/aarch64-linux-gnu/libcuda.so\n\
         lib, /usr/lib/aarch64-linux-gnu/tegra/libcuda.so.1.1\n",
    );
    let cases: [(&str, usize); 4] = [
        ("**/libcuda.so", 0),
        ("/usr/lib/*/libcuda.so", 0),
        ("*.so", 2),
        ("/usr/lib/*.so", 2),
    ];
    for (pattern, want_links) in cases {
        let ignore = [Pattern::new(pattern).unwrap()];
        let got = discover(&roots, std::slice::from_ref(&file), &ignore).unwrap();
        assert_eq!(got.files.len(), 2, "case {pattern}: the lib line stays");
        assert_eq!(got.files[0].links.len(), want_links, "case {pattern}");
    }
}

#[test]
fn tegra_is_told_by_its_files_and_never_with_a_dgpu_driver() {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path();
    let roots = Roots {
        driver: root.to_path_buf(),
        dev: root.to_path_buf(),
        proc: root.to_path_buf(),
    };
    assert!(!is_tegra(&roots), "nothing");
    write(&root.join("sys/devices/soc0/family"), "Tegra\n");
    assert!(is_tegra(&roots), "soc0 family");
    write(&root.join("sys/devices/soc0/family"), "jep106:036b\n");
    assert!(!is_tegra(&roots), "another SoC");
    write(&root.join("etc/nv_tegra_release"), "# R36\n");
    assert!(is_tegra(&roots), "release file");
    fs::create_dir_all(root.join("proc/driver/nvidia/gpus")).unwrap();
    assert!(!is_tegra(&roots), "a dGPU driver lists GPUs");
}

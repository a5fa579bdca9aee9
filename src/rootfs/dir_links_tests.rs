use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use super::Rootfs;

const FW: &str = "/lib/firmware/nvidia/550.54.15";

fn rootfs() -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("rootfs");
    fs::create_dir_all(root.join("usr/lib")).unwrap();
    fs::create_dir_all(root.join("usr/bin")).unwrap();
    symlink("usr/lib", root.join("lib")).unwrap();
    (tmp, root)
}

fn links() -> Vec<(PathBuf, String)> {
    vec![
        (
            PathBuf::from(format!("{FW}/gsp_ga10x.bin")),
            "/usr/lib/nvshim/gsp_ga10x.bin".into(),
        ),
        (
            PathBuf::from(format!("{FW}/gsp_tu10x.bin")),
            "/usr/lib/nvshim/gsp_tu10x.bin".into(),
        ),
        (
            PathBuf::from("/usr/bin/nvidia-smi"),
            "/usr/lib/nvshim/nvidia-smi".into(),
        ),
    ]
}

fn place(r: &Rootfs, dir_link: &dyn Fn(&Path) -> Option<String>) -> super::Placed {
    let owned = links();
    let refs: Vec<(&Path, &str)> = owned
        .iter()
        .map(|(p, t)| (p.as_path(), t.as_str()))
        .collect();
    r.place_links(&refs, dir_link).unwrap()
}

fn tree(dir: &Path) -> Option<String> {
    Some(format!("/usr/lib/nvshim/t{}", dir.display()))
}

#[test]
fn the_topmost_missing_directory_becomes_one_link_and_stays_one_on_restart() {
    let (_tmp, root) = rootfs();
    let r = Rootfs::open(&root).unwrap();
    let placed = place(&r, &tree);
    assert_eq!(placed.dir_links, [PathBuf::from("/lib/firmware")]);
    assert!(placed.occupied.is_empty());
    // Through the image's /lib -> usr/lib: one link, no directories, no file links.
    let link = root.join("usr/lib/firmware");
    assert_eq!(
        fs::read_link(&link).unwrap(),
        Path::new("/usr/lib/nvshim/t/lib/firmware")
    );
    assert_eq!(
        fs::read_link(root.join("usr/bin/nvidia-smi")).unwrap(),
        Path::new("/usr/lib/nvshim/nvidia-smi")
    );
    // A restarted container's rootfs: the link is found and kept.
    let again = place(&r, &tree);
    assert_eq!(again.dir_links, [PathBuf::from("/lib/firmware")]);
    assert_eq!(
        fs::read_link(&link).unwrap(),
        Path::new("/usr/lib/nvshim/t/lib/firmware")
    );
}

#[test]
fn without_a_target_or_with_the_directory_there_directories_are_made() {
    let (_tmp, root) = rootfs();
    let r = Rootfs::open(&root).unwrap();
    let placed = place(&r, &|_| None);
    assert!(placed.dir_links.is_empty());
    let file = root.join("usr/lib/firmware/nvidia/550.54.15/gsp_ga10x.bin");
    assert!(
        fs::symlink_metadata(root.join("usr/lib/firmware"))
            .unwrap()
            .is_dir()
    );
    assert_eq!(
        fs::read_link(&file).unwrap(),
        Path::new("/usr/lib/nvshim/gsp_ga10x.bin")
    );
    // The image has the directories now: no directory link even when one is offered.
    let (_tmp2, other) = rootfs();
    fs::create_dir_all(other.join("usr/lib/firmware/nvidia")).unwrap();
    let r = Rootfs::open(&other).unwrap();
    let placed = place(&r, &tree);
    assert_eq!(
        placed.dir_links,
        [PathBuf::from("/lib/firmware/nvidia/550.54.15")]
    );
    assert!(
        fs::symlink_metadata(other.join("usr/lib/firmware"))
            .unwrap()
            .is_dir()
    );
}

#[test]
fn a_foreign_link_or_one_place_under_two_names_gets_no_directory_link() {
    // The image's own dangling link where the directory would be: left to the usual
    // path (which reports it), not taken over.
    let (_tmp, root) = rootfs();
    symlink("/nowhere", root.join("usr/lib/firmware")).unwrap();
    let r = Rootfs::open(&root).unwrap();
    let owned = links();
    let refs: Vec<(&Path, &str)> = owned
        .iter()
        .map(|(p, t)| (p.as_path(), t.as_str()))
        .collect();
    assert!(r.place_links(&refs, &tree).is_err());
    assert_eq!(
        fs::read_link(root.join("usr/lib/firmware")).unwrap(),
        Path::new("/nowhere")
    );
    // /lib/firmware and /usr/lib/firmware are one place: directories, no link.
    let (_tmp2, root) = rootfs();
    let r = Rootfs::open(&root).unwrap();
    let two = [
        (
            Path::new("/lib/firmware/nvidia/1/a.bin"),
            "/usr/lib/nvshim/a.bin",
        ),
        (
            Path::new("/usr/lib/firmware/nvidia/1/b.bin"),
            "/usr/lib/nvshim/b.bin",
        ),
    ];
    let placed = r.place_links(&two, &tree).unwrap();
    assert!(placed.dir_links.is_empty(), "{placed:?}");
    assert!(
        fs::symlink_metadata(root.join("usr/lib/firmware"))
            .unwrap()
            .is_dir()
    );
    assert!(fs::symlink_metadata(root.join("usr/lib/firmware/nvidia/1/a.bin")).is_ok());
    assert!(fs::symlink_metadata(root.join("usr/lib/firmware/nvidia/1/b.bin")).is_ok());
}

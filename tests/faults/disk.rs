//! A bundle on a full (or read-only) filesystem: the runtime's rewrite of `config.json`
//! cannot be written, so `create` fails naming the cause, runc never runs, the original
//! file is intact and no temp file is left behind.
//!
//! Each case mounts a small tmpfs over an empty directory in a private mount namespace
//! (`unshare -m`), fills it, and runs the runtime there; the mount dies with the
//! namespace, so nothing leaks into the host's mount table even if the test dies.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;

use crate::kit::{Host, can_mount, finish, spec_bytes};

/// `$1` mount point, `$2` the original config.json, `$3` where results go, `$4` how to
/// fill the tmpfs; the rest is the runtime's command line.
const SCRIPT: &str = r#"
set -eu
mnt=$1 orig=$2 out=$3 fill=$4
shift 4
mount -t tmpfs -o size=256k,nr_inodes=64 nvshim-faults "$mnt"
cp "$orig" "$mnt/config.json"
case $fill in
no-space)
    dd if=/dev/zero of="$mnt/fill" bs=4096 2>/dev/null || true ;;
one-page-left)
    dd if=/dev/zero of="$mnt/pad" bs=4096 count=1 2>/dev/null
    dd if=/dev/zero of="$mnt/fill" bs=4096 2>/dev/null || true
    rm "$mnt/pad" ;;
no-inodes)
    i=0
    while touch "$mnt/inode$i" 2>/dev/null; do i=$((i + 1)); done ;;
read-only)
    mount -o remount,ro "$mnt" ;;
esac
set +e
"$@" >"$out/stdout" 2>"$out/stderr"
echo $? >"$out/rc"
cp "$mnt/config.json" "$out/after.json"
ls -A "$mnt" >"$out/ls"
"#;

#[test]
fn a_full_filesystem_fails_the_create_and_keeps_config_json() {
    if !can_mount("a_full_filesystem_fails_the_create_and_keeps_config_json") {
        return;
    }
    let host = Host::new(2);
    // The rootfs is elsewhere: the driver's symlinks and linker cache go in before
    // config.json is written, and this is about config.json.
    let rootfs = host.dir.path().join("rootfs");
    fs::create_dir(&rootfs).unwrap();
    let original = spec_bytes(&["NVIDIA_VISIBLE_DEVICES=0"], rootfs.to_str().unwrap());
    let orig = host.dir.path().join("original.json");
    fs::write(&orig, &original).unwrap();
    let runtime = crate::common::runtime_bin();
    let cases = [
        ("no-space", "No space left on device"),
        ("one-page-left", "No space left on device"),
        ("no-inodes", "No space left on device"),
        ("read-only", "Read-only file system"),
    ];
    for (case, want) in cases {
        let mnt = host.dir.path().join(format!("{case}-mnt"));
        let out = host.dir.path().join(format!("{case}-out"));
        fs::create_dir(&mnt).unwrap();
        fs::create_dir(&out).unwrap();
        host.forget_runc();
        let (m, o) = (mnt.to_str().unwrap(), out.to_str().unwrap());
        let args = [
            "-m",
            "sh",
            "-c",
            SCRIPT,
            "sh",
            m,
            orig.to_str().unwrap(),
            o,
            case,
            &runtime,
            "create",
            "--bundle",
            m,
            "c",
        ];
        let done = finish(case, host.command_with("unshare", &args).spawn().unwrap());
        assert!(
            done.status.success(),
            "{case}: the harness ran: {}",
            crate::kit::stderr(&done)
        );
        let read = |name: &str| fs::read_to_string(out.join(name)).unwrap();
        let err = read("stderr");
        assert_eq!(read("rc").trim(), "1", "{case}: {err}");
        assert!(
            err.starts_with("nvidia-container-runtime: cannot write ")
                && err.contains(&format!("{m}/"))
                && err.contains(want),
            "{case}: names the file and the cause: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{case}: {err}");
        assert!(host.runc_argv().is_none(), "{case}: runc must not run");
        assert_eq!(
            fs::read(out.join("after.json")).unwrap(),
            original,
            "{case}: config.json as it was"
        );
        let left: Vec<String> = read("ls")
            .lines()
            .filter(|n| !(*n == "fill" || n.starts_with("inode")))
            .map(String::from)
            .collect();
        assert_eq!(left, ["config.json"], "{case}: no temp file left");
        assert!(
            fs::read_dir(&mnt).unwrap().next().is_none(),
            "{case}: the tmpfs never showed outside its namespace"
        );
    }
}

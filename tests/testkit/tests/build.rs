// SPDX-License-Identifier: Apache-2.0
//! Builds simulated nodes into temp dirs and checks each part against the spec. Needs root (mknod,
//! `ldconfig -r`) and a C compiler. Uses stand-in artifacts (a stub with the mock's soname and a
//! shell script) so it does not depend on the mock crate; `located_artifacts_make_a_working_node`
//! checks the real ones when they have been built.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use nvshim_testkit::{
    Artifacts, LIB_DIR, LIBRARIES, NodeSpec, STALE_LIBRARY, SimNode, Soname, device_nodes,
    ldconfig, mig_ci_minor, mig_gi_minor,
};
use tempfile::TempDir;

/// A stand-in mock NVML (soname `libnvidia-ml.so.1`) and nvidia-smi, built into `dir`.
fn stand_in_artifacts(dir: &Path) -> Artifacts {
    let source = dir.join("nvml.c");
    fs::write(&source, "int nvmlInit_v2(void) { return 0; }\n").unwrap();
    let mock_nvml = dir.join("libnvshim_mock_nvml.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-Wl,-soname,libnvidia-ml.so.1", "-o"])
        .arg(&mock_nvml)
        .arg(&source)
        .status()
        .unwrap();
    assert!(status.success(), "building the stand-in mock NVML");
    let nvidia_smi = dir.join("nvshim-fake-nvidia-smi");
    fs::write(&nvidia_smi, "#!/bin/sh\necho fake nvidia-smi\n").unwrap();
    fs::set_permissions(&nvidia_smi, fs::Permissions::from_mode(0o755)).unwrap();
    Artifacts {
        mock_nvml,
        nvidia_smi,
    }
}

struct Fixture {
    _tmp: TempDir,
    node: SimNode,
}

fn build(spec: &NodeSpec) -> Fixture {
    let tmp = TempDir::new().unwrap();
    let tools = tmp.path().join("tools");
    fs::create_dir(&tools).unwrap();
    let artifacts = stand_in_artifacts(&tools);
    let node = SimNode::build(spec, &tmp.path().join("node"), &artifacts).unwrap();
    Fixture { _tmp: tmp, node }
}

/// `ldconfig -p` of the node's cache: soname → path inside the driver root.
fn cache_entries(node: &SimNode) -> BTreeMap<String, String> {
    let cache = node.driver_root.join("etc/ld.so.cache");
    assert!(cache.is_file(), "{} exists", cache.display());
    let out = Command::new(ldconfig().unwrap())
        .arg("-p")
        .arg("-C")
        .arg(&cache)
        .output()
        .unwrap();
    assert!(out.status.success(), "ldconfig -p: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .filter_map(|line| {
            let (left, path) = line.trim().split_once(" => ")?;
            let name = left.split_whitespace().next()?;
            Some((name.to_owned(), path.to_owned()))
        })
        .collect()
}

/// `Key: value` pairs of a procfs file.
fn fields(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

fn read(path: &Path) -> String {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

#[test]
fn ld_cache_lists_driver_libraries() {
    let f = build(&NodeSpec::standard(2));
    let v = f.node.library_version().to_owned();
    let entries = cache_entries(&f.node);
    for (name, want) in [
        ("libcuda.so.1", format!("/{LIB_DIR}/libcuda.so.1")),
        ("libnvidia-ml.so.1", format!("/{LIB_DIR}/libnvidia-ml.so.1")),
        (
            "libGLX_nvidia.so.0",
            format!("/{LIB_DIR}/libGLX_nvidia.so.0"),
        ),
        (
            &format!("libnvidia-glcore.so.{v}"),
            format!("/{LIB_DIR}/libnvidia-glcore.so.{v}"),
        ),
        (STALE_LIBRARY, format!("/{LIB_DIR}/{STALE_LIBRARY}")),
        ("libfoo.so.1", format!("/{LIB_DIR}/libfoo.so.1")),
    ] {
        assert_eq!(entries.get(name), Some(&want), "cache entry {name}");
    }
    assert!(
        !entries.contains_key("libvdpau_nvidia.so.1"),
        "vdpau/ is not in ld.so.conf, as on a real host"
    );
}

#[test]
fn libraries_are_elf_with_soname_links() {
    let f = build(&NodeSpec::standard(1));
    let v = f.node.library_version().to_owned();
    let lib_dir = f.node.lib_dir();
    for lib in LIBRARIES {
        let dir = lib.subdir.map_or(lib_dir.clone(), |s| lib_dir.join(s));
        let file = dir.join(lib.file_name(&v));
        let bytes = fs::read(&file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert_eq!(&bytes[..4], b"\x7fELF", "{} is ELF", lib.stem);
        if let Soname::Major(_) = lib.soname {
            let link = dir.join(lib.soname(&v));
            let target = fs::read_link(&link).unwrap_or_else(|e| panic!("{}: {e}", link.display()));
            assert_eq!(
                target,
                PathBuf::from(lib.file_name(&v)),
                "{} link",
                lib.stem
            );
        }
    }
    for (link, target) in [
        ("libcuda.so", "libcuda.so.1"),
        ("libnvidia-ml.so", "libnvidia-ml.so.1"),
    ] {
        assert_eq!(
            fs::read_link(lib_dir.join(link)).unwrap(),
            PathBuf::from(target),
            "dev link {link}"
        );
    }
    assert!(lib_dir.join("libfoo.so.1.0.0").is_file(), "foreign library");
    assert!(
        !f.node.dir.join(".testkit-build").exists(),
        "scratch removed"
    );
}

#[test]
fn driver_root_has_binaries_firmware_and_ipc() {
    let f = build(&NodeSpec::standard(1));
    let root = &f.node.driver_root;
    for name in nvshim_testkit::BINARIES {
        let meta = fs::metadata(root.join("usr/bin").join(name)).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o755, "{name} mode");
    }
    let out = Command::new(root.join("usr/bin/nvidia-debugdump"))
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "nvidia-debugdump"
    );
    for name in nvshim_testkit::FIRMWARE {
        let path = root.join(format!(
            "lib/firmware/nvidia/{}/{name}",
            f.node.library_version()
        ));
        assert!(path.is_file(), "{}", path.display());
    }
    let socket = fs::metadata(root.join(nvshim_testkit::PERSISTENCED_SOCKET)).unwrap();
    assert!(socket.file_type().is_socket(), "persistenced socket");
    assert!(
        root.join(nvshim_testkit::MPS_PIPE_DIR).is_dir(),
        "MPS pipe dir"
    );
    assert!(root.join("etc/ld.so.conf").is_file());
}

#[test]
fn dev_nodes_are_char_devices_with_their_numbers() {
    for (case, spec) in [
        ("standard(2)", NodeSpec::standard(2)),
        ("with_mig(2)", NodeSpec::with_mig(2)),
    ] {
        let f = build(&spec);
        let want = device_nodes(&spec);
        for node in &want {
            let path = f.node.dev_root.join(&node.path);
            let meta =
                fs::symlink_metadata(&path).unwrap_or_else(|e| panic!("{case} {}: {e}", node.path));
            assert!(
                meta.file_type().is_char_device(),
                "{case} {} is a char device",
                node.path
            );
            let rdev = meta.rdev();
            assert_eq!(
                (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev)),
                (u64::from(node.major), u64::from(node.minor)),
                "{case} {} rdev",
                node.path
            );
            assert_eq!(meta.mode() & 0o777, node.mode, "{case} {} mode", node.path);
        }
        for gpu in &spec.gpus {
            assert!(
                want.iter()
                    .any(|n| n.path == format!("nvidia{}", gpu.minor)),
                "{case} has /dev/nvidia{}",
                gpu.minor
            );
        }
        // Less the two directories, `nvidia-caps` and `dri` (checked below).
        let count = fs::read_dir(&f.node.dev_root).unwrap().count()
            + fs::read_dir(f.node.dev_root.join("nvidia-caps"))
                .unwrap()
                .count()
            - 2;
        assert_eq!(count, want.len(), "{case}: no extra nodes");
        // DRM: card0 (the onboard VGA) and each GPU's card and render node, with udev's links.
        let dri = f.node.dev_root.join("dri");
        for (index, gpu) in spec.gpus.iter().enumerate() {
            let (card, render) = nvshim_testkit::drm_nodes(index);
            for (kind, name) in [("card", &card), ("render", &render)] {
                let meta = fs::symlink_metadata(dri.join(name)).unwrap();
                assert!(meta.file_type().is_char_device(), "{case} {name}");
                assert_eq!(nix::sys::stat::major(meta.rdev()), 226, "{case} {name}");
                let link = dri.join(format!("by-path/pci-{}-{kind}", gpu.bus_id));
                assert_eq!(
                    fs::read_link(&link).unwrap(),
                    Path::new("..").join(name),
                    "{case} {}",
                    link.display()
                );
            }
        }
        assert_eq!(
            fs::read_dir(&dri).unwrap().count(),
            2 * spec.gpus.len() + 2,
            "{case}: card0, two nodes per GPU, by-path"
        );
    }
}

#[test]
fn proc_files_describe_the_gpus() {
    let spec = NodeSpec::standard(3);
    let f = build(&spec);
    let nvidia = f.node.proc_root.join("driver/nvidia");
    let version = read(&nvidia.join("version"));
    assert!(
        version.starts_with("NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.54.15  "),
        "version: {version:?}"
    );
    assert_eq!(
        fields(&read(&nvidia.join("params")))["ModifyDeviceFiles"],
        "1"
    );
    let mut seen = 0;
    for entry in fs::read_dir(nvidia.join("gpus")).unwrap() {
        let entry = entry.unwrap();
        let bus = entry.file_name().into_string().unwrap();
        let info = fields(&read(&entry.path().join("information")));
        let gpu = spec.gpus.iter().find(|g| g.bus_id == bus).unwrap();
        assert_eq!(info["Bus Location"], bus, "{bus}");
        assert_eq!(info["GPU UUID"], gpu.uuid, "{bus}");
        assert_eq!(info["Device Minor"], gpu.minor.to_string(), "{bus}");
        assert_eq!(info["Model"], "NVIDIA A100-SXM4-80GB", "{bus}");
        assert_eq!(info["GPU Excluded"], "No", "{bus}");
        seen += 1;
    }
    assert_eq!(seen, 3);
    // The exact byte layout of one line, as the driver prints it.
    let first = read(&nvidia.join(format!("gpus/{}/information", spec.gpus[0].bus_id)));
    assert!(first.contains("\nDevice Minor: \t 0\n"), "{first:?}");
    let minors = read(&f.node.proc_root.join("driver/nvidia-caps/mig-minors"));
    assert!(
        minors.starts_with("config 1\nmonitor 2\n"),
        "mig-minors head"
    );
    assert!(minors.contains("\ngpu0/gi1/access 12\n"), "gpu0/gi1 minor");
}

#[test]
fn mig_node_has_caps_in_dev_proc_and_config() {
    let spec = NodeSpec::with_mig(2);
    let f = build(&spec);
    let gpu = &spec.gpus[0];
    assert_eq!(
        gpu.minor, 1,
        "MIG GPU is index 0, minor 1 (the last two minors are swapped)"
    );
    let caps = f.node.proc_root.join("driver/nvidia/capabilities");
    let minors = read(&f.node.proc_root.join("driver/nvidia-caps/mig-minors"));
    for mig in &gpu.mig_devices {
        let (gi, ci) = (mig.gpu_instance_id, mig.compute_instance_id);
        for (rel, minor, key) in [
            (
                format!("gpu1/mig/gi{gi}/access"),
                mig_gi_minor(1, gi),
                format!("gpu1/gi{gi}/access"),
            ),
            (
                format!("gpu1/mig/gi{gi}/ci{ci}/access"),
                mig_ci_minor(1, gi, ci),
                format!("gpu1/gi{gi}/ci{ci}/access"),
            ),
        ] {
            let file = fields(&read(&caps.join(&rel)));
            assert_eq!(file["DeviceFileMinor"], minor.to_string(), "{rel}");
            assert_eq!(file["DeviceFileMode"], "292", "{rel}");
            assert!(
                minors.contains(&format!("\n{key} {minor}\n")),
                "mig-minors {key}"
            );
            let dev = f
                .node
                .dev_root
                .join(format!("nvidia-caps/nvidia-cap{minor}"));
            assert!(
                fs::symlink_metadata(&dev)
                    .unwrap()
                    .file_type()
                    .is_char_device(),
                "{rel} dev"
            );
        }
    }
    assert!(!caps.join("gpu0").exists(), "no caps for the non-MIG GPU");
    let json: serde_json::Value = serde_json::from_str(&read(&f.node.mock_config)).unwrap();
    assert_eq!(json["gpus"][0]["mig_mode"], true);
    assert_eq!(json["gpus"][0]["mig_devices"][1]["profile"], "2g.20gb");
    assert_eq!(json["gpus"][0]["mig_devices"][1]["gpu_instance_id"], 2);
    assert_eq!(json["gpus"][1]["mig_mode"], false);
}

#[test]
fn mock_config_matches_the_spec() {
    let mut spec = NodeSpec::standard(2);
    spec.xid_events.push((spec.gpus[1].uuid.clone(), 79, 50));
    let f = build(&spec);
    let json: serde_json::Value = serde_json::from_str(&read(&f.node.mock_config)).unwrap();
    let dir = f.node.dir.display().to_string();
    // Sorted: the order depends on serde_json's `preserve_order`, which the workspace may enable.
    let mut keys: Vec<&str> = json
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "cuda_driver_version",
            "dev_root",
            "driver_version",
            "event_file",
            "gpus",
            "xid_events"
        ]
    );
    assert_eq!(json["driver_version"], "550.54.15");
    assert_eq!(json["cuda_driver_version"], 12040);
    assert_eq!(json["dev_root"], format!("{dir}/dev"));
    assert_eq!(json["event_file"], format!("{dir}/xid-events"));
    assert!(Path::new(&format!("{dir}/xid-events")).is_file());
    assert!(!f.node.call_log.exists(), "call log left to the mock");
    for (i, gpu) in spec.gpus.iter().enumerate() {
        let g = &json["gpus"][i];
        assert_eq!(g["uuid"], gpu.uuid.as_str(), "gpu {i}");
        assert_eq!(
            g["bus_id"],
            format!("0000{}", gpu.bus_id.to_uppercase()),
            "gpu {i}"
        );
        assert_eq!(g["minor"], gpu.minor, "gpu {i}");
        assert_eq!(g["memory_total_bytes"], 85_899_345_920_u64, "gpu {i}");
        assert_eq!(
            g["compute_capability"],
            serde_json::json!([8, 0]),
            "gpu {i}"
        );
    }
    assert_eq!(json["gpus"][0]["bus_id"], "00000000:07:00.0");
    assert_eq!(
        json["xid_events"],
        serde_json::json!([{ "gpu_uuid": spec.gpus[1].uuid, "xid": 79, "delay_ms": 50 }])
    );
    let env = f.node.env();
    assert_eq!(
        env[0],
        (
            "MOCK_NVML_CONFIG".to_owned(),
            format!("{dir}/mock-nvml.json")
        )
    );
    assert_eq!(
        env[1],
        (
            "MOCK_NVML_CALL_LOG".to_owned(),
            format!("{dir}/nvml-calls.log")
        )
    );
    assert_eq!(
        f.node.root_args(),
        [
            "--driver-root".to_owned(),
            format!("{dir}/driver"),
            "--dev-root".to_owned(),
            dir.to_string(),
            "--proc-root".to_owned(),
            dir.to_string(),
        ]
    );
}

#[test]
fn build_refuses_a_non_empty_dir_and_bad_specs() {
    let tmp = TempDir::new().unwrap();
    let artifacts = stand_in_artifacts(tmp.path());
    let err = SimNode::build(&NodeSpec::standard(1), tmp.path(), &artifacts).unwrap_err();
    assert!(err.to_string().contains("is not empty"), "{err}");
    let mut spec = NodeSpec::standard(2);
    spec.gpus[1].minor = spec.gpus[0].minor;
    let err = SimNode::build(&spec, &tmp.path().join("n"), &artifacts).unwrap_err();
    assert!(err.to_string().contains("used by two GPUs"), "{err}");
}

#[test]
fn deep_node_dir_still_gets_its_socket() {
    let tmp = TempDir::new().unwrap();
    let artifacts = stand_in_artifacts(tmp.path());
    let deep = tmp.path().join("a".repeat(60)).join("b".repeat(60));
    let node = SimNode::build(&NodeSpec::standard(1), &deep, &artifacts).unwrap();
    let socket = node.driver_root.join(nvshim_testkit::PERSISTENCED_SOCKET);
    assert!(
        socket.as_os_str().len() > 108,
        "path is longer than sun_path"
    );
    assert!(fs::metadata(&socket).unwrap().file_type().is_socket());
}

#[test]
fn simnode_binary_builds_and_replaces_nodes() {
    let tmp = TempDir::new().unwrap();
    let artifacts = stand_in_artifacts(tmp.path());
    let dir = tmp.path().join("demo");
    let run = |extra: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_nvshim-simnode"))
            .arg(&dir)
            .args(extra)
            .env("NVSHIM_MOCK_NVML", &artifacts.mock_nvml)
            .env("NVSHIM_FAKE_NVIDIA_SMI", &artifacts.nvidia_smi)
            .output()
            .unwrap()
    };
    let out = run(&["--gpus", "4", "--mig", "--driver-version", "535.104.05"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let d = dir.display();
    assert_eq!(
        stdout,
        format!(
            "export MOCK_NVML_CONFIG='{d}/mock-nvml.json'\n\
             export MOCK_NVML_CALL_LOG='{d}/nvml-calls.log'\n\
             # nvshim flags: --driver-root {d}/driver --dev-root {d} --proc-root {d}\n"
        )
    );
    assert!(
        dir.join("driver")
            .join(LIB_DIR)
            .join("libcuda.so.535.104.05")
            .is_file()
    );
    assert!(dir.join("dev/nvidia3").exists());
    // An earlier node is replaced.
    let out = run(&["--gpus", "1"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!dir.join("dev/nvidia3").exists(), "old node removed");
    // Anything else is not.
    fs::remove_file(dir.join("mock-nvml.json")).unwrap();
    let out = run(&[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("refusing to delete"));
    assert!(dir.join("driver").exists(), "foreign dir kept");
}

/// With the real mock (built by `cargo build --workspace`): it has the soname `libnvidia-ml.so.1`
/// (checked with binutils' `readelf`) and lands in the cache under it.
/// Skipped when the artifacts are missing, except under `CI=true`.
#[test]
fn located_artifacts_make_a_working_node() {
    let artifacts = match Artifacts::locate() {
        Ok(a) => a,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let readelf = Command::new("readelf")
        .arg("-d")
        .arg(&artifacts.mock_nvml)
        .output()
        .unwrap();
    let dynamic = String::from_utf8_lossy(&readelf.stdout);
    assert!(
        dynamic.contains("Library soname: [libnvidia-ml.so.1]"),
        "the mock NVML {} must have the soname libnvidia-ml.so.1: {dynamic}",
        artifacts.mock_nvml.display()
    );
    let tmp = TempDir::new().unwrap();
    let node = SimNode::build(&NodeSpec::standard(2), &tmp.path().join("n"), &artifacts).unwrap();
    let entries = cache_entries(&node);
    assert_eq!(
        entries.get("libnvidia-ml.so.1").map(String::as_str),
        Some(format!("/{LIB_DIR}/libnvidia-ml.so.1").as_str()),
        "the mock's soname is libnvidia-ml.so.1 (artifact {})",
        artifacts.mock_nvml.display()
    );
}

#[test]
fn fake_mps_control_daemonizes_records_and_quits() {
    let f = build(&NodeSpec::standard(1));
    let control = f.node.driver_root.join("usr/bin/nvidia-cuda-mps-control");
    let scratch = tempfile::tempdir().unwrap();
    let (pipe, logs) = (scratch.path().join("pipe"), scratch.path().join("log"));
    let run = |args: &[&str], stdin: &str| {
        let mut child = Command::new(&control)
            .args(args)
            .env("CUDA_MPS_PIPE_DIRECTORY", &pipe)
            .env("CUDA_MPS_LOG_DIRECTORY", &logs)
            .env("CUDA_VISIBLE_DEVICES", "GPU-a,GPU-b")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        use std::io::Write as _;
        // A client without a daemon may exit before it reads: a broken pipe is fine.
        let _ = child.stdin.take().unwrap().write_all(stdin.as_bytes());
        child.wait().unwrap().success()
    };
    assert!(
        !run(&[], "get_server_list\n"),
        "a client without a daemon fails"
    );
    assert!(run(&["-d"], ""), "-d returns once the daemon is forked");
    let pid_file = pipe.join(nvshim_testkit::MPS_PID_FILE);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !pid_file.exists() {
        assert!(std::time::Instant::now() < deadline, "no pid file");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let pid = fs::read_to_string(&pid_file).unwrap().trim().to_string();
    let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap();
    assert_eq!(comm.trim(), "nvidia-cuda-mps", "the daemon's process name");
    assert!(
        !run(&["-d"], ""),
        "a second daemon on one pipe dir is refused"
    );
    assert!(run(
        &[],
        "set_default_active_thread_percentage 25\n\nquit\n"
    ));
    while Path::new(&format!("/proc/{pid}")).exists() && pid_file.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "quit did not stop the daemon"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        nvshim_testkit::mps_record(&logs),
        [
            "start CUDA_VISIBLE_DEVICES=GPU-a,GPU-b",
            "set_default_active_thread_percentage 25",
            "quit"
        ]
    );
}

//! `nvshim info` and `nvshim list` against a simulated 8-GPU node, through the real
//! binary, with the mock NVML logging every call it gets.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;

use crate::common::{node, nvshim, nvshim_env, ok, stderr};
use nvshim_testkit::{GpuSpec, NodeSpec};
use serde_json::Value;

/// The spec's GPUs in PCI bus order, i.e. by index.
fn by_index(spec: &NodeSpec) -> Vec<GpuSpec> {
    let mut gpus = spec.gpus.clone();
    gpus.sort_by(|a, b| a.bus_id.cmp(&b.bus_id));
    gpus
}

/// The identity columns of `nvshim info`'s table rows (index, minor, UUID, bus, name).
fn identity_rows(table: &str) -> Vec<String> {
    table
        .lines()
        .skip_while(|l| !l.starts_with("INDEX"))
        .skip(1)
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            cols[..4].join(" ") + " " + &cols[4..].join(" ")
        })
        .map(|l| {
            l.split(" 81920 MiB")
                .next()
                .unwrap_or(&l)
                .trim_end_matches(" - - -")
                .to_string()
        })
        .collect()
}

#[test]
fn info_shows_the_same_eight_gpus_via_nvml_and_procfs() {
    let node = node(&NodeSpec::standard(8));
    let nvml = ok(
        nvshim(&node, &["info", "--backend", "nvml"]),
        "info --backend nvml",
    );
    let procfs = ok(
        nvshim(&node, &["info", "--backend", "procfs"]),
        "info --backend procfs",
    );

    let gpus = by_index(&node.sim.spec);
    for (index, gpu) in gpus.iter().enumerate() {
        let row = format!(
            "{index} {} {} {} {}",
            gpu.minor, gpu.uuid, gpu.bus_id, gpu.name
        );
        for (backend, table) in [("nvml", &nvml), ("procfs", &procfs)] {
            assert!(
                identity_rows(table).iter().any(|r| r.starts_with(&row)),
                "{backend}: no row {row:?} in\n{table}"
            );
        }
    }
    assert_eq!(
        identity_rows(&nvml),
        identity_rows(&procfs),
        "nvml:\n{nvml}\nprocfs:\n{procfs}"
    );
    assert_eq!(identity_rows(&nvml).len(), 8);
    assert!(nvml.contains("Driver version: 550.54.15"), "{nvml}");
    assert!(nvml.contains("CUDA version:   12.4"), "{nvml}");
    assert!(
        nvml.contains("81920 MiB") && nvml.contains("8.0"),
        "NVML details missing:\n{nvml}"
    );
}

#[test]
fn info_json_is_the_same_inventory_from_both_backends() {
    let node = node(&NodeSpec::standard(8));
    let parse = |backend: &str| -> Value {
        let out = ok(
            nvshim(&node, &["info", "--json", "--backend", backend]),
            backend,
        );
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("{backend}: bad JSON ({e}):\n{out}"))
    };
    let (nvml, procfs) = (parse("nvml"), parse("procfs"));
    assert_eq!(nvml["backend"], "nvml");
    assert_eq!(procfs["backend"], "procfs");
    assert_eq!(nvml["driver"]["version"], procfs["driver"]["version"]);
    let identity = |v: &Value| -> Vec<Value> {
        v["gpus"]
            .as_array()
            .expect("gpus array")
            .iter()
            .map(|g| serde_json::json!([g["index"], g["minor"], g["uuid"], g["bus_id"], g["name"]]))
            .collect()
    };
    assert_eq!(identity(&nvml), identity(&procfs));
    let uuids: Vec<String> = by_index(&node.sim.spec)
        .into_iter()
        .map(|g| g.uuid)
        .collect();
    let got: Vec<&str> = nvml["gpus"]
        .as_array()
        .expect("gpus")
        .iter()
        .filter_map(|g| g["uuid"].as_str())
        .collect();
    assert_eq!(got, uuids);
}

#[test]
fn the_procfs_path_never_loads_nvml() {
    let node = node(&NodeSpec::standard(8));
    let log = node.sim.call_log.clone();
    let uuid3 = by_index(&node.sim.spec)[3].uuid.clone();
    let devices = format!("--devices=0,{uuid3}");
    for args in [
        vec!["info", "--backend", "procfs"],
        vec!["list", "--backend", "procfs", &devices],
        vec!["list", &devices],
        vec!["list", "--devices=all", "--caps=all"],
    ] {
        let _ = fs::remove_file(&log);
        ok(nvshim(&node, &args), &args.join(" "));
        let calls = fs::read_to_string(&log).unwrap_or_default();
        assert!(calls.is_empty(), "{args:?} touched NVML:\n{calls}");
    }
    // The counter works: the NVML backend is seen.
    let _ = fs::remove_file(&log);
    ok(
        nvshim(&node, &["info", "--backend", "nvml"]),
        "info --backend nvml",
    );
    let calls = fs::read_to_string(&log).unwrap_or_default();
    assert!(
        calls.lines().any(|l| l == "loaded"),
        "no load logged:\n{calls}"
    );
    assert!(
        calls.lines().any(|l| l.starts_with("nvmlInit")),
        "no init logged:\n{calls}"
    );
}

#[test]
fn list_shows_exactly_what_two_gpus_with_compute_and_utility_get() {
    let node = node(&NodeSpec::standard(8));
    let gpus = by_index(&node.sim.spec);
    let devices = format!("--devices=0,{}", gpus[3].uuid);
    let out = ok(
        nvshim(
            &node,
            &["list", &devices, "--caps=compute,utility", "--json"],
        ),
        "list --json",
    );
    let plan: Value = serde_json::from_str(&out).expect("plan JSON");
    let edits = &plan["edits"];

    let nodes: Vec<&str> = edits["deviceNodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["path"].as_str())
        .collect();
    let mut want_gpu_nodes = [gpus[0].minor, gpus[3].minor];
    want_gpu_nodes.sort();
    // In path order (`ContainerEdits::normalise`).
    let mut want = vec![
        "/dev/nvidia-uvm".to_string(),
        "/dev/nvidia-uvm-tools".into(),
    ];
    want.extend(want_gpu_nodes.iter().map(|m| format!("/dev/nvidia{m}")));
    want.push("/dev/nvidiactl".into());
    assert_eq!(nodes, want, "device nodes");
    assert_eq!(
        nodes[2..4],
        ["/dev/nvidia0", "/dev/nvidia3"],
        "GPUs 0 and 3 have minors 0 and 3 on the standard node"
    );
    for n in edits["deviceNodes"].as_array().expect("nodes") {
        assert_eq!(n["type"], "c");
        assert_eq!(n["permissions"], "rwm");
        assert!(
            n["hostPath"]
                .as_str()
                .is_some_and(|p| p.starts_with(node.sim.dev_root.to_str().expect("utf8")))
        );
    }
    let ctl = &edits["deviceNodes"][4];
    assert_eq!(
        (ctl["major"].as_i64(), ctl["minor"].as_i64()),
        (Some(195), Some(255))
    );

    let ver = node.sim.library_version().to_string();
    let mounts: Vec<&str> = edits["mounts"]
        .as_array()
        .expect("mounts")
        .iter()
        .filter_map(|m| m["containerPath"].as_str())
        .collect();
    let libs: Vec<String> = mounts
        .iter()
        .filter_map(|p| p.rsplit('/').next())
        .filter(|n| n.ends_with(&format!(".so.{ver}")))
        .map(|n| n.to_string())
        .collect();
    let mut want_libs: Vec<String> = [
        "libcuda",
        "libcudadebugger",
        "libnvidia-allocator",
        "libnvidia-cfg",
        "libnvidia-gpucomp",
        "libnvidia-ml",
        "libnvidia-nscq",
        "libnvidia-nvvm",
        "libnvidia-opencl",
        "libnvidia-pkcs11",
        "libnvidia-pkcs11-openssl3",
        "libnvidia-ptxjitcompiler",
    ]
    .iter()
    .map(|s| format!("{s}.so.{ver}"))
    .collect();
    want_libs.sort();
    let mut got_libs = libs.clone();
    got_libs.sort();
    assert_eq!(
        got_libs, want_libs,
        "compute+utility libraries of {ver} and nothing else"
    );
    for bin in [
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    ] {
        assert!(
            mounts.contains(&format!("/usr/bin/{bin}").as_str()),
            "{bin} not mounted: {mounts:?}"
        );
    }
    assert!(
        mounts.contains(&"/run/nvidia-persistenced/socket"),
        "{mounts:?}"
    );
    assert!(
        mounts
            .iter()
            .any(|m| m.starts_with(&format!("/lib/firmware/nvidia/{ver}/"))
                || m.starts_with(&format!("/usr/lib/firmware/nvidia/{ver}/"))),
        "{mounts:?}"
    );
    assert!(
        !mounts
            .iter()
            .any(|m| m.contains("libfoo") || m.contains("vdpau") || m.contains("GLX")),
        "{mounts:?}"
    );
    for m in edits["mounts"].as_array().expect("mounts") {
        let opts: Vec<&str> = m["options"]
            .as_array()
            .expect("options")
            .iter()
            .filter_map(|o| o.as_str())
            .collect();
        assert!(
            opts.contains(&"nosuid") && opts.contains(&"nodev") && opts.contains(&"bind"),
            "{m}"
        );
    }

    // The stale 470 library is reported, not mounted.
    let missing = plan["missing"].to_string();
    assert!(
        missing.contains("libnvidia-fatbinaryloader") && missing.contains("470.82.01"),
        "{missing}"
    );

    // No hooks: the real file is mounted once, the symlink chain (libcuda.so -> .so.1
    // -> .so.<ver>) is in the plan for the runtime to create in the rootfs, and so are
    // the linker cache entries.
    assert_eq!(edits["hooks"], serde_json::json!(null), "no hooks: {edits}");
    let mounted = |path: &str| {
        edits["mounts"]
            .as_array()
            .expect("mounts")
            .iter()
            .any(|m| m["containerPath"] == path)
    };
    assert!(mounted(&format!(
        "/usr/lib/x86_64-linux-gnu/libcuda.so.{ver}"
    )));
    let links: Vec<(&str, &str)> = plan["symlinks"]
        .as_array()
        .expect("symlinks")
        .iter()
        .map(|l| {
            (
                l["path"].as_str().expect("path"),
                l["target"].as_str().expect("target"),
            )
        })
        .collect();
    let so1 = format!("libcuda.so.{ver}");
    for (link, target) in [
        ("libcuda.so.1", so1.as_str()),
        ("libcuda.so", "libcuda.so.1"),
    ] {
        let path = format!("/usr/lib/x86_64-linux-gnu/{link}");
        assert!(!mounted(&path), "{link} is not mounted");
        assert!(
            links.contains(&(path.as_str(), target)),
            "{link}: {links:?}"
        );
    }
    let cache: Vec<(&str, &str)> = plan["ldcache"]
        .as_array()
        .expect("ldcache")
        .iter()
        .map(|e| {
            (
                e["key"].as_str().expect("key"),
                e["value"].as_str().expect("value"),
            )
        })
        .collect();
    assert!(
        cache.contains(&("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"))
            && cache.contains(&(
                "libnvidia-ml.so.1",
                "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"
            )),
        "{cache:?}"
    );
    assert_eq!(
        cache.len(),
        want_libs.len(),
        "one entry per library: {cache:?}"
    );

    // The text form lists the same nodes.
    let text = ok(
        nvshim(&node, &["list", &devices, "--caps=compute,utility"]),
        "list",
    );
    for n in &want {
        assert!(
            text.contains(&format!("  {n}  c ")),
            "{n} missing from\n{text}"
        );
    }
    assert!(!text.contains("/dev/nvidia-modeset"), "{text}");
}

#[test]
fn modeset_comes_with_display_or_graphics() {
    let node = node(&NodeSpec::standard(2));
    // libnvidia-container gives it to display only; issue 21 to both graphics
    // capabilities (NVIDIA's JIT-CDI to every container).
    for (caps, want) in [
        ("display", true),
        ("graphics", true),
        ("graphics,display", true),
        ("compute,utility,video,ngx,compat32", false),
        ("all", true),
    ] {
        let out = ok(
            nvshim(&node, &["list", "--devices=0", &format!("--caps={caps}")]),
            caps,
        );
        assert_eq!(
            out.matches("/dev/nvidia-modeset").count(),
            usize::from(want),
            "caps {caps}: once or not at all:\n{out}"
        );
    }
}

#[test]
fn bad_device_lists_are_errors_naming_the_value() {
    let node = node(&NodeSpec::standard(8));
    let junk = "#".repeat(10 * 1024);
    let junk_arg = format!("--devices={junk}");
    let cases: Vec<(&str, &str, &str)> = vec![
        ("unknown index", "--devices=9", "\"9\""),
        ("malformed uuid", "--devices=GPU-nope", "\"GPU-nope\""),
        ("empty entry", "--devices=0,,1", "position 2"),
        ("negative", "--devices=-1", "\"-1\""),
        ("junk", &junk_arg, "(10240 bytes)"),
    ];
    for (name, arg, needle) in cases {
        let out = nvshim(&node, &["list", arg]);
        let err = stderr(&out);
        assert!(!out.status.success(), "case {name}: succeeded");
        assert!(
            err.contains(needle),
            "case {name}: stderr lacks {needle:?}:\n{err}"
        );
        assert!(
            err.len() < 2000,
            "case {name}: error is {} bytes",
            err.len()
        );
    }
    // Unknown devices also say what exists.
    let err = stderr(&nvshim(&node, &["list", "--devices=9"]));
    assert!(err.contains(&node.sim.spec.gpus[0].uuid), "{err}");
}

#[test]
fn mig_devices_resolve_through_nvml_and_bring_their_caps() {
    let node = node(&NodeSpec::with_mig(2));
    let out = ok(
        nvshim(&node, &["list", "--devices=0:1", "--json"]),
        "list 0:1",
    );
    let plan: Value = serde_json::from_str(&out).expect("plan");
    assert_eq!(plan["backend"], "nvml", "MIG ids need NVML");
    let nodes: Vec<&str> = plan["edits"]["deviceNodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .filter_map(|n| n["path"].as_str())
        .collect();
    let parent = by_index(&node.sim.spec)[0].minor;
    assert!(
        nodes.contains(&format!("/dev/nvidia{parent}").as_str()),
        "{nodes:?}"
    );
    let caps: Vec<&&str> = nodes
        .iter()
        .filter(|n| n.starts_with("/dev/nvidia-caps/"))
        .collect();
    assert_eq!(caps.len(), 2, "GI and CI access nodes: {nodes:?}");

    let err = stderr(&nvshim(&node, &["list", "--devices=0:7"]));
    assert!(err.contains("\"0:7\"") && err.contains("0:0 MIG-"), "{err}");

    // `all` on a node with MIG instances switches auto to NVML as well.
    let out = ok(
        nvshim(&node, &["list", "--devices=all", "--json"]),
        "list all",
    );
    let plan: Value = serde_json::from_str(&out).expect("plan");
    assert_eq!(plan["backend"], "nvml");
    assert_eq!(
        plan["selection"]["mig_devices"].as_array().map(Vec::len),
        Some(2)
    );
}

#[test]
fn void_requests_touch_nothing() {
    let node = node(&NodeSpec::standard(1));
    let log = node.sim.call_log.clone();
    let out = ok(
        nvshim_env(&node, &["list", "--devices=void", "--json"], &[]),
        "void",
    );
    let plan: Value = serde_json::from_str(&out).expect("plan");
    assert_eq!(plan["edits"], serde_json::json!({}));
    assert!(plan["backend"].is_null());
    assert!(!log.exists());
}

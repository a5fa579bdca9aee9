//! `nvshim configure containerd` on the containerd corpus (v2 and v3 files), and containerd
//! started by the test on what it wrote.

use super::ctk::ctk_ok;
use super::*;

pub(super) const CRI_V2: &str = "io.containerd.grpc.v1.cri";
pub(super) const CRI_V3: &str = "io.containerd.cri.v1.runtime";

/// containerd fixtures: file, CRI runtime plugin, whether configure + undo gives it back
/// byte for byte (the commented one had an old `nvidia` entry, which undo removes).
const CONTAINERD_CASES: &[(&str, &str, bool)] = &[
    ("containerd-1.6-default.toml", CRI_V2, true),
    ("debian-bookworm.toml", CRI_V2, true),
    ("containerd-2.x-v3.toml", CRI_V3, true),
    ("commented-v2.toml", CRI_V2, false),
];

pub(super) fn toml_at<'a>(doc: &'a toml::Table, keys: &[&str]) -> Option<&'a toml::Value> {
    let (first, rest) = keys.split_first()?;
    let mut v = doc.get(*first)?;
    for k in rest {
        v = v.get(k)?;
    }
    Some(v)
}

/// The comment of each line that has one, from its `#` (none of the fixtures has a `#` in a
/// string).
fn comments(text: &str) -> Vec<&str> {
    text.lines()
        .filter_map(|l| l.find('#').map(|i| l[i..].trim_end()))
        .collect()
}

#[test]
fn containerd_configs_get_the_runtime_at_the_schemas_path() {
    let runtime = runtime_bin();
    for (name, plugin, round_trips) in CONTAINERD_CASES {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let original = fs::read_to_string(fixture("containerd", name)).unwrap();
        fs::write(&path, &original).unwrap();
        let out = ok(
            &[
                "containerd",
                "--config",
                s(&path),
                "--runtime-path",
                &runtime,
                "--set-as-default",
            ],
            name,
        );
        assert!(
            out.contains("systemctl restart containerd"),
            "{name}: {out}"
        );

        let configured = fs::read_to_string(&path).unwrap();
        let doc: toml::Table = configured.parse().unwrap();
        let entry = ["plugins", plugin, "containerd", "runtimes", "nvidia"];
        let at = |tail: &[&str]| toml_at(&doc, &[&entry[..], tail].concat()).cloned();
        assert_eq!(
            at(&["runtime_type"])
                .and_then(|v| v.as_str().map(str::to_owned))
                .as_deref(),
            Some("io.containerd.runc.v2"),
            "{name}"
        );
        assert_eq!(
            at(&["options", "BinaryName"]).and_then(|v| v.as_str().map(str::to_owned)),
            Some(runtime.clone()),
            "{name}"
        );
        let default = toml_at(
            &doc,
            &["plugins", plugin, "containerd", "default_runtime_name"],
        );
        assert_eq!(default.and_then(|v| v.as_str()), Some("nvidia"), "{name}");
        let runc = toml_at(&doc, &["plugins", plugin, "containerd", "runtimes", "runc"]);
        assert!(runc.is_some(), "{name}: runc still declared");
        let other = if *plugin == CRI_V2 { CRI_V3 } else { CRI_V2 };
        assert!(
            toml_at(
                &doc,
                &["plugins", other, "containerd", "runtimes", "nvidia"]
            )
            .is_none(),
            "{name}: nothing under the other schema's plugin"
        );
        for comment in comments(&original) {
            assert!(configured.contains(comment), "{name}: lost {comment:?}");
        }
        assert!(
            configured.starts_with(original.lines().next().unwrap()),
            "{name}: the head of the file is untouched"
        );

        ok(&["containerd", "--config", s(&path), "--undo"], name);
        let undone = fs::read_to_string(&path).unwrap();
        if *round_trips {
            assert_eq!(
                undone, original,
                "{name}: configure + undo gives the file back"
            );
        } else {
            let doc: toml::Table = undone.parse().unwrap();
            assert!(toml_at(&doc, &entry).is_none(), "{name}: {undone}");
            let default = toml_at(
                &doc,
                &["plugins", plugin, "containerd", "default_runtime_name"],
            );
            assert_eq!(default.and_then(|v| v.as_str()), Some("runc"), "{name}");
            let lost = ["# An older toolkit", "# old install"];
            for comment in comments(&original) {
                if !lost.iter().any(|l| comment.starts_with(l)) {
                    assert!(undone.contains(comment), "{name}: lost {comment:?}");
                }
            }
        }
    }
}

/// containerd's own parser on the configured v2 files: `containerd config dump` prints the
/// merged config it would run with. (containerd 1.6, the one here, predates version 3 and
/// ignores a v3 file's plugin ids, so the v3 sample is checked by parsing above only.)
#[test]
fn containerd_config_dump_reads_our_runtime() {
    let runtime = runtime_bin();
    for name in [
        "containerd-1.6-default.toml",
        "debian-bookworm.toml",
        "commented-v2.toml",
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        fs::copy(fixture("containerd", name), &path).unwrap();
        ok(
            &[
                "containerd",
                "--config",
                s(&path),
                "--runtime-path",
                &runtime,
            ],
            name,
        );
        let out = Command::new("containerd")
            .args(["--config", s(&path), "config", "dump"])
            .output()
            .unwrap();
        let (dump, err) = text(&out);
        assert!(out.status.success(), "{name}: {err}");
        let doc: toml::Table = dump.parse().unwrap();
        let runtimes = ["plugins", CRI_V2, "containerd", "runtimes"];
        let binary = toml_at(
            &doc,
            &[&runtimes[..], &["nvidia", "options", "BinaryName"]].concat(),
        );
        assert_eq!(
            binary.and_then(|v| v.as_str()),
            Some(runtime.as_str()),
            "{name}: {dump}"
        );
        let runc = toml_at(&doc, &[&runtimes[..], &["runc", "runtime_type"]].concat());
        assert_eq!(
            runc.and_then(|v| v.as_str()),
            Some("io.containerd.runc.v2"),
            "{name}: runc survives"
        );
    }
}

/// A config with host paths of its own pointed into `dir`, so the containerd the test starts
/// touches nothing outside it (root, state and socket are the testkit's flags).
fn private_paths(config: &str, dir: &Path) -> String {
    let mut text = config.to_owned();
    for (host, private) in [
        ("/var/lib/containerd/opt", "opt"),
        ("/opt/containerd", "opt"),
        ("/etc/cni/net.d", "cni/net.d"),
        ("/opt/cni/bin", "cni/bin"),
        ("/usr/lib/cni", "cni/bin"),
    ] {
        let private = dir.join(private);
        text = text.replace(
            &format!("\"{host}\""),
            &format!("\"{}\"", private.display()),
        );
    }
    text
}

#[test]
fn containerd_loads_the_configured_file_and_ctr_runs_a_gpu_container() {
    let node = node(&NodeSpec::standard(4));
    let runtime = runtime_bin();
    let mut n = 0;
    // The stock file edited in place by `nvshim configure`; Debian's file through NVIDIA's
    // default, a drop-in the config imports, by `nvidia-ctk runtime configure`.
    for (name, drop_in) in [
        ("containerd-1.6-default.toml", false),
        ("debian-bookworm.toml", true),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("config.toml");
        let original = fs::read_to_string(fixture("containerd", name)).unwrap();
        fs::write(&path, private_paths(&original, dir.path())).unwrap();
        let runtime_file = if drop_in {
            let file = dir.path().join("conf.d/99-nvidia.toml");
            ctk_ok(
                &[
                    "--runtime=containerd",
                    "--config",
                    s(&path),
                    "--drop-in-config",
                    s(&file),
                    "--nvidia-runtime-path",
                    &runtime,
                    "--set-as-default",
                    "--cdi.enabled",
                ],
                name,
            );
            file
        } else {
            ok(
                &[
                    "containerd",
                    "--config",
                    s(&path),
                    "--runtime-path",
                    &runtime,
                    "--set-as-default",
                ],
                name,
            );
            path.clone()
        };
        let runtime_config = dir.path().join("runtime.toml");
        fs::write(&runtime_config, node.sim.runtime_config("runc", None)).unwrap();
        let containerd = Containerd::start_with_config(
            &dir.path().join("ctd"),
            &path,
            &[("NVIDIA_CTK_CONFIG_FILE_PATH", s(&runtime_config))],
        )
        .unwrap_or_else(|e| panic!("{name}: containerd did not start: {e}"));

        // The CRI plugin — the one that reads `runtimes` — loaded, with our runtime as default.
        let plugins = containerd.ctr().args(["plugins", "ls"]).output().unwrap();
        let plugins = text(&plugins).0;
        let cri = plugins
            .lines()
            .find(|l| l.split_whitespace().nth(1) == Some("cri"))
            .unwrap_or_else(|| panic!("{name}: no cri plugin:\n{plugins}"));
        let log = fs::read_to_string(containerd.log()).unwrap();
        assert!(cri.trim_end().ends_with("ok"), "{name}: {cri}\n{log}");
        let started = log
            .lines()
            .find(|l| l.contains("Start cri plugin with config"))
            .unwrap_or_else(|| panic!("{name}: {log}"));
        assert!(
            started.contains("DefaultRuntimeName:nvidia"),
            "{name}: {started}"
        );
        assert!(
            started.contains("nvidia:{Type:io.containerd.runc.v2"),
            "{name}: {started}"
        );
        assert!(
            started.contains(&format!("BinaryName:{runtime}")),
            "{name}: {started}"
        );
        assert!(
            started.contains("runc:{Type:io.containerd.runc.v2"),
            "{name}: {started}"
        );
        // The file's own CRI settings hold with the drop-in imported (Debian's CNI dir).
        let bin_dir = format!(
            "NetworkPluginBinDir:{}",
            dir.path().join("cni/bin").display()
        );
        assert!(started.contains(&bin_dir), "{name}: {started}");

        // ctr does not resolve CRI runtime names: it takes the shim and binary themselves. Read
        // them from the configured file, which is what the CRI plugin hands the runc shim.
        let doc: toml::Table = fs::read_to_string(&runtime_file).unwrap().parse().unwrap();
        let entry = ["plugins", CRI_V2, "containerd", "runtimes", "nvidia"];
        let shim = toml_at(&doc, &[&entry[..], &["runtime_type"]].concat()).unwrap();
        let binary = toml_at(&doc, &[&entry[..], &["options", "BinaryName"]].concat()).unwrap();
        let rootfs = dir.path().join("rootfs");
        node.sim.container_rootfs().build(&rootfs).unwrap();
        let mount = format!(
            "type=bind,src={},dst=/etc/mock-nvml.json,options=rbind:ro",
            node.sim.mock_config.display()
        );
        n += 1;
        let id = format!("nvshim-configure-{}-{n}", std::process::id());
        let out = containerd
            .ctr_run()
            .args(["--rm", "--rootfs"])
            .args(["--runtime", shim.as_str().unwrap()])
            .args(["--runc-binary", binary.as_str().unwrap()])
            .args(["--mount", &mount])
            .args(["--env", "MOCK_NVML_CONFIG=/etc/mock-nvml.json"])
            .args(["--env", "MOCK_NVML_DEV_ROOT=/dev"])
            .args(["--env", "NVIDIA_VISIBLE_DEVICES=2"])
            .arg(&rootfs)
            .arg(&id)
            .args(["/bin/sh", "-c", GPU_SCRIPT])
            .output()
            .unwrap();
        let (stdout, stderr) = text(&out);
        assert!(out.status.success(), "{name}: ctr run: {stderr}\n{stdout}");
        // GPU 2 is /dev/nvidia3 on the standard node.
        let printed = Printed(stdout.clone());
        assert_eq!(printed.gpu_nodes(), ["nvidia3"], "{name}: {stdout}");
        let smi = printed.smi_lines();
        assert!(
            smi.len() == 1 && smi[0].contains(&node.sim.spec.gpus[2].uuid),
            "{name}: {smi:?}"
        );
    }
}

/// Why configure writes out containerd's built-in `runc` when a file lists no runtime: with only
/// our entry, containerd 1.6 loses `runc` and its CRI plugin refuses the config. If a containerd
/// ever stops doing that, this test says the workaround can go.
#[test]
fn containerd_1_6_drops_builtin_runc_when_a_file_lists_only_ours() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    let original = fs::read_to_string(fixture("containerd", "debian-bookworm.toml")).unwrap();
    let naive = format!(
        "{}\n[plugins.\"{CRI_V2}\".containerd.runtimes.nvidia]\n  runtime_type = \"io.containerd.runc.v2\"\n",
        private_paths(&original, dir.path())
    );
    fs::write(&path, naive).unwrap();
    let containerd = Containerd::start_with_config(&dir.path().join("ctd"), &path, &[]).unwrap();
    let plugins = containerd.ctr().args(["plugins", "ls"]).output().unwrap();
    let plugins = text(&plugins).0;
    let cri = plugins
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some("cri"))
        .unwrap();
    assert!(cri.trim_end().ends_with("error"), "{cri}");
    let log = fs::read_to_string(containerd.log()).unwrap();
    assert!(
        log.contains("no corresponding runtime configured in `containerd.runtimes`"),
        "{log}"
    );
}

/// A version 1 file (no `version`: containerd 1.x's own default) gets the runtime under
/// `plugins.cri`, and containerd's parser, which migrates it to the version 2 plugin id on
/// load, sees it there.
#[test]
fn containerd_version_1_file_gets_the_runtime_under_plugins_cri() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("config.toml");
    let original = "oom_score = 0\n\n[plugins.cri]\n  sandbox_image = \"example.com/pause:1\"\n";
    fs::write(&path, original).unwrap();
    let runtime = runtime_bin();
    let args = [
        "containerd",
        "--config",
        s(&path),
        "--runtime-path",
        &runtime,
    ];
    ok(&[&args[..], &["--set-as-default"]].concat(), "v1");
    let configured = fs::read_to_string(&path).unwrap();
    assert!(configured.starts_with(original), "{configured}");
    let doc: toml::Table = configured.parse().unwrap();
    assert!(
        doc.get("version").is_none(),
        "still version 1: {configured}"
    );
    let binary = toml_at(
        &doc,
        &[
            "plugins",
            "cri",
            "containerd",
            "runtimes",
            "nvidia",
            "options",
            "BinaryName",
        ],
    );
    assert_eq!(binary.and_then(|v| v.as_str()), Some(runtime.as_str()));

    let out = Command::new("containerd")
        .args(["--config", s(&path), "config", "dump"])
        .output()
        .unwrap();
    let (dump, err) = text(&out);
    assert!(out.status.success(), "{err}");
    let dumped: toml::Table = dump.parse().unwrap();
    let cri = ["plugins", CRI_V2];
    let at = |tail: &[&str]| toml_at(&dumped, &[&cri[..], tail].concat()).cloned();
    assert_eq!(
        at(&["containerd", "runtimes", "nvidia", "options", "BinaryName"])
            .and_then(|v| v.as_str().map(str::to_owned)),
        Some(runtime.clone()),
        "{dump}"
    );
    assert_eq!(
        at(&["containerd", "default_runtime_name"]).and_then(|v| v.as_str().map(str::to_owned)),
        Some("nvidia".to_owned())
    );
    assert_eq!(
        at(&["sandbox_image"]).and_then(|v| v.as_str().map(str::to_owned)),
        Some("example.com/pause:1".to_owned())
    );
    assert!(at(&["containerd", "runtimes", "runc"]).is_some(), "{dump}");

    ok(&["containerd", "--config", s(&path), "--undo"], "v1 undo");
    assert_eq!(fs::read_to_string(&path).unwrap(), original);
}

#[test]
fn containerd_missing_file_becomes_a_minimal_v2_config() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("etc/containerd/config.toml");
    let out = ok(
        &["containerd", "--config", s(&path), "--dry-run"],
        "dry run",
    );
    assert!(out.contains("--- /dev/null"), "{out}");
    assert!(!dir.path().join("etc").exists());
    ok(&["containerd", "--config", s(&path)], "create");
    let doc: toml::Table = fs::read_to_string(&path).unwrap().parse().unwrap();
    assert_eq!(doc["version"].as_integer(), Some(2));
    let runtimes = ["plugins", CRI_V2, "containerd", "runtimes"];
    let binary = toml_at(
        &doc,
        &[&runtimes[..], &["nvidia", "options", "BinaryName"]].concat(),
    );
    assert_eq!(
        binary.and_then(|v| v.as_str()),
        Some("/usr/bin/nvidia-container-runtime")
    );
    ok(&["containerd", "--config", s(&path), "--undo"], "undo");
    assert_eq!(fs::read_to_string(&path).unwrap(), "version = 2\n");
}

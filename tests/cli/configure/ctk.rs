//! `nvidia-ctk runtime configure`: the nvshim binary started under NVIDIA's name, with NVIDIA's
//! flags and defaults, on the corpus `nvshim configure` is tested on. containerd's own parser
//! (`containerd config dump`, cheap: no daemon) reads every version 2 result, a dockerd started
//! by the test lists the runtime from the daemon.json it wrote; the containerd started on a
//! drop-in is in `containerd::containerd_loads_the_configured_file_and_ctr_runs_a_gpu_container`.

use super::containerd::{CRI_V2, CRI_V3, toml_at};
use super::*;

/// `nvidia-ctk <args>` (a link named `nvidia-ctk` to the nvshim binary) with nothing inherited.
pub(super) fn ctk(args: &[&str]) -> Output {
    let dir = tempfile::tempdir().unwrap();
    let link = dir.path().join("nvidia-ctk");
    symlink(NVSHIM, &link).unwrap();
    Command::new(&link)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .args(args)
        .output()
        .unwrap()
}

/// `nvidia-ctk runtime configure <args>`, asserted to succeed; stdout.
pub(super) fn ctk_ok(args: &[&str], case: &str) -> String {
    let out = ctk(&[&["runtime", "configure"][..], args].concat());
    let (stdout, stderr) = text(&out);
    assert!(
        out.status.success(),
        "{case}: nvidia-ctk runtime configure {args:?}: {}\n{stdout}\n{stderr}",
        out.status
    );
    stdout
}

#[test]
fn ctk_docker_set_as_default_cdi_and_dry_run() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = docker_case(dir.path(), Some("log-driver.json"));
    let before = read_object(&path);
    let args = [
        "--runtime=docker",
        "--config",
        s(&path),
        "--set-as-default",
        "--cdi.enabled",
    ];
    let printed = ctk_ok(&[&args[..], &["--dry-run"]].concat(), "dry run");
    assert_eq!(read_object(&path), before, "dry run writes nothing");
    assert_eq!(
        nvshim_testkit::dir_names(path.parent().unwrap()),
        ["daemon.json"]
    );

    ctk_ok(&args, "write");
    let written = read_object(&path);
    assert_eq!(
        parse_object(&printed),
        written,
        "--dry-run prints what is written"
    );
    // NVIDIA's entry: the bare executable name, which dockerd looks up on its PATH.
    assert_eq!(
        written["runtimes"]["nvidia"],
        serde_json::json!({"args": [], "path": "nvidia-container-runtime"})
    );
    assert_eq!(written["default-runtime"], "nvidia");
    assert_eq!(written["features"]["cdi"], true);
    for (key, value) in &before {
        assert_eq!(&written[key], value, "{key} kept");
    }
}

/// Every containerd fixture through NVIDIA's default mode, a drop-in imported from the config:
/// the drop-in at the schema's path, the config changed by one `imports` entry only, and
/// containerd's own parser seeing the runtime through the import (version 2).
#[test]
fn ctk_containerd_drop_in_for_every_fixture() {
    let runtime = runtime_bin();
    for (name, plugin) in [
        ("containerd-1.6-default.toml", CRI_V2),
        ("debian-bookworm.toml", CRI_V2),
        ("commented-v2.toml", CRI_V2),
        ("containerd-2.x-v3.toml", CRI_V3),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("config.toml");
        let original = fs::read_to_string(fixture("containerd", name)).unwrap();
        fs::write(&config, &original).unwrap();
        let drop_in = dir.path().join("conf.d/99-nvidia.toml");
        let args = [
            "--runtime=containerd",
            "--config",
            s(&config),
            "--drop-in-config",
            s(&drop_in),
            "--nvidia-runtime-path",
            &runtime,
            "--nvidia-set-as-default",
            "--cdi.enabled",
        ];
        ctk_ok(&args, name);
        let doc: toml::Table = fs::read_to_string(&drop_in).unwrap().parse().unwrap();
        let version = if plugin == CRI_V3 { 3 } else { 2 };
        assert_eq!(doc["version"].as_integer(), Some(version), "{name}");
        let cri = ["plugins", plugin];
        let at = |tail: &[&str]| toml_at(&doc, &[&cri[..], tail].concat()).cloned();
        assert_eq!(
            at(&["containerd", "runtimes", "nvidia", "options", "BinaryName"]),
            Some(toml::Value::String(runtime.clone())),
            "{name}"
        );
        assert_eq!(
            at(&["containerd", "default_runtime_name"]),
            Some(toml::Value::String("nvidia".into())),
            "{name}"
        );
        assert_eq!(
            at(&["enable_cdi"]),
            Some(toml::Value::Boolean(true)),
            "{name}"
        );

        let top = fs::read_to_string(&config).unwrap();
        let import = format!(
            "imports = [\"{}/*.toml\"]",
            drop_in.parent().unwrap().display()
        );
        // containerd's stock file has `imports = []`: the import goes into it.
        assert_eq!(
            top.replacen(&format!("{import}\n"), "", 1),
            original.replacen("imports = []\n", "", 1),
            "{name}: only the import added:\n{top}"
        );
        let out = ctk_ok(&args, name);
        assert!(out.is_empty(), "{name}: {out}");
        assert_eq!(fs::read_to_string(&config).unwrap(), top, "{name}: again");

        if plugin == CRI_V2 {
            dump_sees_the_runtime(&config, name, &runtime);
        }

        // `nvshim configure --undo` on the same drop-in: the file gone, the import too (its
        // directory holds nothing else); `imports = []` is not kept.
        ok(
            &[
                "containerd",
                "--config",
                s(&config),
                "--drop-in-config",
                s(&drop_in),
                "--undo",
            ],
            name,
        );
        assert!(!drop_in.exists(), "{name}");
        assert_eq!(
            fs::read_to_string(&config).unwrap(),
            original.replacen("imports = []\n", "", 1),
            "{name}: undo"
        );
    }
}

/// containerd's own parser on a config that imports the drop-in.
fn dump_sees_the_runtime(config: &Path, name: &str, runtime: &str) {
    let out = Command::new("containerd")
        .args(["--config", s(config), "config", "dump"])
        .output()
        .unwrap();
    let (dump, err) = text(&out);
    assert!(out.status.success(), "{name}: {err}");
    let dumped: toml::Table = dump.parse().unwrap();
    let runtimes = ["plugins", CRI_V2, "containerd", "runtimes"];
    let binary = toml_at(
        &dumped,
        &[&runtimes[..], &["nvidia", "options", "BinaryName"]].concat(),
    );
    assert_eq!(binary.and_then(|v| v.as_str()), Some(runtime), "{name}");
    let runc = toml_at(&dumped, &[&runtimes[..], &["runc"]].concat());
    assert!(runc.is_some(), "{name}: runc survives the import\n{dump}");
    // The file's own CRI settings survive too (containerd 1.x replaces the table).
    if name == "debian-bookworm.toml" {
        let bin_dir = toml_at(&dumped, &["plugins", CRI_V2, "cni", "bin_dir"]);
        assert_eq!(
            bin_dir.and_then(|v| v.as_str()),
            Some("/usr/lib/cni"),
            "{name}"
        );
    }
}

/// `--config-source=command`: the drop-in is built from containerd's merged view of its config
/// (`containerd config dump`), defaults included; CRI-O's commands missing here, it says so.
#[test]
fn ctk_config_source_command() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    fs::copy(fixture("containerd", "debian-bookworm.toml"), &config).unwrap();
    let drop_in = dir.path().join("conf.d/99-nvidia.toml");
    ctk_ok(
        &[
            "--runtime=containerd",
            "--config",
            s(&config),
            "--drop-in-config",
            s(&drop_in),
            "--config-source=command",
            "--executable-path=/usr/bin/containerd",
        ],
        "command",
    );
    let doc: toml::Table = fs::read_to_string(&drop_in).unwrap().parse().unwrap();
    let cri = ["plugins", CRI_V2];
    let at = |tail: &[&str]| {
        toml_at(&doc, &[&cri[..], tail].concat()).and_then(|v| v.as_str().map(str::to_owned))
    };
    assert_eq!(
        at(&["cni", "bin_dir"]).as_deref(),
        Some("/usr/lib/cni"),
        "the file's"
    );
    assert!(
        at(&["sandbox_image"]).is_some(),
        "containerd's default, from the dump"
    );
    assert_eq!(
        at(&["containerd", "runtimes", "nvidia", "options", "BinaryName"]).as_deref(),
        Some("/usr/bin/nvidia-container-runtime")
    );
    dump_sees_the_runtime(&config, "command", "/usr/bin/nvidia-container-runtime");

    let out = ctk(&[
        "runtime",
        "configure",
        "--runtime=crio",
        "--config-source=command",
        "--executable-path=/nonexistent/crio",
        "--dry-run",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let stderr = text(&out).1;
    assert!(
        stderr.contains("cannot read CRI-O's config from the engine")
            && stderr.contains("/nonexistent/crio status config")
            && stderr.contains("crio-status config"),
        "{stderr}"
    );
}

/// `--drop-in-config=""` edits the config itself, exactly as `nvshim configure containerd`
/// does: one implementation behind both names.
#[test]
fn ctk_containerd_in_place_matches_nvshim_configure() {
    let dir = tempfile::tempdir().unwrap();
    let ours = dir.path().join("nvshim.toml");
    let theirs = dir.path().join("ctk.toml");
    for path in [&ours, &theirs] {
        fs::copy(fixture("containerd", "commented-v2.toml"), path).unwrap();
    }
    ok(
        &[
            "containerd",
            "--config",
            s(&ours),
            "--set-as-default",
            "--cdi-enabled",
        ],
        "nvshim",
    );
    ctk_ok(
        &[
            "--runtime=containerd",
            "--config",
            s(&theirs),
            "--drop-in-config=",
            "--set-as-default",
            "--enable-cdi",
        ],
        "nvidia-ctk",
    );
    assert_eq!(
        fs::read_to_string(&theirs).unwrap(),
        fs::read_to_string(&ours).unwrap()
    );
}

#[test]
fn ctk_crio_drop_in_and_oci_hook() {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("crio.conf");
    fs::write(
        &main,
        "[crio.runtime]\ndefault_runtime = \"crun\"\n\n[crio.runtime.runtimes.crun]\n\
         runtime_path = \"/usr/libexec/crio/crun\"\nmonitor_path = \"/usr/libexec/crio/conmon\"\n",
    )
    .unwrap();
    let drop_in = dir.path().join("crio.conf.d/99-nvidia.toml");
    let args = [
        "--runtime=crio",
        "--config",
        s(&main),
        "--drop-in-config",
        s(&drop_in),
        "--set-as-default",
    ];
    let printed = ctk_ok(&[&args[..], &["--dry-run"]].concat(), "crio dry run");
    assert!(!drop_in.exists());
    ctk_ok(&args, "crio");
    let content = fs::read_to_string(&drop_in).unwrap();
    assert_eq!(printed, content);
    let doc: toml::Table = content.parse().unwrap();
    let entry = &doc["crio"]["runtime"]["runtimes"]["nvidia"];
    assert_eq!(
        entry["runtime_path"].as_str(),
        Some("/usr/bin/nvidia-container-runtime")
    );
    assert_eq!(entry["runtime_type"].as_str(), Some("oci"));
    assert_eq!(
        entry["monitor_path"].as_str(),
        Some("/usr/libexec/crio/conmon"),
        "copied from the default runtime"
    );
    assert_eq!(
        doc["crio"]["runtime"]["default_runtime"].as_str(),
        Some("nvidia")
    );

    let hook = dir.path().join("hooks.d/oci-nvidia-hook.json");
    let args = [
        "--runtime=crio",
        "--config-mode=oci-hook",
        "--oci-hook-path",
        s(&hook),
        "--nvidia-runtime-hook-path=/opt/nv/bin/nvidia-container-runtime-hook",
    ];
    ctk_ok(&args, "oci hook");
    let json: Value = serde_json::from_str(&fs::read_to_string(&hook).unwrap()).unwrap();
    assert_eq!(json["version"], "1.0.0");
    assert_eq!(json["stages"], serde_json::json!(["prestart"]));
    assert_eq!(json["when"]["always"], true);
    assert_eq!(
        json["hook"]["args"],
        serde_json::json!(["nvidia-container-runtime-hook", "prestart"])
    );
    assert!(
        json["hook"]["env"][0]
            .as_str()
            .unwrap()
            .ends_with(":/bin:/opt/nv/bin"),
        "{json}"
    );
}

/// NVIDIA's checks: exit 1 with the reason; warnings where NVIDIA only warns.
#[test]
fn ctk_refusals_and_warnings() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("config.toml");
    let config = s(&config);
    for (case, args, says) in [
        (
            "relative path",
            &[
                "--runtime=containerd",
                "--config",
                config,
                "--nvidia-runtime-path=bin/rt",
            ][..],
            "is not an absolute path",
        ),
        (
            "docker drop-in",
            &["--config", config, "--drop-in-config=/tmp/x.json"],
            "does not support drop-in configs",
        ),
        (
            "engine",
            &["--runtime=podman"],
            "possible values: docker, containerd, crio",
        ),
        (
            "source",
            &["--config-source=etcd"],
            "possible values: file, command",
        ),
    ] {
        let out = ctk(&[&["runtime", "configure"][..], args].concat());
        assert_eq!(out.status.code(), Some(1), "{case}");
        assert!(text(&out).1.contains(says), "{case}: {}", text(&out).1);
    }
    assert!(!Path::new(config).exists());

    let out = ctk(&[
        "runtime",
        "configure",
        "--runtime=crio",
        "--config",
        config,
        "--drop-in-config=",
        "--config-mode=toml",
        "--cdi.enabled=true",
        "--set-as-default=false",
    ]);
    let (_, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("ignoring unsupported --config-mode \"toml\""),
        "{stderr}"
    );
    assert!(
        stderr.contains("ignoring --cdi.enabled for crio"),
        "{stderr}"
    );
    let doc: toml::Table = fs::read_to_string(config).unwrap().parse().unwrap();
    assert!(doc["crio"]["runtime"].get("default_runtime").is_none());
    assert!(doc["crio"]["runtime"]["runtimes"].get("nvidia").is_some());
}

/// dockerd started on the daemon.json `nvidia-ctk runtime configure --runtime=docker
/// --set-as-default --cdi.enabled` wrote: it lists the runtime and runs it by default.
#[test]
fn dockerd_starts_with_the_nvidia_ctk_daemon_json() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = docker_case(dir.path(), Some("registry-mirrors.json"));
    let runtime = runtime_bin();
    ctk_ok(
        &[
            "--runtime=docker",
            "--config",
            s(&path),
            "--nvidia-runtime-path",
            &runtime,
            "--set-as-default",
            "--cdi.enabled",
        ],
        "docker",
    );
    let configured = Value::Object(read_object(&path));
    assert_eq!(configured["features"]["cdi"], true);
    let daemon = Dockerd::start(&dir.path().join("d"), &configured).unwrap();
    let out = daemon
        .docker()
        .args(["info", "--format", "{{json .Runtimes}}|{{.DefaultRuntime}}"])
        .output()
        .unwrap();
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "docker info: {stderr}");
    let (runtimes, default) = stdout.trim().split_once('|').unwrap();
    let runtimes: Value = serde_json::from_str(runtimes).unwrap();
    assert_eq!(runtimes["nvidia"]["path"], runtime, "{runtimes}");
    assert_eq!(default, "nvidia");
}

//! Defaults, the fixture files, valid values and what they parse to; also the
//! fixtures and helpers the other config test modules share.

use std::path::{Path, PathBuf};

use super::values::Words;
use super::*;

pub(super) const NVIDIA_DEFAULT: &str =
    include_str!("../../tests/fixtures/config-toml/nvidia-default.toml");
const DRIVER_CONTAINER: &str =
    include_str!("../../tests/fixtures/config-toml/driver-container.toml");
const ROOTLESS: &str = include_str!("../../tests/fixtures/config-toml/rootless.toml");
pub(super) const UNKNOWN_KEYS: &str =
    include_str!("../../tests/fixtures/config-toml/unknown-keys.toml");
const NVSHIM: &str = include_str!("../../tests/fixtures/config-toml/nvshim.toml");

pub(super) const FILE: &str = "/etc/nvidia-container-runtime/config.toml";

pub(super) fn parse_ok(text: &str) -> (Config, Vec<String>) {
    match parse(text, Path::new(FILE)) {
        Ok(parsed) => parsed,
        Err(e) => panic!("parse failed: {e}"),
    }
}

pub(super) fn parse_err(text: &str) -> ConfigError {
    match parse(text, Path::new(FILE)) {
        Ok((config, _)) => panic!("parse succeeded: {config:?}"),
        Err(e) => e,
    }
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

#[test]
fn defaults_are_nvidias() {
    let c = Config::default();
    let cli = &c.nvidia_container_cli;
    let rt = &c.nvidia_container_runtime;
    let f = &c.features;
    // (key, ours, NVIDIA's default as `nvidia-ctk config default` gives it)
    let cases: &[(&str, String, &str)] = &[
        ("disable-require", c.disable_require.to_string(), "false"),
        ("swarm-resource", c.swarm_resource.clone(), ""),
        (
            "accept-nvidia-visible-devices-envvar-when-unprivileged",
            c.accept_nvidia_visible_devices_envvar_when_unprivileged
                .to_string(),
            "true",
        ),
        (
            "accept-nvidia-visible-devices-as-volume-mounts",
            c.accept_nvidia_visible_devices_as_volume_mounts.to_string(),
            "false",
        ),
        (
            "supported-driver-capabilities",
            c.supported_driver_capabilities.clone(),
            "compat32,compute,display,graphics,ngx,utility,video",
        ),
        ("cli.root", cli.root.display().to_string(), ""),
        ("cli.path", cli.path.display().to_string(), ""),
        ("cli.environment", format!("{:?}", cli.environment), "[]"),
        ("cli.debug", cli.debug.display().to_string(), ""),
        ("cli.ldcache", cli.ldcache.display().to_string(), ""),
        ("cli.load-kmods", cli.load_kmods.to_string(), "true"),
        ("cli.no-pivot", cli.no_pivot.to_string(), "false"),
        ("cli.no-cgroups", cli.no_cgroups.to_string(), "false"),
        ("cli.user", cli.user.clone(), ""),
        ("cli.ldconfig", cli.ldconfig.clone(), "@/sbin/ldconfig"),
        ("runtime.debug", rt.debug.display().to_string(), "/dev/null"),
        ("runtime.log-level", rt.log_level.to_string(), "info"),
        ("runtime.mode", rt.mode.to_string(), "auto"),
        (
            "modes.cdi.spec-dirs",
            format!("{:?}", rt.modes.cdi.spec_dirs),
            r#"["/etc/cdi", "/var/run/cdi"]"#,
        ),
        (
            "modes.cdi.default-kind",
            rt.modes.cdi.default_kind.clone(),
            "nvidia.com/gpu",
        ),
        (
            "modes.cdi.annotation-prefixes",
            format!("{:?}", rt.modes.cdi.annotation_prefixes),
            r#"["cdi.k8s.io/"]"#,
        ),
        (
            "modes.csv.mount-spec-path",
            rt.modes.csv.mount_spec_path.display().to_string(),
            "/etc/nvidia-container-runtime/host-files-for-container.d",
        ),
        (
            "modes.csv.compat-container-root",
            rt.modes.csv.compat_container_root.display().to_string(),
            "",
        ),
        (
            "modes.jit-cdi.nvcdi-feature-flags",
            format!("{:?}", rt.modes.jit_cdi.nvcdi_feature_flags),
            "[]",
        ),
        (
            "modes.jit-cdi.nvcdi-disable-hooks",
            format!("{:?}", rt.modes.jit_cdi.nvcdi_disable_hooks),
            "[]",
        ),
        (
            "modes.legacy.cuda-compat-mode",
            rt.modes.legacy.cuda_compat_mode.to_string(),
            "ldconfig",
        ),
        (
            "hook.path",
            c.nvidia_container_runtime_hook.path.display().to_string(),
            "nvidia-container-runtime-hook",
        ),
        (
            "hook.skip-mode-detection",
            c.nvidia_container_runtime_hook
                .skip_mode_detection
                .to_string(),
            "false",
        ),
        (
            "nvidia-ctk.path",
            c.nvidia_ctk.path.display().to_string(),
            "nvidia-ctk",
        ),
        (
            "features (all seven)",
            format!(
                "{:?}",
                [
                    f.allow_cuda_compat_libs_from_container,
                    f.allow_ldconfig_from_container,
                    f.allow_unknown_oci_spec_fields,
                    f.disable_cuda_compat_lib_hook,
                    f.disable_imex_channel_creation,
                    f.ignore_imex_channel_requests,
                    f.no_additional_gids_for_device_nodes,
                ]
            ),
            "[false, false, false, false, false, false, false]",
        ),
    ];
    for (key, ours, nvidia) in cases {
        assert_eq!(ours, nvidia, "default of {key}");
    }
}

#[test]
fn defaults_that_differ_from_nvidia_by_design() {
    let c = Config::default();
    let cases: &[(&str, String, &str)] = &[
        (
            "runtimes (NVIDIA: [\"runc\", \"crun\"])",
            format!("{:?}", c.nvidia_container_runtime.runtimes),
            r#"["docker-runc", "runc", "crun"]"#,
        ),
        (
            "nvshim.proc-root (ours)",
            c.nvshim.proc_root.display().to_string(),
            "/",
        ),
        (
            "nvshim.systemd-root (ours)",
            c.nvshim.systemd_root.display().to_string(),
            "/",
        ),
        (
            "nvshim.nvml-timeout (ours, seconds)",
            c.nvshim.nvml_timeout.to_string(),
            "10",
        ),
        (
            "nvshim.driver-mounts (ours)",
            c.nvshim.driver_mounts.to_string(),
            "staged",
        ),
        (
            "nvshim.driver-stage-dir (ours)",
            c.nvshim.driver_stage_dir.display().to_string(),
            "/run/nvshim/driver-stage",
        ),
        (
            "nvidia-container-cli.dev-root (ours)",
            format!("{:?}", c.nvidia_container_cli.dev_root),
            "None",
        ),
    ];
    for (key, ours, want) in cases {
        assert_eq!(ours, want, "default of {key}");
    }
}

#[test]
fn table_defaults_are_slices_of_the_one_default() {
    let c = Config::default();
    assert_eq!(CliConfig::default(), c.nvidia_container_cli, "cli");
    assert_eq!(
        RuntimeConfig::default(),
        c.nvidia_container_runtime,
        "runtime"
    );
    assert_eq!(Modes::default(), c.nvidia_container_runtime.modes, "modes");
    assert_eq!(
        HookConfig::default(),
        c.nvidia_container_runtime_hook,
        "hook"
    );
    assert_eq!(CtkConfig::default(), c.nvidia_ctk, "ctk");
    assert_eq!(Features::default(), c.features, "features");
    assert_eq!(NvshimConfig::default(), c.nvshim, "nvshim");
}

#[test]
fn nvidia_default_file_parses_to_default() {
    let (config, unknown) = parse_ok(NVIDIA_DEFAULT);
    let mut want = Config::default();
    // The one key whose default differs by design (see the module doc).
    want.nvidia_container_runtime.runtimes = strings(&["runc", "crun"]);
    assert_eq!(config, want);
    assert_eq!(unknown, Vec::<String>::new(), "unknown keys");
}

#[test]
fn empty_file_is_default() {
    for (name, text) in [("empty", ""), ("comments", "# nothing\n\n# here\n")] {
        assert_eq!(parse_ok(text), (Config::default(), vec![]), "{name}");
    }
}

#[test]
fn fixtures_parse() {
    let driver_container = {
        let mut c = Config {
            accept_nvidia_visible_devices_as_volume_mounts: true,
            accept_nvidia_visible_devices_envvar_when_unprivileged: false,
            ..Config::default()
        };
        let cli = &mut c.nvidia_container_cli;
        cli.root = "/run/nvidia/driver".into();
        cli.path = "/usr/local/nvidia/toolkit/nvidia-container-cli".into();
        cli.ldconfig = "@/run/nvidia/driver/sbin/ldconfig".into();
        let rt = &mut c.nvidia_container_runtime;
        rt.mode = Mode::Cdi;
        rt.modes.cdi.default_kind = "management.nvidia.com/gpu".into();
        rt.modes.cdi.annotation_prefixes = strings(&["cdi.k8s.io/", "nvidia.cdi.k8s.io/"]);
        c.nvidia_container_runtime_hook.path =
            "/usr/local/nvidia/toolkit/nvidia-container-runtime-hook".into();
        c.nvidia_ctk.path = "/usr/local/nvidia/toolkit/nvidia-ctk".into();
        c
    };
    let rootless = {
        let mut c = Config::default();
        c.nvidia_container_cli.no_cgroups = true;
        c.nvidia_container_cli.debug = "/tmp/nvidia-container-toolkit.log".into();
        c.nvidia_container_runtime.log_level = LogLevel::Debug;
        c.nvidia_container_runtime.debug = "/tmp/nvidia-container-runtime.log".into();
        c
    };
    let nvshim = {
        let mut c = Config::default();
        c.nvidia_container_cli.root = "/run/nvidia/driver".into();
        c.nvidia_container_cli.dev_root = Some("/".into());
        c.nvshim.proc_root = "/host".into();
        c
    };
    let cases = [
        ("driver-container.toml", DRIVER_CONTAINER, driver_container),
        ("rootless.toml", ROOTLESS, rootless),
        ("nvshim.toml", NVSHIM, nvshim),
    ];
    for (name, text, want) in cases {
        let (config, unknown) = parse_ok(text);
        assert_eq!(config, want, "{name}");
        assert!(unknown.is_empty(), "{name}: unknown keys {unknown:?}");
    }
}

#[test]
fn partial_table_keeps_the_other_defaults() {
    let (config, _) = parse_ok(
        "[nvidia-container-runtime]\nmode = \"cdi\"\n\
         [nvidia-container-runtime.modes.cdi]\nspec-dirs = [\"/opt/cdi\"]\n",
    );
    let mut want = Config::default();
    want.nvidia_container_runtime.mode = Mode::Cdi;
    want.nvidia_container_runtime.modes.cdi.spec_dirs = vec![PathBuf::from("/opt/cdi")];
    assert_eq!(config, want);
}

#[test]
fn dotted_and_inline_keys_work() {
    let cases = [
        (
            "dotted",
            "nvidia-container-runtime.modes.legacy.cuda-compat-mode = \"hook\"\n",
        ),
        (
            "inline table",
            "nvidia-container-runtime = { modes = { legacy = { cuda-compat-mode = \"hook\" } } }\n",
        ),
    ];
    for (name, text) in cases {
        let (config, _) = parse_ok(text);
        assert_eq!(
            config
                .nvidia_container_runtime
                .modes
                .legacy
                .cuda_compat_mode,
            CudaCompatMode::Hook,
            "{name}"
        );
        assert_eq!(
            config.nvidia_container_runtime.log_level,
            LogLevel::Info,
            "{name}: the rest stays default"
        );
    }
}

#[test]
fn unknown_keys_are_returned_not_fatal() {
    let (config, mut unknown) = parse_ok(UNKNOWN_KEYS);
    unknown.sort();
    assert_eq!(
        unknown,
        strings(&[
            "not-a-key",
            "nvidia-container-cli.made-up",
            "nvidia-container-runtime.experimental",
            "nvidia-container-runtime.modes.cdi.\"key with spaces\"",
            "nvidia-container-runtime.retired",
            "some-other-tool",
        ])
    );
    // The known keys around them still apply.
    assert_eq!(config.nvidia_container_runtime.runtimes, strings(&["runc"]));
    assert_eq!(
        config.nvidia_container_runtime.modes.cdi.spec_dirs,
        vec![PathBuf::from("/etc/cdi")]
    );
}

#[test]
fn enum_values() {
    let cases = [
        (
            "mode cdi",
            "[nvidia-container-runtime]\nmode = \"cdi\"",
            Ok(()),
        ),
        (
            "mode jit-cdi",
            "[nvidia-container-runtime]\nmode = \"jit-cdi\"",
            Ok(()),
        ),
        (
            "mode upper case",
            "[nvidia-container-runtime]\nmode = \"CDI\"",
            Err(()),
        ),
        (
            "log-level Warning",
            "[nvidia-container-runtime]\nlog-level = \"Warning\"",
            Ok(()),
        ),
        (
            "compat mount",
            "[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = \"mount\"",
            Ok(()),
        ),
    ];
    for (name, text, want) in cases {
        assert_eq!(
            parse(text, Path::new(FILE)).map(|_| ()).map_err(|_| ()),
            want,
            "{name}"
        );
    }

    let levels = [
        ("trace", LogLevel::Trace),
        ("DEBUG", LogLevel::Debug),
        ("info", LogLevel::Info),
        ("warn", LogLevel::Warn),
        ("warning", LogLevel::Warn),
        ("error", LogLevel::Error),
        ("fatal", LogLevel::Error),
        ("Panic", LogLevel::Error),
    ];
    for (word, want) in levels {
        let (config, _) = parse_ok(&format!(
            "[nvidia-container-runtime]\nlog-level = \"{word}\""
        ));
        assert_eq!(
            config.nvidia_container_runtime.log_level, want,
            "log-level {word}"
        );
    }
}

#[test]
fn enum_round_trips_through_its_word() {
    for (word, mode) in Mode::WORDS {
        assert_eq!(mode.as_str(), *word, "mode {word}");
        assert_eq!(word.parse::<Mode>(), Ok(*mode), "mode {word}");
    }
    for (word, mode) in CudaCompatMode::WORDS {
        assert_eq!(mode.as_str(), *word, "cuda-compat-mode {word}");
    }
    let canonical = ["trace", "debug", "info", "warn", "error"];
    for word in canonical {
        let level: LogLevel = word.parse().unwrap_or(LogLevel::Trace);
        assert_eq!(level.as_str(), word, "log-level {word}");
    }
}

#[test]
fn roots() {
    let cases = [
        ("defaults", "", "/", "/"),
        (
            "driver container",
            "[nvidia-container-cli]\nroot = \"/run/nvidia/driver\"\n",
            "/run/nvidia/driver",
            "/run/nvidia/driver",
        ),
        (
            "split dev root",
            "[nvidia-container-cli]\nroot = \"/run/nvidia/driver\"\ndev-root = \"/\"\n",
            "/run/nvidia/driver",
            "/",
        ),
        (
            "empty dev root means the driver root",
            "[nvidia-container-cli]\nroot = \"/drv\"\ndev-root = \"\"\n",
            "/drv",
            "/drv",
        ),
        (
            "dev root alone",
            "[nvidia-container-cli]\ndev-root = \"/host\"\n",
            "/",
            "/host",
        ),
    ];
    for (name, text, driver, dev) in cases {
        let (config, _) = parse_ok(text);
        assert_eq!(
            config.driver_root(),
            Path::new(driver),
            "{name}: driver root"
        );
        assert_eq!(config.dev_root(), Path::new(dev), "{name}: dev root");
    }
}

#[test]
fn serialized_default_parses_back() {
    let mut configs = vec![Config::default()];
    let (nvshim, _) = parse_ok(NVSHIM);
    configs.push(nvshim);
    for config in configs {
        let text = match toml::to_string(&config) {
            Ok(text) => text,
            Err(e) => panic!("serialize: {e}"),
        };
        assert_eq!(parse_ok(&text), (config, vec![]), "{text}");
    }
}

#[test]
fn driver_mounts_takes_its_two_words_and_names_them_otherwise() {
    let (c, _) = parse_ok("[nvshim]\ndriver-mounts = \"per-file\"\n");
    assert_eq!(c.nvshim.driver_mounts, DriverMounts::PerFile);
    let err = parse_err("[nvshim]\ndriver-mounts = \"overlay\"\n").to_string();
    for want in ["overlay", "staged", "per-file"] {
        assert!(err.contains(want), "{err}");
    }
}

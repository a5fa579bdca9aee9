use std::collections::HashMap;
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use super::*;
use crate::request::Capability;

const NVIDIA_DEFAULT: &str = include_str!("../../tests/fixtures/config-toml/nvidia-default.toml");
const DRIVER_CONTAINER: &str =
    include_str!("../../tests/fixtures/config-toml/driver-container.toml");
const ROOTLESS: &str = include_str!("../../tests/fixtures/config-toml/rootless.toml");
const UNKNOWN_KEYS: &str = include_str!("../../tests/fixtures/config-toml/unknown-keys.toml");
const NVSHIM: &str = include_str!("../../tests/fixtures/config-toml/nvshim.toml");

const FILE: &str = "/etc/nvidia-container-runtime/config.toml";

fn parse_ok(text: &str) -> (Config, Vec<String>) {
    match parse(text, Path::new(FILE)) {
        Ok(parsed) => parsed,
        Err(e) => panic!("parse failed: {e}"),
    }
}

fn parse_err(text: &str) -> ConfigError {
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
            "nvshim.hook-path (ours)",
            c.nvshim.hook_path.display().to_string(),
            "/usr/bin/nvshim",
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
        c.nvshim.hook_path = "/usr/local/bin/nvshim".into();
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
fn bad_enum_value_names_key_value_and_valid_set() {
    let cases = [
        (
            "mode",
            "[nvidia-container-runtime]\nmode = \"bogus\"\n",
            "/etc/nvidia-container-runtime/config.toml:2:8: nvidia-container-runtime.mode: \
             unknown value \"bogus\" (valid: auto, legacy, cdi, jit-cdi, csv)",
        ),
        (
            "log-level",
            "[nvidia-container-runtime]\nlog-level = \"loud\"\n",
            "/etc/nvidia-container-runtime/config.toml:2:13: nvidia-container-runtime.log-level: \
             unknown value \"loud\" (valid: trace, debug, info, warn, error, warning, fatal, panic)",
        ),
        (
            "cuda-compat-mode",
            "[nvidia-container-runtime.modes.legacy]\ncuda-compat-mode = \"sometimes\"\n",
            "/etc/nvidia-container-runtime/config.toml:2:20: \
             nvidia-container-runtime.modes.legacy.cuda-compat-mode: \
             unknown value \"sometimes\" (valid: ldconfig, mount, hook, disabled)",
        ),
        (
            "mode as a dotted key",
            "nvidia-container-runtime.mode = \"\"\n",
            "/etc/nvidia-container-runtime/config.toml:1:33: nvidia-container-runtime.mode: \
             unknown value \"\" (valid: auto, legacy, cdi, jit-cdi, csv)",
        ),
    ];
    for (name, text, want) in cases {
        let err = parse_err(text);
        assert!(matches!(err, ConfigError::Value { .. }), "{name}: {err:?}");
        assert_eq!(err.to_string(), want, "{name}");
    }
}

#[test]
fn syntax_error_reports_line_and_column() {
    let cases = [
        (
            "unclosed table header",
            "disable-require = false\n[nvidia-container-runtime\nmode = \"cdi\"\n",
            (2, 26),
        ),
        (
            "missing value",
            "[nvidia-container-cli]\nroot =\nload-kmods = true\n",
            (2, 7),
        ),
        (
            "duplicate key",
            "[nvidia-ctk]\npath = \"a\"\npath = \"b\"\n",
            (3, 1),
        ),
        ("column counts characters", "# é\n  ü = = 1\n", (2, 7)),
    ];
    for (name, text, (line, column)) in cases {
        match parse_err(text) {
            ConfigError::Syntax { at, message } => {
                assert_eq!((at.line, at.column), (line, column), "{name}: {message}");
                assert_eq!(at.path, Path::new(FILE), "{name}");
                assert!(!message.is_empty(), "{name}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(
        parse_err("disable-require = false\n[nvidia-container-runtime\n").to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:26: invalid TOML: unclosed table, expected `]`"
    );
}

#[test]
fn type_error_reports_line_column_and_key() {
    let cases = [
        (
            "string for a list",
            "# comment\n[nvidia-container-runtime]\nruntimes = \"runc\"\n",
            (3, 12),
            "nvidia-container-runtime.runtimes",
        ),
        (
            "number in a list",
            "[nvidia-container-runtime]\nruntimes = [\"runc\", 7]\n",
            (2, 21),
            "nvidia-container-runtime.runtimes",
        ),
        (
            "string for a bool",
            "disable-require = \"yes\"\n",
            (1, 19),
            "disable-require",
        ),
        (
            "value for a table",
            "nvidia-ctk = 3\n",
            (1, 14),
            "nvidia-ctk",
        ),
        (
            "number for a path",
            "[nvshim]\nhook-path = 1\n",
            (2, 13),
            "nvshim.hook-path",
        ),
    ];
    for (name, text, (line, column), want_key) in cases {
        match parse_err(text) {
            ConfigError::Value { at, key, message } => {
                assert_eq!((at.line, at.column), (line, column), "{name}: {message}");
                assert_eq!(key, want_key, "{name}");
                assert!(message.starts_with("invalid type"), "{name}: {message}");
            }
            other => panic!("{name}: {other:?}"),
        }
    }
    assert_eq!(
        parse_err("[nvidia-container-runtime]\nruntimes = \"runc\"\n").to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:12: nvidia-container-runtime.runtimes: \
         invalid type: string \"runc\", expected a sequence"
    );
}

#[test]
fn supported_driver_capabilities() {
    let all = DriverCapabilities::all();
    let compute_video = DriverCapabilities::EMPTY
        .with(Capability::Compute)
        .with(Capability::Video);
    let cases = [
        ("default", None, all),
        ("all", Some("all"), all),
        ("subset", Some("video, compute"), compute_video),
        (
            "empty means none, as in NVIDIA's hook",
            Some(""),
            DriverCapabilities::EMPTY,
        ),
    ];
    for (name, value, want) in cases {
        let text = value.map_or(String::new(), |v| {
            format!("supported-driver-capabilities = \"{v}\"\n")
        });
        let (config, _) = parse_ok(&text);
        assert_eq!(config.supported_capabilities().ok(), Some(want), "{name}");
    }

    let err = parse_err("\nsupported-driver-capabilities = \"compute,gpu\"\n");
    assert_eq!(
        err.to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:33: supported-driver-capabilities: \
         unsupported driver capability \"gpu\" in \"compute,gpu\" \
         (valid: compat32, compute, display, graphics, ngx, utility, video, all)"
    );

    let config = Config {
        supported_driver_capabilities: "compute,gpu".into(),
        ..Config::default()
    };
    assert!(matches!(
        config.supported_capabilities(),
        Err(ConfigError::Capabilities(_))
    ));
}

#[test]
fn ldconfig_must_be_a_host_path_unless_allowed() {
    let cases = [
        (
            "host path",
            "[nvidia-container-cli]\nldconfig = \"@/sbin/ldconfig.real\"\n",
            true,
        ),
        (
            "container path",
            "[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n",
            false,
        ),
        ("empty", "[nvidia-container-cli]\nldconfig = \"\"\n", false),
        (
            "container path, allowed",
            "[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n\
             [features]\nallow-ldconfig-from-container = true\n",
            true,
        ),
    ];
    for (name, text, ok) in cases {
        assert_eq!(parse(text, Path::new(FILE)).is_ok(), ok, "{name}");
    }
    assert_eq!(
        parse_err("[nvidia-container-cli]\nldconfig = \"/sbin/ldconfig\"\n").to_string(),
        "/etc/nvidia-container-runtime/config.toml:2:12: nvidia-container-cli.ldconfig: \
         \"/sbin/ldconfig\" is not a host path (no leading '@'); an ldconfig inside the \
         container needs features.allow-ldconfig-from-container = true"
    );
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

fn env_of<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
    let map: HashMap<&str, &str> = vars.iter().copied().collect();
    move |name| map.get(name).map(|v| v.to_string())
}

#[test]
fn locate_precedence() {
    type Vars = &'static [(&'static str, &'static str)];
    let cases: &[(&str, Vars, &str)] = &[
        (
            "nothing set",
            &[],
            "/etc/nvidia-container-runtime/config.toml",
        ),
        (
            "XDG_CONFIG_HOME",
            &[("XDG_CONFIG_HOME", "/home/u/.config")],
            "/home/u/.config/nvidia-container-runtime/config.toml",
        ),
        (
            "override wins over XDG",
            &[
                ("XDG_CONFIG_HOME", "/home/u/.config"),
                ("NVIDIA_CTK_CONFIG_FILE_PATH", "/opt/my.toml"),
            ],
            "/opt/my.toml",
        ),
        (
            "empty override is unset",
            &[
                ("XDG_CONFIG_HOME", "/x"),
                ("NVIDIA_CTK_CONFIG_FILE_PATH", ""),
            ],
            "/x/nvidia-container-runtime/config.toml",
        ),
        (
            "empty XDG is unset",
            &[("XDG_CONFIG_HOME", "")],
            "/etc/nvidia-container-runtime/config.toml",
        ),
        (
            "relative override used as is",
            &[("NVIDIA_CTK_CONFIG_FILE_PATH", "conf/c.toml")],
            "conf/c.toml",
        ),
    ];
    for (name, vars, want) in cases {
        assert_eq!(locate(env_of(vars)), Path::new(want), "{name}");
    }
}

fn tempdir() -> tempfile::TempDir {
    match tempfile::tempdir() {
        Ok(dir) => dir,
        Err(e) => panic!("tempdir: {e}"),
    }
}

#[test]
fn load_missing_file_at_default_location_is_defaults() {
    let dir = tempdir();
    let xdg = dir.path().to_string_lossy().into_owned();
    let vars = [("XDG_CONFIG_HOME", xdg.as_str())];
    let loaded = match load(env_of(&vars)) {
        Ok(loaded) => loaded,
        Err(e) => panic!("load: {e}"),
    };
    assert_eq!(
        loaded,
        Loaded {
            config: Config::default(),
            path: dir.path().join(RELATIVE_PATH),
            from_file: false,
            unknown_keys: vec![],
        }
    );
}

#[test]
fn load_missing_file_named_by_env_is_an_error() {
    let dir = tempdir();
    let path = dir.path().join("absent.toml");
    let path_str = path.to_string_lossy().into_owned();
    let vars = [("NVIDIA_CTK_CONFIG_FILE_PATH", path_str.as_str())];
    match load(env_of(&vars)) {
        Err(ConfigError::Missing { path: p }) => assert_eq!(p, path),
        other => panic!("{other:?}"),
    }
    let err = ConfigError::Missing { path: path.clone() };
    assert_eq!(
        err.to_string(),
        format!(
            "config file {} named by NVIDIA_CTK_CONFIG_FILE_PATH does not exist",
            path.display()
        )
    );
}

#[test]
fn load_reads_and_parses_the_file() {
    let dir = tempdir();
    let conf_dir = dir.path().join("nvidia-container-runtime");
    let write = |text: &str| {
        if let Err(e) = std::fs::create_dir_all(&conf_dir)
            .and_then(|()| std::fs::write(conf_dir.join("config.toml"), text))
        {
            panic!("write: {e}");
        }
    };
    let xdg = dir.path().to_string_lossy().into_owned();
    let vars = [("XDG_CONFIG_HOME", xdg.as_str())];

    write(UNKNOWN_KEYS);
    let loaded = match load(env_of(&vars)) {
        Ok(loaded) => loaded,
        Err(e) => panic!("load: {e}"),
    };
    assert!(loaded.from_file);
    assert_eq!(loaded.path, conf_dir.join("config.toml"));
    assert_eq!(loaded.unknown_keys.len(), 6, "{:?}", loaded.unknown_keys);

    // A bad file is an error, never the defaults.
    write("[nvidia-container-runtime]\nmode = \"bogus\"\n");
    match load(env_of(&vars)) {
        Err(ConfigError::Value { at, key, .. }) => {
            assert_eq!(at.path, conf_dir.join("config.toml"));
            assert_eq!(key, "nvidia-container-runtime.mode");
        }
        other => panic!("{other:?}"),
    }

    // Unreadable (a directory where the file should be) is a read error, not defaults.
    if let Err(e) = std::fs::remove_file(conf_dir.join("config.toml"))
        .and_then(|()| std::fs::create_dir(conf_dir.join("config.toml")))
    {
        panic!("setup: {e}");
    }
    assert!(
        matches!(load(env_of(&vars)), Err(ConfigError::Read { .. })),
        "directory"
    );
}

#[test]
fn line_column_of_offsets() {
    let text = "ab\ncé\n\nd";
    let cases = [
        (0, (1, 1)),
        (2, (1, 3)),
        (3, (2, 1)),
        (4, (2, 2)),
        (5, (2, 2)), // inside 'é': rounds down to its start
        (6, (2, 3)),
        (7, (3, 1)),
        (8, (4, 1)),
        (9, (4, 2)),
        (99, (4, 2)),
    ];
    for (offset, want) in cases {
        assert_eq!(line_column(text, offset), want, "offset {offset}");
    }
}

/// Random edits of the NVIDIA default file: delete a range, insert text, or replace a
/// character.
fn mutated_default() -> impl Strategy<Value = String> {
    let edit = (
        0usize..4,
        any::<prop::sample::Index>(),
        0usize..40,
        ".{0,12}",
    );
    prop::collection::vec(edit, 1..6).prop_map(|edits| {
        let mut chars: Vec<char> = NVIDIA_DEFAULT.chars().collect();
        for (kind, at, len, insert) in edits {
            let at = at.index(chars.len() + 1);
            match kind {
                0 => {
                    let end = (at + len).min(chars.len());
                    chars.drain(at..end);
                }
                1 => {
                    chars.splice(at..at, insert.chars());
                }
                2 if at < chars.len() => {
                    chars[at] = insert.chars().next().unwrap_or('"');
                }
                _ => {
                    let pick = ['"', '[', ']', '=', '\n', '.', ',', '#', '\\', '{'];
                    chars.insert(at, pick[len % pick.len()]);
                }
            }
        }
        chars.into_iter().collect()
    })
}

proptest! {
    #[test]
    fn parse_never_panics(text in "\\PC*") {
        let _ = parse(&text, Path::new(FILE));
    }

    #[test]
    fn parse_never_panics_on_toml_like_text(text in "[\\[\\]a-z\\-\\.=\"#, \\n{}0-9@/]{0,200}") {
        let _ = parse(&text, Path::new(FILE));
    }

    #[test]
    fn parse_never_panics_on_mutated_default(text in mutated_default()) {
        match parse(&text, Path::new(FILE)) {
            // Every error points into the file.
            Err(ConfigError::Syntax { at, .. } | ConfigError::Value { at, .. }) => {
                prop_assert!(at.line <= text.lines().count() + 1, "{at} in {text:?}");
            }
            Err(e) => prop_assert!(false, "unexpected error kind {e:?}"),
            Ok(_) => {}
        }
    }
}

#![allow(clippy::unwrap_used, clippy::expect_used)]

use clap::Parser;

use super::*;
use crate::ctk::{Ctk, CtkCommand};
use crate::discover::csv::CsvFiles;

fn generate_args(args: &[&str]) -> (GlobalArgs, GenerateArgs) {
    let argv = ["nvidia-ctk", "cdi", "generate"].iter().chain(args);
    let ctk = Ctk::try_parse_from(argv).unwrap();
    match ctk.command {
        CtkCommand::Cdi(CdiArgs {
            command: CdiCommand::Generate(g),
        }) => (ctk.global, *g),
        other => panic!("{other:?}"),
    }
}

fn plan(args: &[&str]) -> Result<GeneratePlan, CdiError> {
    let (mut global, a) = generate_args(args);
    // Never the host's config file: an empty one (the defaults).
    let config = tempfile::NamedTempFile::new().unwrap();
    global.config = Some(config.path().to_path_buf());
    GeneratePlan::from_args(&global, &a)
}

#[test]
fn nvidias_defaults() {
    let (_, a) = generate_args(&[]);
    assert_eq!(a.mode, "auto");
    assert_eq!(a.device_name_strategy, ["index", "uuid"]);
    assert_eq!(a.device_id, ["all"]);
    assert_eq!(a.vendor, "nvidia.com");
    assert_eq!(a.class, "gpu");
    assert_eq!(hook_path(None), "/usr/bin/nvidia-cdi-hook");
    assert_eq!(
        hook_path(Some("/opt/bin/nvidia-ctk")),
        "/opt/bin/nvidia-ctk"
    );
    // Aliases NVIDIA has.
    let (_, a) = generate_args(&[
        "--nvidia-ctk-path=/x/nvidia-ctk",
        "--discovery-mode",
        "nvml",
        "--cdi-vendor",
        "example.com",
        "--devices",
        "0,1",
        "--disable-hooks",
        "chmod",
    ]);
    assert_eq!(a.nvidia_cdi_hook_path.as_deref(), Some("/x/nvidia-ctk"));
    assert_eq!(
        (a.mode.as_str(), a.vendor.as_str()),
        ("nvml", "example.com")
    );
    assert_eq!(a.device_id, ["0", "1"]);
    assert_eq!(a.disable_hook, ["chmod"]);
}

#[test]
fn flags_become_options() {
    let p = plan(&["--no-all-device", "--format", "JSON", "--driver-root", "/d"]).unwrap();
    assert!(!p.options.all_device);
    assert_eq!(p.format, Some(Format::Json));
    assert_eq!(p.ctx.roots.driver, PathBuf::from("/d"));
    assert_eq!(
        p.ctx.roots.dev,
        PathBuf::from("/d"),
        "dev root defaults to the driver root"
    );
    assert_eq!(p.options.hook_path, "/usr/bin/nvidia-cdi-hook");
    assert!(generate::nvidia_shape(&p.options.hook_path));
    assert_eq!(p.nvidia, NvidiaHooks::default());

    let p = plan(&[
        "--disable-hook",
        "all",
        "--enable-hook",
        "update-ldcache,chmod",
        "--ldconfig-path",
        "/sbin/ldconfig.real",
    ])
    .unwrap();
    assert!(!p.options.cover_params);
    assert!(p.nvidia.update_ldcache && p.nvidia.chmod);
    assert!(!p.nvidia.create_symlinks && !p.nvidia.application_profile);
    assert_eq!(
        p.nvidia.ldconfig_path.as_deref(),
        Some("/sbin/ldconfig.real")
    );

    let p = plan(&["--mode", "management"]).unwrap();
    assert!(p.options.strategies.is_empty() && p.options.all_device);

    let p = plan(&[
        "--device-id",
        "0,1:2",
        "--device-name-strategy",
        "type-index",
    ])
    .unwrap();
    let only: Vec<String> = p.options.only.unwrap().into_iter().collect();
    assert_eq!(only, ["0", "1:2", "gpu0", "mig1:2"]);
}

#[test]
fn unsupported_and_bad_values_say_so() {
    let err = |args: &[&str]| plan(args).err().map(|e| e.to_string()).unwrap_or_default();
    let e = err(&["--mode", "csv", "--csv.ignore-pattern", "[a-"]);
    assert!(
        e.contains("invalid --csv.ignore-pattern \"[a-\": unterminated"),
        "{e}"
    );
    let e = err(&["--mode", "bogus"]);
    assert!(
        e.contains("invalid discovery mode \"bogus\"") && e.contains("nvml"),
        "{e}"
    );
    let e = err(&["--format", "toml"]);
    assert!(e.contains("\"toml\"") && e.contains("yaml, json"), "{e}");
    let e = err(&["--disable-hook", "bogus"]);
    assert!(
        e.contains("\"bogus\"") && e.contains("update-ldcache"),
        "{e}"
    );
    let e = err(&["--enable-hook", "all"]);
    assert!(e.contains("\"all\""), "{e}");
    let e = err(&["--feature-flag", "enable-explicit-driver-libraries"]);
    assert!(e.contains("not supported yet"), "{e}");
    let e = err(&["--config-search-path", "/x"]);
    assert!(
        e.contains("--config-search-path is not supported yet"),
        "{e}"
    );
    let e = err(&["--device-name-strategy", "name"]);
    assert!(e.contains("\"name\"") && e.contains("type-index"), "{e}");
    // CSV-only flags are accepted outside CSV mode, as NVIDIA's.
    assert!(plan(&["--library-search-path", "/x", "--csv.file", "/y.csv"]).is_ok());
}

#[test]
fn csv_mode_takes_the_csv_flags() {
    let p = plan(&["--mode", "csv"]).unwrap();
    assert_eq!(
        p.csv.map(|c| c.files),
        Some(CsvFiles::Dir {
            path: "/etc/nvidia-container-runtime/host-files-for-container.d".into(),
            all: false,
        }),
        "default: the base files of the config's mount-spec-path"
    );
    let p = plan(&[
        "--mode=CSV",
        "--csv.file",
        "/a.csv,/b.csv",
        "--csv.ignore-pattern",
        "**/libcuda.so",
    ])
    .unwrap();
    let csv = p.csv.unwrap();
    assert_eq!(
        csv.files,
        CsvFiles::Listed(vec!["/a.csv".into(), "/b.csv".into()])
    );
    assert_eq!(csv.ignore.len(), 1);
    assert!(plan(&["--csv.file", "/a.csv"]).unwrap().csv.is_none());
}

#[test]
fn transform_root_rewrites_a_yaml_spec() {
    let tmp = tempfile::tempdir().unwrap();
    let input = tmp.path().join("in.yaml");
    std::fs::write(
        &input,
        "cdiVersion: 0.5.0\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: /dev/nvidia0\ncontainerEdits:\n  mounts:\n  - hostPath: /run/nvidia/driver/usr/lib/libcuda.so.1\n    containerPath: /usr/lib/libcuda.so.1\n",
    )
    .unwrap();
    let output = tmp.path().join("out.json");
    let args = RootArgs {
        from: "/run/nvidia/driver".into(),
        to: "/".into(),
        relative_to: "host".into(),
        input: input.display().to_string(),
        output: Some(output.clone()),
    };
    transform_root(&args, &mut Vec::new()).unwrap();
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&output).unwrap()).unwrap();
    assert_eq!(
        spec["containerEdits"]["mounts"][0]["hostPath"],
        "/usr/lib/libcuda.so.1"
    );
    let bad = RootArgs {
        relative_to: "both".into(),
        ..args
    };
    let e = transform_root(&bad, &mut Vec::new())
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("\"both\"") && e.contains("host, container"),
        "{e}"
    );
}

use super::*;

fn doc(env: &[&str]) -> SpecDoc {
    let spec = serde_json::json!({"ociVersion": "1.0.2", "process": {"env": env}});
    SpecDoc::parse(spec.to_string().as_bytes()).unwrap()
}

/// A config whose roots lead nowhere: a test that needs the host fails loudly.
fn config() -> Config {
    let mut config = Config::default();
    config.nvidia_container_cli.root = "/nonexistent/driver".into();
    config.nvshim.proc_root = "/nonexistent/proc".into();
    config
}

#[test]
fn no_gpu_is_an_outcome_not_a_plan() {
    for env in [&[][..], &["NVIDIA_VISIBLE_DEVICES=void"]] {
        for front in [Front::Runtime, Front::Hook] {
            let got = prepare(&doc(env), &config(), front, NvmlAccess::Elsewhere);
            assert!(matches!(got, Ok(Preparation::NoGpu)), "{env:?}: {got:?}");
        }
    }
}

/// Whether NVML is needed is decided before the host is read (the roots here lead
/// nowhere), for both front ends.
#[test]
fn requests_needing_nvml_are_handed_over_before_planning() {
    for (env, reason) in [
        (&["NVIDIA_VISIBLE_DEVICES=0:1"][..], "MIG devices are named"),
        (
            &["NVIDIA_VISIBLE_DEVICES=MIG-5f4c2c5e-0000-0000-0000-000000000000"],
            "MIG devices are named",
        ),
        (
            &["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_REQUIRE_CUDA=cuda>=12.0"],
            "NVIDIA_REQUIRE_* checks the CUDA version or GPU architecture",
        ),
    ] {
        for front in [Front::Runtime, Front::Hook] {
            match prepare(&doc(env), &config(), front, NvmlAccess::Elsewhere) {
                Ok(Preparation::NeedsNvml { reason: got }) => assert_eq!(got, reason, "{env:?}"),
                other => panic!("{env:?} {front:?}: {other:?}"),
            }
        }
    }
}

/// A request procfs can serve is planned in the process: on a host without a driver
/// that is the inventory's error, not a hand-over.
#[test]
fn requests_procfs_serves_are_planned_here() {
    let got = prepare(
        &doc(&["NVIDIA_VISIBLE_DEVICES=0"]),
        &config(),
        Front::Runtime,
        NvmlAccess::Elsewhere,
    );
    assert!(
        matches!(
            got,
            Err(ContainerError::Pipeline(PipelineError::Inventory(_)))
        ),
        "{got:?}"
    );
}

#[test]
fn the_hook_plans_cdi_names_in_memory() {
    let config = config();
    assert_eq!(context(&config, Front::Hook).cdi, CdiFiles::Never);
    assert!(matches!(
        context(&config, Front::Runtime).cdi,
        CdiFiles::Prefer(_)
    ));
}

#[test]
fn the_params_cover_is_turned_off_by_name_or_all() {
    let mut config = config();
    assert!(covers_params(&config));
    for off in [DISABLE_DEVICE_NODE_MODIFICATION, "all"] {
        config
            .nvidia_container_runtime
            .modes
            .jit_cdi
            .nvcdi_disable_hooks = vec!["other".into(), off.into()];
        assert!(!covers_params(&config), "{off}");
    }
}

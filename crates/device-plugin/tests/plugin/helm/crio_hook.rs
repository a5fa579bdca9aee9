// SPDX-License-Identifier: Apache-2.0
//! `installer.crioConfigMode: hook`: the installer writes CRI-O's OCI hook instead of a
//! runtime handler, so nothing may name a RuntimeClass (its handler would not exist); the
//! value is CRI-O's only and refused with what is valid otherwise.

use super::render::{case, find, object, pod, render, strings};

#[test]
fn crio_hook_mode_passes_the_mode_and_names_no_runtime_class() {
    let docs = render(case("CRI-O with the OCI hook")).unwrap();
    let installer = &pod(object(&docs, "DaemonSet", "nvshim-toolkit"))["containers"][0];
    let args = strings(&installer["args"]);
    assert!(args.contains(&"--config-mode=hook"), "{args:?}");
    assert!(args.contains(&"--runtime=crio"), "{args:?}");
    assert!(
        !args.iter().any(|a| a.starts_with("--restart-mode")),
        "the installer's default for CRI-O: {args:?}"
    );
    assert!(
        find(&docs, "RuntimeClass", "nvidia").is_none(),
        "no handler: no RuntimeClass"
    );
    for (kind, name) in [
        ("DaemonSet", "nvshim-device-plugin"),
        ("DaemonSet", "nvshim-labels"),
        ("Job", "nvshim-validation-1"),
    ] {
        let spec = pod(object(&docs, kind, name));
        assert!(
            spec.get("runtimeClassName").is_none(),
            "{kind} {name}: {}",
            spec["runtimeClassName"]
        );
    }
    // The default (config mode) keeps the class.
    let docs = render(case("defaults")).unwrap();
    assert!(find(&docs, "RuntimeClass", "nvidia").is_some());
    let args = strings(&pod(object(&docs, "DaemonSet", "nvshim-toolkit"))["containers"][0]["args"]);
    assert!(
        !args.iter().any(|a| a.starts_with("--config-mode")),
        "{args:?}"
    );
}

#[test]
fn a_bad_crio_config_mode_fails_the_render_naming_it() {
    for (values, want) in [
        (
            "installer: {runtime: containerd, crioConfigMode: hook}",
            "installer.crioConfigMode hook is CRI-O's, but installer.runtime is \"containerd\"",
        ),
        (
            "installer: {runtime: crio, crioConfigMode: hooks}",
            "installer.crioConfigMode \"hooks\" is not valid (valid: config, hook, or null)",
        ),
    ] {
        let err = render(values).expect_err(values);
        assert!(err.contains(want), "{values}: {err}");
    }
}

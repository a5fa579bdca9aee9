//! The hook contract: what a hook entry in an OCI spec says, in one place for both
//! sides of it. The edit builders (the runtime's params hook, `generate`'s CDI hooks)
//! write these names and arguments; the hook binaries (`hook::entry`, `nvshim hook`)
//! read them back. Neither side spells a binary, stage, flag or argument format of its
//! own, so a spec we write is always one our hook accepts.
//!
//! Sits below `inject` and the front ends, above the leaves it uses (`cdi` for the hook
//! shape and its env, `discover` and `ldcache` for what `link-driver` carries). It
//! decides nothing about GPUs and runs nothing.

mod args;

use std::path::Path;

use crate::cdi::{HOOK_ENV, Hook};

pub use args::{
    ArgError, encode_link_driver, params_args, parse_entry, parse_link, parse_link_driver,
    parse_params_args,
};

/// The hook binary packages install (static): NVIDIA's name, so that docker's
/// `--gpus` and `hooks.d` find it.
pub const HOOK_BINARY: &str = "nvidia-container-runtime-hook";
/// NVIDIA's older name for the same prestart hook (still found in specs).
pub const TOOLKIT_HOOK_BINARY: &str = "nvidia-container-toolkit";
/// The admin binary; its `hook` subcommand runs the same stages.
pub const NVSHIM_BINARY: &str = "nvshim";
/// NVIDIA's admin tool; `nvidia-ctk hook <stage>` runs the CDI hooks. Packages install
/// it as a name of the `nvshim` binary.
pub const CTK_BINARY: &str = "nvidia-ctk";
/// NVIDIA's CDI hook binary (`nvidia-cdi-hook <stage>`), the hooks of specs that
/// `nvidia-ctk cdi generate` writes; also a name of the `nvshim` binary.
pub const CDI_HOOK_BINARY: &str = "nvidia-cdi-hook";
/// `nvshim hook <stage>`.
pub const NVSHIM_HOOK_COMMAND: &str = "hook";

/// The OCI hook point our CDI and runtime hooks run at.
pub const CREATE_CONTAINER: &str = "createContainer";

/// `prestart`: NVIDIA's hook stage for docker's `--gpus` and `hooks.d`.
pub const PRESTART: &str = "prestart";
/// `poststart` and `poststop`: accepted, nothing to do.
pub const POSTSTART: &str = "poststart";
pub const POSTSTOP: &str = "poststop";
/// Our `createContainer` stage that creates the driver's symlinks and merges the
/// linker cache (what NVIDIA's `create-symlinks` and `update-ldcache` do).
pub const LINK_DRIVER: &str = "link-driver";
/// NVIDIA's hook that covers the container's `/proc/driver/nvidia/params` with
/// `ModifyDeviceFiles: 0`; also the name `nvcdi-disable-hooks` turns it off by.
pub const DISABLE_DEVICE_NODE_MODIFICATION: &str = "disable-device-node-modification";
/// NVIDIA's `createContainer` hooks that specs of `nvidia-ctk cdi generate` run
/// (`nvidia-cdi-hook <name>`, `nvidia-ctk hook <name>`).
pub const CREATE_SYMLINKS: &str = "create-symlinks";
pub const UPDATE_LDCACHE: &str = "update-ldcache";
pub const CHMOD: &str = "chmod";
pub const ENABLE_CUDA_COMPAT: &str = "enable-cuda-compat";
pub const UPDATE_APPLICATION_PROFILE: &str = "update-application-profile";
/// Every hook `nvidia-cdi-hook` runs, in NVIDIA's order within a spec.
pub const NVIDIA_HOOKS: [&str; 6] = [
    CREATE_SYMLINKS,
    ENABLE_CUDA_COMPAT,
    UPDATE_LDCACHE,
    DISABLE_DEVICE_NODE_MODIFICATION,
    UPDATE_APPLICATION_PROFILE,
    CHMOD,
];
/// `update-ldcache --folder DIR`.
pub const FOLDER_FLAG: &str = "--folder";

/// The value of `nvcdi-disable-hooks` / `--disable-hook` that turns every hook off.
pub const ALL_HOOKS: &str = "all";

/// `link-driver --link TARGET::PATH`.
pub const LINK_FLAG: &str = "--link";
/// `link-driver --ldcache KEY=PATH@FLAGS[+HWCAP]`.
pub const LDCACHE_FLAG: &str = "--ldcache";
/// `disable-device-node-modification --rootfs <absolute path>`.
pub const ROOTFS_FLAG: &str = "--rootfs";

/// Loader variables that must never reach a hook running as root on the host: an
/// image's `ENV LD_PRELOAD` reached NVIDIA's hooks (CVE-2025-23266). The
/// `createContainer` stages refuse to run with any of them set (their env comes from a
/// spec we wrote: [`HOOK_ENV`] only); `prestart` removes them before handing anything
/// to a dynamic binary.
pub const LOADER_VARS: [&str; 3] = ["LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"];

/// The first loader variable set in this process's environment.
pub fn loader_var() -> Option<&'static str> {
    LOADER_VARS
        .iter()
        .copied()
        .find(|v| std::env::var_os(v).is_some())
}

/// A flag's name without its dashes, as clap takes it (`--link` → `link`).
pub fn long_name(flag: &'static str) -> &'static str {
    flag.trim_start_matches('-')
}

/// A `createContainer` hook running `stage` of the hook binary at `path` (absolute, on
/// the host) with `args` after it: `nvshim hook <stage> …` and `nvidia-ctk hook <stage>
/// …` for those two binaries, `<binary> <stage> …` otherwise. Its env is [`HOOK_ENV`], never the container's.
pub fn stage_hook(path: &Path, stage: &str, args: Vec<String>) -> Hook {
    stage_hook_named(path, None, stage, args)
}

/// [`stage_hook`] with the binary started as `argv0` (its `args[0]`) instead of by its
/// file name: a multi-call binary installed under another name takes the front end of
/// the name it is started as.
pub fn stage_hook_named(path: &Path, argv0: Option<&str>, stage: &str, args: Vec<String>) -> Hook {
    let name = argv0.map(str::to_owned).unwrap_or_else(|| {
        path.file_name()
            .map_or_else(|| HOOK_BINARY.into(), |n| n.to_string_lossy().into_owned())
    });
    let mut argv = Vec::with_capacity(3 + args.len());
    // `nvshim hook <stage>` and `nvidia-ctk hook <stage>`; the hook binaries take the
    // stage first.
    let subcommand = name == NVSHIM_BINARY || name == CTK_BINARY;
    argv.push(name);
    if subcommand {
        argv.push(NVSHIM_HOOK_COMMAND.to_owned());
    }
    argv.push(stage.to_owned());
    argv.extend(args);
    Hook {
        hook_name: CREATE_CONTAINER.to_owned(),
        path: path.display().to_string(),
        args: argv,
        env: vec![HOOK_ENV.to_owned()],
        timeout: None,
    }
}

/// `create-symlinks`' arguments for `links` (`--link TARGET::PATH` each, as
/// `link-driver` spells them).
pub fn create_symlinks_args(
    links: &[crate::discover::SymlinkEdit],
) -> Result<Vec<String>, ArgError> {
    encode_link_driver(links, &[])
}

/// `update-ldcache`'s arguments for `folders` (`--folder DIR` each).
pub fn update_ldcache_args<'a>(folders: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    folders
        .into_iter()
        .flat_map(|f| [FOLDER_FLAG.to_owned(), f.to_owned()])
        .collect()
}

/// Whether `disabled` (NVIDIA's `nvcdi-disable-hooks`, `--disable-hook`) turns `hook` off.
pub fn disables(disabled: &[String], hook: &str) -> bool {
    disabled.iter().any(|h| h == hook || h == ALL_HOOKS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stage_hooks_name_the_binary_and_the_stage() {
        let hook = stage_hook(
            Path::new("/usr/bin/nvidia-container-runtime-hook"),
            LINK_DRIVER,
            vec!["--link".into(), "a::/b".into()],
        );
        assert_eq!(hook.hook_name, "createContainer");
        assert_eq!(hook.path, "/usr/bin/nvidia-container-runtime-hook");
        assert_eq!(
            hook.args,
            [
                "nvidia-container-runtime-hook",
                "link-driver",
                "--link",
                "a::/b"
            ]
        );
        assert_eq!(hook.env, [HOOK_ENV]);
        let hook = stage_hook(
            Path::new("/usr/bin/nvshim"),
            DISABLE_DEVICE_NODE_MODIFICATION,
            Vec::new(),
        );
        assert_eq!(
            hook.args,
            ["nvshim", "hook", "disable-device-node-modification"]
        );
        let hook = stage_hook(Path::new("/usr/bin/nvidia-ctk"), LINK_DRIVER, Vec::new());
        assert_eq!(hook.args, ["nvidia-ctk", "hook", "link-driver"]);
        let hook = stage_hook(
            Path::new("/usr/bin/nvidia-cdi-hook"),
            LINK_DRIVER,
            Vec::new(),
        );
        assert_eq!(hook.args, ["nvidia-cdi-hook", "link-driver"]);
    }

    #[test]
    fn hooks_are_disabled_by_name_or_all() {
        let names = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(disables(&names(&["all"]), LINK_DRIVER));
        assert!(disables(
            &names(&["x", DISABLE_DEVICE_NODE_MODIFICATION]),
            DISABLE_DEVICE_NODE_MODIFICATION
        ));
        assert!(!disables(&names(&["x"]), DISABLE_DEVICE_NODE_MODIFICATION));
        assert_eq!(long_name(LINK_FLAG), "link");
    }
}

//! Finding the config file ([`locate`]) and reading it ([`load`]).

use std::collections::HashMap;
use std::path::Path;

use super::tests::UNKNOWN_KEYS;
use super::*;

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
fn load_installed_looks_beside_argv0_after_the_variables_and_before_etc() {
    let dir = tempdir();
    let bin = dir.path().join("toolkit");
    let beside_file = bin.join(BESIDE_DIR).join(RELATIVE_PATH);
    let argv0 = bin.join("nvidia-container-runtime");
    let argv0 = Some(argv0.as_os_str());
    let xdg = dir.path().join("xdg");
    let xdg_str = xdg.to_string_lossy().into_owned();
    let loaded = |vars: &[(&str, &str)], argv0| match load_installed(env_of(vars), argv0) {
        Ok(l) => (l.path, l.config.nvidia_container_cli.root),
        Err(e) => panic!("load_installed: {e}"),
    };
    // No file beside: /etc (whatever it holds on this machine).
    let (path, _) = loaded(&[], argv0);
    assert_eq!(path, PathBuf::from(DEFAULT_PATH), "nothing beside");

    let Some(parent) = beside_file.parent() else {
        panic!("no parent")
    };
    std::fs::create_dir_all(parent).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::write(
        &beside_file,
        "[nvidia-container-cli]\nroot = \"/run/nvidia/driver\"\n",
    )
    .unwrap_or_else(|e| panic!("write: {e}"));
    type Case<'a> = (
        &'a str,
        Vec<(&'a str, &'a str)>,
        Option<&'a std::ffi::OsStr>,
        PathBuf,
        &'a str,
    );
    let cases: &[Case] = &[
        (
            "beside argv0",
            vec![],
            argv0,
            beside_file.clone(),
            "/run/nvidia/driver",
        ),
        (
            "XDG_CONFIG_HOME wins",
            vec![("XDG_CONFIG_HOME", xdg_str.as_str())],
            argv0,
            xdg.join(RELATIVE_PATH),
            "",
        ),
        (
            "a relative argv0 is not looked beside",
            vec![],
            Some(std::ffi::OsStr::new("nvidia-container-runtime")),
            PathBuf::from(DEFAULT_PATH),
            "-",
        ),
    ];
    for (case, vars, argv0, want_path, want_root) in cases {
        let (path, root) = loaded(vars, *argv0);
        assert_eq!(&path, want_path, "{case}");
        if *want_root != "-" {
            assert_eq!(root, Path::new(want_root), "{case}");
        }
    }
    assert_eq!(beside(Some(std::ffi::OsStr::new("runtime"))), None);
    assert_eq!(
        beside(Some(std::ffi::OsStr::new(
            "/usr/bin/nvidia-container-runtime"
        ))),
        Some(PathBuf::from(
            "/usr/bin/.config/nvidia-container-runtime/config.toml"
        ))
    );
}

/// An OCI hook file names the hook by its bare name in `args[0]` (NVIDIA's format): the hook
/// finds the toolkit's config through its own executable, `versions/<id>/` of the toolkit,
/// whose `.config` leads to the toolkit's.
#[test]
fn a_bare_argv0_looks_beside_the_executable() {
    let dir = tempdir();
    let toolkit = dir.path().join("toolkit");
    let version = toolkit.join("versions").join("abc");
    std::fs::create_dir_all(toolkit.join(BESIDE_DIR).join("nvidia-container-runtime"))
        .unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::fs::create_dir_all(&version).unwrap_or_else(|e| panic!("mkdir: {e}"));
    std::os::unix::fs::symlink("../../.config", version.join(BESIDE_DIR))
        .unwrap_or_else(|e| panic!("symlink: {e}"));
    std::fs::write(
        toolkit.join(BESIDE_DIR).join(RELATIVE_PATH),
        "accept-nvidia-visible-devices-as-volume-mounts = true\n",
    )
    .unwrap_or_else(|e| panic!("write: {e}"));
    let exe = version.join("nvidia-container-runtime-hook");
    let bare = Some(std::ffi::OsStr::new("nvidia-container-runtime-hook"));
    let loaded = load_installed_from(env_of(&[]), bare, || Some(exe.clone()))
        .unwrap_or_else(|e| panic!("load: {e}"));
    assert_eq!(loaded.path, version.join(BESIDE_DIR).join(RELATIVE_PATH));
    assert!(loaded.config.accept_nvidia_visible_devices_as_volume_mounts);
    // An absolute argv0 is used as it is; the executable is not asked.
    let absolute = toolkit.join("nvidia-container-runtime-hook");
    let loaded = load_installed_from(env_of(&[]), Some(absolute.as_os_str()), || {
        panic!("asked for the executable")
    })
    .unwrap_or_else(|e| panic!("load: {e}"));
    assert_eq!(loaded.path, toolkit.join(BESIDE_DIR).join(RELATIVE_PATH));
    // No executable path: /etc.
    let loaded = load_installed_from(env_of(&[]), bare, || None).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(loaded.path, PathBuf::from(DEFAULT_PATH));
}

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

// SPDX-License-Identifier: Apache-2.0
//! `config.json` files written by runc, docker, containerd and podman (and two hand-written
//! ones) survive `SpecDoc` and `Bundle::save` with every value and every key in its place; a
//! failed save leaves `config.json` and the bundle directory as they were.
//! tests/fixtures/config-json/README.md says where each file came from.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt, chown};
use std::path::{Path, PathBuf};

use crate::bundle::{Bundle, BundleError, SpecDoc};
use serde_json::{Value, json};

fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/config-json")
}

/// (file name, bytes) of every `*.json` directly in the fixture folder, sorted by name.
fn fixtures() -> Vec<(String, Vec<u8>)> {
    let mut files: Vec<(String, Vec<u8>)> = fs::read_dir(fixture_dir())
        .expect("fixture folder")
        .map(|entry| entry.expect("fixture entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "json"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&path).expect("read fixture"))
        })
        .collect();
    files.sort();
    assert!(files.len() >= 10, "fixtures missing: {files:?}");
    files
}

/// The object keys of a JSON text in the order they appear, scanned from the bytes
/// themselves, so that the check does not depend on how `serde_json::Map` orders keys.
fn keys_in_text_order(json: &[u8]) -> Vec<String> {
    let mut keys = Vec::new();
    let mut i = 0;
    while i < json.len() {
        if json[i] != b'"' {
            i += 1;
            continue;
        }
        let start = i + 1;
        i = start;
        while json[i] != b'"' {
            i += if json[i] == b'\\' { 2 } else { 1 };
        }
        let text = String::from_utf8_lossy(&json[start..i]).into_owned();
        i += 1;
        let mut j = i;
        while json[j].is_ascii_whitespace() {
            j += 1;
        }
        if json[j] == b':' {
            keys.push(text);
        }
    }
    keys
}

fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .expect("read_dir")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// A bundle in a fresh tempdir with `bytes` as its `config.json`, given `mode`.
fn bundle_with(bytes: &[u8], mode: u32) -> (tempfile::TempDir, Bundle) {
    let dir = tempfile::tempdir().expect("tempdir");
    let bundle = Bundle::new(dir.path());
    fs::write(bundle.config_path(), bytes).expect("write config.json");
    fs::set_permissions(bundle.config_path(), fs::Permissions::from_mode(mode)).expect("chmod");
    (dir, bundle)
}

#[test]
fn every_fixture_round_trips_with_values_and_key_order() {
    for (name, bytes) in fixtures() {
        let original: Value = serde_json::from_slice(&bytes).expect(&name);
        let doc = SpecDoc::parse(&bytes).expect(&name);
        assert_eq!(doc.value(), &original, "{name}: parse");

        let written = doc.to_vec().expect(&name);
        let again = SpecDoc::parse(&written).expect(&name);
        assert_eq!(again.value(), &original, "{name}: parse, to_vec, parse");

        let source_keys = keys_in_text_order(&bytes);
        assert!(source_keys.len() > 10, "{name}: too few keys found");
        assert_eq!(
            keys_in_text_order(&written),
            source_keys,
            "{name}: key order"
        );
        assert_eq!(
            again.value().to_string(),
            original.to_string(),
            "{name}: serialized forms"
        );
    }
}

#[test]
fn views_read_real_files() {
    // (file, NVIDIA_VISIBLE_DEVICES, privileged, root.path prefix, a mount destination)
    let cases = [
        ("runc-spec.json", None, false, "rootfs", "/proc"),
        ("runc-spec-rootless.json", None, false, "rootfs", "/sys"),
        (
            "docker.json",
            Some("all"),
            false,
            "/tmp/nvcap/x/root/vfs/dir/",
            "/etc/hostname",
        ),
        (
            "docker-privileged.json",
            None,
            true,
            "/tmp/nvcap/x/root/vfs/dir/",
            "/dev/shm",
        ),
        (
            "docker-gpus.json",
            Some("0,1"),
            false,
            "/tmp/nvcap/x/root/vfs/dir/",
            "/dev/pts",
        ),
        ("containerd.json", Some("all"), false, "rootfs", "/run"),
        ("containerd-gpus.json", None, false, "rootfs", "/dev/mqueue"),
        (
            "podman.json",
            Some("all"),
            false,
            "/tmp/nvcap/p/root/vfs/dir/",
            "/etc/hosts",
        ),
        (
            "podman-hooks.json",
            Some("0"),
            false,
            "/tmp/nvcap/p/root/vfs/dir/",
            "/dev/shm",
        ),
        (
            "legacy-capabilities.json",
            Some("all"),
            true,
            "rootfs",
            "/sys",
        ),
        ("future-fields.json", Some("1"), true, "rootfs", "/data"),
    ];
    let dir = fixture_dir();
    for (name, visible, privileged, root, mount) in cases {
        let doc = SpecDoc::parse(&fs::read(dir.join(name)).expect(name)).expect(name);
        assert_eq!(
            doc.env_var("NVIDIA_VISIBLE_DEVICES"),
            visible,
            "{name}: env"
        );
        assert_eq!(doc.is_privileged(), privileged, "{name}: privileged");
        assert!(
            !doc.bounding_capabilities().is_empty(),
            "{name}: bounding set"
        );
        let root_path = doc.root_path().expect(name);
        assert!(root_path.starts_with(root), "{name}: root.path {root_path}");
        assert!(
            doc.mounts().iter().any(|m| m.destination == mount),
            "{name}: mount {mount}"
        );
    }

    let future = SpecDoc::parse(&fs::read(dir.join("future-fields.json")).unwrap()).unwrap();
    assert_eq!(
        future.annotations(),
        [
            ("org.example.string", "value"),
            ("io.kubernetes.cri.container-type", "container")
        ]
    );
    assert_eq!(
        future.bounding_capabilities(),
        ["CAP_FUTURE", "CAP_CHOWN", "CAP_KILL", "CAP_SYS_ADMIN"]
    );
}

#[test]
fn save_then_load_keeps_the_document_mode_and_owner() {
    // As root, give the file a foreign owner to see it carried over; otherwise our own.
    let probe = tempfile::NamedTempFile::new().expect("probe");
    let me = fs::metadata(probe.path()).expect("probe metadata");
    let owner = if me.uid() == 0 {
        (1234, 5678)
    } else {
        (me.uid(), me.gid())
    };

    for (i, (name, bytes)) in fixtures().into_iter().enumerate() {
        let mode = [0o600, 0o640, 0o644][i % 3];
        let (dir, bundle) = bundle_with(&bytes, mode);
        chown(bundle.config_path(), Some(owner.0), Some(owner.1)).expect("chown");

        let loaded = bundle.load().expect(&name);
        assert_eq!(
            (loaded.mode, loaded.uid, loaded.gid),
            (mode, owner.0, owner.1),
            "{name}: load"
        );
        bundle.save(&loaded.doc, &loaded).expect(&name);

        let reloaded = bundle.load().expect(&name);
        assert_eq!(reloaded, loaded, "{name}: value, mode and owner after save");
        assert_eq!(
            fs::read(bundle.config_path()).unwrap(),
            loaded.doc.to_vec().unwrap(),
            "{name}: file holds to_vec"
        );
        assert_eq!(
            entries(dir.path()),
            ["config.json"],
            "{name}: no temp file left"
        );
    }
}

#[test]
fn an_edit_survives_save_and_nothing_else_changes() {
    let bytes = fs::read(fixture_dir().join("future-fields.json")).unwrap();
    let (dir, bundle) = bundle_with(&bytes, 0o600);
    let mut loaded = bundle.load().unwrap();
    let hook = json!({"path": "/usr/bin/nvidia-ctk", "args": ["nvidia-ctk", "hook"]});
    loaded.doc.value_mut()["hooks"]["createContainer"] = json!([hook]);
    bundle.save(&loaded.doc, &loaded).unwrap();

    let mut want: Value = serde_json::from_slice(&bytes).unwrap();
    want["hooks"]["createContainer"] = json!([hook]);
    let saved = fs::read(bundle.config_path()).unwrap();
    let reloaded = SpecDoc::parse(&saved).unwrap();
    assert_eq!(reloaded.value(), &want);
    let mut want_keys = keys_in_text_order(&bytes);
    let at = want_keys.iter().position(|k| k == "poststop").unwrap() + 1;
    want_keys.splice(
        at..at,
        ["createContainer", "path", "args"].map(String::from),
    );
    assert_eq!(keys_in_text_order(&saved), want_keys);
    assert_eq!(
        fs::metadata(bundle.config_path()).unwrap().mode() & 0o7777,
        0o600
    );
    assert_eq!(entries(dir.path()), ["config.json"]);
}

#[test]
fn a_failed_save_leaves_everything_as_it_was() {
    let bytes = fs::read(fixture_dir().join("docker.json")).unwrap();
    let (dir, bundle) = bundle_with(&bytes, 0o600);
    let loaded = bundle.load().unwrap();
    let mut edited = loaded.doc.clone();
    edited.value_mut()["x-edit"] = json!(true);

    // The bundle directory does not exist: the temp file cannot be created.
    let missing = Bundle::new(dir.path().join("missing"));
    let error = missing.save(&edited, &loaded).expect_err("missing dir");
    assert!(
        matches!(&error, BundleError::Write { path, .. } if path.starts_with(&missing.dir)),
        "{error:?}"
    );
    assert!(error.to_string().starts_with("cannot write "), "{error}");
    assert!(!missing.dir.exists());

    // config.json is a non-empty directory: the temp file is written, the rename fails.
    let blocked = tempfile::tempdir().unwrap();
    let target = Bundle::new(blocked.path());
    fs::create_dir(target.config_path()).unwrap();
    fs::write(target.config_path().join("keep"), "kept").unwrap();
    let error = target
        .save(&edited, &loaded)
        .expect_err("config.json is a directory");
    assert!(
        matches!(&error, BundleError::Write { path, .. } if *path == target.config_path()),
        "{error:?}"
    );
    assert_eq!(
        entries(blocked.path()),
        ["config.json"],
        "temp file removed"
    );
    assert_eq!(
        fs::read_to_string(target.config_path().join("keep")).unwrap(),
        "kept"
    );

    // The original bundle was never touched.
    assert_eq!(fs::read(bundle.config_path()).unwrap(), bytes);
    assert_eq!(entries(dir.path()), ["config.json"]);
}

#[test]
fn load_names_the_file_in_its_errors() {
    let (dir, bundle) = bundle_with(b"{\"ociVersion\": \"1.0.2\",\n  oops}", 0o644);
    let error = bundle.load().expect_err("bad JSON");
    assert_eq!(
        error.to_string(),
        format!(
            "{} is not valid JSON: key must be a string at line 2 column 3",
            bundle.config_path().display()
        )
    );

    let empty = Bundle::new(dir.path().join("nothing-here"));
    let error = empty.load().expect_err("no config.json");
    assert!(
        matches!(&error, BundleError::Read { path, .. } if *path == empty.config_path()),
        "{error:?}"
    );
}

//! Every captured `config.json` (runc, docker, podman, containerd; see
//! tests/fixtures/config-json/README.md) goes through `nvidia-container-runtime
//! create` on a simulated node, and the JSON before and after is diffed: the only
//! differences allowed are the additions GPU injection makes (device nodes, cgroup
//! rules, mounts, the marker annotation) and the removal of dockerd's legacy hook.
//! Every other value, and every key's position, is as it was. Without a GPU request
//! the file is not rewritten at all.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::common::{Node, node};
use nvshim_testkit::NodeSpec;
use serde_json::{Value, json};

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/config-json");

struct Host {
    node: Node,
    dir: tempfile::TempDir,
}

fn host() -> Host {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let runc = dir.path().join("fake-runc");
    fs::write(&runc, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&runc, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(
        dir.path().join("config.toml"),
        node.sim.runtime_config(runc.to_str().unwrap(), None),
    )
    .unwrap();
    Host { node, dir }
}

impl Host {
    /// A bundle holding `bytes` as config.json, with an empty rootfs beside it.
    fn bundle(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let bundle = self.dir.path().join(name);
        fs::create_dir_all(&bundle).unwrap();
        fs::write(bundle.join("config.json"), bytes).unwrap();
        bundle
    }

    fn create(&self, bundle: &Path) {
        let out = Command::new(crate::common::runtime_bin())
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
            .env(
                "NVIDIA_CTK_CONFIG_FILE_PATH",
                self.dir.path().join("config.toml"),
            )
            .envs(self.node.sim.env())
            .args(["create", "--bundle"])
            .arg(bundle)
            .arg("ctr")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "create of {}: {}",
            bundle.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn fixtures() -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> = fs::read_dir(FIXTURES)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            (name, fs::read(&p).unwrap())
        })
        .collect();
    out.sort();
    assert!(out.len() >= 9, "the corpus is in {FIXTURES}");
    out
}

/// The fixture with its rootfs moved into the bundle and its NVIDIA_* variables
/// replaced by `env`.
fn with_env(bytes: &[u8], env: &[&str]) -> Vec<u8> {
    let mut spec: Value = serde_json::from_slice(bytes).unwrap();
    spec["root"]["path"] = json!("rootfs");
    let list = spec["process"]["env"].as_array_mut().unwrap();
    list.retain(|v| !v.as_str().unwrap_or("").starts_with("NVIDIA_"));
    list.extend(env.iter().map(|e| json!(e)));
    serde_json::to_vec_pretty(&spec).unwrap()
}

/// Arrays injection appends to: the additions must satisfy the predicate.
fn appended(pointer: &str) -> Option<fn(&Value) -> bool> {
    match pointer {
        "/linux/devices" => Some(|d| {
            d["path"]
                .as_str()
                .is_some_and(|p| p.starts_with("/dev/nvidia"))
                && d["type"] == "c"
                && d["major"].is_u64()
        }),
        "/linux/resources/devices" => Some(|r| r["allow"] == true && r["access"] == "rwm"),
        "/mounts" => Some(|m| {
            let opts: Vec<&str> = m["options"]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            m["type"] == "bind"
                && (opts.contains(&"bind") || opts.contains(&"rbind"))
                && opts.contains(&"nosuid")
                && opts.contains(&"nodev")
                && opts.contains(&"rprivate")
        }),
        // The one hook the runtime adds: the driver params cover, with its own env.
        "/hooks/createContainer" => Some(|h| {
            h["path"]
                .as_str()
                .is_some_and(|p| p.ends_with("/nvidia-container-runtime-hook"))
                && h["args"][1] == "disable-device-node-modification"
                && h["args"][2] == "--rootfs"
                && h["args"][3].as_str().is_some_and(|p| p.starts_with('/'))
                && h["env"] == json!(["PATH=/usr/sbin:/usr/bin:/sbin:/bin"])
        }),
        _ => None,
    }
}

/// Keys injection may add to an object (`pointer` of the object, key).
const NEW_KEYS: &[(&str, &str)] = &[
    ("", "annotations"),
    ("", "linux"),
    ("/linux", "devices"),
    ("/linux", "resources"),
    ("/linux/resources", "devices"),
    ("/annotations", "nvshim.io/injected"),
    ("", "hooks"),
    ("/hooks", "createContainer"),
];

fn diff(before: &Value, after: &Value, pointer: &str, errors: &mut Vec<String>) {
    if let Some(ok) = appended(pointer) {
        let empty = Vec::new();
        let old = before.as_array().unwrap_or(&empty);
        let Some(new) = after.as_array() else {
            errors.push(format!("{pointer}: not an array after"));
            return;
        };
        if new.len() < old.len() || new[..old.len()] != old[..] {
            errors.push(format!("{pointer}: existing entries changed"));
        }
        for added in new.iter().skip(old.len()) {
            if !ok(added) {
                errors.push(format!("{pointer}: unexpected addition {added}"));
            }
        }
        return;
    }
    if pointer == "/hooks/prestart" {
        let kept: Vec<&Value> = before
            .as_array()
            .unwrap()
            .iter()
            .filter(|h| {
                !h["path"]
                    .as_str()
                    .is_some_and(|p| p.ends_with("nvidia-container-runtime-hook"))
            })
            .collect();
        let now: Vec<&Value> = after.as_array().unwrap().iter().collect();
        if kept != now {
            errors.push(format!("{pointer}: only the legacy hook may go: {after}"));
        }
        return;
    }
    match (before, after) {
        (Value::Object(old), Value::Object(new)) => {
            let old_keys: Vec<&String> = old.keys().collect();
            let kept: Vec<&String> = new.keys().filter(|k| old.contains_key(*k)).collect();
            if old_keys != kept {
                errors.push(format!("{pointer}: key order changed"));
            }
            for (key, value) in new {
                let child = format!("{pointer}/{key}");
                match old.get(key) {
                    Some(old_value) => diff(old_value, value, &child, errors),
                    None if NEW_KEYS.contains(&(pointer, key.as_str())) => {
                        diff(&Value::Null, value, &child, errors)
                    }
                    None => errors.push(format!("{child}: unexpected new key")),
                }
            }
            for key in old.keys().filter(|k| !new.contains_key(*k)) {
                errors.push(format!("{pointer}/{key}: removed"));
            }
        }
        (Value::Null, Value::Object(_)) => {
            // A whole object injection created: check its members as additions.
            diff(&json!({}), after, pointer, errors)
        }
        (Value::Null, Value::String(_)) if pointer == "/annotations/nvshim.io/injected" => {}
        _ if before == after => {}
        _ => errors.push(format!("{pointer}: {before} became {after}")),
    }
}

#[test]
fn every_fixture_gets_only_the_expected_additions() {
    let host = host();
    for (name, bytes) in fixtures() {
        let input = with_env(&bytes, &["NVIDIA_VISIBLE_DEVICES=all"]);
        let bundle = host.bundle(&name, &input);
        fs::create_dir_all(bundle.join("rootfs")).unwrap();
        host.create(&bundle);
        let before: Value = serde_json::from_slice(&input).unwrap();
        let after: Value =
            serde_json::from_slice(&fs::read(bundle.join("config.json")).unwrap()).unwrap();
        let mut errors = Vec::new();
        diff(&before, &after, "", &mut errors);
        assert!(errors.is_empty(), "{name}:\n{}", errors.join("\n"));
        // And something was injected: all 4 GPUs' nodes and the libraries.
        let devices = after["linux"]["devices"].as_array().unwrap();
        for minor in 0..4 {
            let path = format!("/dev/nvidia{minor}");
            assert!(
                devices.iter().any(|d| d["path"] == path.as_str()),
                "{name}: {path}"
            );
        }
        let mounts = after["mounts"].as_array().unwrap();
        let lib = format!(
            "/usr/lib/x86_64-linux-gnu/libcuda.so.{}",
            host.node.sim.library_version()
        );
        // The driver's files come in one bind of the stage, linked at their paths.
        assert!(
            mounts
                .iter()
                .any(|m| m["destination"] == nvshim::driver_stage::CONTAINER_DIR),
            "{name}"
        );
        assert!(
            mounts.iter().all(|m| m["destination"] != lib.as_str()),
            "{name}"
        );
        assert_eq!(
            fs::read_link(bundle.join("rootfs").join(lib.trim_start_matches('/'))).ok(),
            Some(PathBuf::from(format!(
                "{}/libcuda.so.{}",
                nvshim::driver_stage::CONTAINER_DIR,
                host.node.sim.library_version()
            ))),
            "{name}"
        );
        // The soname link is created in the rootfs, not mounted.
        let link = bundle.join("rootfs/usr/lib/x86_64-linux-gnu/libcuda.so.1");
        assert_eq!(
            fs::read_link(&link).ok(),
            Some(PathBuf::from(format!(
                "libcuda.so.{}",
                host.node.sim.library_version()
            ))),
            "{name}"
        );
        assert_eq!(after["annotations"]["nvshim.io/injected"], "all", "{name}");
    }
}

#[test]
fn every_fixture_without_a_gpu_request_is_left_byte_for_byte() {
    let host = host();
    for (name, bytes) in fixtures() {
        // As captured (the GPU fixtures with their request taken out), and with `void`.
        for (tag, input) in [
            ("plain", with_env(&bytes, &[])),
            ("void", with_env(&bytes, &["NVIDIA_VISIBLE_DEVICES=void"])),
        ] {
            let bundle = host.bundle(&format!("{name}-{tag}"), &input);
            host.create(&bundle);
            assert_eq!(
                fs::read(bundle.join("config.json")).unwrap(),
                input,
                "{name} ({tag}) was rewritten"
            );
            assert!(!bundle.join("rootfs").exists(), "{name} ({tag})");
        }
    }
}

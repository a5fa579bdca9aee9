// SPDX-License-Identifier: Apache-2.0
//! One check per parser of untrusted input: feed it bytes, and panic if the parser
//! panics or breaks a property its module promises (a list prints back to itself, an
//! edited `config.json` keeps every field we did not touch, …).
//!
//! Shared by the cargo-fuzz targets (`fuzz/fuzz_targets/*.rs`, one line each) and by
//! `tests/security/fuzz_regressions.rs`, which includes this file with `#[path]` and
//! replays the seed corpora and every crash ever found, so a plain `cargo test`
//! re-checks them without the fuzzer. It may use only `nvshim`, `serde_json` and `std`:
//! the test crate has nothing else. No `unwrap`/`expect` (clippy runs on the test
//! crate): a broken property is a `panic!` that says which. The device plugin's check is
//! `plugin_checks.rs`, replayed by the plugin crate's tests.

use std::path::Path;
use std::str::FromStr;

use nvshim::bundle::{self, SpecDoc};
use nvshim::cdi::spec as cdi_spec;
use nvshim::cdi::{ContainerEdits, DeviceNode, Hook, Mount};
use nvshim::request::{
    ContainerInputs, DeviceList, DriverCapabilities, InputMount, RequestPolicy, Requirement,
    compare_versions,
};
use serde_json::{Map, Value};

/// A check: panics if the parser fails it on these bytes.
pub type Check = fn(&[u8]);

// The exporter's checks live in `serve_checks.rs` (this file is near its size limit).
pub use super::serve_checks::{http_request_head, pod_resources_response};

/// Every target: its name (the fuzz target's, and the directory of its corpus and
/// regressions) and its check.
pub const TARGETS: &[(&str, Check)] = &[
    ("device_list", device_list),
    ("require", require),
    ("request_build", request_build),
    ("ldcache", ldcache),
    ("config_json", config_json),
    ("config_toml", config_toml),
    ("plugin_yaml", plugin_yaml),
    ("oci_state", oci_state),
    ("cdi_spec_json", cdi_spec_json),
    ("cdi_spec_yaml", cdi_spec_yaml),
    ("hook_link", hook_link),
    ("pod_resources_response", pod_resources_response),
    ("http_request_head", http_request_head),
];

/// The device plugin's targets (`plugin_checks.rs`): the plugin crate's tests replay
/// them, so the core crate's tests need not link the plugin.
pub const PLUGIN_TARGETS: &[&str] = &["http2_inbound"];

/// Env values and annotations are strings; a runtime never sees invalid UTF-8 there
/// (Go's JSON decoder replaces it), so neither do the string parsers.
fn text(data: &[u8]) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(data)
}

/// `NVIDIA_VISIBLE_DEVICES`: whatever parses prints back to a list that parses to the
/// same thing (the promise in `request/devices.rs`).
pub fn device_list(data: &[u8]) {
    let input = text(data);
    let Ok(list) = DeviceList::from_str(&input) else {
        return;
    };
    let printed = list.to_string();
    match DeviceList::from_str(&printed) {
        Ok(again) if again == list => {}
        Ok(again) => {
            panic!("{input:?} parsed to {list:?}, printed {printed:?}, re-parsed to {again:?}")
        }
        Err(e) => panic!("{input:?} parsed to {list:?}, printed {printed:?}, which fails: {e}"),
    }
}

/// `NVIDIA_REQUIRE_*`: a requirement prints back to itself (`Requirement`'s `Display`
/// promise), conditions evaluate against any fact, version order is antisymmetric.
pub fn require(data: &[u8]) {
    let input = text(data);
    if let Ok(requirement) = Requirement::parse("NVIDIA_REQUIRE_CUDA", &input) {
        let printed = requirement.to_string();
        match Requirement::parse("NVIDIA_REQUIRE_CUDA", &printed) {
            Ok(again) if again == requirement => {}
            Ok(again) => panic!(
                "{input:?} parsed to {requirement:?}, printed {printed:?}, re-parsed to {again:?}"
            ),
            Err(e) => panic!("{input:?} printed as {printed:?}, which fails: {e}"),
        }
        for condition in requirement.alternatives.iter().flatten() {
            for fact in [
                "12.4",
                "550.54.15",
                "8.0",
                "tesla",
                "",
                "x.y",
                &condition.value,
            ] {
                let _ = condition.holds_for(fact);
            }
        }
    }
    // The input's first two words as versions.
    let mut words = input.split_whitespace();
    let (a, b) = (words.next().unwrap_or(""), words.next().unwrap_or(""));
    let ab = compare_versions(a, b);
    let ba = compare_versions(b, a);
    if ab.map(std::cmp::Ordering::reverse) != ba {
        panic!("compare_versions({a:?}, {b:?}) = {ab:?} but ({b:?}, {a:?}) = {ba:?}");
    }
}

/// The whole request builder from a container's inputs. The input is lines:
///
/// ```text
/// env K=V                           one process.env entry (a line with no known word is one too)
/// annotation KEY=VALUE
/// mount DESTINATION [SOURCE]
/// privileged
/// policy accept-volume-mounts | deny-envvar-unprivileged | disable-require
/// policy swarm NAME | prefix PREFIX | capabilities LIST
/// ```
pub fn request_build(data: &[u8]) {
    let input = text(data);
    let mut inputs = ContainerInputs::default();
    let mut policy = RequestPolicy::default();
    for line in input.split('\n') {
        let (word, rest) = line.split_once(' ').unwrap_or((line, ""));
        match word {
            "env" => inputs.env.push(rest.to_owned()),
            "annotation" => {
                let (k, v) = rest.split_once('=').unwrap_or((rest, ""));
                inputs.annotations.push((k.to_owned(), v.to_owned()));
            }
            "mount" => {
                let (destination, source) = match rest.split_once(' ') {
                    Some((d, s)) => (d, Some(s.to_owned())),
                    None => (rest, None),
                };
                inputs.mounts.push(InputMount {
                    destination: destination.to_owned(),
                    source,
                });
            }
            "privileged" => inputs.privileged = true,
            "policy" => {
                let (knob, value) = rest.split_once(' ').unwrap_or((rest, ""));
                match knob {
                    "accept-volume-mounts" => policy.accept_volume_mounts = true,
                    "deny-envvar-unprivileged" => policy.accept_envvar_when_unprivileged = false,
                    "disable-require" => policy.disable_require = true,
                    "swarm" => policy.swarm_resource.push(value.to_owned()),
                    "prefix" => policy.annotation_prefixes.push(value.to_owned()),
                    "capabilities" => {
                        if let Ok(caps) = DriverCapabilities::from_str(value) {
                            policy.supported_capabilities = caps;
                        }
                    }
                    _ => {}
                }
            }
            _ => inputs.env.push(line.to_owned()),
        }
    }
    if let Ok(request) = nvshim::request::build(&inputs, &policy) {
        // The invariants `tests/request_inputs.rs` states for the builder.
        if request.ignored.is_some() && request.devices != DeviceList::Void {
            panic!("a dropped request has devices: {request:?}");
        }
        if request.devices == DeviceList::Void && !request.requirements.is_empty() {
            panic!("a void request carries requirements: {request:?}");
        }
        let _ = request.devices.to_string();
    }
}

/// `ld.so.cache` in any layout. What parses writes back (new format) to the same entries.
pub fn ldcache(data: &[u8]) {
    let Ok(cache) = nvshim::ldcache::parse(data) else {
        return;
    };
    let _ = cache.lookup("libcuda.so.1").count();
    let written = nvshim::ldcache::write_new(&cache.entries);
    match nvshim::ldcache::parse(&written) {
        Ok(again) if again.entries == cache.entries => {}
        Ok(again) => panic!(
            "entries changed through write_new: {:?} became {:?}",
            cache.entries, again.entries
        ),
        Err(e) => panic!(
            "write_new of parsed entries {:?} does not parse: {e}",
            cache.entries
        ),
    }
}

/// The edits the `config_json` check applies: one of each kind, with names a spec may
/// already use.
pub fn fixed_edits() -> ContainerEdits {
    let node = |path: &str, minor: i64| DeviceNode {
        path: path.into(),
        host_path: None,
        kind: Some("c".into()),
        major: Some(195),
        minor: Some(minor),
        file_mode: Some(0o666),
        permissions: Some("rwm".into()),
        uid: None,
        gid: None,
    };
    let mount = |path: &str| Mount {
        host_path: path.into(),
        container_path: path.into(),
        kind: Some("bind".into()),
        options: vec!["ro".into(), "nosuid".into(), "nodev".into(), "bind".into()],
    };
    ContainerEdits {
        env: vec![
            "NVIDIA_VISIBLE_DEVICES=0".into(),
            "NVIDIA_DRIVER_CAPABILITIES=compute,utility".into(),
        ],
        device_nodes: vec![node("/dev/nvidiactl", 255), node("/dev/nvidia0", 0)],
        mounts: vec![
            mount("/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15"),
            mount("/usr/bin/nvidia-smi"),
        ],
        hooks: vec![
            Hook {
                hook_name: "createContainer".into(),
                path: "/usr/bin/nvshim".into(),
                args: vec!["nvshim".into(), "hook".into(), "link-driver".into()],
                env: vec!["PATH=/usr/bin".into()],
                timeout: Some(30),
            },
            Hook {
                hook_name: "prestart".into(),
                path: "/usr/bin/true".into(),
                args: Vec::new(),
                env: Vec::new(),
                timeout: None,
            },
        ],
        additional_gids: vec![44],
    }
}

/// `config.json` as the runtime rewrites it: parse, apply [`fixed_edits`], serialise,
/// parse again. What parses must serialise, and re-parse to the same document; every
/// field the edits do not own is kept, in place and in order; applying again changes
/// nothing; applying no edits changes nothing. Also reads the container's request from
/// it, as the runtime does.
pub fn config_json(data: &[u8]) {
    let Ok(doc) = SpecDoc::parse(data) else {
        return;
    };
    let original = doc.value().clone();
    let bytes = match doc.to_vec() {
        Ok(b) => b,
        Err(e) => panic!("a parsed config.json does not serialise: {e}"),
    };
    same_after_reparse(&original, &bytes, "unedited");

    let inputs = nvshim::container::inputs(&doc);
    let _ = nvshim::request::build(&inputs, &RequestPolicy::default());

    let mut untouched = original.clone();
    if let Err(e) = nvshim::inject::apply(&mut untouched, &ContainerEdits::default()) {
        panic!("empty edits failed: {e}");
    }
    if untouched != original || to_string(&untouched) != to_string(&original) {
        panic!("empty edits changed the spec");
    }

    let edits = fixed_edits();
    let mut edited = doc;
    if nvshim::inject::apply(edited.value_mut(), &edits).is_err() {
        // A field of the wrong type: the runtime refuses the container. Fine.
        return;
    }
    let bytes = match edited.to_vec() {
        Ok(b) => b,
        Err(e) => panic!("an edited config.json does not serialise: {e}"),
    };
    let reparsed = same_after_reparse(edited.value(), &bytes, "edited");

    let mut twice = reparsed.clone();
    match nvshim::inject::apply(&mut twice, &edits) {
        Ok(_) if to_string(&twice) == to_string(&reparsed) => {}
        Ok(_) => panic!("applying the edits twice changed the spec again"),
        Err(e) => panic!("applying the edits to an edited spec failed: {e}"),
    }

    if let Err(e) = kept_in_place(&original, &reparsed, &edits) {
        panic!("{e}");
    }
}

/// Whether `edited` (`original` with `edits` applied) still has everything of
/// `original` that the edits do not own, in place and in order. `Err` says what changed.
pub fn kept_in_place(
    original: &Value,
    edited: &Value,
    edits: &ContainerEdits,
) -> Result<(), String> {
    let ours = ours(edits);
    let before = to_string(&normalise(original, original, &ours));
    let after = to_string(&normalise(edited, original, &ours));
    if before == after {
        Ok(())
    } else {
        Err(format!(
            "fields the edits do not own changed:\nbefore {before}\nafter  {after}"
        ))
    }
}

fn to_string(value: &Value) -> String {
    serde_json::to_string(value).unwrap_or_else(|e| panic!("a Value does not serialise: {e}"))
}

/// Parses `bytes` (what `to_vec` wrote for `value`) and checks it is `value` again, key
/// order included, and that writing it again gives the same bytes.
fn same_after_reparse(value: &Value, bytes: &[u8], what: &str) -> Value {
    let again = match SpecDoc::parse(bytes) {
        Ok(d) => d,
        Err(e) => panic!("{what}: serialised config.json does not parse: {e}"),
    };
    if again.value() != value || to_string(again.value()) != to_string(value) {
        panic!("{what}: config.json changed through a write and a read");
    }
    match again.to_vec() {
        Ok(b) if b == bytes => {}
        Ok(_) => panic!("{what}: writing the re-read config.json gives other bytes"),
        Err(e) => panic!("{what}: the re-read config.json does not serialise: {e}"),
    }
    again.into_value()
}

/// What the edits write, read off an empty spec they are applied to, so the check does
/// not restate `inject`'s JSON shapes.
struct Ours {
    env_names: Vec<String>,
    device_paths: Vec<Value>,
    rules: Vec<Value>,
    destinations: Vec<Value>,
    hooks: Map<String, Value>,
    gids: Vec<u64>,
}

fn ours(edits: &ContainerEdits) -> Ours {
    let mut empty = Value::Object(Map::new());
    if let Err(e) = nvshim::inject::apply(&mut empty, edits) {
        panic!("the edits do not apply to an empty spec: {e}");
    }
    let list = |pointer: &str| match empty.pointer(pointer) {
        Some(Value::Array(a)) => a.clone(),
        _ => Vec::new(),
    };
    let field = |items: Vec<Value>, key: &str| {
        items
            .iter()
            .filter_map(|v| v.get(key).cloned())
            .collect::<Vec<_>>()
    };
    Ours {
        env_names: edits.env.iter().map(|v| env_name(v).to_owned()).collect(),
        device_paths: field(list("/linux/devices"), "path"),
        rules: list("/linux/resources/devices"),
        destinations: field(list("/mounts"), "destination"),
        hooks: match empty.get("hooks") {
            Some(Value::Object(h)) => h.clone(),
            _ => Map::new(),
        },
        gids: edits
            .additional_gids
            .iter()
            .map(|&g| u64::from(g))
            .collect(),
    }
}

fn env_name(var: &str) -> &str {
    var.split_once('=').map_or(var, |(n, _)| n)
}

/// `value` without anything the edits own: our env names, device paths, cgroup rules,
/// mount destinations, hook entries and gids are dropped, and a container the edits
/// created (absent or null in `original`) is dropped once it is empty; a null the edits
/// replace reads as absent. What is left must be the same before and after the edits.
fn normalise(value: &Value, original: &Value, ours: &Ours) -> Value {
    let mut v = value.clone();
    let retain = |v: &mut Value, pointer: &str, keep: &dyn Fn(&Value) -> bool| {
        if let Some(Value::Array(items)) = v.pointer_mut(pointer) {
            items.retain(|i| keep(i));
        }
    };
    retain(&mut v, "/process/env", &|e| {
        e.as_str()
            .is_none_or(|s| !ours.env_names.iter().any(|n| n == env_name(s)))
    });
    retain(&mut v, "/process/user/additionalGids", &|g| {
        g.as_u64().is_none_or(|g| !ours.gids.contains(&g))
    });
    retain(&mut v, "/linux/devices", &|d| {
        d.get("path")
            .filter(|p| p.is_string())
            .is_none_or(|p| !ours.device_paths.contains(p))
    });
    retain(&mut v, "/linux/resources/devices", &|r| {
        !ours.rules.contains(r)
    });
    retain(&mut v, "/mounts", &|m| {
        m.get("destination")
            .filter(|d| d.is_string())
            .is_none_or(|d| !ours.destinations.contains(d))
    });
    for (stage, entries) in &ours.hooks {
        let entries = match entries {
            Value::Array(e) => e.clone(),
            _ => Vec::new(),
        };
        retain(&mut v, &format!("/hooks/{}", pointer_token(stage)), &|h| {
            !entries.contains(h)
        });
    }
    // Deepest first, so a parent emptied by dropping its children goes too.
    let mut created: Vec<Vec<String>> = vec![
        vec!["process".into(), "user".into(), "additionalGids".into()],
        vec!["process".into(), "user".into()],
        vec!["process".into(), "env".into()],
        vec!["linux".into(), "resources".into(), "devices".into()],
        vec!["linux".into(), "resources".into()],
        vec!["linux".into(), "devices".into()],
    ];
    for stage in ours.hooks.keys() {
        created.push(vec!["hooks".into(), stage.clone()]);
    }
    created.extend([
        vec!["process".into()],
        vec!["linux".into()],
        vec!["mounts".into()],
        vec!["hooks".into()],
    ]);
    for path in &created {
        prune(&mut v, original, path);
    }
    v
}

/// Drops `path` from `v` if it is null, or if `original` lacks it (or has null there)
/// and it is an empty array or object in `v`.
fn prune(v: &mut Value, original: &Value, path: &[String]) {
    let Some((last, parents)) = path.split_last() else {
        return;
    };
    let mut in_original = Some(original);
    for key in path {
        in_original = in_original.and_then(|o| o.get(key.as_str()));
    }
    let absent_before = in_original.is_none_or(Value::is_null);
    let mut parent = Some(&mut *v);
    for key in parents {
        parent = parent.and_then(|p| p.get_mut(key.as_str()));
    }
    let Some(Value::Object(parent)) = parent else {
        return;
    };
    let drop = match parent.get(last.as_str()) {
        Some(Value::Null) => true,
        Some(Value::Array(a)) => absent_before && a.is_empty(),
        Some(Value::Object(o)) => absent_before && o.is_empty(),
        _ => false,
    };
    if drop {
        parent.shift_remove(last.as_str());
    }
}

/// A JSON pointer reference token (RFC 6901).
fn pointer_token(key: &str) -> String {
    key.replace('~', "~0").replace('/', "~1")
}

/// `/etc/nvidia-container-runtime/config.toml`, and the request policy it gives.
pub fn config_toml(data: &[u8]) {
    // The loader reads the file as UTF-8 and fails before parsing otherwise.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok((config, _unknown)) = nvshim::config::parse(text, Path::new("config.toml")) else {
        return;
    };
    let _ = (config.driver_root(), config.dev_root());
    let _ = nvshim::container::policy(&config);
    let _ = nvshim::container::context(&config, nvshim::container::Front::Runtime);
}

/// The device plugin's (and GFD's) YAML config file.
pub fn plugin_yaml(data: &[u8]) {
    let _ = nvshim::k8s_config::parse_file(data, Path::new("config.yaml"));
}

/// The OCI state a runtime writes on a hook's stdin. What parses has what
/// `parse_state` promises: a non-empty bundle, no pid or a positive one.
pub fn oci_state(data: &[u8]) {
    let Ok(state) = bundle::parse_state(data) else {
        return;
    };
    if state.bundle.as_os_str().is_empty() || state.pid.is_some_and(|p| p <= 0) {
        panic!("parse_state accepted {state:?}");
    }
}

/// A CDI spec read as `.json`; what parses writes back (JSON and YAML) to itself.
pub fn cdi_spec_json(data: &[u8]) {
    cdi_spec(data, "x.json");
}

/// A CDI spec read as `.yaml`; what parses writes back (JSON and YAML) to itself.
pub fn cdi_spec_yaml(data: &[u8]) {
    cdi_spec(data, "x.yaml");
}

fn cdi_spec(data: &[u8], path: &str) {
    let Ok(spec) = cdi_spec::parse(data, Path::new(path)) else {
        return;
    };
    let _ = nvshim::cdi::minimum_version(&spec);
    let json = cdi_spec::to_json(&spec);
    match cdi_spec::parse(&json, Path::new("back.json")) {
        Ok(back) if back == spec => {}
        Ok(back) => panic!("{spec:?} came back from JSON as {back:?}"),
        Err(e) => panic!("{spec:?} written as JSON does not parse: {e}"),
    }
    let yaml = match cdi_spec::to_yaml(&spec) {
        Ok(y) => y,
        Err(e) => panic!("{spec:?} does not write as YAML: {e}"),
    };
    match cdi_spec::parse(yaml.as_bytes(), Path::new("back.yaml")) {
        Ok(back) if back == spec => {}
        Ok(back) => panic!("{spec:?} came back from YAML {yaml:?} as {back:?}"),
        Err(e) => panic!("{spec:?} written as YAML {yaml:?} does not parse: {e}"),
    }
}

/// The `link-driver` hook's `--link` and `--ldcache` values (each line of the input is
/// tried as both). What parses and encodes parses back to itself.
pub fn hook_link(data: &[u8]) {
    use nvshim::hook_contract::{encode_link_driver as encode, parse_entry, parse_link};
    let input = text(data);
    for line in input.split('\n') {
        if let Ok(link) = parse_link(line)
            && let Ok(args) = encode(std::slice::from_ref(&link), &[])
        {
            match args.get(1).map(|a| parse_link(a)) {
                Some(Ok(back)) if back == link => {}
                other => panic!("{line:?} → {link:?} → {args:?} → {other:?}"),
            }
        }
        if let Ok(entry) = parse_entry(line)
            && let Ok(args) = encode(&[], std::slice::from_ref(&entry))
        {
            match args.get(1).map(|a| parse_entry(a)) {
                Some(Ok(back)) if back == entry => {}
                other => panic!("{line:?} → {entry:?} → {args:?} → {other:?}"),
            }
        }
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The real `nvidia-device-plugin` against the fake kubelet: when the spec appears, how
//! it is written, SIGHUP, SIGTERM, and the stale spec of a run without CDI.

use std::collections::BTreeSet;
use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
use nix::sys::signal::Signal;
use nvshim_device_plugin::api::{AllocateRequest, ContainerAllocateRequest};
use nvshim_device_plugin::config::CDI_SPEC_FILE;
use nvshim_testkit::NodeSpec;
use serde_json::Value;

use super::{GENEROUS, GPU_SOCKET, KIND, names};
use crate::common::kubelet::{FakeKubelet, dial_plugin};
use crate::common::plugin_proc::{CDI_DIR, PluginProc, node_args};
use crate::common::{Node, node};

/// A plugin process on `node` with its socket and CDI directories in `dir`; `extra`
/// adds flags (`--flag=value`, or a flag and its value) or, for a flag [`node_args`]
/// gives, replaces its value.
pub(super) fn spawn(node: &Node, dir: &Path, extra: &[&str]) -> PluginProc {
    let mut args = node_args(&node.sim, dir);
    let mut extra = extra.iter().map(|a| a.to_string());
    while let Some(arg) = extra.next() {
        match args.iter().position(|a| *a == arg) {
            Some(at) if !arg.contains('=') => args[at + 1] = extra.next().unwrap(),
            _ => args.push(arg),
        }
    }
    PluginProc::spawn(
        Path::new(env!("CARGO_BIN_EXE_nvidia-device-plugin")),
        &args,
        &node.sim.env(),
    )
}

/// The CDI names `Allocate` returns for `ids` (one container, `cdi-cri`).
pub(super) async fn allocate(socket: &Path, ids: &[&str]) -> Vec<String> {
    let mut client = dial_plugin(socket).await;
    let request = AllocateRequest {
        container_requests: vec![ContainerAllocateRequest {
            devices_ids: ids.iter().map(|s| s.to_string()).collect(),
        }],
    };
    let response = client.allocate(request).await.unwrap().into_inner();
    response.container_responses[0]
        .cdi_devices
        .iter()
        .map(|d| d.name.clone())
        .collect()
}

pub(super) fn read_spec(path: &Path) -> Value {
    serde_json::from_slice(&fs::read(path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The events on `name` since the last call, as flag sets.
fn events_on(inotify: &Inotify, name: &str) -> Vec<AddWatchFlags> {
    let mut out = Vec::new();
    while let Ok(events) = inotify.read_events() {
        if events.is_empty() {
            break;
        }
        out.extend(
            events
                .into_iter()
                .filter(|e| e.name.as_deref().and_then(|n| n.to_str()) == Some(name))
                .map(|e| e.mask),
        );
    }
    out
}

/// Every write to the spec's own name is a rename onto it: no reader ever sees it
/// created empty or half-written.
fn assert_renamed_in(events: &[AddWatchFlags], case: &str) {
    assert!(
        events
            .iter()
            .any(|m| m.contains(AddWatchFlags::IN_MOVED_TO)),
        "{case}: not renamed into place: {events:?}"
    );
    let written = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_ATTRIB;
    assert!(
        !events.iter().any(|m| m.intersects(written)),
        "{case}: written in place: {events:?}"
    );
}

#[tokio::test]
async fn the_binary_keeps_the_spec_through_sighup_and_removes_it_on_sigterm() {
    let node = node(&NodeSpec::standard(4));
    let dir = tempfile::tempdir().unwrap();
    let cdi_dir = dir.path().join(CDI_DIR);
    fs::create_dir(&cdi_dir).unwrap();
    let spec_path = cdi_dir.join(CDI_SPEC_FILE);
    let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC).unwrap();
    // What changes a file; reads (the plugin compares before it writes) are not events.
    let changes = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_CLOSE_WRITE
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE;
    inotify.add_watch(&cdi_dir, changes).unwrap();
    let config = dir.path().join("config.yaml");
    let write_config = |ids: &str| {
        let text = format!("version: v1\nflags:\n  plugin:\n    deviceIDStrategy: {ids}\n");
        fs::write(&config, text).unwrap();
    };
    write_config("uuid");

    let kubelet = FakeKubelet::start(dir.path());
    let config_arg = config.display().to_string();
    let mut plugin = spawn(
        &node,
        dir.path(),
        &[
            "--device-list-strategy=cdi-cri",
            "--config-file",
            &config_arg,
        ],
    );
    kubelet.wait_registrations(1, GENEROUS).await;
    // Written before the plugin registered: kubelet can hand out no name it lacks.
    let spec = read_spec(&spec_path);
    assert_renamed_in(&events_on(&inotify, CDI_SPEC_FILE), "start");
    let uuids: Vec<String> = node.sim.spec.gpus.iter().map(|g| g.uuid.clone()).collect();
    assert_eq!(spec["kind"], KIND);
    assert_eq!(names(&spec), uuids, "one device per GPU, by UUID");
    let got = allocate(&dir.path().join(GPU_SOCKET), &[&uuids[2], &uuids[0]]).await;
    let defined: BTreeSet<String> = names(&spec).iter().map(|n| format!("{KIND}={n}")).collect();
    assert_eq!(
        got,
        [
            format!("{KIND}={}", uuids[0]),
            format!("{KIND}={}", uuids[2])
        ]
    );
    assert!(
        got.iter().all(|n| defined.contains(n)),
        "{got:?} ⊄ {defined:?}"
    );
    let leftovers: Vec<_> = fs::read_dir(&cdi_dir).unwrap().collect();
    assert_eq!(leftovers.len(), 1, "only the spec: {leftovers:?}");

    // The devices' names change (uuid → index): SIGHUP rewrites the spec.
    write_config("index");
    plugin.signal(Signal::SIGHUP);
    kubelet.wait_registrations(2, GENEROUS).await;
    let spec = read_spec(&spec_path);
    assert_eq!(
        names(&spec),
        ["0", "1", "2", "3"],
        "after SIGHUP\n{}",
        plugin.log()
    );
    assert_renamed_in(&events_on(&inotify, CDI_SPEC_FILE), "SIGHUP");
    assert_eq!(
        allocate(&dir.path().join(GPU_SOCKET), &["1"]).await,
        [format!("{KIND}=1")]
    );

    // Nothing changed: the file is left as it is.
    let inode = fs::metadata(&spec_path).unwrap().ino();
    plugin.signal(Signal::SIGHUP);
    kubelet.wait_registrations(3, GENEROUS).await;
    assert_eq!(fs::metadata(&spec_path).unwrap().ino(), inode, "rewritten");
    assert_eq!(
        events_on(&inotify, CDI_SPEC_FILE),
        [],
        "touched without a change"
    );

    plugin.signal(Signal::SIGTERM);
    let status = plugin.exit(GENEROUS).await;
    assert!(
        status.is_some_and(|s| s.success()),
        "exit {status:?}\n{}",
        plugin.log()
    );
    assert!(!spec_path.exists(), "the spec outlived the plugin");
}

#[tokio::test]
async fn without_a_cdi_strategy_a_stale_spec_goes_and_a_foreign_file_stays() {
    let node = node(&NodeSpec::standard(2));
    let cases = [
        (
            "a stale spec of the plugin",
            format!(r#"{{"cdiVersion":"0.5.0","kind":"{KIND}","devices":[]}}"#),
            false,
        ),
        (
            "another kind",
            r#"{"cdiVersion":"0.5.0","kind":"example.com/net","devices":[]}"#.to_string(),
            true,
        ),
    ];
    for (case, text, stays) in cases {
        let dir = tempfile::tempdir().unwrap();
        let cdi_dir = dir.path().join(CDI_DIR);
        fs::create_dir(&cdi_dir).unwrap();
        let path = cdi_dir.join(CDI_SPEC_FILE);
        fs::write(&path, &text).unwrap();
        let kubelet = FakeKubelet::start(dir.path());
        let mut plugin = spawn(&node, dir.path(), &[]);
        kubelet.wait_registrations(1, GENEROUS).await;
        assert_eq!(path.exists(), stays, "{case}\n{}", plugin.log());
        plugin.signal(Signal::SIGTERM);
        assert!(
            plugin.exit(GENEROUS).await.is_some_and(|s| s.success()),
            "{case}"
        );
        if stays {
            assert_eq!(
                fs::read_to_string(&path).unwrap(),
                text,
                "{case}: untouched"
            );
        }
    }
}

#[tokio::test]
async fn a_spec_directory_that_cannot_be_used_fails_only_a_cdi_start() {
    let node = node(&NodeSpec::standard(2));
    // A regular file where the directory should be: nothing can be read or made in it.
    let blocker = tempfile::NamedTempFile::new().unwrap();
    let blocked = blocker.path().display().to_string();

    let dir = tempfile::tempdir().unwrap();
    let mut plugin = spawn(
        &node,
        dir.path(),
        &["--device-list-strategy=cdi-cri", "--cdi-spec-dir", &blocked],
    );
    let status = plugin.exit(GENEROUS).await;
    let log = plugin.log();
    assert!(
        status.is_some_and(|s| !s.success()),
        "a cdi-cri plugin without its spec must not serve: {status:?}\n{log}"
    );
    assert!(log.contains(&blocked), "the error names the path:\n{log}");

    // Without a CDI strategy the directory is only checked for a stale spec.
    let dir = tempfile::tempdir().unwrap();
    let kubelet = FakeKubelet::start(dir.path());
    let mut plugin = spawn(&node, dir.path(), &["--cdi-spec-dir", &blocked]);
    kubelet.wait_registrations(1, GENEROUS).await;
    // The reader thread may not have the line yet: wait for it.
    assert!(
        plugin
            .wait_log("cannot check for a stale CDI spec", GENEROUS)
            .await,
        "{}",
        plugin.log()
    );
    plugin.signal(Signal::SIGTERM);
    assert!(plugin.exit(GENEROUS).await.is_some_and(|s| s.success()));
}

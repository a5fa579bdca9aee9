//! `nvidia-ctk cdi transform root`: moves a spec's paths from one root to another, as
//! when the driver lives in a driver container (`/run/nvidia/driver`) and the spec
//! was generated inside it.
//!
//! It works on the spec as a JSON value, so fields this crate does not model survive
//! untouched. A path is moved when it is the root itself or lies under it (a whole
//! component: root `/driver` leaves `/driverfoo` alone). NVIDIA's rules:
//! - relative to the host: device nodes' `hostPath` (from `path` when absent), mounts'
//!   `hostPath`, and every hook's `path` except `startContainer`'s (which resolves in
//!   the container); the arguments of hooks other than `createContainer` and
//!   `startContainer` (both sides of `TARGET::LINK`);
//! - relative to the container: device nodes' `path`, mounts' `containerPath`,
//!   `startContainer` hooks' `path`, and the arguments of `createContainer` and
//!   `startContainer` hooks.

use serde_json::Value;

/// Which side of the spec's paths moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RelativeTo {
    Host,
    Container,
}

impl std::str::FromStr for RelativeTo {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "host" => Ok(Self::Host),
            "container" => Ok(Self::Container),
            other => Err(format!(
                "invalid --relative-to value {other:?} (valid: host, container)"
            )),
        }
    }
}

/// Moves paths under `from` to `to` in `spec` (a parsed spec document).
pub fn root(spec: &mut Value, from: &str, to: &str, relative_to: RelativeTo) {
    if from == to {
        return;
    }
    let t = Roots { from, to };
    if let Some(edits) = spec.get_mut("containerEdits") {
        t.edits(edits, relative_to);
    }
    if let Some(Value::Array(devices)) = spec.get_mut("devices") {
        for device in devices {
            if let Some(edits) = device.get_mut("containerEdits") {
                t.edits(edits, relative_to);
            }
        }
    }
}

struct Roots<'a> {
    from: &'a str,
    to: &'a str,
}

impl Roots<'_> {
    fn edits(&self, edits: &mut Value, relative_to: RelativeTo) {
        for node in items(edits, "deviceNodes") {
            match relative_to {
                RelativeTo::Host => {
                    let host = node
                        .get("hostPath")
                        .and_then(Value::as_str)
                        .filter(|p| !p.is_empty())
                        .or_else(|| node.get("path").and_then(Value::as_str))
                        .map(str::to_owned);
                    if let (Some(host), Some(obj)) = (host, node.as_object_mut()) {
                        obj.insert("hostPath".into(), Value::String(self.path(&host)));
                    }
                }
                RelativeTo::Container => self.field(node, "path"),
            }
        }
        for mount in items(edits, "mounts") {
            match relative_to {
                RelativeTo::Host => self.field(mount, "hostPath"),
                RelativeTo::Container => self.field(mount, "containerPath"),
            }
        }
        for hook in items(edits, "hooks") {
            let name = hook
                .get("hookName")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned();
            let in_container = name == "createContainer" || name == "startContainer";
            let (move_path, move_args) = match relative_to {
                RelativeTo::Host => (name != "startContainer", !in_container),
                RelativeTo::Container => (name == "startContainer", in_container),
            };
            if move_path {
                self.field(hook, "path");
            }
            if move_args && let Some(Value::Array(args)) = hook.get_mut("args") {
                for arg in args {
                    if let Some(text) = arg.as_str() {
                        *arg = Value::String(self.arg(text));
                    }
                }
            }
        }
    }

    fn field(&self, obj: &mut Value, key: &str) {
        if let Some(Value::String(path)) = obj.get_mut(key) {
            *path = self.path(path);
        }
    }

    /// A hook argument: a path, or `TARGET::LINK` with both sides moved.
    fn arg(&self, arg: &str) -> String {
        match arg.split_once("::") {
            Some((target, link)) => format!("{}::{}", self.path(target), self.path(link)),
            None => self.path(arg),
        }
    }

    fn path(&self, path: &str) -> String {
        let from = self.from.trim_end_matches('/');
        let to = self.to.trim_end_matches('/');
        if !from.is_empty() && path == from {
            return if to.is_empty() { "/".into() } else { to.into() };
        }
        match path.strip_prefix(from) {
            Some(rest) if rest.starts_with('/') => format!("{to}{rest}"),
            _ => path.to_owned(),
        }
    }
}

fn items<'a>(edits: &'a mut Value, key: &str) -> impl Iterator<Item = &'a mut Value> {
    edits
        .get_mut(key)
        .and_then(Value::as_array_mut)
        .into_iter()
        .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec() -> Value {
        json!({
            "cdiVersion": "0.5.0",
            "kind": "nvidia.com/gpu",
            "x-unknown": {"kept": true},
            "devices": [{"name": "0", "containerEdits": {"deviceNodes": [
                {"path": "/driver/dev/nvidia0"}
            ]}}],
            "containerEdits": {
                "mounts": [{"hostPath": "/driver/usr/lib/libcuda.so.1",
                            "containerPath": "/driver/usr/lib/libcuda.so.1"},
                           {"hostPath": "/driverfoo/x", "containerPath": "/x"}],
                "hooks": [{"hookName": "createContainer",
                           "path": "/driver/usr/bin/nvidia-cdi-hook",
                           "args": ["nvidia-cdi-hook", "create-symlinks",
                                    "--link", "/driver/a::/driver/b"]}]
            }
        })
    }

    #[test]
    fn host_paths_move_and_container_paths_stay() {
        let mut s = spec();
        root(&mut s, "/driver", "/", RelativeTo::Host);
        let edits = &s["containerEdits"];
        assert_eq!(edits["mounts"][0]["hostPath"], "/usr/lib/libcuda.so.1");
        assert_eq!(
            edits["mounts"][0]["containerPath"],
            "/driver/usr/lib/libcuda.so.1"
        );
        assert_eq!(edits["mounts"][1]["hostPath"], "/driverfoo/x");
        assert_eq!(edits["hooks"][0]["path"], "/usr/bin/nvidia-cdi-hook");
        // createContainer arguments are container paths.
        assert_eq!(edits["hooks"][0]["args"][3], "/driver/a::/driver/b");
        let node = &s["devices"][0]["containerEdits"]["deviceNodes"][0];
        assert_eq!(node["hostPath"], "/dev/nvidia0");
        assert_eq!(node["path"], "/driver/dev/nvidia0");
        assert_eq!(s["x-unknown"]["kept"], true);
    }

    #[test]
    fn container_paths_move_with_create_container_arguments() {
        let mut s = spec();
        root(
            &mut s,
            "/driver/",
            "/run/nvidia/driver",
            RelativeTo::Container,
        );
        let edits = &s["containerEdits"];
        assert_eq!(
            edits["mounts"][0]["containerPath"],
            "/run/nvidia/driver/usr/lib/libcuda.so.1"
        );
        assert_eq!(
            edits["mounts"][0]["hostPath"],
            "/driver/usr/lib/libcuda.so.1"
        );
        assert_eq!(edits["hooks"][0]["path"], "/driver/usr/bin/nvidia-cdi-hook");
        assert_eq!(
            edits["hooks"][0]["args"][3],
            "/run/nvidia/driver/a::/run/nvidia/driver/b"
        );
        assert_eq!(edits["hooks"][0]["args"][0], "nvidia-cdi-hook");
        let mut same = spec();
        root(&mut same, "/driver", "/driver", RelativeTo::Host);
        assert_eq!(same, spec());
        assert!("sideways".parse::<RelativeTo>().is_err());
    }
}

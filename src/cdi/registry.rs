//! The CDI spec directories (`/etc/cdi`, `/var/run/cdi`): every device they define,
//! and the edits a list of device names resolves to.
//!
//! This is the only part of `cdi` that does I/O. It behaves like the CDI library's
//! cache: a missing directory is no error, a file that cannot be read or parsed is
//! recorded and skipped, a later directory overrides an earlier one, and a device
//! defined twice in one directory is a conflict that makes it unresolvable. Loading
//! never fails; what went wrong surfaces when a name is resolved, or through
//! [`Registry::errors`]. It decides no policy and logs only at debug level.

use std::collections::{BTreeMap, HashSet};
use std::fmt::Write as _;
use std::fs;
use std::io::Read as _;
use std::path::{Path, PathBuf};

use super::name::{self, QualifiedName};
use super::spec::{self, MAX_SPEC_SIZE, SpecError};
use super::{ContainerEdits, Spec};

/// How many known names an unknown-device error lists before it stops.
const MAX_LISTED: usize = 20;

/// Why a list of device names cannot be resolved.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// `known` holds the device names of the requested kind; `unreadable` the spec
    /// files that were skipped, since the device may have been in one of them.
    #[error("unknown CDI device \"{name}\" ({}){}", known_list(.name, .known), unreadable_list(.unreadable))]
    UnknownDevice {
        name: QualifiedName,
        known: Vec<String>,
        unreadable: Vec<(PathBuf, String)>,
    },
    #[error(
        "CDI device \"{name}\" is defined in both {} and {}, which are in the same \
         directory, so neither wins",
        first.display(),
        second.display()
    )]
    Conflict {
        name: QualifiedName,
        first: PathBuf,
        second: PathBuf,
    },
}

fn known_list(name: &QualifiedName, known: &[String]) -> String {
    let kind = name.kind();
    if known.is_empty() {
        return format!("no {kind} devices are defined");
    }
    let mut out = format!("known {kind} devices: ");
    out.push_str(
        &known
            .iter()
            .take(MAX_LISTED)
            .cloned()
            .collect::<Vec<_>>()
            .join(", "),
    );
    if known.len() > MAX_LISTED {
        out.push_str(", …");
    }
    out
}

fn unreadable_list(unreadable: &[(PathBuf, String)]) -> String {
    if unreadable.is_empty() {
        return String::new();
    }
    let mut out = format!(
        "; and {} spec file(s) could not be read: ",
        unreadable.len()
    );
    for (i, (path, message)) in unreadable.iter().enumerate() {
        let sep = if i == 0 { "" } else { "; " };
        let _ = write!(out, "{sep}{}: {message}", path.display());
    }
    out
}

/// Every spec file of the spec directories and the devices they define.
#[derive(Debug, Clone, Default)]
pub struct Registry {
    /// Each spec that loaded, with its file, in load order.
    specs: Vec<(PathBuf, Spec)>,
    devices: BTreeMap<QualifiedName, Entry>,
    /// Devices defined by two files of one directory: the first two such files.
    conflicts: BTreeMap<QualifiedName, (PathBuf, PathBuf)>,
    errors: Vec<(PathBuf, String)>,
}

/// Where a device is defined.
#[derive(Debug, Clone, Copy)]
struct Entry {
    /// Index into `Registry::specs`.
    spec: usize,
    /// Index into that spec's `devices`.
    device: usize,
    /// Index of the directory: a higher one wins.
    priority: usize,
}

impl Registry {
    /// Reads the `*.json`, `*.yaml` and `*.yml` files directly in each of `dirs` (in
    /// file-name order; symlinks are followed, as the directories are the host's
    /// own configuration). A later directory has priority over an earlier one.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut registry = Registry::default();
        for (priority, dir) in dirs.iter().enumerate() {
            for path in registry.spec_files(dir) {
                match read_spec(&path) {
                    Ok(spec) => registry.add(path, spec, priority),
                    Err(message) => registry.errors.push((path, message)),
                }
            }
        }
        registry
    }

    /// The spec files in `dir`, sorted; records a directory it cannot list.
    fn spec_files(&mut self, dir: &Path) -> Vec<PathBuf> {
        let entries = match fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::debug!(dir = %dir.display(), "no CDI spec directory");
                return Vec::new();
            }
            Err(e) => {
                self.errors
                    .push((dir.to_path_buf(), format!("cannot list directory: {e}")));
                return Vec::new();
            }
        };
        let mut paths = Vec::new();
        for entry in entries {
            match entry {
                Ok(entry) => paths.push(entry.path()),
                Err(e) => self
                    .errors
                    .push((dir.to_path_buf(), format!("cannot list directory: {e}"))),
            }
        }
        paths.retain(|p| {
            matches!(
                p.extension().and_then(|e| e.to_str()),
                Some("json" | "yaml" | "yml")
            )
        });
        // The CDI library skips subdirectories; so do we, whatever they are called.
        paths.retain(|p| !p.is_dir());
        paths.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
        paths
    }

    fn add(&mut self, path: PathBuf, spec: Spec, priority: usize) {
        // `parse` validated the kind and the names; a failure here is a bug, but one
        // that should cost this file, not the load.
        let (vendor, class) = match name::parse_kind(&spec.kind) {
            Ok(parts) => parts,
            Err(e) => {
                self.errors.push((path, e.to_string()));
                return;
            }
        };
        let index = self.specs.len();
        for (device, def) in spec.devices.iter().enumerate() {
            let qualified = match QualifiedName::new(&vendor, &class, &def.name) {
                Ok(qualified) => qualified,
                Err(e) => {
                    self.errors.push((path.clone(), e.to_string()));
                    continue;
                }
            };
            if let Some(old) = self.devices.get(&qualified).copied() {
                let old_path = &self.specs[old.spec].0;
                if old.priority == priority {
                    self.conflicts
                        .entry(qualified)
                        .or_insert_with(|| (old_path.clone(), path.clone()));
                    continue;
                }
                tracing::debug!(
                    device = %qualified,
                    shadowed = %old_path.display(),
                    by = %path.display(),
                    "CDI device overridden by a later spec directory"
                );
                self.conflicts.remove(&qualified);
            }
            let entry = Entry {
                spec: index,
                device,
                priority,
            };
            self.devices.insert(qualified, entry);
        }
        self.specs.push((path, spec));
    }

    /// Every defined device, sorted (by kind, then name). A device in conflict is
    /// listed: it is defined, but [`resolve`](Self::resolve) refuses it.
    pub fn devices(&self) -> Vec<QualifiedName> {
        self.devices.keys().cloned().collect()
    }

    /// Files (or directories) that could not be read or parsed, with the reason.
    pub fn errors(&self) -> &[(PathBuf, String)] {
        &self.errors
    }

    /// Every spec that loaded, with its file, in load order (lowest priority first).
    pub fn specs(&self) -> impl Iterator<Item = (&Path, &Spec)> {
        self.specs.iter().map(|(path, spec)| (path.as_path(), spec))
    }

    /// Whether some loaded spec has this `vendor/class` kind.
    pub fn has_kind(&self, kind: &str) -> bool {
        self.specs.iter().any(|(_, spec)| spec.kind == kind)
    }

    /// Whether `name` is defined (possibly in conflict).
    pub fn contains(&self, name: &QualifiedName) -> bool {
        self.devices.contains_key(name)
    }

    /// The edits `names` resolve to, combined as the CDI library combines them: for
    /// each device in order, its spec's spec-level edits the first time that spec is
    /// used, then the device's own edits. A name given twice is applied once.
    pub fn resolve(&self, names: &[QualifiedName]) -> Result<ContainerEdits, RegistryError> {
        let mut edits = ContainerEdits::default();
        let mut used_specs = Vec::new();
        let mut seen = HashSet::new();
        for name in names {
            if !seen.insert(name) {
                continue;
            }
            if let Some((first, second)) = self.conflicts.get(name) {
                return Err(RegistryError::Conflict {
                    name: name.clone(),
                    first: first.clone(),
                    second: second.clone(),
                });
            }
            let Some(entry) = self.devices.get(name) else {
                return Err(self.unknown(name));
            };
            let spec = &self.specs[entry.spec].1;
            if !used_specs.contains(&entry.spec) {
                used_specs.push(entry.spec);
                edits.merge(&spec.container_edits);
            }
            edits.merge(&spec.devices[entry.device].container_edits);
        }
        Ok(edits)
    }

    fn unknown(&self, name: &QualifiedName) -> RegistryError {
        let known = self
            .devices
            .keys()
            .filter(|k| k.vendor() == name.vendor() && k.class() == name.class())
            .map(|k| k.name().to_owned())
            .collect();
        RegistryError::UnknownDevice {
            name: name.clone(),
            known,
            unreadable: self.errors.clone(),
        }
    }
}

/// Reads and parses one spec file; the error is a message without the path, which
/// the caller pairs with it.
fn read_spec(path: &Path) -> Result<Spec, String> {
    let file = fs::File::open(path).map_err(|e| format!("cannot open: {e}"))?;
    let meta = file.metadata().map_err(|e| format!("cannot stat: {e}"))?;
    if !meta.is_file() {
        return Err("not a regular file".to_owned());
    }
    let mut bytes = Vec::new();
    // One byte past the limit, so `parse` sees the file is too large without our
    // reading all of it.
    let limit = u64::try_from(MAX_SPEC_SIZE).map_or(u64::MAX, |n| n.saturating_add(1));
    file.take(limit)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("cannot read: {e}"))?;
    spec::parse(&bytes, path).map_err(|e| without_path(&e))
}

/// A parse error's message without the file name, which `errors()` pairs with it.
fn without_path(err: &SpecError) -> String {
    match err {
        SpecError::TooLarge { .. } => format!("over the {MAX_SPEC_SIZE}-byte limit"),
        SpecError::Json { source, .. } => format!("invalid JSON: {source}"),
        SpecError::Yaml { source, .. } => format!("invalid YAML: {source}"),
        SpecError::Invalid { source, .. } => format!("invalid CDI spec: {source}"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::path::{Path, PathBuf};

    use tempfile::TempDir;

    use super::*;

    type TestResult = Result<(), Box<dyn std::error::Error>>;

    /// A JSON spec of kind `kind` whose devices each set `DEV=<name>@<tag>`, and whose
    /// spec-level edits set `SPEC=<tag>` and add a hook.
    fn json_spec(kind: &str, names: &[&str], tag: &str) -> String {
        let devices: Vec<String> = names
            .iter()
            .map(|n| {
                format!(
                    r#"{{"name":"{n}","containerEdits":{{"env":["DEV={n}@{tag}"],"deviceNodes":[{{"path":"/dev/{n}"}}]}}}}"#
                )
            })
            .collect();
        format!(
            r#"{{"cdiVersion":"0.5.0","kind":"{kind}","devices":[{}],"containerEdits":{{"env":["SPEC={tag}"],"hooks":[{{"hookName":"createContainer","path":"/usr/bin/nvshim","args":["nvshim","{tag}"]}}]}}}}"#,
            devices.join(",")
        )
    }

    fn write(dir: &Path, file: &str, text: &str) -> std::io::Result<PathBuf> {
        let path = dir.join(file);
        fs::write(&path, text)?;
        Ok(path)
    }

    fn qn(s: &str) -> QualifiedName {
        s.parse()
            .unwrap_or_else(|e| panic!("bad name in test: {e}"))
    }

    fn env_of(edits: &ContainerEdits, key: &str) -> Option<String> {
        edits
            .env
            .iter()
            .find_map(|v| v.strip_prefix(&format!("{key}=")).map(str::to_owned))
    }

    #[test]
    fn later_directories_override_earlier_ones() -> TestResult {
        let etc = TempDir::new()?;
        let run = TempDir::new()?;
        write(
            etc.path(),
            "nvidia.json",
            &json_spec("nvidia.com/gpu", &["0", "1"], "etc"),
        )?;
        write(
            run.path(),
            "nvidia.json",
            &json_spec("nvidia.com/gpu", &["0"], "run"),
        )?;
        let registry = Registry::load(&[etc.path().into(), run.path().into()]);
        assert!(registry.errors().is_empty(), "{:?}", registry.errors());
        assert_eq!(
            registry.devices(),
            [qn("nvidia.com/gpu=0"), qn("nvidia.com/gpu=1")]
        );

        let edits = registry.resolve(&[qn("nvidia.com/gpu=0")])?;
        assert_eq!(env_of(&edits, "DEV").as_deref(), Some("0@run"));
        assert_eq!(env_of(&edits, "SPEC").as_deref(), Some("run"));

        let edits = registry.resolve(&[qn("nvidia.com/gpu=1")])?;
        assert_eq!(env_of(&edits, "DEV").as_deref(), Some("1@etc"));
        assert_eq!(env_of(&edits, "SPEC").as_deref(), Some("etc"));
        Ok(())
    }

    #[test]
    fn a_device_defined_twice_in_one_directory_is_a_conflict() -> TestResult {
        let etc = TempDir::new()?;
        let a = write(
            etc.path(),
            "a.json",
            &json_spec("example.com/x", &["0", "1"], "a"),
        )?;
        let b = write(
            etc.path(),
            "b.yaml",
            &json_spec("example.com/x", &["0"], "b"),
        )?;
        let registry = Registry::load(&[etc.path().into()]);
        assert!(registry.contains(&qn("example.com/x=0")));

        let err = registry
            .resolve(&[qn("example.com/x=0")])
            .map_err(|e| e.to_string());
        let want = format!(
            "CDI device \"example.com/x=0\" is defined in both {} and {}",
            a.display(),
            b.display()
        );
        assert!(matches!(&err, Err(e) if e.starts_with(&want)), "{err:?}");
        // The other device of the file is unaffected.
        assert!(registry.resolve(&[qn("example.com/x=1")]).is_ok());

        // A later directory settles the conflict.
        let run = TempDir::new()?;
        write(
            run.path(),
            "c.json",
            &json_spec("example.com/x", &["0"], "c"),
        )?;
        let registry = Registry::load(&[etc.path().into(), run.path().into()]);
        let edits = registry.resolve(&[qn("example.com/x=0")])?;
        assert_eq!(env_of(&edits, "DEV").as_deref(), Some("0@c"));
        Ok(())
    }

    #[test]
    fn bad_files_are_recorded_and_the_rest_still_load() -> TestResult {
        let etc = TempDir::new()?;
        let bad = write(etc.path(), "bad.json", "{")?;
        let invalid = write(
            etc.path(),
            "invalid.yaml",
            "cdiVersion: 0.3.0\nkind: example.com/x\ndevices: []\n",
        )?;
        write(
            etc.path(),
            "good.yml",
            "cdiVersion: 0.5.0\nkind: example.com/y\ndevices:\n- name: \"0\"\n  containerEdits:\n    env: [\"A=1\"]\n",
        )?;
        write(etc.path(), "notes.txt", "not a spec")?;
        fs::create_dir(etc.path().join("sub.json"))?;
        let registry = Registry::load(&[etc.path().into(), etc.path().join("missing")]);

        let errors = registry.errors();
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert_eq!(errors[0].0, bad);
        assert!(errors[0].1.starts_with("invalid JSON: "), "{errors:?}");
        assert_eq!(errors[1].0, invalid);
        assert_eq!(errors[1].1, "invalid CDI spec: spec has no devices");
        assert_eq!(registry.devices(), [qn("example.com/y=0")]);
        assert!(registry.has_kind("example.com/y"));
        assert!(!registry.has_kind("example.com/x"));
        assert_eq!(registry.specs().count(), 1);
        let edits = registry.resolve(&[qn("example.com/y=0")])?;
        assert_eq!(edits.env, ["A=1"]);
        Ok(())
    }

    #[test]
    fn symlinked_spec_files_are_followed() -> TestResult {
        let store = TempDir::new()?;
        let etc = TempDir::new()?;
        let target = write(
            store.path(),
            "real.json",
            &json_spec("example.com/x", &["a"], "t"),
        )?;
        std::os::unix::fs::symlink(&target, etc.path().join("link.json"))?;
        let registry = Registry::load(&[etc.path().into()]);
        assert_eq!(registry.devices(), [qn("example.com/x=a")]);
        Ok(())
    }

    #[test]
    fn spec_edits_are_applied_once_before_the_first_device_of_the_spec() -> TestResult {
        let etc = TempDir::new()?;
        write(
            etc.path(),
            "gpu.json",
            &json_spec("nvidia.com/gpu", &["0", "1"], "s"),
        )?;
        let registry = Registry::load(&[etc.path().into()]);
        let names = [
            qn("nvidia.com/gpu=0"),
            qn("nvidia.com/gpu=1"),
            qn("nvidia.com/gpu=0"),
        ];
        let edits = registry.resolve(&names)?;
        // Device 1 came last, so its DEV wins; device 0, asked for twice, is not re-applied.
        assert_eq!(edits.env, ["SPEC=s", "DEV=1@s"]);
        assert_eq!(edits.hooks.len(), 1);
        let paths: Vec<&str> = edits.device_nodes.iter().map(|n| n.path.as_str()).collect();
        assert_eq!(paths, ["/dev/0", "/dev/1"]);

        // A device's own edits override its spec's: spec edits come first.
        let text = r#"{"cdiVersion":"0.5.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"env":["X=device"]}}],"containerEdits":{"env":["X=spec"]}}"#;
        write(etc.path(), "override.json", text)?;
        let registry = Registry::load(&[etc.path().into()]);
        let edits = registry.resolve(&[qn("a.com/b=d")])?;
        assert_eq!(edits.env, ["X=device"]);
        Ok(())
    }

    #[test]
    fn unknown_devices_list_the_known_ones_and_unreadable_files() -> TestResult {
        let etc = TempDir::new()?;
        write(
            etc.path(),
            "gpu.json",
            &json_spec("nvidia.com/gpu", &["0", "1", "all"], "s"),
        )?;
        write(
            etc.path(),
            "other.json",
            &json_spec("example.com/x", &["z"], "s"),
        )?;
        let bad = write(etc.path(), "zz.yaml", "kind: [")?;
        let registry = Registry::load(&[etc.path().into()]);

        let err = registry.resolve(&[qn("nvidia.com/gpu=0"), qn("nvidia.com/gpu=7")]);
        let message = err.map_err(|e| e.to_string()).err().unwrap_or_default();
        let want = format!(
            "unknown CDI device \"nvidia.com/gpu=7\" (known nvidia.com/gpu devices: 0, 1, all); \
             and 1 spec file(s) could not be read: {}: invalid YAML: ",
            bad.display()
        );
        assert!(
            message.starts_with(&want),
            "{message:?}\nwant prefix {want:?}"
        );

        let message = registry
            .resolve(&[qn("amd.com/gpu=0")])
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert!(
            message.starts_with(
                "unknown CDI device \"amd.com/gpu=0\" (no amd.com/gpu devices are defined)"
            ),
            "{message:?}"
        );
        Ok(())
    }

    #[test]
    fn long_lists_of_known_devices_are_cut_short() -> TestResult {
        let etc = TempDir::new()?;
        let names: Vec<String> = (0..30).map(|i| format!("d{i:02}")).collect();
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        write(
            etc.path(),
            "many.json",
            &json_spec("example.com/x", &refs, "s"),
        )?;
        let registry = Registry::load(&[etc.path().into()]);
        let message = registry
            .resolve(&[qn("example.com/x=nope")])
            .map_err(|e| e.to_string())
            .err()
            .unwrap_or_default();
        assert!(message.contains("d19, …)"), "{message:?}");
        assert!(!message.contains("d20"), "{message:?}");
        Ok(())
    }

    #[test]
    fn no_directories_means_no_devices() -> TestResult {
        let registry = Registry::load(&[]);
        assert!(registry.devices().is_empty());
        assert!(registry.errors().is_empty());
        assert!(registry.resolve(&[])?.is_empty());
        Ok(())
    }
}

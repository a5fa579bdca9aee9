//! The files `graphics` and `display` bring beyond the capability table, as NVIDIA's
//! graphics modifier adds them when either capability is asked for: the loader
//! configs (Vulkan ICD and layers, GLVND's EGL vendor file, the EGL external platform
//! JSONs, Xorg snippets) wherever the driver installed them, the EGL platform
//! libraries (versioned apart from the driver), GBM's backend link to the allocator,
//! Vulkan's producer, Xorg's driver and GLX modules, `nvidia-xconfig`; and for
//! `display` the driver's default application profiles.
//!
//! Configs keep NVIDIA's container paths whatever the host's: the Vulkan files go to
//! `/etc/vulkan/…`, the others to `/usr/share/…`, so a loader in any image finds them.
//! Nothing here runs unless the request has `graphics` or `display`.

use std::io;
use std::path::{Path, PathBuf};

use super::resolve::Resolver;
use super::table::{
    APPLICATION_PROFILES, CONFIG_DIRS, EGL_PLATFORM_LIBRARIES, GBM_BACKEND, GBM_BACKEND_TARGET,
    GRAPHICS_BINARIES, GRAPHICS_LIBRARIES, GRAPHICS_SHARE_CONFIGS, VULKAN_ARCH_ICD, VULKAN_CONFIGS,
    XORG_DIRS, XORG_LIB_SUBDIRS, XORG_MODULES,
};
use super::{
    DiscoverError, FileKind, HostFile, HostResources, Missing, SymlinkEdit, Want, binary,
    cache_entry, io_err, is_stem_key, library, push_file, symlink_edit,
};
use crate::ldcache::{Class, LdCache};
use crate::request::{Capability, DriverCapabilities};

/// Whether `caps` asks for any of this (NVIDIA: `graphics` or `display`).
pub(super) fn wanted(caps: DriverCapabilities) -> bool {
    caps.contains(Capability::Graphics) || caps.contains(Capability::Display)
}

pub(super) fn files(
    want: Want<'_>,
    cache: Option<&LdCache>,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let caps = want.capabilities;
    let cap = if caps.contains(Capability::Graphics) {
        Capability::Graphics
    } else {
        Capability::Display
    };
    let version = want.driver_version;
    for stem in GRAPHICS_LIBRARIES {
        library(stem, Class::Lib64, cap, version, cache, resolver, out)?;
    }
    for stem in EGL_PLATFORM_LIBRARIES {
        platform_library(stem, cap, cache, resolver, out)?;
    }
    for name in GRAPHICS_BINARIES {
        binary(name, cap, resolver, out)?;
    }
    for name in GRAPHICS_SHARE_CONFIGS {
        config(name, CONFIG_DIRS, "/usr/share", cap, resolver, out)?;
    }
    // Vulkan's: the config dirs, then the driver root itself.
    let vulkan_dirs: Vec<&str> = CONFIG_DIRS.iter().copied().chain(["/"]).collect();
    for name in VULKAN_CONFIGS.iter().chain([&VULKAN_ARCH_ICD]) {
        config(name, &vulkan_dirs, "/etc", cap, resolver, out)?;
    }
    library_links(version, out);
    xorg(version, cap, resolver, out)?;
    if caps.contains(Capability::Display) {
        for path in APPLICATION_PROFILES {
            let path = path.replace("{version}", version);
            super::optional_file(&path, FileKind::Config, Capability::Display, resolver, out)?;
        }
    }
    Ok(())
}

/// The first of `dirs` (under the driver root) that has `name`, mounted at
/// `<container_dir>/<name>`; a note in `missing` when none has it.
fn config(
    name: &str,
    dirs: &[&str],
    container_dir: &str,
    cap: Capability,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let path = Path::new(container_dir).join(name);
    for dir in dirs {
        let candidate = Path::new(dir).join(name);
        let Some(real) = resolver.resolve(&candidate).map_err(io_err(&candidate))? else {
            continue;
        };
        if !real.metadata.is_file() {
            continue;
        }
        if !out.files.iter().any(|f| f.path == path) {
            out.files.push(HostFile {
                kind: FileKind::Config,
                host_path: resolver.host(&real.path),
                path,
                links: Vec::new(),
                ldcache: None,
            });
        }
        return Ok(());
    }
    out.missing.push(Missing {
        what: path.display().to_string(),
        needed_for: cap.name().to_string(),
        required: false,
        detail: Some(format!("not in {} under the driver root", dirs.join(", "))),
    });
    Ok(())
}

/// An EGL platform library `<stem>.so.<X>.<Y>…`: through the cache's entries for
/// `stem` (its soname `<stem>.so.1`), or without a cache through the soname link in
/// the usual library directories.
fn platform_library(
    stem: &str,
    cap: Capability,
    cache: Option<&LdCache>,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let candidates: Vec<(PathBuf, Option<&crate::ldcache::Entry>)> = match cache {
        Some(cache) => cache
            .entries
            .iter()
            .filter(|e| e.class() == Class::Lib64 && is_stem_key(&e.key, stem))
            .map(|e| (PathBuf::from(&e.value), Some(e)))
            .collect(),
        None => super::arch::library_dirs(crate::ldcache::Arch::NATIVE, Class::Lib64)
            .iter()
            .map(|d| (Path::new(d).join(format!("{stem}.so.1")), None))
            .collect(),
    };
    for (candidate, entry) in candidates {
        let Some(real) = resolver.resolve(&candidate).map_err(io_err(&candidate))? else {
            continue;
        };
        let name = real.path.file_name().and_then(|n| n.to_str());
        if !name.is_some_and(|n| is_platform_file(n, stem)) || !real.metadata.is_file() {
            continue;
        }
        let links: Vec<SymlinkEdit> = real.links.iter().map(symlink_edit).collect();
        let entry = cache_entry(entry, Class::Lib64, &real.path, &links);
        let before = out.files.len();
        push_file(out, FileKind::Library, real.path, resolver, links);
        if out.files.len() > before
            && let Some(file) = out.files.last_mut()
        {
            file.ldcache = entry;
        }
        return Ok(());
    }
    out.missing.push(Missing {
        what: stem.to_string(),
        needed_for: cap.name().to_string(),
        required: false,
        detail: None,
    });
    Ok(())
}

/// `libnvidia-egl-gbm.so.1.1.2` for stem `libnvidia-egl-gbm`: at least two numeric
/// components after `.so.` (the soname link `.so.1` is not the file).
pub(super) fn is_platform_file(name: &str, stem: &str) -> bool {
    let Some(version) = name
        .strip_prefix(stem)
        .and_then(|rest| rest.strip_prefix(".so."))
    else {
        return false;
    };
    let parts: Vec<&str> = version.split('.').collect();
    parts.len() >= 2
        && parts
            .iter()
            .all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
}

/// The links NVIDIA's graphics modifier creates next to the driver's libraries:
/// `gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1` and
/// `libnvidia-vulkan-producer.so -> libnvidia-vulkan-producer.so.<version>`.
fn library_links(version: &str, out: &mut HostResources) {
    let allocator = format!("libnvidia-allocator.so.{version}");
    let producer = format!("libnvidia-vulkan-producer.so.{version}");
    for file in out.files.iter_mut().filter(|f| f.kind == FileKind::Library) {
        let (Some(dir), Some(name)) = (file.path.parent(), file.path.file_name()) else {
            continue;
        };
        let link = if name == allocator.as_str() {
            SymlinkEdit {
                path: dir.join(GBM_BACKEND),
                target: GBM_BACKEND_TARGET.to_owned(),
            }
        } else if name == producer.as_str() {
            SymlinkEdit {
                path: dir.join("libnvidia-vulkan-producer.so"),
                target: producer.clone(),
            }
        } else {
            continue;
        };
        if !file.links.iter().any(|l| l.path == link.path) {
            file.links.push(link);
        }
    }
}

/// Xorg's modules: each from the first directory that has it, the driver's library
/// directory's Xorg subdirectories first; `libglxserver_nvidia.so` links to the GLX
/// module, as NVIDIA's hook makes it.
fn xorg(
    version: &str,
    cap: Capability,
    resolver: &mut Resolver<'_>,
    out: &mut HostResources,
) -> Result<(), DiscoverError> {
    let suffix = format!(".so.{version}");
    let lib_dir = out
        .files
        .iter()
        .find(|f| {
            f.kind == FileKind::Library
                && f.path
                    .file_name()
                    .and_then(|n| n.to_str())
                    .is_some_and(|n| n.ends_with(&suffix))
        })
        .and_then(|f| f.path.parent().map(Path::to_path_buf));
    let dirs: Vec<PathBuf> = lib_dir
        .iter()
        .flat_map(|d| XORG_LIB_SUBDIRS.iter().map(move |s| d.join(s)))
        .chain(XORG_DIRS.iter().map(PathBuf::from))
        .collect();
    for module in XORG_MODULES {
        let name = module.replace("{version}", version);
        let mut found = false;
        for dir in &dirs {
            let candidate = dir.join(&name);
            let real = match resolver.resolve(&candidate) {
                Ok(Some(real)) if real.metadata.is_file() => real,
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => continue,
                Err(e) => return Err(io_err(&candidate)(e)),
            };
            let mut links: Vec<SymlinkEdit> = Vec::new();
            if let Some(base) = name.strip_suffix(&format!(".{version}"))
                && base.ends_with(".so")
                && let Some(parent) = real.path.parent()
            {
                links.push(SymlinkEdit {
                    path: parent.join(base),
                    target: name.clone(),
                });
            }
            push_file(out, FileKind::Library, real.path, resolver, links);
            found = true;
            break;
        }
        if !found {
            out.missing.push(Missing {
                what: name,
                needed_for: cap.name().to_string(),
                required: false,
                detail: Some("no Xorg module directory has it".into()),
            });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::fs;
    use std::os::unix::fs::symlink;

    use super::*;
    use crate::select::Selection;

    const V: &str = "550.54.15";

    fn touch(root: &Path, path: &str) {
        let path = root.join(path.trim_start_matches('/'));
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, b"x").unwrap();
    }

    fn run(root: &Path, caps: DriverCapabilities) -> HostResources {
        let selection = Selection::default();
        let classes = crate::request::DeviceClasses::default();
        let want = Want {
            driver_version: V,
            capabilities: caps,
            selection: &selection,
            classes: &classes,
        };
        let mut resolver = Resolver::new(root);
        let mut out = HostResources::default();
        files(want, None, &mut resolver, &mut out).unwrap();
        out
    }

    fn mounted(out: &HostResources) -> Vec<(String, String)> {
        out.files
            .iter()
            .map(|f| {
                (
                    f.path.display().to_string(),
                    f.host_path.display().to_string(),
                )
            })
            .collect()
    }

    /// A driver root with its configs split between `/usr/share` and `/etc`, no
    /// `ld.so.cache`: every file is found, at NVIDIA's container paths.
    #[test]
    fn graphics_files_are_found_where_the_driver_put_them() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        // Without a cache, this build's multiarch directory is searched (not another's).
        let tuple = crate::ldcache::Arch::NATIVE.map_or("x86_64-linux-gnu", |a| a.multiarch());
        let lib = format!("/usr/lib/{tuple}");
        let lib = lib.as_str();
        touch(root, "/usr/share/vulkan/icd.d/nvidia_icd.json");
        touch(root, "/etc/vulkan/implicit_layer.d/nvidia_layers.json");
        touch(root, "/usr/share/glvnd/egl_vendor.d/10_nvidia.json");
        touch(
            root,
            "/usr/local/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
        );
        touch(
            root,
            "/usr/share/egl/egl_external_platform.d/15_nvidia_gbm.json",
        );
        touch(root, &format!("{lib}/libnvidia-egl-gbm.so.1.1.2"));
        symlink(
            "libnvidia-egl-gbm.so.1.1.2",
            root.join(&lib[1..]).join("libnvidia-egl-gbm.so.1"),
        )
        .unwrap();
        touch(root, &format!("{lib}/libnvidia-allocator.so.{V}"));
        symlink(
            format!("libnvidia-allocator.so.{V}"),
            root.join(&lib[1..]).join("libnvidia-allocator.so.1"),
        )
        .unwrap();
        touch(root, &format!("{lib}/nvidia/xorg/nvidia_drv.so"));
        touch(
            root,
            &format!("/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so.{V}"),
        );
        touch(
            root,
            &format!("/usr/share/nvidia/nvidia-application-profiles-{V}-rc"),
        );

        let graphics = DriverCapabilities::EMPTY.with(Capability::Graphics);
        let out = run(root, graphics);
        let got = mounted(&out);
        let host = |p: &str| format!("{}{p}", root.display());
        for (path, from) in [
            (
                "/etc/vulkan/icd.d/nvidia_icd.json",
                "/usr/share/vulkan/icd.d/nvidia_icd.json",
            ),
            (
                "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
                "/etc/vulkan/implicit_layer.d/nvidia_layers.json",
            ),
            (
                "/usr/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
                "/usr/local/share/egl/egl_external_platform.d/20_nvidia_xcb.json",
            ),
            (
                &format!("{lib}/libnvidia-egl-gbm.so.1.1.2"),
                &format!("{lib}/libnvidia-egl-gbm.so.1.1.2"),
            ),
            (
                &format!("{lib}/nvidia/xorg/nvidia_drv.so"),
                &format!("{lib}/nvidia/xorg/nvidia_drv.so"),
            ),
        ] {
            assert!(
                got.contains(&(path.to_owned(), host(from))),
                "{path} from {from}: {got:#?}"
            );
        }
        let links: Vec<String> = out
            .files
            .iter()
            .flat_map(|f| &f.links)
            .map(|l| format!("{} -> {}", l.path.display(), l.target))
            .collect();
        for want in [
            format!("{lib}/gbm/nvidia-drm_gbm.so -> ../libnvidia-allocator.so.1"),
            format!("{lib}/libnvidia-egl-gbm.so.1 -> libnvidia-egl-gbm.so.1.1.2"),
            "/usr/lib/xorg/modules/extensions/libglxserver_nvidia.so -> libglxserver_nvidia.so.550.54.15"
                .to_owned(),
        ] {
            assert!(links.contains(&want), "{want}: {links:#?}");
        }
        let gbm = out
            .files
            .iter()
            .find(|f| f.path.ends_with("libnvidia-egl-gbm.so.1.1.2"))
            .unwrap();
        assert_eq!(
            gbm.ldcache.as_ref().map(|e| e.key.as_str()),
            Some("libnvidia-egl-gbm.so.1"),
            "the container's linker finds the platform library by its soname"
        );
        assert!(
            !got.iter().any(|(p, _)| p.contains("application-profiles")),
            "the profiles are display's"
        );
        assert!(
            out.missing
                .iter()
                .any(|m| m.what == "libnvidia-egl-xlib" && !m.required),
            "absent platforms are noted, never required"
        );

        let display = DriverCapabilities::EMPTY.with(Capability::Display);
        let got = mounted(&run(root, display));
        let profile = format!("/usr/share/nvidia/nvidia-application-profiles-{V}-rc");
        assert!(got.contains(&(profile.clone(), host(&profile))), "{got:#?}");
        assert!(
            got.iter()
                .any(|(p, _)| p == "/etc/vulkan/icd.d/nvidia_icd.json")
        );
    }

    #[test]
    fn platform_files_carry_their_own_versions() {
        let cases = [
            ("libnvidia-egl-gbm.so.1.1.2", "libnvidia-egl-gbm", true),
            (
                "libnvidia-egl-wayland.so.1.1.17",
                "libnvidia-egl-wayland",
                true,
            ),
            ("libnvidia-egl-xcb.so.1.0", "libnvidia-egl-xcb", true),
            ("libnvidia-egl-gbm.so.1", "libnvidia-egl-gbm", false),
            ("libnvidia-egl-gbm.so", "libnvidia-egl-gbm", false),
            (
                "libnvidia-egl-wayland2.so.1.0.0",
                "libnvidia-egl-wayland",
                false,
            ),
            ("libnvidia-egl-gbm.so.1..2", "libnvidia-egl-gbm", false),
            ("libnvidia-egl-gbm.so.1.x", "libnvidia-egl-gbm", false),
        ];
        for (name, stem, want) in cases {
            assert_eq!(is_platform_file(name, stem), want, "case {name} / {stem}");
        }
    }

    #[test]
    fn either_graphics_capability_wants_the_files() {
        let none = DriverCapabilities::EMPTY;
        assert!(!wanted(
            none.with(Capability::Compute).with(Capability::Utility)
        ));
        assert!(wanted(none.with(Capability::Graphics)));
        assert!(wanted(none.with(Capability::Display)));
    }
}

//! The OCI hook file (`hooks.d/oci-nvidia-hook.json`) that podman and CRI-O read to run the
//! NVIDIA prestart hook in every container: what `nvidia-ctk runtime configure
//! --config-mode=oci-hook` writes (NVIDIA calls this mode deprecated: the runtime or CDI is the
//! preferred way). Same fields as NVIDIA's: version 1.0.0, the `prestart` stage, `when.always`,
//! the hook's own name and `prestart` as its argv, and a `PATH` with the hook's directory.

use std::path::Path;

use serde_json::json;

/// The directories NVIDIA's hook file puts on `PATH` (the hook looks for
/// `nvidia-container-cli` there).
const PATH_DIRS: [&str; 6] = [
    "/usr/local/sbin",
    "/usr/local/bin",
    "/usr/sbin",
    "/usr/bin",
    "/sbin",
    "/bin",
];

/// NVIDIA's default hook path.
pub const DEFAULT_HOOK_PATH: &str = "/usr/bin/nvidia-container-runtime-hook";

/// The hook file for the hook binary at `hook_path` (absolute), as JSON with a final newline.
pub fn hook_json(hook_path: &str) -> String {
    let path = Path::new(hook_path);
    let mut dirs: Vec<String> = PATH_DIRS.iter().map(|d| (*d).to_owned()).collect();
    if let Some(dir) = path.parent().map(|d| d.display().to_string())
        && !dirs.contains(&dir)
    {
        dirs.push(dir);
    }
    let name = path.file_name().map_or_else(
        || hook_path.to_owned(),
        |n| n.to_string_lossy().into_owned(),
    );
    let hook = json!({
        "version": "1.0.0",
        "hook": {
            "path": hook_path,
            "args": [name, "prestart"],
            "env": [format!("PATH={}", dirs.join(":"))],
        },
        "when": {"always": true, "commands": [".*"]},
        "stages": ["prestart"],
    });
    // serde_json's pretty printer indents by two spaces, as NVIDIA's encoder does.
    let mut text = serde_json::to_string_pretty(&hook).unwrap_or_default();
    text.push('\n');
    text
}

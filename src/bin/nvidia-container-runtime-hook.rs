//! `nvidia-container-runtime-hook prestart|poststart|poststop`: the hook docker's
//! `--gpus` adds. Reads the OCI state on stdin; see `nvshim::hook`.

use std::io::Read;
use std::process::ExitCode;

use nvshim::{config, hook};

const NAME: &str = "nvidia-container-runtime-hook";

fn main() -> ExitCode {
    // NVIDIA's hook takes Go-style flags (-config, -debug) before the stage.
    let stage = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    match stage.as_deref() {
        Some("prestart") => {}
        Some("poststart" | "poststop") => return ExitCode::SUCCESS,
        Some(other) => {
            eprintln!("{NAME}: unknown stage {other:?} (valid: prestart, poststart, poststop)");
            return ExitCode::FAILURE;
        }
        None => {
            eprintln!(
                "{NAME}: usage: {NAME} prestart|poststart|poststop (reads the OCI state on stdin)"
            );
            return ExitCode::FAILURE;
        }
    }
    let mut state = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut state) {
        eprintln!("{NAME}: cannot read the OCI state from stdin: {e}");
        return ExitCode::FAILURE;
    }
    let result = config::load(|key| std::env::var(key).ok())
        .map_err(hook::HookError::from)
        .and_then(|loaded| hook::prestart(&state, &loaded.config));
    match result {
        Ok(_) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{NAME}: {e}");
            ExitCode::FAILURE
        }
    }
}

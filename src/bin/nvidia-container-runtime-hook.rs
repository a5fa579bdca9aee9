//! `nvidia-container-runtime-hook [-config FILE] [-debug] prestart|poststart|poststop`:
//! the OCI hook docker's `--gpus` and `hooks.d` add, and `… link-driver` for our CDI
//! specs. Reads the OCI state on stdin; see `nvshim::hook::entry`.
//!
//! Single-threaded on purpose: the hook `setns`es into the container's mount
//! namespace, which a multi-threaded process cannot do. Never writes to stdout.
//! Installed as a static binary, which never loads NVML: requests that need it go to
//! `nvshim runtime-hook`.

use std::process::ExitCode;

#[global_allocator]
static ALLOC: nvshim::bump::Bump = nvshim::bump::Bump::new();

use nvshim::hook::entry;
use nvshim::pipeline::NvmlAccess;

fn main() -> ExitCode {
    entry::main(std::env::args().skip(1).collect(), NvmlAccess::Elsewhere)
}

//! `nvidia-container-runtime`: a runc shim. On `create`/`run` it adds the requested
//! GPUs to the bundle's config.json; every command then goes to runc through `exec`.
//! This binary never loads NVML; requests that need it go to `nvshim runtime`.

use std::process::ExitCode;

#[global_allocator]
static ALLOC: nvshim::bump::Bump = nvshim::bump::Bump::new();

use nvshim::pipeline::NvmlAccess;
use nvshim::runtime::entry;

fn main() -> ExitCode {
    entry::main(std::env::args_os().skip(1).collect(), NvmlAccess::Elsewhere)
}

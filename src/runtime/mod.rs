//! The `nvidia-container-runtime` shim: read runc's argv, and for `create`/`run`
//! plan and inject the requested GPUs into the bundle's `config.json`; then `exec`
//! the low-level runtime with the same arguments.

pub mod args;
pub mod lowlevel;

//! NVML's side of preparing: where a request that needs it goes, and how long the
//! process that loads it waits for it.

use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::Duration;

use super::ContainerError;
use crate::hook_contract::NVSHIM_BINARY;
use crate::pipeline::{self, Context, Plan};
use crate::request::Request;

/// The admin binary that prepares requests needing NVML, next to the static runtime
/// and hook.
pub const NVML_HELPER: &str = NVSHIM_BINARY;
/// The runtime's hand-over: `nvshim runtime -- <runc argv>`.
pub const RUNTIME_HELPER_COMMAND: &str = "runtime";
/// The hook's hand-over: `nvshim runtime-hook -- <hook argv>`, the OCI state given
/// again on stdin.
pub const HOOK_HELPER_COMMAND: &str = "runtime-hook";

/// [`pipeline::plan`] on a helper thread, given at most `seconds` (0: no limit).
///
/// Only the runtime that loads NVML (`nvshim runtime`) plans this way: a driver that
/// hangs hangs every NVML call in it, and a runtime that never returns leaves the
/// engine's container start hanging with no error. On a timeout the thread is left
/// stuck in the driver and the process fails the `create` and exits, which ends it.
pub(super) fn plan_within(
    ctx: &Context,
    request: &Request,
    seconds: u64,
) -> Result<Plan, ContainerError> {
    if seconds == 0 {
        return Ok(pipeline::plan(ctx, request)?);
    }
    let (tx, rx) = mpsc::channel();
    let (ctx, request) = (ctx.clone(), request.clone());
    let worker = std::thread::Builder::new()
        .name("nvml".into())
        .spawn(move || {
            // The receiver is gone only after a timeout, when nobody wants the result.
            let _ = tx.send(pipeline::plan(&ctx, &request));
        })
        .map_err(ContainerError::Thread)?;
    match rx.recv_timeout(Duration::from_secs(seconds)) {
        Ok(planned) => {
            // Joined, so the process is single-threaded again before it execs runc.
            let _ = worker.join();
            Ok(planned?)
        }
        Err(RecvTimeoutError::Timeout) => Err(ContainerError::NvmlTimeout { seconds }),
        Err(RecvTimeoutError::Disconnected) => {
            // The worker ended without sending: it panicked. Carry the panic on.
            let panic = worker
                .join()
                .err()
                .unwrap_or_else(|| Box::new("the planning thread ended without a result"));
            std::panic::resume_unwind(panic)
        }
    }
}

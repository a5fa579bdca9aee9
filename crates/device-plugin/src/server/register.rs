//! Registration with kubelet: dial `kubelet.sock` and call `Register` once per
//! resource, retrying with a short backoff until every resource is registered.
//!
//! NVIDIA's plugin gives up after one 5 s attempt and retries everything 30 s later;
//! we retry quickly at first (100 ms, doubling, capped at 5 s) and can be woken early
//! when `kubelet.sock` appears, so a starting kubelet sees us within a second.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint, Uri};

use super::watch::FileId;
use crate::api::RegisterRequest;
use crate::api::registration_client::RegistrationClient;
use crate::metrics::Metrics;

/// First retry delay; doubled after each failure up to [`MAX_BACKOFF`].
pub(super) const FIRST_BACKOFF: Duration = Duration::from_millis(100);
/// Longest delay between two registration attempts.
pub(super) const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// How long one `Register` call may take before it counts as failed.
const CALL_TIMEOUT: Duration = Duration::from_secs(5);

/// Why one registration attempt failed (logged, then retried).
#[derive(Debug, thiserror::Error)]
pub(super) enum RegisterError {
    #[error("kubelet socket path {path:?} is not UTF-8")]
    PathNotUtf8 { path: PathBuf },
    #[error("cannot reach kubelet at {path:?}")]
    Connect {
        path: PathBuf,
        #[source]
        source: tonic::transport::Error,
    },
    #[error("kubelet refused to register {resource:?}: {status}")]
    Rejected {
        resource: String,
        status: tonic::Status,
    },
}

/// The delay after `failures` consecutive failures: 100 ms, 200 ms, 400 ms, … 5 s.
pub(super) fn backoff(failures: u32) -> Duration {
    let factor = 1u32.checked_shl(failures.min(16)).unwrap_or(u32::MAX);
    FIRST_BACKOFF.saturating_mul(factor).min(MAX_BACKOFF)
}

/// A gRPC channel over a Unix socket. The HTTP/2 `:authority` is `localhost`, as
/// kubelet's own client sends: h2 servers reject a socket path there.
pub(super) async fn dial(path: &Path) -> Result<Channel, RegisterError> {
    let text = path.to_str().ok_or_else(|| RegisterError::PathNotUtf8 {
        path: path.to_path_buf(),
    })?;
    let connect = |source| RegisterError::Connect {
        path: path.to_path_buf(),
        source,
    };
    Endpoint::from_shared(format!("unix:{text}"))
        .map_err(connect)?
        .origin(Uri::from_static("http://localhost"))
        .timeout(CALL_TIMEOUT)
        .connect()
        .await
        .map_err(connect)
}

/// Registers each request with kubelet, retrying failures with [`backoff`] (or at
/// once when `kick` is notified) until all are registered. Returns the identity of
/// `kubelet.sock` seen before the successful attempt: a different one later means
/// kubelet restarted and has forgotten us.
pub(super) async fn register_all(
    kubelet: &Path,
    requests: &[RegisterRequest],
    kick: Arc<Notify>,
    metrics: &Metrics,
) -> Option<FileId> {
    let mut failures = 0u32;
    let mut done = 0usize;
    loop {
        let seen = FileId::of(kubelet);
        match register_from(kubelet, &requests[done..], metrics).await {
            Ok(()) => return seen,
            Err((registered, error)) => {
                done += registered;
                if let Some(failed) = requests.get(done) {
                    metrics.registered(&failed.resource_name, false);
                }
                let delay = backoff(failures);
                failures = failures.saturating_add(1);
                tracing::warn!(
                    kubelet = %kubelet.display(),
                    error = %error,
                    cause = ?std::error::Error::source(&error).map(ToString::to_string),
                    retry_in_ms = delay.as_millis() as u64,
                    "registration with kubelet failed"
                );
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    () = kick.notified() => {}
                }
            }
        }
    }
}

/// One attempt: dial, then register the requests in order. On failure, says how
/// many were registered before it.
async fn register_from(
    kubelet: &Path,
    requests: &[RegisterRequest],
    metrics: &Metrics,
) -> Result<(), (usize, RegisterError)> {
    let channel = dial(kubelet).await.map_err(|e| (0, e))?;
    let mut client = RegistrationClient::new(channel);
    for (n, request) in requests.iter().enumerate() {
        // Before the call: kubelet opens ListAndWatch while it handles Register, so the
        // "registered" event below can come after the first ListAndWatch.
        tracing::debug!(
            resource = %request.resource_name,
            endpoint = %request.endpoint,
            "Register"
        );
        client.register(request.clone()).await.map_err(|status| {
            (
                n,
                RegisterError::Rejected {
                    resource: request.resource_name.clone(),
                    status,
                },
            )
        })?;
        metrics.registered(&request.resource_name, true);
        tracing::info!(
            resource = %request.resource_name,
            endpoint = %request.endpoint,
            "registered with kubelet"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn backoff_starts_fast_and_caps() {
        let ms: Vec<u128> = (0..8).map(|n| backoff(n).as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(backoff(u32::MAX), MAX_BACKOFF);
    }

    #[tokio::test(flavor = "current_thread")]
    async fn unreachable_kubelet_is_a_connect_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = dial(&dir.path().join("kubelet.sock")).await.err();
        assert!(
            matches!(err, Some(RegisterError::Connect { .. })),
            "{err:?}"
        );
    }
}

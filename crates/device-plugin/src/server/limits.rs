//! What one request may make the plugin allocate, and the refusals past it.
//!
//! Kubelet's requests are a few KiB: device ids it got from us, at most all of them.
//! Anything larger is a broken or hostile client, refused with `INVALID_ARGUMENT`
//! naming the limit before it costs us memory: the message size is checked on its
//! 5-byte gRPC prefix, before the message is buffered or decoded ([`Bounded`]); the
//! number and length of ids after decoding ([`Limits::check_ids`]). tonic's own size
//! check would answer `OUT_OF_RANGE`, and only after a 4 MiB default.

use std::convert::Infallible;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use http_body_util::{BodyExt, Full};
use tonic::Status;
use tonic::body::Body;
use tonic::codegen::{BoxFuture, Service, http};
use tonic::server::NamedService;

use crate::resources::Resource;

/// The smallest message limit, whatever the resource: far above what kubelet sends
/// for a node of 8 GPUs (about 400 bytes; 56 MIG devices: under 6 KiB), and small
/// enough that no message under it decodes into much: 10,000 one-character ids
/// (60 KB) would cost about 0.7 MiB of `String`s.
const MIN_MESSAGE: usize = 8 * 1024;
/// The gRPC message prefix: a compression flag and a 4-byte length.
const PREFIX: usize = 5;

/// One resource's limits, from the devices it advertises.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest request message, in bytes.
    pub message: usize,
    /// The most ids one list may hold: every device the resource has.
    pub ids: usize,
    /// The longest id: the longest one the resource has.
    pub id_len: usize,
}

impl Limits {
    pub fn for_resource(resource: &Resource) -> Self {
        let id_len = resource
            .devices
            .iter()
            .map(|d| d.id.len())
            .max()
            .unwrap_or(0);
        // A `GetPreferredAllocation` may list every id twice (available and
        // must-include), each with 3 bytes of protobuf framing.
        let listed: usize = resource.devices.iter().map(|d| d.id.len() + 3).sum();
        Self {
            message: MIN_MESSAGE.max(2 * listed + 4096),
            ids: resource.devices.len(),
            id_len,
        }
    }

    /// Refuses a list of ids longer than the resource's device list, or holding an id
    /// longer than any it has (those could never be valid).
    pub fn check_ids(&self, call: &str, resource: &str, ids: &[String]) -> Result<(), Status> {
        if ids.len() > self.ids {
            return Err(Status::invalid_argument(format!(
                "{call}: {} device ids for {resource}, more than the {} it has (the limit)",
                ids.len(),
                self.ids
            )));
        }
        if let Some(id) = ids.iter().find(|id| id.len() > self.id_len) {
            return Err(Status::invalid_argument(format!(
                "{call}: a device id of {} bytes for {resource}, whose ids are at most {} bytes \
                 (the limit)",
                id.len(),
                self.id_len
            )));
        }
        Ok(())
    }
}

/// A gRPC service whose request messages may be at most `limit` bytes. The request
/// body (one message: none of the device-plugin calls streams requests) is read
/// here, at most `limit` bytes of it, and handed on whole.
#[derive(Debug, Clone)]
pub struct Bounded<S> {
    inner: S,
    limit: usize,
}

impl<S> Bounded<S> {
    pub fn new(inner: S, limit: usize) -> Self {
        Self { inner, limit }
    }
}

impl<S: NamedService> NamedService for Bounded<S> {
    const NAME: &'static str = S::NAME;
}

impl<S> Service<http::Request<Body>> for Bounded<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        // The clone is not ready; the ready one serves this call (tower's rule).
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let limit = self.limit;
        Box::pin(async move {
            let (parts, body) = request.into_parts();
            match read_message(body, limit, parts.uri.path()).await {
                Ok(bytes) => {
                    let body = Body::new(Full::new(bytes));
                    inner.call(http::Request::from_parts(parts, body)).await
                }
                Err(status) => Ok(status.into_http()),
            }
        })
    }
}

/// Reads a request body's one gRPC message (and no more than arrived with it),
/// refusing it from its prefix when the message is larger than `limit`.
async fn read_message(mut body: Body, limit: usize, method: &str) -> Result<Bytes, Status> {
    let mut first: Option<Bytes> = None;
    let mut joined = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| Status::invalid_argument(format!("{method}: {e}")))?;
        let Ok(data) = frame.into_data() else {
            continue;
        };
        match first.take() {
            None if joined.is_empty() => first = Some(data),
            held => {
                if let Some(held) = held {
                    joined.extend_from_slice(&held);
                }
                joined.extend_from_slice(&data);
            }
        }
        let seen: &[u8] = first.as_deref().unwrap_or(&joined);
        if seen.len() >= PREFIX {
            let mut prefix = &seen[1..PREFIX];
            let len = prefix.get_u32() as usize;
            if len > limit {
                return Err(too_large(method, len, limit));
            }
            if seen.len() > limit + PREFIX {
                // More than the prefix said, and more than we take.
                return Err(too_large(method, seen.len() - PREFIX, limit));
            }
            if seen.len() >= PREFIX + len {
                // The one message is here: hand it on without waiting for the
                // client to half-close (a client may keep its side of a
                // `ListAndWatch` open).
                break;
            }
        }
    }
    Ok(first.unwrap_or_else(|| joined.freeze()))
}

fn too_large(method: &str, len: usize, limit: usize) -> Status {
    tracing::warn!(method, bytes = len, limit, "request refused: too large");
    Status::invalid_argument(format!(
        "{method}: a request message of {len} bytes is larger than the {limit}-byte limit"
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::path::PathBuf;

    use super::*;
    use crate::resources::{Device, Unit};

    fn resource(n: u32) -> Resource {
        Resource {
            name: "nvidia.com/gpu".into(),
            devices: (0..n)
                .map(|gpu| Device {
                    id: format!("GPU-{gpu:036}"),
                    unit: Unit { gpu, mig: None },
                    replica: None,
                    uuid: format!("GPU-{gpu:036}"),
                    runtime_id: format!("GPU-{gpu:036}"),
                    numa_node: None,
                    bus_id: String::new(),
                    memory_mib: None,
                    nodes: vec![PathBuf::from(format!("/dev/nvidia{gpu}"))],
                })
                .collect(),
            replicas: None,
            sharing: None,
            fail_requests_greater_than_one: false,
        }
    }

    #[test]
    fn limits_follow_the_resource() {
        let small = Limits::for_resource(&resource(8));
        assert_eq!(
            small,
            Limits {
                message: MIN_MESSAGE,
                ids: 8,
                id_len: 40
            }
        );
        let big = Limits::for_resource(&resource(2000));
        assert_eq!(big.message, 2 * 2000 * 43 + 4096);
    }

    #[test]
    fn id_lists_past_the_limits_are_refused_naming_them() {
        let limits = Limits::for_resource(&resource(2));
        let cases: [(&str, Vec<String>, Option<&str>); 4] = [
            ("fits", vec!["GPU-1".into(), "GPU-2".into()], None),
            (
                "too many",
                vec!["a".into(); 3],
                Some("3 device ids for nvidia.com/gpu, more than the 2"),
            ),
            (
                "too long",
                vec!["x".repeat(1 << 20)],
                Some("1048576 bytes for nvidia.com/gpu, whose ids are at most 40"),
            ),
            ("empty list", vec![], None),
        ];
        for (name, ids, want) in cases {
            let got = limits.check_ids("Allocate", "nvidia.com/gpu", &ids);
            match want {
                None => assert!(got.is_ok(), "case {name}: {got:?}"),
                Some(text) => {
                    let status = got.unwrap_err();
                    assert_eq!(status.code(), tonic::Code::InvalidArgument, "case {name}");
                    assert!(
                        status.message().contains(text),
                        "case {name}: {}",
                        status.message()
                    );
                }
            }
        }
    }

    fn body(chunks: Vec<Vec<u8>>) -> Body {
        let stream = futures_stream(chunks);
        Body::new(http_body_util::StreamBody::new(stream))
    }

    fn futures_stream(
        chunks: Vec<Vec<u8>>,
    ) -> impl tokio_stream::Stream<Item = Result<hyper::body::Frame<Bytes>, Infallible>> {
        tokio_stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok(hyper::body::Frame::data(Bytes::from(c)))),
        )
    }

    #[tokio::test(flavor = "current_thread")]
    async fn messages_are_read_whole_or_refused_from_their_prefix() {
        let message = [&[0u8, 0, 0, 0, 3][..], b"abc"].concat();
        let split = vec![message[..2].to_vec(), message[2..].to_vec()];
        assert_eq!(read_message(body(split), 10, "/m").await.unwrap(), message);
        assert_eq!(
            read_message(body(vec![message.clone()]), 10, "/m")
                .await
                .unwrap(),
            message
        );
        assert_eq!(
            read_message(body(vec![]), 10, "/m").await.unwrap(),
            Bytes::new()
        );
        // 1 MiB announced: refused on the prefix alone, before the rest arrives.
        let huge = vec![vec![0, 0, 0x10, 0, 0]];
        let status = read_message(body(huge), 65_536, "/v1beta1.DevicePlugin/Allocate")
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status
                .message()
                .contains("1048576 bytes is larger than the 65536-byte limit"),
            "{status:?}"
        );
        // A lying prefix does not let more than the limit in.
        let liar = vec![vec![0, 0, 0, 0, 1], vec![7; 100]];
        assert!(read_message(body(liar), 50, "/m").await.is_err());
    }
}

// SPDX-License-Identifier: Apache-2.0
//! The exporter's parsers of untrusted input: kubelet's side of a pod-resources call
//! (HTTP/2 frames, HPACK, gRPC framing, protobuf) and a scraper's HTTP/1.1 request head.

use nvshim::kubelet::pod_resources::{http2::ResponseReader, wire};
use nvshim::metrics_server::request;

/// Feeds `reads` to a fresh reader as separate reads: the outcome (message or error)
/// and the replies it wrote.
fn follow(reads: &[&[u8]]) -> (Result<Option<Vec<u8>>, String>, Vec<u8>) {
    let mut reader = ResponseReader::default();
    let mut replies = Vec::new();
    let mut outcome = Ok(None);
    for read in reads {
        outcome = reader.feed(read, &mut replies).map_err(|e| e.to_string());
        if !matches!(outcome, Ok(None)) {
            break;
        }
    }
    (outcome, replies)
}

/// A server's bytes for one `List` call (the first byte splits the reads). The outcome
/// and the replies do not depend on where the reads split; a message that arrives
/// decodes or is refused, without a panic.
pub fn pod_resources_response(data: &[u8]) {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let cut = usize::from(cut) * data.len() / 256;
    let whole = follow(&[data]);
    let split = follow(&[&data[..cut], &data[cut..]]);
    if whole != split {
        panic!(
            "pod_resources_response: the outcome changed when the reads split at {cut}: {whole:?} vs {split:?}"
        );
    }
    if let (Ok(Some(message)), _) = whole {
        let _ = wire::decode_list_response(&message);
    }
    let _ = wire::decode_list_response(data);
}

/// A request head. What parses took bytes of the input, and the same bytes alone parse
/// to the same head.
pub fn http_request_head(data: &[u8]) {
    let Ok(Some((head, used))) = request::parse(data) else {
        return;
    };
    if used > data.len() {
        panic!("http_request_head: used {used} of {} bytes", data.len());
    }
    match request::parse(&data[..used]) {
        Ok(Some((again, n))) if again == head && n == used => {}
        other => panic!("http_request_head: the head alone parses to {other:?}, not {head:?}"),
    }
}

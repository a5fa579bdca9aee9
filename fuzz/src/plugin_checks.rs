// SPDX-License-Identifier: Apache-2.0
//! The device plugin's fuzz check (`http2_inbound`), part of [`super`]'s set: its
//! `:authority` fix lives in its own crate, `crates/http2-authority`.

use nvshim_http2_authority::{Http2Error, Inbound, PREFACE};

/// A client's HTTP/2 bytes through the device plugin's `:authority` fix (the fuzzer's
/// bytes follow the preface; the first byte says where to split the reads). It must
/// not panic; its output must not depend on how reads fall; when it replaced no
/// authority, it passed on a prefix of its input byte for byte; and its output, read
/// again, needs no change (every authority in it is one h2 accepts, and h2's table
/// follows it).
pub fn http2_inbound(data: &[u8]) {
    let Some((&cut, data)) = data.split_first() else {
        return;
    };
    let mut input = PREFACE.to_vec();
    input.extend_from_slice(data);
    let cut = usize::from(cut) * input.len() / 256;
    let (whole, rewritten, transparent) = match inbound_output(&[&input]) {
        Ok(done) => done,
        Err(_) => return,
    };
    let split = inbound_output(&[&input[..cut], &input[cut..]]).map(|(out, ..)| out);
    if split.as_ref() != Ok(&whole) {
        panic!("http2_inbound: the output changed when the reads split at {cut}");
    }
    if rewritten == 0 && !input.starts_with(&whole) {
        panic!("http2_inbound: nothing was rewritten, yet the output differs from the input");
    }
    if rewritten > 0 && !transparent {
        // A re-encoded block can grow past a limit on the second read: not a failure.
        if let Ok((again, fixed, _)) = inbound_output(&[&whole]) {
            if fixed != 0 {
                panic!("http2_inbound: {fixed} authorities in the output still needed a fix");
            }
            if again != whole {
                panic!("http2_inbound: the output changed when read again");
            }
        }
    }
}

/// What an `Inbound` passes on for `reads`, how many authorities it replaced, and
/// whether it gave up rewriting.
fn inbound_output(reads: &[&[u8]]) -> Result<(Vec<u8>, u64, bool), Http2Error> {
    let mut inbound = Inbound::default();
    let mut out = Vec::new();
    for read in reads {
        inbound.feed(read, &mut out)?;
    }
    Ok((out, inbound.rewritten(), inbound.is_transparent()))
}

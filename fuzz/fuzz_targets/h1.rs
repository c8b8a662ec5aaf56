//! Fuzzes the gateway's strict HTTP/1.1 codec (`capgate_gateway::h1`).
//!
//! For arbitrary bytes:
//! - `parse_request_head` with default limits; for a complete head, `consumed` is within the
//!   input, the head re-serialises with `write_request_head` (method, `Target`'s Display,
//!   headers) and the output parses again to the same method, target, headers and framing,
//!   taking exactly the written bytes;
//! - for a chunked request, the bytes after the head go to a `ChunkedDecoder` in two slices
//!   (split at a point taken from the input's last two bytes): no panic, never more consumed
//!   than given, no more payload than consumed, and the same outcome as one-shot decoding
//!   (the decoder is documented to accept its input "split anywhere");
//! - `parse_response_head` on the same bytes for GET and HEAD.
#![no_main]

use capgate_gateway::h1::{
    ChunkedDecoder, Framing, H1Error, Limits, Parsed, RequestHead, ResponseHead, Version,
    parse_request_head, parse_response_head, write_request_head,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let limits = Limits::default();
    check_request(data, &limits);
    check_responses(data, &limits);
});

fn check_request(data: &[u8], limits: &Limits) {
    let Ok(Parsed::Complete { head, consumed }) = parse_request_head(data, limits) else {
        return;
    };
    assert!(consumed <= data.len(), "request head consumed {consumed} of {} bytes", data.len());
    assert!(consumed > 0, "a complete request head consumed nothing");

    round_trip(&head, limits);

    if head.framing == Framing::Chunked {
        let body = data.get(consumed..).expect("consumed is within the input");
        check_chunked(body, split_seed(data), limits);
    }
}

/// `write_request_head` of a parsed head succeeds and parses back to the same head.
fn round_trip(head: &RequestHead, limits: &Limits) {
    let target = head.target.to_string();
    let mut out = Vec::new();
    if let Err(error) = write_request_head(&head.method, &target, &head.headers, &mut out) {
        panic!("write_request_head refused a parsed head: {error:?}\nhead: {head:#?}\ntarget: {target:?}");
    }
    match parse_request_head(&out, limits) {
        Ok(Parsed::Complete { head: again, consumed }) => {
            assert_eq!(consumed, out.len(), "re-parse did not take exactly the written head\nwritten: {}", out.escape_ascii());
            assert_eq!(again.method, head.method, "method changed\nwritten: {}", out.escape_ascii());
            assert_eq!(again.target, head.target, "target changed\nwritten: {}", out.escape_ascii());
            assert_eq!(again.headers, head.headers, "headers changed\nwritten: {}", out.escape_ascii());
            assert_eq!(again.framing, head.framing, "framing changed\nwritten: {}", out.escape_ascii());
            assert_eq!(again.version, Version::Http11, "writer always speaks HTTP/1.1");
        }
        // The writer always says HTTP/1.1, which needs a Host header (except CONNECT) where
        // HTTP/1.0 did not: the one expected refusal.
        Err(H1Error::MissingHost)
            if head.version == Version::Http10 && head.method != "CONNECT" && head.host().is_none() => {}
        // The writer normalizes (`name: value`, an empty absolute path as `/`), which can
        // push a head that sat exactly at a size limit one byte per line over it. The
        // limits are defensive bounds, not framing: that is the other expected refusal.
        Err(H1Error::TargetTooLong { .. } | H1Error::HeadTooLarge { .. })
            if out.len() <= head_len_bound(head) => {}
        other => panic!(
            "written head does not re-parse: {other:?}\nwritten: {}\noriginal: {head:#?}",
            out.escape_ascii()
        ),
    }
}

/// The largest head the writer may produce from `head`: its limits plus one byte per
/// header line and one for the target.
fn head_len_bound(head: &RequestHead) -> usize {
    let limits = Limits::default();
    limits.max_head_bytes + head.headers.len() + 1
}

/// Two bytes from the end of the input (usually body bytes the fuzzer mutates freely).
fn split_seed(data: &[u8]) -> usize {
    match data {
        [.., a, b] => usize::from(u16::from_le_bytes([*a, *b])),
        [a] => usize::from(*a),
        [] => 0,
    }
}

/// Outcome of decoding: payload, total consumed, finished flag, or the error.
type Decoded = Result<(Vec<u8>, usize, bool), H1Error>;

fn check_chunked(body: &[u8], seed: usize, limits: &Limits) {
    let whole = decode_in_slices(body, &[body.len()], limits);
    let split = seed % body.len().saturating_add(1);
    let pieces = decode_in_slices(body, &[split, body.len()], limits);
    assert_eq!(
        pieces, whole,
        "decoding in two slices (split at {split}) differs from one-shot decoding\nbody: {}",
        body.escape_ascii()
    );
}

/// Feeds `body` to a fresh decoder in the slices ending at each of `ends`, the way the proxy
/// does: after a slice, the unconsumed rest is fed again with the next bytes appended.
fn decode_in_slices(body: &[u8], ends: &[usize], limits: &Limits) -> Decoded {
    let mut decoder = ChunkedDecoder::new(limits);
    let mut out = Vec::new();
    let mut pos = 0usize;
    for &end in ends {
        let input = body.get(pos..end).expect("slice ends are within the body");
        let before = out.len();
        let result = decoder.decode(input, &mut out);
        let added = out.len() - before;
        match result {
            Ok((n, finished)) => {
                assert!(n <= input.len(), "decoder consumed {n} of {} bytes", input.len());
                assert!(added <= n, "decoder produced {added} payload bytes from {n} consumed");
                assert_eq!(finished, decoder.is_finished(), "finished flag disagrees with is_finished");
                assert!(finished || n == input.len(), "decoder stopped early ({n} of {}) without finishing", input.len());
                pos += n;
                if finished {
                    assert_eq!(decoder.finish(), Ok(()), "finished decoder refuses finish()");
                    // Once finished, the decoder takes nothing more.
                    let rest = body.get(pos..).unwrap_or_default();
                    assert_eq!(decoder.decode(rest, &mut out), Ok((0, true)));
                    return Ok((out, pos, true));
                }
            }
            Err(error) => {
                assert!(added <= input.len(), "decoder produced {added} payload bytes from {} given", input.len());
                // After an error the decoder keeps returning it.
                assert_eq!(decoder.decode(b"0\r\n\r\n", &mut Vec::new()), Err(error.clone()));
                assert_eq!(decoder.finish(), Err(error.clone()));
                return Err(error);
            }
        }
    }
    assert!(!decoder.is_finished());
    assert!(decoder.finish().is_err(), "unfinished decoder accepts finish()");
    Ok((out, pos, false))
}

fn check_responses(data: &[u8], limits: &Limits) {
    let get = parse_response_head(data, limits, "GET");
    let head = parse_response_head(data, limits, "HEAD");
    match (&get, &head) {
        (
            Ok(Parsed::Complete { head: g, consumed: cg }),
            Ok(Parsed::Complete { head: h, consumed: ch }),
        ) => {
            assert!(*cg <= data.len() && *cg > 0, "response head consumed {cg} of {} bytes", data.len());
            assert_eq!(cg, ch, "GET and HEAD responses consumed differently");
            check_response(g);
            check_response(h);
            assert_eq!(h.framing, Framing::None, "a response to HEAD has a body");
            assert_eq!((g.version, g.status, &g.reason, &g.headers), (h.version, h.status, &h.reason, &h.headers));
        }
        (Ok(Parsed::Partial), Ok(Parsed::Partial)) => {}
        (Err(a), Err(b)) => assert_eq!(a, b, "GET and HEAD responses refused differently"),
        _ => panic!("GET and HEAD responses parse differently: {get:?} vs {head:?}"),
    }
}

fn check_response(head: &ResponseHead) {
    assert!((100..600).contains(&head.status), "status {} out of range", head.status);
    if head.framing == Framing::CloseDelimited {
        assert!(!head.keep_alive, "close-delimited response kept alive");
    }
}

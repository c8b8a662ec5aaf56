//! Fuzzes the gateway's masking of secrets in answers (`capgate_gateway::mask`).
//!
//! The input's first byte is a secret's length (8 to 40), the secret follows, and the rest
//! is an upstream's answer:
//! - masked as it streams (cut into pieces at points taken from the answer's bytes), the
//!   answer comes out exactly as masking it whole does, and as long;
//! - wherever a run of 8 of the secret's bytes stood, the output differs;
//! - read as WebSocket frames from a server, it never panics, and what leaves before an
//!   error is well-formed frames.
#![no_main]

use capgate_gateway::mask::{Mask, WINDOW, WsMasker};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else {
        return;
    };
    let n = 8 + usize::from(n) % 33;
    if rest.len() < n {
        return;
    }
    let (secret, answer) = rest.split_at(n);
    let Some(mask) = Mask::new([secret]) else {
        return;
    };

    let mut whole = answer.to_vec();
    mask.apply(&mut whole);
    assert_eq!(whole.len(), answer.len());
    // Where a run of the secret stood, the output differs (unless the run is made of the
    // marker's own bytes, which the marker may restate).
    let marker = b"[capgate:masked]*";
    for p in 0..answer.len().saturating_sub(WINDOW - 1) {
        let run = &answer[p..p + WINDOW];
        if secret.windows(WINDOW).any(|w| w == run) && !run.iter().all(|b| marker.contains(b)) {
            assert_ne!(&whole[p..p + WINDOW], run, "a run of the secret left unmasked");
        }
    }

    let mut stream = mask.stream();
    let (mut streamed, mut out) = (Vec::new(), Vec::new());
    let mut at = 0;
    for &cut in answer.iter().step_by(7) {
        let end = (at + usize::from(cut) % 64).min(answer.len());
        stream.feed(&answer[at..end], &mut out);
        streamed.extend_from_slice(&out);
        at = end;
    }
    stream.feed(&answer[at..], &mut out);
    streamed.extend_from_slice(&out);
    streamed.extend(stream.finish());
    assert_eq!(streamed, whole, "streaming masks as masking whole does");

    let mut ws = WsMasker::new(&mask);
    let mut frames = Vec::new();
    for piece in answer.chunks(13) {
        if ws.feed(piece, &mut frames).is_err() {
            break;
        }
    }
    assert_well_formed(&frames);
});

/// Unmasked frames, each whole.
fn assert_well_formed(mut wire: &[u8]) {
    while !wire.is_empty() {
        assert!(wire.len() >= 2, "a frame cut short");
        assert_eq!(wire[1] & 0x80, 0, "a masked frame");
        let (len, at) = match wire[1] & 0x7f {
            126 => (usize::from(u16::from_be_bytes([wire[2], wire[3]])), 4),
            127 => (
                usize::try_from(u64::from_be_bytes(wire[2..10].try_into().unwrap())).unwrap(),
                10,
            ),
            n => (usize::from(n), 2),
        };
        assert!(wire.len() >= at + len, "a frame cut short");
        wire = &wire[at + len..];
    }
}

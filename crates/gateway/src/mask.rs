//! Masking the secrets a request carried out of the response that answers it.
//!
//! An inject domain that reflects its request (an echo endpoint, an error page quoting the
//! `Authorization` header, a debug mode) would hand the real secret to the workload, which
//! is only ever meant to hold a sentinel. So every response to a request the broker wrote
//! a secret into is masked, in the status line's reason, the header values, the body and
//! the trailers: every run of [`WINDOW`] or more bytes that also occurs in the secret (or,
//! for `scheme: basic`, in the base64 text it was sent as) is overwritten with a marker of
//! the same length. Runs, not only the whole secret: a reflection cut short (an error page
//! quoting the first 50 bytes of a header, a close reason) would otherwise hand out all of
//! the secret but its end, and two secrets that overlap are covered together. So at most
//! `WINDOW - 1` consecutive bytes of a secret can leave in clear.
//!
//! Same length keeps every framing valid (`Content-Length`, chunk sizes, HTTP/2 flow
//! control) without re-framing. A body arrives in pieces, so [`MaskStream`] holds back the
//! end of a piece while it could grow into such a run, and lets it go once the next piece
//! shows it does not (or masks it when it does); at the end of the body the rest leaves.
//! Only a piece's end that occurs in a secret is held, so an event stream whose events end
//! with a newline is not delayed. A stream that goes quiet with at most [`RELEASE_MAX`]
//! such bytes held gets them after [`RELEASE_AFTER`] (a turn-taking protocol would
//! otherwise wait forever for its message's last byte); should the rest of the run
//! follow, it is still overwritten.
//!
//! What is not masked: a secret the upstream sends otherwise encoded (compressed, escaped,
//! percent- or base64-encoded unless basic), or in runs shorter than [`WINDOW`].

use std::fmt;
use std::time::Duration;

use aho_corasick::{AhoCorasick, Input, MatchKind};
use memchr::memmem;

/// What a masked run reads as; cut to the run's length, or padded with `*`.
const MARKER: &[u8] = b"[capgate:masked]";

/// How many bytes that could begin a run a quiet stream lets out (see the module's
/// account).
pub const RELEASE_MAX: usize = 4;

/// How long a stream must be quiet before it lets out held bytes.
pub const RELEASE_AFTER: Duration = Duration::from_millis(200);

/// Secrets shorter than this are not masked: a short value occurs by chance in ordinary
/// text, and masking it would corrupt responses more than it protects.
pub const MIN_MASKED_LEN: usize = 8;

/// The shortest run of a secret's bytes that is masked wherever it stands.
pub const WINDOW: usize = MIN_MASKED_LEN;

/// The secrets one request carried, to be masked in its response.
pub struct Mask {
    /// Every distinct run of [`WINDOW`] bytes of every secret, searched for in one pass.
    windows: AhoCorasick,
    /// The secrets, to tell whether the end of a piece could grow into a run.
    secrets: Vec<Vec<u8>>,
}

impl fmt::Debug for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mask({} secrets, <redacted>)", self.secrets.len())
    }
}

impl Mask {
    /// A mask for `secrets` (those shorter than [`MIN_MASKED_LEN`] left out); `None` when
    /// none is left.
    pub fn new<I, S>(secrets: I) -> Option<Mask>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<[u8]>,
    {
        let mut kept: Vec<Vec<u8>> = Vec::new();
        for s in secrets {
            let s = s.as_ref();
            if s.len() >= MIN_MASKED_LEN && !kept.iter().any(|k| k == s) {
                kept.push(s.to_vec());
            }
        }
        if kept.is_empty() {
            return None;
        }
        let windows: std::collections::BTreeSet<&[u8]> =
            kept.iter().flat_map(|s| s.windows(WINDOW)).collect();
        // Leftmost-first lets the search use its fast prefilters; overlapping runs are
        // found by searching again one byte after each match.
        let windows = AhoCorasick::builder()
            .match_kind(MatchKind::LeftmostFirst)
            .build(windows)
            .ok()?;
        Some(Mask {
            windows,
            secrets: kept,
        })
    }

    /// The stretches of `bytes` to overwrite: where runs of a secret's bytes stand,
    /// overlapping and touching ones joined, in order.
    fn runs(&self, bytes: &[u8]) -> Vec<(usize, usize)> {
        let mut found = Vec::new();
        let mut at = 0;
        while let Some(m) = self.windows.find(Input::new(bytes).span(at..bytes.len())) {
            found.push((m.start(), m.end()));
            at = m.start() + 1;
        }
        let mut runs: Vec<(usize, usize)> = Vec::new();
        for (start, end) in found {
            match runs.last_mut() {
                Some(last) if start <= last.1 => last.1 = last.1.max(end),
                _ => runs.push((start, end)),
            }
        }
        runs
    }

    /// Overwrites every run of a secret's bytes in `bytes`; returns how many there were.
    pub fn apply(&self, bytes: &mut [u8]) -> usize {
        let runs = self.runs(bytes);
        for &(start, end) in &runs {
            overwrite(&mut bytes[start..end]);
        }
        runs.len()
    }

    /// Whether `bytes` holds a run of a secret's bytes (for a header name, which is
    /// dropped rather than overwritten: the marker is not a token).
    pub fn finds(&self, bytes: &[u8]) -> bool {
        self.windows.is_match(bytes)
    }

    /// A masker for one body.
    pub fn stream(&self) -> MaskStream<'_> {
        MaskStream {
            mask: self,
            raw: Vec::new(),
            out: Vec::new(),
            sent: 0,
            base: 0,
            last_run: None,
        }
    }

    /// The length of the longest end of `bytes` that could grow into a run: shorter than
    /// [`WINDOW`], and found in a secret with room after it to make one.
    fn open_end(&self, bytes: &[u8]) -> usize {
        let most = bytes.len().min(WINDOW - 1);
        (1..=most)
            .rev()
            .find(|&k| {
                let end = &bytes[bytes.len() - k..];
                self.secrets
                    .iter()
                    .any(|s| memmem::find(&s[..s.len() - WINDOW + k], end).is_some())
            })
            .unwrap_or(0)
    }
}

fn overwrite(place: &mut [u8]) {
    overwrite_from(place, 0);
}

/// Overwrites `place`, the part of a run that begins `from` bytes into it.
fn overwrite_from(place: &mut [u8], from: usize) {
    for (i, b) in place.iter_mut().enumerate() {
        *b = MARKER.get(from + i).copied().unwrap_or(b'*');
    }
}

/// Masks a body that arrives in pieces (see the module's account).
pub struct MaskStream<'a> {
    mask: &'a Mask,
    /// The end of what was taken that could grow into a run, as it came: kept so that a
    /// run that goes on in the next piece is found whole.
    raw: Vec<u8>,
    /// The same bytes as they leave (a run that ended in them already overwrote them).
    out: Vec<u8>,
    /// How many of them have left (by [`MaskStream::release`]); the rest are held.
    sent: usize,
    /// Where in the body `raw` begins.
    base: u64,
    /// The last run overwritten, from and to where in the body: a run found going on from
    /// it carries on its marker rather than starting another.
    last_run: Option<(u64, u64)>,
}

impl fmt::Debug for MaskStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MaskStream({} bytes held, <redacted>)", self.held())
    }
}

impl MaskStream<'_> {
    /// Takes the next piece of the body; puts into `out` (cleared first) what may leave now.
    pub fn feed(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        let mut raw = std::mem::take(&mut self.raw);
        raw.extend_from_slice(piece);
        out.clear();
        out.append(&mut self.out);
        out.extend_from_slice(piece);
        for (start, end) in self.mask.runs(&raw) {
            let (from, to) = (self.base + start as u64, self.base + end as u64);
            let began = match self.last_run {
                Some((began, until)) if from <= until => began,
                _ => from,
            };
            let into = usize::try_from(from - began).unwrap_or(usize::MAX);
            overwrite_from(&mut out[start..end], into);
            self.last_run = Some((began, to.max(self.last_run.map_or(0, |r| r.1))));
        }
        // The end that could grow into a run: what of it has not left yet is held.
        let open_at = raw.len() - self.mask.open_end(&raw);
        let held_at = open_at.max(self.sent);
        self.raw = raw.split_off(open_at);
        self.out = out[open_at..].to_vec();
        self.base += open_at as u64;
        let sent = std::mem::replace(&mut self.sent, held_at - open_at);
        out.truncate(held_at);
        out.drain(..sent.min(out.len()));
    }

    /// Whether [`MaskStream::release`] would let bytes out.
    pub fn releasable(&self) -> bool {
        self.held() > 0 && self.raw.len() <= RELEASE_MAX
    }

    /// The stream has been quiet for [`RELEASE_AFTER`]: lets out what is held when the
    /// end it belongs to is at most [`RELEASE_MAX`] bytes (empty otherwise).
    pub fn release(&mut self) -> Vec<u8> {
        if !self.releasable() {
            return Vec::new();
        }
        let out = self.out[self.sent..].to_vec();
        self.sent = self.out.len();
        out
    }

    /// The body has ended: what was held back leaves (shorter than a run, it is no secret).
    pub fn finish(&mut self) -> Vec<u8> {
        let out = self.out.split_off(self.sent.min(self.out.len()));
        self.base += self.raw.len() as u64;
        self.raw.clear();
        self.out.clear();
        self.sent = 0;
        out
    }

    /// Bytes taken but not yet let out.
    pub fn held(&self) -> usize {
        self.out.len() - self.sent
    }
}

/// `text` from the upstream, masked, for a message that quotes it.
pub fn masked_text(mask: &Mask, text: String) -> String {
    let mut bytes = text.into_bytes();
    mask.apply(&mut bytes);
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Why an answer with a body (its header `fields`) cannot be masked, if it cannot: the
/// body is encoded (compressed as a whole, or gRPC messages compressed). Such an answer is
/// refused rather than relayed unread. The request asked for neither encoding, so an
/// upstream sends one only against that (or because the workload itself sent compressed
/// gRPC messages). The reason quotes the encoding, masked and printable.
pub fn unreadable<'h>(
    mask: &Mask,
    fields: impl IntoIterator<Item = (&'h str, &'h [u8])>,
) -> Option<String> {
    let (name, value) = fields.into_iter().find(|(name, value)| {
        let value = value.trim_ascii();
        (name.eq_ignore_ascii_case("content-encoding")
            || name.eq_ignore_ascii_case("grpc-encoding"))
            && !value.is_empty()
            && !value.eq_ignore_ascii_case(b"identity")
    })?;
    let quoted = masked_text(mask, format!("{name}: {}", String::from_utf8_lossy(value)));
    Some(format!(
        "it is encoded (`{}`), so capgate cannot make sure it does not hand back the secret the request carried",
        capgate_spec::text::printable(&quoted)
    ))
}

/// Masks the frames a WebSocket server sends (RFC 6455 §5), for a connection whose upgrade
/// request carried a secret. A secret may be cut across the frames of one message, so the
/// payloads of a message go through one [`MaskStream`], and the message is framed anew as
/// its masked bytes become ready (what is ready at the end of each read leaves as a
/// fragment): an intermediary may change a message's fragmentation
/// when no extension is in use (§5.4), and none is (the upgrade's extension offer is
/// withheld). Everything a message held back leaves with its last frame, so a message is
/// never delayed past its own end. Control frames (close, ping, pong) are masked whole.
/// A frame the masker cannot read as plain RFC 6455 (masked, reserved bits or opcodes set,
/// a fragmented control frame, a continuation of nothing) is an error: the connection ends.
pub struct WsMasker<'a> {
    mask: &'a Mask,
    /// The header of the next frame, as far as it has come.
    head: Vec<u8>,
    /// The frame whose payload is coming.
    frame: Option<FrameHead>,
    /// The message under way: its masker, its opcode, and whether a frame of it was sent.
    message: Option<(MaskStream<'a>, u8, bool)>,
    /// A control frame's payload, as far as it has come.
    control: Vec<u8>,
    /// Masked payload of the message under way not yet sent in a frame.
    ready: Vec<u8>,
    scratch: Vec<u8>,
}

/// A frame's final bit, opcode, and the payload bytes still to come.
type FrameHead = (bool, u8, u64);

impl fmt::Debug for WsMasker<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "WsMasker(<redacted>)")
    }
}

impl<'a> WsMasker<'a> {
    pub fn new(mask: &'a Mask) -> Self {
        WsMasker {
            mask,
            head: Vec::new(),
            frame: None,
            message: None,
            control: Vec::new(),
            ready: Vec::new(),
            scratch: Vec::new(),
        }
    }

    /// Takes the next bytes from the server; appends to `out` the frames that may leave.
    pub fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        loop {
            let Some((fin, opcode, left)) = self.frame else {
                if bytes.is_empty() {
                    return Ok(());
                }
                let (taken, frame) = self.read_head(bytes)?;
                bytes = &bytes[taken..];
                self.frame = frame;
                if self.frame.is_none() {
                    return Ok(());
                }
                continue;
            };
            let take = usize::try_from(left).unwrap_or(usize::MAX).min(bytes.len());
            let (piece, rest) = bytes.split_at(take);
            bytes = rest;
            let left = left - take as u64;
            self.frame = Some((fin, opcode, left));
            if opcode >= 8 {
                self.control.extend_from_slice(piece);
            } else if let Some((stream, _, _)) = &mut self.message {
                stream.feed(piece, &mut self.scratch);
                self.ready.extend_from_slice(&self.scratch);
            }
            if left == 0 {
                self.frame = None;
                self.end_frame(fin, opcode, out);
            } else {
                // The frame goes on in later bytes: what is ready leaves now, as a fragment.
                if opcode < 8 && !self.ready.is_empty() {
                    self.send_fragment(false, out);
                }
                return Ok(());
            }
        }
    }

    /// Reads a frame header from the start of `bytes` (after what came before): the bytes
    /// taken, and the frame once its header is whole.
    fn read_head(&mut self, bytes: &[u8]) -> Result<(usize, Option<FrameHead>), String> {
        let need = |head: &[u8]| match head {
            [_, b, ..] => {
                2 + match b & 0x7f {
                    126 => 2,
                    127 => 8,
                    _ => 0,
                } + if b & 0x80 != 0 { 4 } else { 0 }
            }
            _ => 2,
        };
        let mut taken = 0;
        while self.head.len() < need(&self.head) && taken < bytes.len() {
            self.head.push(bytes[taken]);
            taken += 1;
        }
        if self.head.len() < need(&self.head) {
            return Ok((taken, None));
        }
        let (b0, b1) = (self.head[0], self.head[1]);
        let (fin, opcode) = (b0 & 0x80 != 0, b0 & 0x0f);
        if b0 & 0x70 != 0 {
            return Err("a frame with reserved bits set (an extension nobody agreed to)".into());
        }
        if b1 & 0x80 != 0 {
            return Err("a masked frame from the server".into());
        }
        let len = match b1 & 0x7f {
            126 => u64::from(u16::from_be_bytes([self.head[2], self.head[3]])),
            127 => {
                let mut n = [0u8; 8];
                n.copy_from_slice(&self.head[2..10]);
                u64::from_be_bytes(n)
            }
            n => u64::from(n),
        };
        match opcode {
            0 if self.message.is_none() => return Err("a continuation of no message".into()),
            1 | 2 if self.message.is_some() => {
                return Err("a new message before the last one ended".into());
            }
            1 | 2 => self.message = Some((self.mask.stream(), opcode, false)),
            0 => {}
            8..=10 if !fin || len > 125 => {
                return Err("a fragmented or oversized control frame".into());
            }
            8..=10 => self.control.clear(),
            other => return Err(format!("a frame with the reserved opcode {other}")),
        }
        if len >> 63 != 0 {
            return Err("a frame length over 2^63".into());
        }
        self.head.clear();
        Ok((taken, Some((fin, opcode, len))))
    }

    fn end_frame(&mut self, fin: bool, opcode: u8, out: &mut Vec<u8>) {
        if opcode >= 8 {
            let mut payload = std::mem::take(&mut self.control);
            self.mask.apply(&mut payload);
            write_frame(true, opcode, &payload, out);
            return;
        }
        if fin {
            if let Some((stream, _, _)) = &mut self.message {
                let rest = stream.finish();
                self.ready.extend_from_slice(&rest);
            }
            self.send_fragment(true, out);
            self.message = None;
        } else if !self.ready.is_empty() {
            self.send_fragment(false, out);
        }
    }

    /// Sends what is ready of the message under way as one frame.
    fn send_fragment(&mut self, fin: bool, out: &mut Vec<u8>) {
        let Some((_, opcode, sent)) = &mut self.message else {
            return;
        };
        let opcode = if *sent { 0 } else { *opcode };
        *sent = true;
        write_frame(fin, opcode, &self.ready, out);
        self.ready.clear();
    }
}

/// An unmasked frame, as a server sends it.
fn write_frame(fin: bool, opcode: u8, payload: &[u8], out: &mut Vec<u8>) {
    out.push(if fin { 0x80 } else { 0 } | opcode);
    match payload.len() {
        n if n < 126 => out.push(n as u8),
        n if n <= usize::from(u16::MAX) => {
            out.push(126);
            out.extend_from_slice(&(n as u16).to_be_bytes());
        }
        n => {
            out.push(127);
            out.extend_from_slice(&(n as u64).to_be_bytes());
        }
    }
    out.extend_from_slice(payload);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, reason = "tests")]
    use super::*;
    use proptest::prelude::*;

    const SECRET: &str = "ghp_realSECRETvalue0123";

    fn masked(s: &str) -> String {
        let mut b = s.as_bytes().to_vec();
        Mask::new([SECRET]).unwrap().apply(&mut b);
        String::from_utf8(b).unwrap()
    }

    #[test]
    fn each_occurrence_becomes_a_marker_of_its_length() {
        let text = format!("{{\"auth\":\"Bearer {SECRET}\",\"again\":\"{SECRET}\"}}");
        let out = masked(&text);
        assert!(!out.contains(SECRET));
        assert_eq!(out.len(), text.len());
        assert_eq!(
            out,
            "{\"auth\":\"Bearer [capgate:masked]*******\",\"again\":\"[capgate:masked]*******\"}"
        );
        // Its harmless twins: text without the secret is untouched, and so is a run of
        // fewer than WINDOW of its bytes.
        let short = format!("x{}y", &SECRET[3..3 + WINDOW - 1]);
        assert_eq!(masked(&short), short);
        assert_eq!(masked("plain text"), "plain text");
    }

    /// A reflection cut short (an error page quoting the first bytes of a header) is
    /// masked from its eighth byte of the secret on: runs, not only the whole secret.
    #[test]
    fn a_secret_cut_short_is_masked_too() {
        let cut = &SECRET[..SECRET.len() - 1];
        assert_eq!(
            masked(&format!("bad header `{cut}`")),
            "bad header `[capgate:masked]******`"
        );
        let middle = &SECRET[5..5 + WINDOW];
        assert_eq!(masked(&format!("..{middle}..")), "..[capgate..");
    }

    /// Two secrets where one's end is the other's beginning are masked together, and a
    /// secret that repeats itself is masked all along.
    #[test]
    fn overlapping_secrets_are_masked_together() {
        let m = Mask::new(["AAAAAAAAxyzw", "xyzwBBBBBBBBBBBB"]).unwrap();
        let mut b = b"..AAAAAAAAxyzwBBBBBBBBBBBB..".to_vec();
        assert_eq!(m.apply(&mut b), 1);
        assert_eq!(&b, b"..[capgate:masked]********..");
        let m = Mask::new(["abcabcabcabc"]).unwrap();
        let mut b = b"abcabcabcabcabc".to_vec();
        m.apply(&mut b);
        assert_eq!(&b, b"[capgate:masked");
    }

    #[test]
    fn short_secrets_are_not_masked_and_a_mask_needs_one() {
        assert!(Mask::new(["short"]).is_none());
        assert!(Mask::new(Vec::<String>::new()).is_none());
        let m = Mask::new(["1234567", "12345678"]).unwrap();
        let mut b = b"1234567 12345678".to_vec();
        assert_eq!(m.apply(&mut b), 1);
        assert_eq!(&b, b"1234567 [capgate");
    }

    #[test]
    fn the_debug_form_shows_no_secret() {
        let m = Mask::new([SECRET]).unwrap();
        assert!(!format!("{m:?}").contains(SECRET));
    }

    /// Feeds `pieces` through a stream; returns the output and the held count after each.
    fn stream(mask: &Mask, pieces: &[&[u8]]) -> (Vec<u8>, Vec<usize>) {
        let mut s = mask.stream();
        let (mut all, mut held, mut out) = (Vec::new(), Vec::new(), Vec::new());
        for p in pieces {
            s.feed(p, &mut out);
            all.extend_from_slice(&out);
            held.push(s.held());
        }
        all.extend(s.finish());
        (all, held)
    }

    #[test]
    fn a_secret_split_across_pieces_is_masked() {
        let mask = Mask::new([SECRET]).unwrap();
        let body = format!("data: {SECRET}\n\n");
        for cut in 0..=body.len() {
            for cut2 in cut..=body.len() {
                let b = body.as_bytes();
                let (out, _) = stream(&mask, &[&b[..cut], &b[cut..cut2], &b[cut2..]]);
                assert_eq!(out.len(), b.len());
                assert!(
                    !String::from_utf8_lossy(&out).contains(SECRET),
                    "cut at {cut}/{cut2}"
                );
                assert!(out.starts_with(b"data: [capgate:masked]"));
            }
        }
    }

    #[test]
    fn only_a_possible_beginning_is_held_back() {
        let mask = Mask::new([SECRET]).unwrap();
        // An event that ends in a newline leaves whole at once.
        let (_, held) = stream(&mask, &[b"data: {\"x\":1}\n\n"]);
        assert_eq!(held, [0]);
        // An end that begins the secret waits; the next piece shows it was not one.
        let (out, held) = stream(&mask, &[b"token ghp_re", b"d herring", b"!"]);
        // (`g`, the last letter of the second piece, could begin it too.)
        assert_eq!(held, [6, 1, 0]);
        assert_eq!(out, b"token ghp_red herring!");
    }

    #[test]
    fn a_quiet_stream_lets_out_a_short_beginning_and_still_masks_the_rest() {
        let mask = Mask::new([SECRET]).unwrap();
        let mut s = mask.stream();
        let mut out = Vec::new();
        s.feed(b"status g", &mut out);
        assert_eq!(out, b"status ");
        assert!(s.releasable());
        assert_eq!(s.release(), b"g");
        s.feed(b"hp_", &mut out);
        assert_eq!(out, b"");
        assert_eq!(s.release(), b"hp_");
        // Four bytes out: the fifth is held however long the stream waits.
        s.feed(b"r", &mut out);
        assert!(out.is_empty() && !s.releasable() && s.release().is_empty());
        s.feed(b"ealSECRETvalue0123 and on", &mut out);
        assert_eq!(out, b"gate:masked]******* and on");
        // Its twin: a stream whose held end turns out not to be a secret.
        let mut s = mask.stream();
        s.feed(b"status g", &mut out);
        assert_eq!(s.release(), b"g");
        s.feed(b"ood\n", &mut out);
        assert_eq!(out, b"ood\n");
        assert!(!s.releasable() && s.finish().is_empty());
    }

    /// A WebSocket message: its opcode and payload.
    type Message = (u8, Vec<u8>);

    /// Reads server frames: the messages, payloads joined across fragments.
    fn messages(mut wire: &[u8]) -> Vec<Message> {
        let mut out: Vec<Message> = Vec::new();
        let mut current: Option<Message> = None;
        while !wire.is_empty() {
            let (fin, opcode) = (wire[0] & 0x80 != 0, wire[0] & 0x0f);
            assert_eq!(wire[1] & 0x80, 0, "unmasked");
            let (len, at) = match wire[1] {
                126 => (usize::from(u16::from_be_bytes([wire[2], wire[3]])), 4),
                127 => (
                    usize::try_from(u64::from_be_bytes(wire[2..10].try_into().unwrap())).unwrap(),
                    10,
                ),
                n => (usize::from(n), 2),
            };
            let payload = wire[at..at + len].to_vec();
            wire = &wire[at + len..];
            if opcode >= 8 {
                out.push((opcode, payload));
                continue;
            }
            let (op, mut body) = current.take().unwrap_or((opcode, Vec::new()));
            assert!(
                opcode == 0 || body.is_empty(),
                "a new message only after the last"
            );
            body.extend(payload);
            if fin {
                out.push((op, body));
            } else {
                current = Some((op, body));
            }
        }
        assert!(current.is_none(), "every message ended");
        out
    }

    fn frame(fin: bool, opcode: u8, payload: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        write_frame(fin, opcode, payload, &mut out);
        out
    }

    #[test]
    fn a_secret_cut_across_websocket_frames_is_masked() {
        let mask = Mask::new([SECRET]).unwrap();
        let mut wire = frame(false, 1, b"token: ghp_re");
        wire.extend(frame(true, 9, format!("ping {SECRET}").as_bytes()));
        wire.extend(frame(false, 0, b"alSECRETval"));
        wire.extend(frame(true, 0, b"ue0123!"));
        wire.extend(frame(true, 2, b"no secret here"));
        // Whole, and byte by byte: the same messages.
        for step in [wire.len(), 1, 7] {
            let mut ws = WsMasker::new(&mask);
            let mut out = Vec::new();
            for piece in wire.chunks(step) {
                ws.feed(piece, &mut out).unwrap();
            }
            let got = messages(&out);
            assert_eq!(
                got,
                vec![
                    (9, b"ping [capgate:masked]*******".to_vec()),
                    (1, b"token: [capgate:masked]*******!".to_vec()),
                    (2, b"no secret here".to_vec()),
                ],
                "step {step}"
            );
        }
    }

    #[test]
    fn websocket_messages_without_a_secret_keep_their_frames() {
        let mask = Mask::new([SECRET]).unwrap();
        let mut wire = frame(true, 1, b"hello");
        wire.extend(frame(true, 2, &vec![7u8; 70_000]));
        wire.extend(frame(true, 8, b"\x03\xe8bye"));
        let mut ws = WsMasker::new(&mask);
        let mut out = Vec::new();
        ws.feed(&wire, &mut out).unwrap();
        assert_eq!(out, wire);
        // A message's held end leaves with its last frame, at once.
        let mut out = Vec::new();
        WsMasker::new(&mask)
            .feed(&frame(true, 1, b"hello g"), &mut out)
            .unwrap();
        assert_eq!(out, frame(true, 1, b"hello g"));
    }

    /// A long frame is not held until it ends: what is ready leaves as a fragment, and
    /// the message still arrives whole.
    #[test]
    fn a_long_frame_trickles_through_as_fragments() {
        let mask = Mask::new([SECRET]).unwrap();
        let payload = vec![b'.'; 16_384];
        let wire = frame(true, 2, &payload);
        let mut ws = WsMasker::new(&mask);
        let mut out = Vec::new();
        ws.feed(&wire[..4 + 12], &mut out).unwrap();
        assert_eq!(out, frame(false, 2, &payload[..12]));
        ws.feed(&wire[4 + 12..], &mut out).unwrap();
        assert_eq!(messages(&out), vec![(2, payload)]);
    }

    #[test]
    fn websocket_frames_capgate_cannot_read_end_the_connection() {
        let mask = Mask::new([SECRET]).unwrap();
        for (wire, why) in [
            (vec![0x81, 0x85, 1, 2, 3, 4, 0, 0, 0, 0, 0], "masked"),
            (vec![0xc1, 0x01, b'x'], "reserved bits"),
            (vec![0x80, 0x01, b'x'], "continuation of no message"),
            (vec![0x09, 0x00], "fragmented"),
            (vec![0x83, 0x00], "reserved opcode"),
        ] {
            let e = WsMasker::new(&mask)
                .feed(&wire, &mut Vec::new())
                .unwrap_err();
            assert!(e.contains(why), "{why}: {e}");
        }
    }

    proptest! {
        #[test]
        fn hostile_websocket_bytes_are_errors_not_panics(
            wire in proptest::collection::vec(any::<u8>(), 0..300),
            step in 1usize..40,
        ) {
            let mask = Mask::new([SECRET]).unwrap();
            let mut ws = WsMasker::new(&mask);
            let mut out = Vec::new();
            for piece in wire.chunks(step) {
                if ws.feed(piece, &mut out).is_err() {
                    break;
                }
            }
        }

        #[test]
        fn a_message_however_framed_arrives_whole_and_masked(
            parts in proptest::collection::vec(prop_oneof![
                Just(SECRET.as_bytes().to_vec()),
                Just(b"ghp_".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..30),
            ], 1..6),
            cuts in proptest::collection::vec(0usize..200, 0..4),
            step in 1usize..50,
        ) {
            let mask = Mask::new([SECRET]).unwrap();
            let payload = parts.concat();
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(payload.len())).collect();
            cuts.sort_unstable();
            cuts.push(payload.len());
            let mut wire = Vec::new();
            let mut at = 0;
            for (i, &c) in cuts.iter().enumerate() {
                let last = i + 1 == cuts.len();
                wire.extend(frame(last, if i == 0 { 2 } else { 0 }, &payload[at..c]));
                at = c;
            }
            let mut ws = WsMasker::new(&mask);
            let mut out = Vec::new();
            for piece in wire.chunks(step) {
                ws.feed(piece, &mut out).unwrap();
            }
            let mut whole = payload.clone();
            mask.apply(&mut whole);
            prop_assert_eq!(messages(&out), vec![(2u8, whole)]);
        }

        #[test]
        fn releases_never_let_out_more_than_a_short_beginning(
            pieces in proptest::collection::vec(prop_oneof![
                Just(b"ghp_".to_vec()),
                Just(b"realSECRET".to_vec()),
                Just(b"value0123".to_vec()),
                Just(b"g".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..6),
            ], 0..14),
            releases in proptest::collection::vec(any::<bool>(), 14),
        ) {
            let mask = Mask::new([SECRET]).unwrap();
            let mut s = mask.stream();
            let (mut all, mut out) = (Vec::new(), Vec::new());
            for (p, release) in pieces.iter().zip(&releases) {
                s.feed(p, &mut out);
                all.extend_from_slice(&out);
                if *release {
                    all.extend(s.release());
                }
            }
            all.extend(s.finish());
            let input = pieces.concat();
            prop_assert_eq!(all.len(), input.len());
            // Wherever a run of WINDOW of the secret's bytes was, at most its first
            // RELEASE_MAX bytes left as they were: the rest is the marker's.
            let marked = |b: &u8| MARKER.contains(b) || *b == b'*';
            for at in 0..input.len().saturating_sub(WINDOW - 1) {
                if memmem::find(SECRET.as_bytes(), &input[at..at + WINDOW]).is_some() {
                    prop_assert!(
                        all[at + RELEASE_MAX..at + WINDOW].iter().all(marked),
                        "{:?}",
                        String::from_utf8_lossy(&all)
                    );
                }
            }
        }

        #[test]
        fn streaming_masks_like_masking_the_whole(
            body in proptest::collection::vec(prop_oneof![
                Just(SECRET.as_bytes().to_vec()),
                Just(b"ghp_real".to_vec()),
                proptest::collection::vec(any::<u8>(), 0..40),
            ], 0..8),
            cuts in proptest::collection::vec(0usize..400, 0..6),
        ) {
            let mask = Mask::new([SECRET, "realSECRETv"]).unwrap();
            let body: Vec<u8> = body.concat();
            let mut whole = body.clone();
            mask.apply(&mut whole);
            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c.min(body.len())).collect();
            cuts.sort_unstable();
            let mut pieces = Vec::new();
            let mut at = 0;
            for c in cuts {
                pieces.push(&body[at..c]);
                at = c;
            }
            pieces.push(&body[at..]);
            let (out, _) = stream(&mask, &pieces);
            prop_assert!(memmem::find(&whole, SECRET.as_bytes()).is_none());
            // However the body is cut, the same bytes leave.
            prop_assert_eq!(out, whole);
        }
    }
}

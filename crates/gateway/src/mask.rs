//! Masking the secrets a request carried out of the response that answers it.
//!
//! An inject domain that reflects its request (an echo endpoint, an error page quoting the
//! `Authorization` header, a debug mode) would hand the real secret to the workload, which
//! is only ever meant to hold a sentinel. So every response to a request the broker wrote
//! a secret into is masked: each occurrence of the secret (and, for `scheme: basic`, of
//! the base64 text it was sent as) is overwritten with a marker of the same length, in the
//! status line's reason, the header values, the body and the trailers.
//!
//! Same length keeps every framing valid (`Content-Length`, chunk sizes, HTTP/2 flow
//! control) without re-framing. A body arrives in pieces, so [`MaskStream`] holds back the
//! end of a piece while it could be the start of a secret, and lets it go once the next
//! piece shows it is not (or masks it when it is); at the end of the body the rest leaves.
//! Only a piece's end that equals a secret's beginning is held, so an event stream whose
//! events end with a newline is not delayed.
//!
//! What is not masked: a secret the upstream sends otherwise encoded (compressed, escaped,
//! percent- or base64-encoded unless basic), or in parts over several responses.

use std::fmt;

use memchr::memmem;

/// What a masked secret reads as; cut to the secret's length, or padded with `*`.
const MARKER: &[u8] = b"[capgate:masked]";

/// Secrets shorter than this are not masked: a short value occurs by chance in ordinary
/// text, and masking it would corrupt responses more than it protects.
pub const MIN_MASKED_LEN: usize = 8;

/// The secrets one request carried, to be masked in its response.
pub struct Mask {
    needles: Vec<memmem::Finder<'static>>,
    longest: usize,
}

impl fmt::Debug for Mask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mask({} secrets, <redacted>)", self.needles.len())
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
        let mut needles: Vec<memmem::Finder<'static>> = Vec::new();
        for s in secrets {
            let s = s.as_ref();
            if s.len() >= MIN_MASKED_LEN && !needles.iter().any(|n| n.needle() == s) {
                needles.push(memmem::Finder::new(s).into_owned());
            }
        }
        let longest = needles.iter().map(|n| n.needle().len()).max()?;
        Some(Mask { needles, longest })
    }

    /// Overwrites every occurrence of a secret in `bytes`; returns how many there were.
    pub fn apply(&self, bytes: &mut [u8]) -> usize {
        let mut count = 0;
        for needle in &self.needles {
            let len = needle.needle().len();
            let mut at = 0;
            while let Some(found) = needle.find(&bytes[at..]) {
                let start = at + found;
                overwrite(&mut bytes[start..start + len]);
                count += 1;
                at = start + len;
            }
        }
        count
    }

    /// Whether `bytes` holds a secret (for a header name, which is dropped rather than
    /// overwritten: the marker is not a token).
    pub fn finds(&self, bytes: &[u8]) -> bool {
        self.needles.iter().any(|n| n.find(bytes).is_some())
    }

    /// A masker for one body.
    pub fn stream(&self) -> MaskStream<'_> {
        MaskStream {
            mask: self,
            held: Vec::new(),
        }
    }

    /// The length of the longest end of `bytes` that is the beginning of a secret.
    fn open_end(&self, bytes: &[u8]) -> usize {
        let most = bytes.len().min(self.longest - 1);
        (1..=most)
            .rev()
            .find(|&k| {
                let end = &bytes[bytes.len() - k..];
                self.needles.iter().any(|n| n.needle().starts_with(end))
            })
            .unwrap_or(0)
    }
}

fn overwrite(place: &mut [u8]) {
    for (i, b) in place.iter_mut().enumerate() {
        *b = MARKER.get(i).copied().unwrap_or(b'*');
    }
}

/// Masks a body that arrives in pieces (see the module's account).
pub struct MaskStream<'a> {
    mask: &'a Mask,
    /// The end of the last piece, which may be a secret's beginning.
    held: Vec<u8>,
}

impl fmt::Debug for MaskStream<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "MaskStream({} bytes held, <redacted>)", self.held.len())
    }
}

impl MaskStream<'_> {
    /// Takes the next piece of the body; puts into `out` (cleared first) what may leave now.
    pub fn feed(&mut self, piece: &[u8], out: &mut Vec<u8>) {
        out.clear();
        out.append(&mut self.held);
        out.extend_from_slice(piece);
        self.mask.apply(out);
        let keep = self.mask.open_end(out);
        self.held.extend_from_slice(&out[out.len() - keep..]);
        out.truncate(out.len() - keep);
    }

    /// The body has ended: what was held back leaves (it is no secret, being incomplete).
    pub fn finish(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.held)
    }

    /// Bytes taken but not yet let out.
    pub fn held(&self) -> usize {
        self.held.len()
    }
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
        // Its harmless twin: text without the secret is untouched, a near miss too.
        let near = &SECRET[..SECRET.len() - 1];
        assert_eq!(masked(near), near);
        assert_eq!(masked("plain text"), "plain text");
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

    proptest! {
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
            prop_assert_eq!(out.len(), body.len());
            prop_assert!(memmem::find(&out, SECRET.as_bytes()).is_none());
            prop_assert!(memmem::find(&whole, SECRET.as_bytes()).is_none());
        }
    }
}

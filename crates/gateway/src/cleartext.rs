//! The SOCKS5 relay. A SOCKS5 stream is relayed as bytes, unparsed, after two checks on
//! the client's direction:
//!
//! - **Its first bytes.** When they are a TLS ClientHello, it must name (SNI) the host the
//!   client asked SOCKS for, as in a CONNECT tunnel: otherwise a grant for one host would
//!   carry TLS for another served at the same address (a CDN, a shared front). The bytes
//!   are held until they are known not to be TLS or hold a whole hello; nothing of a hello
//!   cut short or naming another host is sent. The server's direction flows meanwhile, so
//!   server-first protocols (SMTP, MySQL) work. TLS begun later inside the protocol
//!   (STARTTLS) is not seen.
//! - **Sentinels.** In a sandbox with credentials, a sentinel sent in a SOCKS stream is
//!   still a sentinel sent where its credential is not injected (no credential is ever
//!   written into a SOCKS stream), so the client's bytes are watched for every sentinel of
//!   the sandbox, in any letter case, across reads: a piece that completes one is not sent,
//!   the connection is closed, and the caller records the exfiltration. At most the
//!   sentinel's first bytes (those before the read that completed it) have left. (CONNECT
//!   tunnels need none of this: in such a sandbox every one is intercepted, and one that
//!   does not carry TLS is refused.)
//!
//! The upstream's answer is copied as it comes. Inside TLS carried by SOCKS nothing can be
//! seen, nor a sentinel split across two connections.

use std::borrow::Cow;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};

use aho_corasick::{AhoCorasick, AhoCorasickBuilder, MatchKind};
use capgate_policy::Reason;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

use crate::tls::{MAX_PEEK_LEN, SniPeek, peek_sni, sni_matches_authority};

/// The size of one read from the client.
const CHUNK: usize = 64 * 1024;

/// The sandbox's sentinels, to look for in a stream.
pub(crate) struct SentinelScan {
    finder: AhoCorasick,
    /// The service of each sentinel, in the finder's pattern order.
    services: Vec<String>,
    /// The longest sentinel's length: a sentinel cut across reads lies within the last
    /// `longest - 1` bytes of the one and the next read.
    longest: usize,
}

impl SentinelScan {
    /// The scan for `sentinels` (sentinel, service); `None` when there are none, or the
    /// finder cannot be built (the caller then refuses what it would have watched).
    pub(crate) fn new(sentinels: &[(String, String)]) -> Option<SentinelScan> {
        if sentinels.is_empty() {
            return None;
        }
        let finder = AhoCorasickBuilder::new()
            .ascii_case_insensitive(true)
            .match_kind(MatchKind::LeftmostFirst)
            .build(sentinels.iter().map(|(s, _)| s.as_bytes()))
            .ok()?;
        Some(SentinelScan {
            finder,
            longest: sentinels.iter().map(|(s, _)| s.len()).max().unwrap_or(0),
            services: sentinels.iter().map(|(_, svc)| svc.clone()).collect(),
        })
    }

    /// The service whose sentinel occurs in `bytes`, if any.
    pub(crate) fn find(&self, bytes: &[u8]) -> Option<&str> {
        let m = self.finder.find(bytes)?;
        self.services
            .get(m.pattern().as_usize())
            .map(String::as_str)
    }
}

/// One stream's watch: what was sent of it lately, so that a sentinel cut across pieces
/// is found in the piece that completes it.
pub(crate) struct Watch<'a> {
    scan: &'a SentinelScan,
    /// The stream's last `longest - 1` bytes sent, then the piece being judged.
    tail: Vec<u8>,
}

impl<'a> Watch<'a> {
    pub(crate) fn new(scan: &'a SentinelScan) -> Watch<'a> {
        Watch {
            scan,
            tail: Vec::with_capacity(scan.longest.saturating_sub(1) + CHUNK),
        }
    }

    /// Judges the stream's next piece: `Ok` when it may be sent (it completes no sentinel
    /// with what was sent before it), else the sentinel's service. After a refusal the
    /// stream must not go on.
    pub(crate) fn pass(&mut self, piece: &[u8]) -> Result<(), &'a str> {
        self.tail.extend_from_slice(piece);
        if let Some(service) = self.scan.find(&self.tail) {
            return Err(service);
        }
        let cut = self
            .tail
            .len()
            .saturating_sub(self.scan.longest.saturating_sub(1));
        self.tail.drain(..cut);
        Ok(())
    }
}

/// How a watched relay ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Relayed {
    /// Both directions ended: the bytes sent each way.
    Done { up: u64, down: u64 },
    /// The client sent the sentinel of `service`; the connection was given up after `up`
    /// bytes had gone upstream (none of the piece that completed the sentinel) and `down`
    /// had come back.
    Sentinel { service: String, up: u64, down: u64 },
    /// The client's first bytes were refused (see [`FirstBytes`]): none of them left, and
    /// `down` bytes had come back.
    Refused {
        reason: Reason,
        message: String,
        down: u64,
    },
}

/// The client's first bytes, held until they are known not to be TLS, or hold a whole
/// ClientHello, whose server name must be `host` (the host the client asked for).
struct FirstBytes<'a> {
    host: &'a str,
    /// What came so far; `None` once judged (from then on every piece passes).
    held: Option<Vec<u8>>,
}

impl<'a> FirstBytes<'a> {
    fn new(host: &'a str) -> FirstBytes<'a> {
        FirstBytes {
            host,
            held: Some(Vec::new()),
        }
    }

    /// Takes the client's next piece (empty at the end of its stream): what may be sent
    /// now (`Ok(None)`: nothing yet, read on; once judged, the piece itself), or the
    /// refusal.
    fn admit<'p>(&mut self, piece: &'p [u8]) -> Result<Option<Cow<'p, [u8]>>, (Reason, String)> {
        let Some(held) = self.held.as_mut() else {
            return Ok(Some(Cow::Borrowed(piece)));
        };
        if piece.is_empty() {
            // The end of the stream: a hello cut short is never sent, its rest would pass
            // unchecked on another connection's words.
            if held.is_empty() {
                return Ok(Some(Cow::Borrowed(piece)));
            }
            return Err((
                Reason::MalformedRequest,
                "the stream's TLS ClientHello stopped before it was complete".to_owned(),
            ));
        }
        held.extend_from_slice(piece);
        match peek_sni(held) {
            Ok(SniPeek::NeedMore) if held.len() < MAX_PEEK_LEN => return Ok(None),
            Ok(SniPeek::NeedMore) | Err(_) => {
                return Err((
                    Reason::MalformedRequest,
                    "the stream's TLS ClientHello is malformed or oversized".to_owned(),
                ));
            }
            Ok(SniPeek::Hello { sni, .. }) if !sni_matches_authority(sni.as_deref(), self.host) => {
                return Err((
                    Reason::InvalidTarget,
                    format!(
                        "the TLS server name `{}` is not the SOCKS host `{}`",
                        sni.as_deref().unwrap_or("(none)"),
                        self.host
                    ),
                ));
            }
            Ok(SniPeek::Hello { .. } | SniPeek::NotTls) => {}
        }
        Ok(self.held.take().map(Cow::Owned))
    }
}

/// How the client's direction of a relay stopped early.
enum Stop {
    Sentinel { service: String, up: u64 },
    Refused { reason: Reason, message: String },
}

/// Relays `client` and `upstream` both ways until both directions end, as
/// `tokio::io::copy_bidirectional` does, judging the client's first bytes against `host`
/// (see [`FirstBytes`]) and watching all of them with `scan`, if any.
pub(crate) async fn relay(
    client: &mut TcpStream,
    upstream: &mut TcpStream,
    host: &str,
    scan: Option<&SentinelScan>,
) -> io::Result<Relayed> {
    let (mut client_r, mut client_w) = client.split();
    let (mut up_r, mut up_w) = upstream.split();
    // What came back so far, for the record of a connection given up mid-stream.
    let down_bytes = AtomicU64::new(0);
    let up = async {
        let mut first = FirstBytes::new(host);
        let mut watch = scan.map(Watch::new);
        let mut buf = vec![0u8; CHUNK];
        let mut total = 0u64;
        loop {
            let n = client_r.read(&mut buf).await?;
            // Until the first bytes are judged, the pieces are held and sent as one.
            let piece = match first.admit(buf.get(..n).unwrap_or_default()) {
                Ok(Some(piece)) => piece,
                Ok(None) => continue,
                Err((reason, message)) => {
                    return Ok::<_, io::Error>(Err(Stop::Refused { reason, message }));
                }
            };
            let piece = piece.as_ref();
            if !piece.is_empty() {
                if let Some(Err(service)) = watch.as_mut().map(|w| w.pass(piece)) {
                    let service = service.to_owned();
                    return Ok(Err(Stop::Sentinel { service, up: total }));
                }
                up_w.write_all(piece).await?;
                total += piece.len() as u64;
            }
            if n == 0 {
                up_w.shutdown().await?;
                return Ok(Ok(total));
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let n = up_r.read(&mut buf).await?;
            if n == 0 {
                client_w.shutdown().await?;
                return Ok::<_, io::Error>(down_bytes.load(Ordering::Relaxed));
            }
            client_w.write_all(buf.get(..n).unwrap_or_default()).await?;
            down_bytes.fetch_add(n as u64, Ordering::Relaxed);
        }
    };
    tokio::pin!(up, down);
    let (mut up_done, mut down_done) = (None, None);
    while up_done.is_none() || down_done.is_none() {
        tokio::select! {
            r = &mut up, if up_done.is_none() => match r? {
                Ok(n) => up_done = Some(n),
                Err(Stop::Sentinel { service, up }) => {
                    return Ok(Relayed::Sentinel {
                        service,
                        up,
                        down: down_bytes.load(Ordering::Relaxed),
                    });
                }
                Err(Stop::Refused { reason, message }) => {
                    return Ok(Relayed::Refused {
                        reason,
                        message,
                        down: down_bytes.load(Ordering::Relaxed),
                    });
                }
            },
            r = &mut down, if down_done.is_none() => down_done = Some(r?),
        }
    }
    Ok(Relayed::Done {
        up: up_done.unwrap_or(0),
        down: down_done.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::panic, reason = "tests")]
    use super::*;
    use std::collections::BTreeMap;

    fn scan() -> SentinelScan {
        let sentinels = BTreeMap::from([
            (
                "github".to_owned(),
                "capgate-sentinel-github-0123456789abcdef0123456789abcdef".to_owned(),
            ),
            (
                "npm".to_owned(),
                "capgate-sentinel-npm-ffffffffffffffffffffffffffffffff".to_owned(),
            ),
        ]);
        let pairs: Vec<(String, String)> = sentinels
            .into_iter()
            .map(|(service, sentinel)| (sentinel, service))
            .collect();
        SentinelScan::new(&pairs).unwrap()
    }

    #[test]
    fn each_sentinel_is_found_in_any_letter_case_and_nothing_else() {
        let s = scan();
        assert_eq!(
            s.find(b"x: CAPGATE-SENTINEL-GITHUB-0123456789ABCDEF0123456789ABCDEF\r\n"),
            Some("github")
        );
        assert_eq!(
            s.find(b"capgate-sentinel-npm-ffffffffffffffffffffffffffffffff"),
            Some("npm")
        );
        assert_eq!(
            s.find(b"capgate-sentinel-npm-fffffffffffffffffffffffffffffff"),
            None
        );
        assert_eq!(s.find(b"capgate-sentinel-github-"), None);
        assert!(SentinelScan::new(&[]).is_none());
    }

    proptest::proptest! {
        /// However a stream is cut into pieces, and wherever a sentinel (in any letter
        /// case) lies in it, the pieces passed never hold the whole sentinel, and the
        /// piece refused is the one that completes it; a stream without one passes whole.
        #[test]
        fn no_cut_lets_a_whole_sentinel_pass(
            before in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            after in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..100),
            upper in proptest::prelude::any::<bool>(),
            leak in proptest::prelude::any::<bool>(),
            cuts in proptest::collection::vec(1usize..40, 1..40),
        ) {
            let s = scan();
            let sentinel = "capgate-sentinel-npm-ffffffffffffffffffffffffffffffff";
            let inserted = if upper { sentinel.to_uppercase() } else { sentinel.to_owned() };
            let mut stream = before.clone();
            if leak {
                stream.extend_from_slice(inserted.as_bytes());
            }
            stream.extend_from_slice(&after);
            // The random bytes around it must not hold a sentinel themselves.
            proptest::prop_assume!(s.find(&before).is_none() && s.find(&after).is_none());
            let mut watch = Watch::new(&s);
            let (mut sent, mut at, mut refused) = (Vec::new(), 0usize, None);
            for cut in cuts.iter().cycle() {
                if at >= stream.len() {
                    break;
                }
                let piece = &stream[at..(at + cut).min(stream.len())];
                match watch.pass(piece) {
                    Ok(()) => sent.extend_from_slice(piece),
                    Err(service) => {
                        refused = Some((service, at + piece.len()));
                        break;
                    }
                }
                at += piece.len();
            }
            proptest::prop_assert!(s.find(&sent).is_none());
            if leak {
                let end = before.len() + sentinel.len();
                let (service, upto) = refused.unwrap();
                proptest::prop_assert_eq!(service, "npm");
                // Refused by the piece that reaches the sentinel's last byte, not earlier.
                proptest::prop_assert!(upto >= end && sent.len() < end, "{} {}", upto, sent.len());
            } else {
                proptest::prop_assert!(refused.is_none());
                proptest::prop_assert_eq!(sent, stream);
            }
        }
    }

    /// Through a real loopback relay: a sentinel cut across the client's writes is not
    /// completed upstream, and the relay says whose it was; without one, bytes pass both
    /// ways and the counts add up.
    #[tokio::test]
    async fn a_sentinel_cut_across_writes_is_caught_before_its_end_leaves() {
        use tokio::net::TcpListener;
        let s = scan();
        let sentinel = "capgate-sentinel-github-0123456789abcdef0123456789abcdef";
        for leak in [true, false] {
            let front = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let back = TcpListener::bind("127.0.0.1:0").await.unwrap();
            let (front_at, back_at) = (front.local_addr().unwrap(), back.local_addr().unwrap());
            let client = tokio::spawn(async move {
                let mut c = TcpStream::connect(front_at).await.unwrap();
                let body = if leak {
                    format!("token={sentinel}")
                } else {
                    "token=harmless".to_owned()
                };
                let (a, b) = body.split_at(body.len() - 10);
                c.write_all(a.as_bytes()).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                c.write_all(b.as_bytes()).await.unwrap();
                c.shutdown().await.unwrap();
                let mut back = Vec::new();
                let _ = c.read_to_end(&mut back).await;
                back
            });
            let upstream = tokio::spawn(async move {
                let (mut u, _) = back.accept().await.unwrap();
                let mut got = Vec::new();
                let _ = u.read_to_end(&mut got).await;
                let _ = u.write_all(b"pong").await;
                got
            });
            let (mut c, _) = front.accept().await.unwrap();
            let mut u = TcpStream::connect(back_at).await.unwrap();
            let relayed = relay(&mut c, &mut u, "upstream.test", Some(&s))
                .await
                .unwrap();
            drop((c, u));
            let seen = upstream.await.unwrap();
            let answer = client.await.unwrap();
            if leak {
                let Relayed::Sentinel { service, up, down } = relayed else {
                    panic!("{relayed:?}")
                };
                assert_eq!(service, "github");
                assert_eq!(down, 0);
                // The first write went (unless both came in one read); the second did not.
                let first = ("token=".len() + sentinel.len() - 10) as u64;
                assert!(up == first || up == 0, "{up}");
                assert_eq!(seen.len() as u64, up);
                let seen = String::from_utf8_lossy(&seen);
                assert!(!seen.contains(sentinel), "{seen}");
                assert!(answer.is_empty());
            } else {
                assert_eq!(relayed, Relayed::Done { up: 14, down: 4 });
                assert_eq!(seen, b"token=harmless");
                assert_eq!(answer, b"pong");
            }
        }
    }
}

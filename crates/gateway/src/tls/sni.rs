//! A small, bounds-checked reader of the TLS ClientHello at the start of a tunnel.
//!
//! The gateway peeks at the first bytes a client sends through a CONNECT tunnel to learn the
//! server name (SNI) and the ALPN protocols it offers, without terminating TLS. The parser
//! reads only what it needs, checks every length against the bytes it has, and never panics.

use std::net::IpAddr;

use rustls_pki_types::DnsName;

use super::TlsError;

/// The largest ClientHello handshake message accepted (header included), in bytes.
pub const MAX_CLIENT_HELLO_LEN: usize = 16 * 1024;

/// The most bytes [`peek_sni`] ever asks for: a ClientHello of [`MAX_CLIENT_HELLO_LEN`] bytes
/// plus the headers of the records that carry it (one KiB of them, two hundred records).
/// A caller that buffers this many bytes gets an answer other than [`SniPeek::NeedMore`].
pub const MAX_PEEK_LEN: usize = MAX_CLIENT_HELLO_LEN + 1024;

/// The largest TLS plaintext record payload (RFC 8446 §5.1).
const MAX_RECORD_PAYLOAD: usize = 16 * 1024;
const RECORD_HEADER_LEN: usize = 5;
const HANDSHAKE_HEADER_LEN: usize = 4;
const CONTENT_TYPE_HANDSHAKE: u8 = 22;
const HANDSHAKE_TYPE_CLIENT_HELLO: u8 = 1;
const EXTENSION_SERVER_NAME: u16 = 0;
const EXTENSION_ALPN: u16 = 16;
const SERVER_NAME_TYPE_HOST_NAME: u8 = 0;
/// The longest DNS name.
const MAX_HOST_NAME_LEN: usize = 253;

/// What the first bytes of a tunnel say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SniPeek {
    /// The bytes so far are the start of a TLS ClientHello; read more and peek again.
    NeedMore,
    /// The bytes are not TLS (plain HTTP, SSH, an SSLv2 hello, …).
    NotTls,
    /// A complete ClientHello.
    Hello {
        /// The `host_name` of the server_name extension, as sent (ASCII; a DNS name or, from
        /// misbehaving clients, an IP literal).
        sni: Option<String>,
        /// The ALPN protocols offered, in order (non-UTF-8 bytes replaced).
        alpn: Vec<String>,
    },
}

/// Reads the TLS ClientHello at the start of `buf`.
///
/// Returns [`SniPeek::NeedMore`] while `buf` holds an incomplete but so far well-formed
/// ClientHello, [`SniPeek::NotTls`] when the first bytes are not a TLS handshake record, and
/// [`SniPeek::Hello`] once the whole ClientHello is there (it may span several records;
/// bytes after it are ignored). A malformed hello, or one longer than
/// [`MAX_CLIENT_HELLO_LEN`] (or needing more than [`MAX_PEEK_LEN`] bytes of records), is an
/// error.
pub fn peek_sni(buf: &[u8]) -> Result<SniPeek, TlsError> {
    // The first record header decides whether this is TLS at all.
    match buf {
        [] => return Ok(SniPeek::NeedMore),
        [first, ..] if *first != CONTENT_TYPE_HANDSHAKE => return Ok(SniPeek::NotTls),
        [_] => return Ok(SniPeek::NeedMore),
        [_, major, ..] if *major != 3 => return Ok(SniPeek::NotTls),
        _ => {}
    }
    match reassemble_client_hello(buf)? {
        Some(body) => parse_client_hello(&body),
        None => Ok(SniPeek::NeedMore),
    }
}

/// Collects the ClientHello handshake message body from the handshake records at the start
/// of `buf`, or `None` when more bytes are needed.
fn reassemble_client_hello(buf: &[u8]) -> Result<Option<Vec<u8>>, TlsError> {
    let mut message: Vec<u8> = Vec::new();
    let mut offset = 0usize;
    loop {
        // The limit holds however much the caller buffered: a hello that does not end within
        // the first MAX_PEEK_LEN bytes is refused, whether they are all here or not.
        if offset + RECORD_HEADER_LEN > MAX_PEEK_LEN {
            return Err(TlsError::ClientHelloTooLarge {
                needed: offset + RECORD_HEADER_LEN,
                max: MAX_PEEK_LEN,
            });
        }
        let Some(header) = buf.get(offset..offset + RECORD_HEADER_LEN) else {
            return need_more(offset + RECORD_HEADER_LEN);
        };
        let &[content_type, major, _minor, len_hi, len_lo] = header else {
            return need_more(offset + RECORD_HEADER_LEN);
        };
        if content_type != CONTENT_TYPE_HANDSHAKE {
            return malformed("a non-handshake record interrupts the ClientHello");
        }
        if major != 3 {
            return malformed("record version is not TLS");
        }
        let payload_len = usize::from(u16::from_be_bytes([len_hi, len_lo]));
        if payload_len == 0 {
            return malformed("empty handshake record");
        }
        if payload_len > MAX_RECORD_PAYLOAD {
            return malformed("record longer than 16 KiB");
        }
        let payload_start = offset + RECORD_HEADER_LEN;
        let payload_end = payload_start + payload_len;
        // Take what this record holds, even when it is not all there yet, so the length of
        // the message is known as early as possible.
        let available = buf
            .get(payload_start..payload_end.min(buf.len()))
            .unwrap_or(&[]);
        let before = message.len();
        message.extend_from_slice(available);

        if let Some(&[msg_type, l0, l1, l2]) = message.get(..HANDSHAKE_HEADER_LEN) {
            if msg_type != HANDSHAKE_TYPE_CLIENT_HELLO {
                return malformed("the first handshake message is not a ClientHello");
            }
            let body_len = u32::from_be_bytes([0, l0, l1, l2]) as usize;
            let total = HANDSHAKE_HEADER_LEN + body_len;
            if total > MAX_CLIENT_HELLO_LEN {
                return Err(TlsError::ClientHelloTooLarge {
                    needed: total,
                    max: MAX_CLIENT_HELLO_LEN,
                });
            }
            // Where in `buf` the hello ends, if it ends in this record.
            let hello_end = payload_start + total.saturating_sub(before);
            if hello_end <= payload_end && hello_end > MAX_PEEK_LEN {
                return Err(TlsError::ClientHelloTooLarge {
                    needed: hello_end,
                    max: MAX_PEEK_LEN,
                });
            }
            if message.len() >= total {
                let body = message.get(HANDSHAKE_HEADER_LEN..total).unwrap_or(&[]);
                return Ok(Some(body.to_vec()));
            }
        }
        if payload_end > buf.len() {
            return need_more(payload_end);
        }
        offset = payload_end;
    }
}

/// `NeedMore`, unless the bytes needed exceed [`MAX_PEEK_LEN`].
fn need_more<T>(needed: usize) -> Result<Option<T>, TlsError> {
    if needed > MAX_PEEK_LEN {
        return Err(TlsError::ClientHelloTooLarge {
            needed,
            max: MAX_PEEK_LEN,
        });
    }
    Ok(None)
}

fn malformed<T>(reason: &'static str) -> Result<T, TlsError> {
    Err(TlsError::MalformedClientHello { reason })
}

/// A cursor over a byte slice whose every read is checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn new(bytes: &'a [u8]) -> Self {
        Self { bytes }
    }

    fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }

    fn take(&mut self, len: usize, what: &'static str) -> Result<&'a [u8], TlsError> {
        if len > self.bytes.len() {
            return malformed(what);
        }
        let (head, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(head)
    }

    fn u8(&mut self, what: &'static str) -> Result<u8, TlsError> {
        match self.take(1, what)? {
            &[byte] => Ok(byte),
            _ => malformed(what),
        }
    }

    fn u16(&mut self, what: &'static str) -> Result<u16, TlsError> {
        match self.take(2, what)? {
            &[hi, lo] => Ok(u16::from_be_bytes([hi, lo])),
            _ => malformed(what),
        }
    }

    /// A vector with a one-byte length prefix.
    fn vec_u8(&mut self, what: &'static str) -> Result<&'a [u8], TlsError> {
        let len = self.u8(what)?;
        self.take(usize::from(len), what)
    }

    /// A vector with a two-byte length prefix.
    fn vec_u16(&mut self, what: &'static str) -> Result<&'a [u8], TlsError> {
        let len = self.u16(what)?;
        self.take(usize::from(len), what)
    }
}

/// Parses a ClientHello body (RFC 8446 §4.1.2) for its server name and ALPN protocols.
fn parse_client_hello(body: &[u8]) -> Result<SniPeek, TlsError> {
    let mut hello = Reader::new(body);
    hello.take(2, "truncated legacy_version")?;
    hello.take(32, "truncated random")?;
    let session_id = hello.vec_u8("truncated legacy_session_id")?;
    if session_id.len() > 32 {
        return malformed("legacy_session_id longer than 32 bytes");
    }
    let suites = hello.vec_u16("truncated cipher_suites")?;
    if suites.is_empty() || suites.len() % 2 != 0 {
        return malformed("cipher_suites is empty or of odd length");
    }
    if hello
        .vec_u8("truncated legacy_compression_methods")?
        .is_empty()
    {
        return malformed("legacy_compression_methods is empty");
    }
    let mut sni = None;
    let mut alpn = Vec::new();
    if hello.is_empty() {
        // A hello without extensions (TLS 1.2 and older) names no server.
        return Ok(SniPeek::Hello { sni, alpn });
    }
    let mut extensions = Reader::new(hello.vec_u16("truncated extensions")?);
    if !hello.is_empty() {
        return malformed("bytes after the extensions");
    }
    let mut seen: Vec<u16> = Vec::new();
    while !extensions.is_empty() {
        let ext_type = extensions.u16("truncated extension type")?;
        let data = extensions.vec_u16("truncated extension data")?;
        if seen.contains(&ext_type) {
            return malformed("an extension appears twice");
        }
        seen.push(ext_type);
        match ext_type {
            EXTENSION_SERVER_NAME => sni = parse_server_name(data)?,
            EXTENSION_ALPN => alpn = parse_alpn(data)?,
            _ => {}
        }
    }
    Ok(SniPeek::Hello { sni, alpn })
}

/// Parses the server_name extension (RFC 6066 §3) for its single `host_name`.
fn parse_server_name(data: &[u8]) -> Result<Option<String>, TlsError> {
    let mut ext = Reader::new(data);
    let mut list = Reader::new(ext.vec_u16("truncated server_name_list")?);
    if !ext.is_empty() {
        return malformed("bytes after server_name_list");
    }
    let mut host_name = None;
    while !list.is_empty() {
        let name_type = list.u8("truncated server name type")?;
        let name = list.vec_u16("truncated server name")?;
        if name_type != SERVER_NAME_TYPE_HOST_NAME {
            // Unknown name types are skipped, as RFC 6066 allows for future types.
            continue;
        }
        if host_name.is_some() {
            return malformed("more than one host_name in server_name");
        }
        host_name = Some(parse_host_name(name)?);
    }
    // An empty list is allowed only in a server's reply; from a client it means nothing
    // was named, which is what absence says too.
    Ok(host_name)
}

/// Checks a `host_name`: a DNS name (a trailing dot allowed), or an IP literal, which
/// [`sni_matches_authority`] then treats as no name.
fn parse_host_name(name: &[u8]) -> Result<String, TlsError> {
    if name.is_empty() {
        return malformed("empty host_name");
    }
    if name.len() > MAX_HOST_NAME_LEN + 1 {
        return malformed("host_name longer than a DNS name");
    }
    let Ok(text) = std::str::from_utf8(name) else {
        return malformed("host_name is not ASCII");
    };
    if !text.is_ascii() {
        return malformed("host_name is not ASCII");
    }
    let bare = text.strip_suffix('.').unwrap_or(text);
    if bare.parse::<IpAddr>().is_err() && DnsName::try_from(bare).is_err() {
        return malformed("host_name is not a DNS name");
    }
    Ok(text.to_owned())
}

/// Parses the ALPN extension (RFC 7301 §3.1).
fn parse_alpn(data: &[u8]) -> Result<Vec<String>, TlsError> {
    let mut ext = Reader::new(data);
    let mut list = Reader::new(ext.vec_u16("truncated protocol_name_list")?);
    if !ext.is_empty() {
        return malformed("bytes after protocol_name_list");
    }
    if list.is_empty() {
        return malformed("empty protocol_name_list");
    }
    let mut protocols = Vec::new();
    while !list.is_empty() {
        let protocol = list.vec_u8("truncated protocol name")?;
        if protocol.is_empty() {
            return malformed("empty protocol name");
        }
        protocols.push(String::from_utf8_lossy(protocol).into_owned());
    }
    Ok(protocols)
}

/// Whether the SNI a client sent names the host of the CONNECT authority it asked for
/// (`authority_host` is the authority without its port).
///
/// Names compare without ASCII case and without a trailing dot; an authority host may be an
/// IPv6 literal in brackets. An SNI that is an IP literal counts as no SNI, as in rustls
/// (RFC 6066 forbids literal addresses in `host_name`).
///
/// No SNI matches only an IP-literal authority: clients send no SNI to an address. For a
/// named authority, no SNI is `false`: an opaque tunnel must not carry TLS whose server the
/// gateway cannot tell. An intercepting caller may still accept a hello without SNI, since it
/// presents a leaf minted for the authority whatever the client sends.
pub fn sni_matches_authority(sni: Option<&str>, authority_host: &str) -> bool {
    let authority = normalize_host(authority_host);
    if authority.is_empty() {
        return false;
    }
    let sni = sni
        .map(normalize_host)
        .filter(|name| !name.is_empty() && name.parse::<IpAddr>().is_err());
    let authority_is_ip = authority.parse::<IpAddr>().is_ok();
    match sni {
        None => authority_is_ip,
        Some(name) => !authority_is_ip && name.eq_ignore_ascii_case(authority),
    }
}

/// Strips IPv6 brackets and one trailing dot.
fn normalize_host(host: &str) -> &str {
    if let Some(inner) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return inner;
    }
    host.strip_suffix('.').unwrap_or(host)
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::panic,
        reason = "tests"
    )]

    use super::*;

    /// A minimal ClientHello body with the given extensions block (None: no extensions).
    fn hello_body(extensions: Option<&[u8]>) -> Vec<u8> {
        let mut body = vec![3, 3];
        body.extend_from_slice(&[0u8; 32]);
        body.push(0); // session id
        body.extend_from_slice(&[0, 2, 0x13, 0x01]); // one suite
        body.extend_from_slice(&[1, 0]); // null compression
        if let Some(ext) = extensions {
            body.extend_from_slice(&u16::try_from(ext.len()).unwrap().to_be_bytes());
            body.extend_from_slice(ext);
        }
        body
    }

    fn handshake(body: &[u8]) -> Vec<u8> {
        let len = u32::try_from(body.len()).unwrap().to_be_bytes();
        let mut msg = vec![HANDSHAKE_TYPE_CLIENT_HELLO, len[1], len[2], len[3]];
        msg.extend_from_slice(body);
        msg
    }

    /// Splits a handshake message into records of at most `chunk` bytes.
    fn records(message: &[u8], chunk: usize) -> Vec<u8> {
        let mut out = Vec::new();
        for piece in message.chunks(chunk) {
            out.extend_from_slice(&[CONTENT_TYPE_HANDSHAKE, 3, 1]);
            out.extend_from_slice(&u16::try_from(piece.len()).unwrap().to_be_bytes());
            out.extend_from_slice(piece);
        }
        out
    }

    fn extension(ext_type: u16, data: &[u8]) -> Vec<u8> {
        let mut out = ext_type.to_be_bytes().to_vec();
        out.extend_from_slice(&u16::try_from(data.len()).unwrap().to_be_bytes());
        out.extend_from_slice(data);
        out
    }

    fn sni_ext(name: &[u8]) -> Vec<u8> {
        let mut entry = vec![SERVER_NAME_TYPE_HOST_NAME];
        entry.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
        entry.extend_from_slice(name);
        let mut list = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
        list.extend_from_slice(&entry);
        extension(EXTENSION_SERVER_NAME, &list)
    }

    #[test]
    fn hello_without_extensions_has_no_sni() {
        let wire = records(&handshake(&hello_body(None)), 1000);
        assert_eq!(
            peek_sni(&wire).unwrap(),
            SniPeek::Hello {
                sni: None,
                alpn: vec![]
            }
        );
    }

    #[test]
    fn hello_split_into_one_byte_records() {
        let ext = sni_ext(b"example.com");
        let message = handshake(&hello_body(Some(&ext)));
        let wire = records(&message, 1);
        assert!(wire.len() > MAX_CLIENT_HELLO_LEN / 200);
        let expected = SniPeek::Hello {
            sni: Some("example.com".into()),
            alpn: vec![],
        };
        // Tiny records cost 5 bytes of header each; this one still fits MAX_PEEK_LEN.
        assert_eq!(peek_sni(&wire).unwrap(), expected);
        for cut in 0..wire.len() {
            assert_eq!(
                peek_sni(&wire[..cut]).unwrap(),
                SniPeek::NeedMore,
                "cut {cut}"
            );
        }
    }

    #[test]
    fn largest_hello_across_two_records() {
        // Padding extension (21) brings the message to exactly MAX_CLIENT_HELLO_LEN.
        let sni = sni_ext(b"big.example");
        let base = handshake(&hello_body(Some(&sni))).len() + 4;
        let padding = extension(21, &vec![0; MAX_CLIENT_HELLO_LEN - base]);
        let mut ext = sni.clone();
        ext.extend_from_slice(&padding);
        let message = handshake(&hello_body(Some(&ext)));
        assert_eq!(message.len(), MAX_CLIENT_HELLO_LEN);
        let wire = records(&message, MAX_RECORD_PAYLOAD);
        assert!(matches!(
            peek_sni(&wire).unwrap(),
            SniPeek::Hello { sni: Some(name), .. } if name == "big.example"
        ));
        assert_eq!(
            peek_sni(&wire[..wire.len() - 1]).unwrap(),
            SniPeek::NeedMore
        );
    }

    #[test]
    fn oversized_hello_is_refused_from_its_header() {
        let wire = [CONTENT_TYPE_HANDSHAKE, 3, 1, 0, 4, 1, 0, 0x40, 0x01];
        assert!(matches!(
            peek_sni(&wire),
            Err(TlsError::ClientHelloTooLarge { needed: 16389, .. })
        ));
    }

    #[test]
    fn endless_tiny_records_are_refused() {
        // A hello of declared length 16 KiB sent one byte per record needs 6 bytes a byte.
        let mut message = vec![HANDSHAKE_TYPE_CLIENT_HELLO, 0, 0x3f, 0xf0];
        message.resize(4000, 0);
        let wire = records(&message, 1);
        assert!(matches!(
            peek_sni(&wire),
            Err(TlsError::ClientHelloTooLarge { .. })
        ));
    }

    #[test]
    fn complete_hello_ending_past_the_peek_limit_is_refused() {
        // 3000 bytes of hello in one-byte records: 18000 bytes on the wire, all present.
        let sni = sni_ext(b"far.example");
        let base = handshake(&hello_body(Some(&sni))).len() + 4;
        let ext = [sni.clone(), extension(21, &vec![0; 3000 - base])].concat();
        let message = handshake(&hello_body(Some(&ext)));
        assert_eq!(message.len(), 3000);
        let wire = records(&message, 1);
        assert!(matches!(
            peek_sni(&wire),
            Err(TlsError::ClientHelloTooLarge { .. })
        ));
        // The same hello in one record is fine.
        assert!(matches!(
            peek_sni(&records(&message, 4000)).unwrap(),
            SniPeek::Hello { .. }
        ));
    }

    #[test]
    fn not_tls() {
        assert_eq!(peek_sni(b"GET / HTTP/1.1\r\n").unwrap(), SniPeek::NotTls);
        assert_eq!(peek_sni(b"SSH-2.0-OpenSSH").unwrap(), SniPeek::NotTls);
        assert_eq!(peek_sni(&[0x16, 0x02]).unwrap(), SniPeek::NotTls);
        assert_eq!(peek_sni(&[0x80, 0x2e, 0x01]).unwrap(), SniPeek::NotTls);
        assert_eq!(peek_sni(&[]).unwrap(), SniPeek::NeedMore);
        assert_eq!(peek_sni(&[0x16]).unwrap(), SniPeek::NeedMore);
    }

    #[test]
    fn malformed_hellos() {
        let cases: Vec<(&str, Vec<u8>)> = vec![
            ("empty record", vec![22, 3, 1, 0, 0]),
            ("record too long", vec![22, 3, 1, 0x40, 0x01]),
            ("server hello", records(&[2, 0, 0, 1, 0], 100)),
            ("interrupted", {
                let mut w = records(&[1, 0, 0, 10, 0], 100);
                w.extend_from_slice(&[23, 3, 3, 0, 1, 0]);
                w
            }),
            ("short body", records(&handshake(&[3, 3, 0]), 100)),
            (
                "duplicate sni",
                records(
                    &handshake(&hello_body(Some(
                        &[sni_ext(b"a.example"), sni_ext(b"b.example")].concat(),
                    ))),
                    1000,
                ),
            ),
            (
                "bad name",
                records(&handshake(&hello_body(Some(&sni_ext(b"ab@cd.com")))), 1000),
            ),
            (
                "empty name",
                records(&handshake(&hello_body(Some(&sni_ext(b"")))), 1000),
            ),
            (
                "empty alpn",
                records(
                    &handshake(&hello_body(Some(&extension(EXTENSION_ALPN, &[0, 0])))),
                    1000,
                ),
            ),
            (
                "trailing bytes",
                records(&handshake(&[hello_body(Some(&[])), vec![0]].concat()), 1000),
            ),
        ];
        for (name, wire) in cases {
            assert!(
                matches!(peek_sni(&wire), Err(TlsError::MalformedClientHello { .. })),
                "{name}: {:?}",
                peek_sni(&wire)
            );
        }
    }

    #[test]
    fn ip_literal_sni_is_reported_and_then_ignored() {
        let wire = records(&handshake(&hello_body(Some(&sni_ext(b"1.1.1.1")))), 1000);
        let SniPeek::Hello { sni, .. } = peek_sni(&wire).unwrap() else {
            panic!("not a hello");
        };
        assert_eq!(sni.as_deref(), Some("1.1.1.1"));
        assert!(!sni_matches_authority(sni.as_deref(), "1.1.1.2.example"));
        assert!(sni_matches_authority(sni.as_deref(), "1.1.1.1"));
    }
}

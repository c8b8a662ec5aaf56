//! The gateway's strict HTTP/1.1 codec: pure functions over byte slices.
//!
//! The proxy does the I/O; this module decides what a message head and a chunked body mean,
//! and refuses anything that two parsers could read differently (request smuggling,
//! parser differentials). It never hands back raw bytes to forward: the proxy re-serialises
//! every head with [`write_request_head`] / [`write_response_head`] and re-chunks every
//! chunked body with [`write_chunk`] / [`write_last_chunk`].
//!
//! Decisions taken here (each refusal is one [`H1Error`] variant):
//! - every line of a head, of a chunk-size line and of a trailer ends in CRLF; a bare LF or a
//!   bare CR anywhere is refused, as is obsolete line folding (a field line starting with SP
//!   or HTAB, including before the first header) and an empty line before the start line;
//! - header values may hold HTAB, SP, visible ASCII and obs-text (0x80–0xFF, as Go does);
//!   every other control byte (NUL, DEL, …) is refused;
//! - framing is unambiguous or refused: Content-Length together with Transfer-Encoding, two
//!   Content-Length lines (even equal ones, in requests), list or signed values, more than 19
//!   digits; Transfer-Encoding must be one line whose value is `chunked` (anything else is
//!   501) and is refused on HTTP/1.0;
//! - request targets hold visible ASCII only, never `\` or `#`, and well-formed `%XX`
//!   escapes; an origin-form target may not start with `//` (scheme-relative to URL
//!   parsers); absolute-form targets may not carry userinfo (`http://allowed.com@evil.com/`);
//!   CONNECT needs `host:port` and only CONNECT may use it; `*` is only for OPTIONS;
//! - hosts (Host header, absolute-form and CONNECT authorities) are `[A-Za-z0-9._~-]` names
//!   or bracketed IPv6 literals without zone, with an optional port 1–65535 written without
//!   leading zeros; percent-encoding in a host is refused;
//! - a Host header that differs from an absolute-form authority is not refused: both are in
//!   the [`RequestHead`] and the proxy decides;
//! - an HTTP/1.1 request needs exactly one Host header, except CONNECT (as in Go), where it
//!   stays optional; an `Expect` other than `100-continue` is 417.
#![deny(clippy::indexing_slicing, clippy::arithmetic_side_effects)]

use std::fmt;
use std::net::Ipv6Addr;

/// Size bounds applied while parsing. [`Limits::default`] gives the gateway's values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest head (start line, header lines and the final empty line), in bytes. 431 above.
    pub max_head_bytes: usize,
    /// Most header lines in one head. 431 above.
    pub max_headers: usize,
    /// Longest request target, in bytes. 414 above.
    pub max_target_bytes: usize,
    /// Longest chunk-size line, extensions included, CRLF excluded.
    pub max_chunk_line: usize,
    /// Largest trailer section of a chunked body, final CRLF included.
    pub max_trailer_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_head_bytes: 32 * 1024,
            max_headers: 100,
            max_target_bytes: 8 * 1024,
            max_chunk_line: 4 * 1024,
            max_trailer_bytes: 16 * 1024,
        }
    }
}

/// The HTTP versions the codec speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Version {
    /// `HTTP/1.0`
    Http10,
    /// `HTTP/1.1`
    Http11,
}

/// A request target in one of the four forms of RFC 9112 §3.2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// `/path?query`, as written.
    Origin(String),
    /// `scheme://authority/path?query` (proxy requests). `scheme` is lowercased,
    /// `authority` is `host[:port]` as written (never userinfo), `path_and_query` starts with
    /// `/` (an empty path is given as `/`).
    Absolute {
        /// Lowercased scheme.
        scheme: String,
        /// `host[:port]` as written.
        authority: String,
        /// Path and query, starting with `/`.
        path_and_query: String,
    },
    /// `host:port`, only for CONNECT. `host` is as written; IPv6 literals keep their brackets.
    Authority {
        /// Host as written.
        host: String,
        /// Port, 1–65535.
        port: u16,
    },
    /// `*`, only for OPTIONS.
    Asterisk,
}

impl fmt::Display for Target {
    /// The target as it goes on the request line.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Origin(path) => f.write_str(path),
            Self::Absolute {
                scheme,
                authority,
                path_and_query,
            } => write!(f, "{scheme}://{authority}{path_and_query}"),
            Self::Authority { host, port } => write!(f, "{host}:{port}"),
            Self::Asterisk => f.write_str("*"),
        }
    }
}

/// One header field line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// Field name as sent (a validated token when parsed).
    pub name: String,
    /// Field value with leading and trailing SP/HTAB removed.
    pub value: Vec<u8>,
}

impl Header {
    /// A header from a name and a value. Not validated here: the writers refuse invalid ones.
    pub fn new(name: impl Into<String>, value: impl Into<Vec<u8>>) -> Self {
        Self {
            name: name.into(),
            value: value.into(),
        }
    }

    /// Whether this header is named `name` (ASCII case-insensitive).
    pub fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name)
    }
}

/// How the message body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    None,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked; decode with [`ChunkedDecoder`].
    Chunked,
    /// Until the server closes the connection (responses only).
    CloseDelimited,
}

/// A parsed request head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// Method token, case-sensitive as sent.
    pub method: String,
    /// Request target.
    pub target: Target,
    /// Protocol version.
    pub version: Version,
    /// Header lines in order, names as sent.
    pub headers: Vec<Header>,
    /// Body framing.
    pub framing: Framing,
    /// Whether the client wants the connection kept open after this exchange.
    pub keep_alive: bool,
}

impl RequestHead {
    /// Value of the first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }

    /// Value of the Host header (validated, at most one). `Some("")` for an empty Host.
    pub fn host(&self) -> Option<&str> {
        self.header("host")
            .and_then(|value| std::str::from_utf8(value).ok())
    }
}

/// A parsed response head.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// Protocol version.
    pub version: Version,
    /// Status code, 100–599.
    pub status: u16,
    /// Reason phrase, possibly empty (obs-text bytes are replaced by U+FFFD).
    pub reason: String,
    /// Header lines in order, names as sent.
    pub headers: Vec<Header>,
    /// Body framing, given the request method.
    pub framing: Framing,
    /// Whether the connection may be reused after this response.
    pub keep_alive: bool,
}

impl ResponseHead {
    /// Value of the first header named `name` (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        find_header(&self.headers, name)
    }
}

/// The result of parsing a head from a buffer that may not hold all of it yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Parsed<T> {
    /// The head is complete; it took the first `consumed` bytes (the body or the next
    /// message starts there).
    Complete {
        /// The parsed head.
        head: T,
        /// Bytes of the buffer the head took.
        consumed: usize,
    },
    /// More bytes are needed; nothing in the buffer so far is wrong.
    Partial,
}

/// Why a message was refused. [`H1Error::status`] gives the status of the client-facing
/// refusal; for a refused *response* the proxy answers 502 instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum H1Error {
    /// The head is longer than [`Limits::max_head_bytes`].
    #[error("message head larger than {limit} bytes")]
    HeadTooLarge {
        /// The limit.
        limit: usize,
    },
    /// More header lines than [`Limits::max_headers`].
    #[error("more than {limit} header fields")]
    TooManyHeaders {
        /// The limit.
        limit: usize,
    },
    /// A line ends in LF without CR.
    #[error("bare LF line ending")]
    BareLf,
    /// A CR not followed by LF.
    #[error("bare CR in message")]
    BareCr,
    /// A field line starting with SP or HTAB.
    #[error("obsolete line folding")]
    ObsoleteLineFolding,
    /// The message starts with an empty line.
    #[error("empty line before the start line")]
    LeadingEmptyLine,
    /// The request line is not `method SP target SP version`.
    #[error("malformed request line")]
    MalformedRequestLine,
    /// The method is not a token.
    #[error("invalid method")]
    InvalidMethod,
    /// The request target has a forbidden byte or an unknown form.
    #[error("invalid request target")]
    InvalidTarget,
    /// The request target is longer than [`Limits::max_target_bytes`].
    #[error("request target longer than {limit} bytes")]
    TargetTooLong {
        /// The limit.
        limit: usize,
    },
    /// The version is not `HTTP/DIGIT.DIGIT`.
    #[error("malformed HTTP version")]
    MalformedVersion,
    /// A well-formed version other than 1.0 and 1.1.
    #[error("unsupported HTTP version")]
    UnsupportedVersion,
    /// An absolute-form or CONNECT target with `user@`.
    #[error("userinfo in request target")]
    UserinfoInTarget,
    /// The authority of a target is not `host[:port]`.
    #[error("invalid authority in request target")]
    InvalidAuthority,
    /// A CONNECT target that is not authority-form (a path, an absolute URI).
    #[error("a connect request needs a `host:port` target")]
    ConnectTargetNotAuthority,
    /// A CONNECT target without a port.
    #[error("connect target without a port")]
    ConnectWithoutPort,
    /// `*` on a method other than OPTIONS.
    #[error("asterisk target outside OPTIONS")]
    AsteriskOutsideOptions,
    /// A header line without `:`.
    #[error("header line without a colon")]
    MissingColon,
    /// A header name that is empty or not a token.
    #[error("invalid header name")]
    InvalidHeaderName,
    /// SP or HTAB between a header name and the colon.
    #[error("whitespace between header name and colon")]
    WhitespaceBeforeColon,
    /// A control byte in a header value.
    #[error("invalid character in `{name}` header value")]
    InvalidHeaderValue {
        /// Header name (truncated).
        name: String,
    },
    /// An HTTP/1.1 request without Host.
    #[error("missing Host header")]
    MissingHost,
    /// More than one Host header.
    #[error("multiple Host headers")]
    DuplicateHost,
    /// A Host value that is not `host[:port]`.
    #[error("invalid Host header")]
    InvalidHost,
    /// Both Content-Length and Transfer-Encoding.
    #[error("both Content-Length and Transfer-Encoding")]
    ContentLengthAndTransferEncoding,
    /// Two Content-Length lines with the same value (requests).
    #[error("duplicate Content-Length headers")]
    DuplicateContentLength,
    /// Two Content-Length lines with different values.
    #[error("conflicting Content-Length headers")]
    ConflictingContentLength,
    /// A Content-Length value that is a list (`5, 5`).
    #[error("list value in Content-Length")]
    ContentLengthList,
    /// A Content-Length value that is not 1*DIGIT.
    #[error("invalid Content-Length value")]
    InvalidContentLength,
    /// A Content-Length value of more than 19 digits.
    #[error("oversized Content-Length value")]
    ContentLengthTooLarge,
    /// More than one Transfer-Encoding line.
    #[error("multiple Transfer-Encoding headers")]
    DuplicateTransferEncoding,
    /// A Transfer-Encoding value other than `chunked`.
    #[error("unsupported transfer coding")]
    UnsupportedTransferEncoding,
    /// Transfer-Encoding in an HTTP/1.0 message.
    #[error("transfer coding in an HTTP/1.0 message")]
    TransferEncodingHttp10,
    /// An Expect value other than `100-continue`.
    #[error("unsupported expectation")]
    UnsupportedExpectation,
    /// A Connection value that is not a list of tokens.
    #[error("invalid Connection header")]
    InvalidConnection,
    /// The status line is not `version SP 3DIGIT [SP reason]`.
    #[error("malformed status line")]
    MalformedStatusLine,
    /// A status code outside 100–599.
    #[error("invalid status code")]
    InvalidStatus,
    /// A control byte in a reason phrase.
    #[error("invalid reason phrase")]
    InvalidReason,
    /// A chunk size that is empty or not bare hex digits.
    #[error("invalid chunk size")]
    InvalidChunkSize,
    /// A chunk size of more than 16 hex digits.
    #[error("chunk size overflow")]
    ChunkSizeOverflow,
    /// A chunk-size line longer than [`Limits::max_chunk_line`].
    #[error("chunk size line longer than {limit} bytes")]
    ChunkLineTooLong {
        /// The limit.
        limit: usize,
    },
    /// A control byte in a chunk extension.
    #[error("invalid chunk extension")]
    InvalidChunkExtension,
    /// Chunk data not followed by exactly CRLF.
    #[error("chunk data not followed by CRLF")]
    MissingChunkCrlf,
    /// A trailer section longer than [`Limits::max_trailer_bytes`].
    #[error("trailer section larger than {limit} bytes")]
    TrailerTooLarge {
        /// The limit.
        limit: usize,
    },
    /// A trailer field that could change framing or routing.
    #[error("trailer field `{name}` not allowed")]
    ForbiddenTrailer {
        /// Lowercased field name.
        name: String,
    },
    /// The connection ended before the last chunk and its trailer section.
    #[error("chunked body ended before the last chunk")]
    IncompleteChunkedBody,
}

impl H1Error {
    /// Status code of the refusal sent to the client: 400, or 414 for a long target, 417 for
    /// an unsupported Expect, 431 for an oversized head, 501 for an unsupported transfer
    /// coding, 505 for an unsupported version.
    pub fn status(&self) -> u16 {
        match self {
            Self::HeadTooLarge { .. } | Self::TooManyHeaders { .. } => 431,
            Self::TargetTooLong { .. } => 414,
            Self::UnsupportedExpectation => 417,
            Self::UnsupportedTransferEncoding => 501,
            Self::UnsupportedVersion => 505,
            _ => 400,
        }
    }

    /// Stable snake_case code for logs and the reason header.
    pub fn code(&self) -> &'static str {
        match self {
            Self::HeadTooLarge { .. } => "head_too_large",
            Self::TooManyHeaders { .. } => "too_many_headers",
            Self::BareLf => "bare_lf",
            Self::BareCr => "bare_cr",
            Self::ObsoleteLineFolding => "obsolete_line_folding",
            Self::LeadingEmptyLine => "leading_empty_line",
            Self::MalformedRequestLine => "malformed_request_line",
            Self::InvalidMethod => "invalid_method",
            Self::InvalidTarget => "invalid_target",
            Self::TargetTooLong { .. } => "target_too_long",
            Self::MalformedVersion => "malformed_version",
            Self::UnsupportedVersion => "unsupported_version",
            Self::UserinfoInTarget => "userinfo_in_target",
            Self::InvalidAuthority => "invalid_authority",
            Self::ConnectTargetNotAuthority => "connect_target_not_authority",
            Self::ConnectWithoutPort => "connect_without_port",
            Self::AsteriskOutsideOptions => "asterisk_outside_options",
            Self::MissingColon => "missing_colon",
            Self::InvalidHeaderName => "invalid_header_name",
            Self::WhitespaceBeforeColon => "whitespace_before_colon",
            Self::InvalidHeaderValue { .. } => "invalid_header_value",
            Self::MissingHost => "missing_host",
            Self::DuplicateHost => "duplicate_host",
            Self::InvalidHost => "invalid_host",
            Self::ContentLengthAndTransferEncoding => "content_length_and_transfer_encoding",
            Self::DuplicateContentLength => "duplicate_content_length",
            Self::ConflictingContentLength => "conflicting_content_length",
            Self::ContentLengthList => "content_length_list",
            Self::InvalidContentLength => "invalid_content_length",
            Self::ContentLengthTooLarge => "content_length_too_large",
            Self::DuplicateTransferEncoding => "duplicate_transfer_encoding",
            Self::UnsupportedTransferEncoding => "unsupported_transfer_encoding",
            Self::TransferEncodingHttp10 => "transfer_encoding_http10",
            Self::UnsupportedExpectation => "unsupported_expectation",
            Self::InvalidConnection => "invalid_connection",
            Self::MalformedStatusLine => "malformed_status_line",
            Self::InvalidStatus => "invalid_status",
            Self::InvalidReason => "invalid_reason",
            Self::InvalidChunkSize => "invalid_chunk_size",
            Self::ChunkSizeOverflow => "chunk_size_overflow",
            Self::ChunkLineTooLong { .. } => "chunk_line_too_long",
            Self::InvalidChunkExtension => "invalid_chunk_extension",
            Self::MissingChunkCrlf => "missing_chunk_crlf",
            Self::TrailerTooLarge { .. } => "trailer_too_large",
            Self::ForbiddenTrailer { .. } => "forbidden_trailer",
            Self::IncompleteChunkedBody => "incomplete_chunked_body",
        }
    }
}

/// Headers that describe one connection, never forwarded: removed by [`strip_hop_by_hop`]
/// together with the ones a Connection header names.
pub const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Headers a Connection header cannot get stripped: dropping Content-Length while the proxy
/// still relays the body would turn the body into a second request upstream.
const NEVER_NOMINATED: &[&str] = &["content-length", "host"];

/// Trailer fields refused in a chunked body: they would change framing or routing.
const FORBIDDEN_TRAILERS: &[&str] = &["content-length", "transfer-encoding", "host", "trailer"];

/// Longest Content-Length value: 19 digits always fit in a `u64`.
const MAX_CONTENT_LENGTH_DIGITS: usize = 19;

/// Longest chunk size: 16 hex digits always fit in a `u64`.
const MAX_CHUNK_SIZE_DIGITS: usize = 16;

/// Longest header name quoted in an error message.
const MAX_NAME_IN_ERROR: usize = 64;

/// Removes hop-by-hop headers: the [`HOP_BY_HOP`] list and every header a Connection header
/// names, except Content-Length and Host, which a Connection header cannot remove.
///
/// Transfer-Encoding is removed, so a chunked message must be forwarded with
/// `Transfer-Encoding: chunked` added back. Strip before adding the proxy's own headers, so
/// a client cannot name them in Connection.
pub fn strip_hop_by_hop(headers: &mut Vec<Header>) {
    let mut nominated: Vec<String> = Vec::new();
    for header in headers.iter().filter(|h| h.is("connection")) {
        for element in header.value.split(|&b| b == b',') {
            let element = trim_ows(element);
            if !element.is_empty() {
                nominated.push(ascii_string(element).to_ascii_lowercase());
            }
        }
    }
    headers.retain(|header| {
        let listed = HOP_BY_HOP.iter().any(|name| header.is(name));
        let nominated = nominated.iter().any(|name| header.is(name))
            && !NEVER_NOMINATED.iter().any(|name| header.is(name));
        !listed && !nominated
    });
}

/// Whether the `Connection` headers list `token` (ASCII case-insensitive).
fn connection_lists(headers: &[Header], token: &str) -> bool {
    headers.iter().filter(|h| h.is("connection")).any(|h| {
        h.value
            .split(|&b| b == b',')
            .any(|element| trim_ows(element).eq_ignore_ascii_case(token.as_bytes()))
    })
}

/// Whether the headers carry exactly one `Upgrade` field and it names exactly `websocket`.
fn upgrades_to_websocket(headers: &[Header]) -> bool {
    let mut upgrades = headers.iter().filter(|h| h.is("upgrade"));
    matches!(
        (upgrades.next(), upgrades.next()),
        (Some(h), None) if trim_ows(&h.value).eq_ignore_ascii_case(b"websocket")
    ) && connection_lists(headers, "upgrade")
}

/// Whether a request asks to switch to WebSocket (RFC 6455 §4.1): a GET without a body,
/// `Connection: upgrade` and one `Upgrade: websocket`. No other protocol switch is relayed
/// (an `h2c` upgrade would carry later requests past the per-request policy).
pub fn is_websocket_upgrade(head: &RequestHead) -> bool {
    head.method == "GET"
        && head.framing == Framing::None
        && head.version == Version::Http11
        && upgrades_to_websocket(&head.headers)
}

/// Whether a response accepts a WebSocket upgrade: `101` with `Connection: upgrade` and
/// one `Upgrade: websocket`.
pub fn is_websocket_accept(head: &ResponseHead) -> bool {
    head.status == 101 && upgrades_to_websocket(&head.headers)
}

/// Parses a request head from the start of `buf`.
///
/// Returns [`Parsed::Partial`] while the head is incomplete and nothing seen so far is
/// wrong; errors are reported as soon as the offending line is complete.
pub fn parse_request_head(buf: &[u8], limits: &Limits) -> Result<Parsed<RequestHead>, H1Error> {
    let Some(raw) = split_head(buf, limits, |line| parse_request_line(line, limits))? else {
        return Ok(Parsed::Partial);
    };
    let RequestLine {
        method,
        target,
        version,
    } = raw.start;
    let fields = FieldSummary::of(&raw.fields)?;

    match fields.hosts.as_slice() {
        [] if version == Version::Http11 && method != "CONNECT" => {
            return Err(H1Error::MissingHost);
        }
        [] => {}
        [host] => check_host(host)?,
        _ => return Err(H1Error::DuplicateHost),
    }
    for expect in &fields.expects {
        if !expect.eq_ignore_ascii_case(b"100-continue") {
            return Err(H1Error::UnsupportedExpectation);
        }
    }
    let framing = match body_framing(version, &fields, true)? {
        Some(framing) => framing,
        None => Framing::None,
    };
    let keep_alive = connection_keep_alive(version, &fields.connection);

    Ok(Parsed::Complete {
        head: RequestHead {
            method,
            target,
            version,
            headers: raw.fields.iter().map(RawField::to_header).collect(),
            framing,
            keep_alive,
        },
        consumed: raw.len,
    })
}

/// Parses a response head from the start of `buf`, for a request made with
/// `request_method`.
///
/// A response to HEAD, a 1xx, 204 or 304, and a 2xx to CONNECT have no body
/// ([`Framing::None`]), whatever their headers say; Content-Length and Transfer-Encoding are
/// still checked. Without either, the body runs to the end of the connection
/// ([`Framing::CloseDelimited`], never kept alive). Duplicate Content-Length lines with the
/// same value and an empty reason phrase are accepted.
pub fn parse_response_head(
    buf: &[u8],
    limits: &Limits,
    request_method: &str,
) -> Result<Parsed<ResponseHead>, H1Error> {
    let Some(raw) = split_head(buf, limits, parse_status_line)? else {
        return Ok(Parsed::Partial);
    };
    let StatusLine {
        version,
        status,
        reason,
    } = raw.start;
    let fields = FieldSummary::of(&raw.fields)?;
    let declared = body_framing(version, &fields, false)?;

    let bodiless = request_method == "HEAD"
        || (100..200).contains(&status)
        || status == 204
        || status == 304
        || (request_method == "CONNECT" && (200..300).contains(&status));
    let framing = match declared {
        _ if bodiless => Framing::None,
        Some(framing) => framing,
        None => Framing::CloseDelimited,
    };
    let keep_alive =
        framing != Framing::CloseDelimited && connection_keep_alive(version, &fields.connection);

    Ok(Parsed::Complete {
        head: ResponseHead {
            version,
            status,
            reason,
            headers: raw.fields.iter().map(RawField::to_header).collect(),
            framing,
            keep_alive,
        },
        consumed: raw.len,
    })
}

/// Writes `METHOD SP target SP HTTP/1.1 CRLF`, the header lines and the empty line.
///
/// Refuses (and leaves `out` untouched) a method that is not a token, a target with a byte
/// or a `%` escape the parser would refuse, a header name that is not a token or a header value with a
/// control byte, so that nothing the proxy adds can split the head.
pub fn write_request_head(
    method: &str,
    target: &str,
    headers: &[Header],
    out: &mut Vec<u8>,
) -> Result<(), H1Error> {
    if !is_token(method.as_bytes()) {
        return Err(H1Error::InvalidMethod);
    }
    let target_ok = !target.is_empty()
        && target.bytes().all(is_target_byte)
        && percent_escapes_ok(target.as_bytes());
    if !target_ok {
        return Err(H1Error::InvalidTarget);
    }
    check_headers_for_writing(headers)?;
    out.extend_from_slice(method.as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    write_header_lines(headers, out);
    Ok(())
}

/// Writes `HTTP/1.1 SP status SP reason CRLF`, the header lines and the empty line.
///
/// Refuses (and leaves `out` untouched) a status outside 100–599, a reason phrase with a
/// control byte, and the header faults [`write_request_head`] refuses.
pub fn write_response_head(
    status: u16,
    reason: &str,
    headers: &[Header],
    out: &mut Vec<u8>,
) -> Result<(), H1Error> {
    if !(100..600).contains(&status) {
        return Err(H1Error::InvalidStatus);
    }
    if !reason.bytes().all(is_field_value_byte) {
        return Err(H1Error::InvalidReason);
    }
    check_headers_for_writing(headers)?;
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.to_string().as_bytes());
    out.push(b' ');
    out.extend_from_slice(reason.as_bytes());
    out.extend_from_slice(b"\r\n");
    write_header_lines(headers, out);
    Ok(())
}

/// Writes one chunk (`SIZE-IN-HEX CRLF data CRLF`). Empty data writes nothing: an empty
/// chunk would be the last chunk.
pub fn write_chunk(data: &[u8], out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

/// Writes the last chunk and an empty trailer section (`0 CRLF CRLF`).
pub fn write_last_chunk(out: &mut Vec<u8>) {
    out.extend_from_slice(b"0\r\n\r\n");
}

/// Incremental decoder of a chunked body: feed it the bytes after the head, in slices split
/// anywhere; it appends the payload to `out` and stops right after the trailer section.
///
/// Chunk sizes are 1–16 hex digits with no prefix, sign or whitespace; extensions are
/// bounded and discarded; every line ends in CRLF; trailers are bounded, checked and
/// discarded. After an error the decoder keeps returning it.
#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    max_chunk_line: usize,
    max_trailer_bytes: usize,
    state: ChunkState,
    /// The trailer line being read (bounded by `max_trailer_bytes`).
    trailer_line: Vec<u8>,
    /// Trailer bytes read so far.
    trailer_bytes: usize,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum ChunkState {
    /// Reading the hex digits of a chunk size; `line` counts the bytes of the size line.
    Size {
        size: u64,
        digits: usize,
        line: usize,
    },
    /// Reading a chunk extension.
    Extension { size: u64, line: usize },
    /// Saw the CR ending a size line.
    SizeLf { size: u64 },
    /// Reading chunk data.
    Data { remaining: u64 },
    /// Expecting the CR after chunk data.
    DataCr,
    /// Expecting the LF after chunk data.
    DataLf,
    /// Reading the trailer section.
    Trailer,
    /// The body is complete.
    Done,
    /// A refused body.
    Failed(H1Error),
}

impl ChunkedDecoder {
    /// A decoder at the start of a chunked body.
    pub fn new(limits: &Limits) -> Self {
        Self {
            max_chunk_line: limits.max_chunk_line,
            max_trailer_bytes: limits.max_trailer_bytes,
            state: ChunkState::Size {
                size: 0,
                digits: 0,
                line: 0,
            },
            trailer_line: Vec::new(),
            trailer_bytes: 0,
        }
    }

    /// Decodes from `input`, appending payload bytes to `out`. Returns how many bytes of
    /// `input` were consumed and whether the body is complete; once complete, the rest of
    /// `input` (from `consumed`) belongs to the next message. On error, payload bytes
    /// decoded before the fault may already be in `out`: the message must be dropped.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<(usize, bool), H1Error> {
        let mut consumed = 0usize;
        loop {
            match &self.state {
                ChunkState::Done => return Ok((consumed, true)),
                ChunkState::Failed(error) => return Err(error.clone()),
                _ => {}
            }
            let rest = input.get(consumed..).unwrap_or_default();
            if rest.is_empty() {
                return Ok((consumed, false));
            }
            match self.step(rest, out) {
                Ok(taken) => consumed = consumed.saturating_add(taken),
                Err(error) => {
                    self.state = ChunkState::Failed(error.clone());
                    return Err(error);
                }
            }
        }
    }

    /// Whether the last chunk and the trailer section have been read.
    pub fn is_finished(&self) -> bool {
        self.state == ChunkState::Done
    }

    /// To call when the connection ends: an error unless the body is complete.
    pub fn finish(&self) -> Result<(), H1Error> {
        match &self.state {
            ChunkState::Done => Ok(()),
            ChunkState::Failed(error) => Err(error.clone()),
            _ => Err(H1Error::IncompleteChunkedBody),
        }
    }

    /// Consumes at least one byte of the non-empty `rest`; returns how many.
    fn step(&mut self, rest: &[u8], out: &mut Vec<u8>) -> Result<usize, H1Error> {
        let Some(&byte) = rest.first() else {
            return Ok(0);
        };
        let next = match self.state.clone() {
            ChunkState::Size { size, digits, line } => {
                let line = self.size_line_byte(line, byte)?;
                match byte {
                    b';' if digits > 0 => ChunkState::Extension { size, line },
                    b'\r' if digits > 0 => ChunkState::SizeLf { size },
                    b'\n' => return Err(H1Error::BareLf),
                    _ => {
                        let Some(digit) = hex_value(byte) else {
                            return Err(H1Error::InvalidChunkSize);
                        };
                        if digits >= MAX_CHUNK_SIZE_DIGITS {
                            return Err(H1Error::ChunkSizeOverflow);
                        }
                        let size = size
                            .checked_mul(16)
                            .and_then(|s| s.checked_add(u64::from(digit)))
                            .ok_or(H1Error::ChunkSizeOverflow)?;
                        ChunkState::Size {
                            size,
                            digits: digits.saturating_add(1),
                            line,
                        }
                    }
                }
            }
            ChunkState::Extension { size, line } => {
                let line = self.size_line_byte(line, byte)?;
                match byte {
                    b'\r' => ChunkState::SizeLf { size },
                    b'\n' => return Err(H1Error::BareLf),
                    b'\t' => ChunkState::Extension { size, line },
                    _ if is_field_value_byte(byte) => ChunkState::Extension { size, line },
                    _ => return Err(H1Error::InvalidChunkExtension),
                }
            }
            ChunkState::SizeLf { size } => match byte {
                b'\n' if size == 0 => ChunkState::Trailer,
                b'\n' => ChunkState::Data { remaining: size },
                _ => return Err(H1Error::BareCr),
            },
            ChunkState::Data { remaining } => {
                let take = usize::try_from(remaining)
                    .unwrap_or(usize::MAX)
                    .min(rest.len());
                out.extend_from_slice(rest.get(..take).unwrap_or_default());
                let remaining = remaining.saturating_sub(u64::try_from(take).unwrap_or(u64::MAX));
                self.state = if remaining == 0 {
                    ChunkState::DataCr
                } else {
                    ChunkState::Data { remaining }
                };
                return Ok(take);
            }
            ChunkState::DataCr => match byte {
                b'\r' => ChunkState::DataLf,
                _ => return Err(H1Error::MissingChunkCrlf),
            },
            ChunkState::DataLf => match byte {
                b'\n' => ChunkState::Size {
                    size: 0,
                    digits: 0,
                    line: 0,
                },
                _ => return Err(H1Error::MissingChunkCrlf),
            },
            ChunkState::Trailer => return self.trailer_bytes_in(rest),
            ChunkState::Done | ChunkState::Failed(_) => return Ok(0),
        };
        self.state = next;
        Ok(1)
    }

    /// Counts `byte` of a chunk-size line against the limit (the ending CR does not count).
    fn size_line_byte(&self, line: usize, byte: u8) -> Result<usize, H1Error> {
        if byte == b'\r' {
            return Ok(line);
        }
        let line = line.saturating_add(1);
        if line > self.max_chunk_line {
            return Err(H1Error::ChunkLineTooLong {
                limit: self.max_chunk_line,
            });
        }
        Ok(line)
    }

    /// Reads trailer bytes up to the end of the current line.
    fn trailer_bytes_in(&mut self, rest: &[u8]) -> Result<usize, H1Error> {
        let line_end = rest.iter().position(|&b| b == b'\n');
        let take = line_end.map_or(rest.len(), |lf| lf.saturating_add(1));
        let total = self.trailer_bytes.saturating_add(take);
        if total > self.max_trailer_bytes {
            return Err(H1Error::TrailerTooLarge {
                limit: self.max_trailer_bytes,
            });
        }
        self.trailer_bytes = total;
        self.trailer_line
            .extend_from_slice(rest.get(..take).unwrap_or_default());
        if line_end.is_some() {
            let line = std::mem::take(&mut self.trailer_line);
            let line = line.strip_suffix(b"\n").unwrap_or(&line);
            let line = crlf_line(line)?;
            if line.is_empty() {
                self.state = ChunkState::Done;
            } else {
                let field = parse_field_line(line)?;
                if let Some(name) = FORBIDDEN_TRAILERS
                    .iter()
                    .find(|name| field.name.eq_ignore_ascii_case(name.as_bytes()))
                {
                    return Err(H1Error::ForbiddenTrailer {
                        name: (*name).to_owned(),
                    });
                }
            }
        }
        Ok(take)
    }
}

// ----------------------------------------------------------------------------------------
// Head splitting

/// A head cut into its start line (already parsed) and its field lines.
struct RawHead<'a, S> {
    start: S,
    fields: Vec<RawField<'a>>,
    len: usize,
}

/// One field line: a token name and a value trimmed of OWS, both checked.
struct RawField<'a> {
    name: &'a [u8],
    value: &'a [u8],
}

impl RawField<'_> {
    fn to_header(&self) -> Header {
        Header {
            name: ascii_string(self.name),
            value: self.value.to_vec(),
        }
    }

    fn is(&self, name: &str) -> bool {
        self.name.eq_ignore_ascii_case(name.as_bytes())
    }
}

/// Cuts the head at the start of `buf` into lines, checking line endings, limits and field
/// line syntax as each line completes; the start line goes to `parse_start` as soon as it is
/// complete. `Ok(None)` when the head is not complete yet.
fn split_head<'a, S>(
    buf: &'a [u8],
    limits: &Limits,
    parse_start: impl FnOnce(&'a [u8]) -> Result<S, H1Error>,
) -> Result<Option<RawHead<'a, S>>, H1Error> {
    if buf.is_empty() {
        return Ok(None);
    }
    let window = buf.get(..limits.max_head_bytes).unwrap_or(buf);
    let mut parse_start = Some(parse_start);
    let mut start = None;
    let mut fields = Vec::new();
    let mut pos = 0usize;
    loop {
        let rest = window.get(pos..).unwrap_or_default();
        let Some(lf) = rest.iter().position(|&b| b == b'\n') else {
            // An incomplete line: a CR is fine only as its last byte.
            if let Some(cr) = rest.iter().position(|&b| b == b'\r')
                && cr.saturating_add(1) < rest.len()
            {
                return Err(H1Error::BareCr);
            }
            if buf.len() >= limits.max_head_bytes {
                return Err(H1Error::HeadTooLarge {
                    limit: limits.max_head_bytes,
                });
            }
            return Ok(None);
        };
        let line = crlf_line(rest.get(..lf).unwrap_or_default())?;
        pos = pos.saturating_add(lf).saturating_add(1);
        match (start.take(), parse_start.take()) {
            (None, Some(parse)) => {
                if line.is_empty() {
                    return Err(H1Error::LeadingEmptyLine);
                }
                start = Some(parse(line)?);
            }
            (Some(parsed), _) => {
                if line.is_empty() {
                    return Ok(Some(RawHead {
                        start: parsed,
                        fields,
                        len: pos,
                    }));
                }
                if fields.len() >= limits.max_headers {
                    return Err(H1Error::TooManyHeaders {
                        limit: limits.max_headers,
                    });
                }
                fields.push(parse_field_line(line)?);
                start = Some(parsed);
            }
            (None, None) => return Err(H1Error::MalformedRequestLine),
        }
    }
}

/// `line` is the bytes before an LF: checks it ends in CR and holds no other CR, and
/// returns it without the CR.
fn crlf_line(line: &[u8]) -> Result<&[u8], H1Error> {
    let Some(line) = line.strip_suffix(b"\r") else {
        return Err(H1Error::BareLf);
    };
    if line.contains(&b'\r') {
        return Err(H1Error::BareCr);
    }
    Ok(line)
}

/// Checks one field line (without its CRLF): no folding, a token name directly followed by
/// `:`, a value without control bytes.
fn parse_field_line(line: &[u8]) -> Result<RawField<'_>, H1Error> {
    if matches!(line.first(), Some(b' ' | b'\t')) {
        return Err(H1Error::ObsoleteLineFolding);
    }
    let Some(colon) = line.iter().position(|&b| b == b':') else {
        return Err(H1Error::MissingColon);
    };
    let name = line.get(..colon).unwrap_or_default();
    let value = trim_ows(line.get(colon.saturating_add(1)..).unwrap_or_default());
    if matches!(name.last(), Some(b' ' | b'\t')) {
        return Err(H1Error::WhitespaceBeforeColon);
    }
    if !is_token(name) {
        return Err(H1Error::InvalidHeaderName);
    }
    if !value.iter().copied().all(is_field_value_byte) {
        return Err(H1Error::InvalidHeaderValue {
            name: name_for_error(name),
        });
    }
    Ok(RawField { name, value })
}

// ----------------------------------------------------------------------------------------
// Start lines

struct RequestLine {
    method: String,
    target: Target,
    version: Version,
}

fn parse_request_line(line: &[u8], limits: &Limits) -> Result<RequestLine, H1Error> {
    let mut parts = line.splitn(3, |&b| b == b' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Err(H1Error::MalformedRequestLine);
    };
    if method.is_empty() || target.is_empty() || version.contains(&b' ') {
        return Err(H1Error::MalformedRequestLine);
    }
    if !is_token(method) {
        return Err(H1Error::InvalidMethod);
    }
    let version = parse_version(version)?;
    if target.len() > limits.max_target_bytes {
        return Err(H1Error::TargetTooLong {
            limit: limits.max_target_bytes,
        });
    }
    let method = ascii_string(method);
    let target = parse_target(&method, target)?;
    Ok(RequestLine {
        method,
        target,
        version,
    })
}

fn parse_version(version: &[u8]) -> Result<Version, H1Error> {
    match version {
        b"HTTP/1.1" => Ok(Version::Http11),
        b"HTTP/1.0" => Ok(Version::Http10),
        [b'H', b'T', b'T', b'P', b'/', major, b'.', minor]
            if major.is_ascii_digit() && minor.is_ascii_digit() =>
        {
            Err(H1Error::UnsupportedVersion)
        }
        [b'H', b'T', b'T', b'P', b'/', major] if major.is_ascii_digit() => {
            Err(H1Error::UnsupportedVersion)
        }
        _ => Err(H1Error::MalformedVersion),
    }
}

/// A request target as HTTP/1.1 reads it (RFC 9112 §3.2), refusing what other parsers
/// read differently (a `//` origin-form, bytes outside the target's grammar, broken
/// percent escapes). HTTP/2's `:path` is held to the same.
pub(crate) fn parse_target(method: &str, target: &[u8]) -> Result<Target, H1Error> {
    if !target.iter().copied().all(is_target_byte) || !percent_escapes_ok(target) {
        return Err(H1Error::InvalidTarget);
    }
    if method == "CONNECT" {
        if target.contains(&b'/') || target.contains(&b'?') {
            return Err(H1Error::ConnectTargetNotAuthority);
        }
        if target.contains(&b'@') {
            return Err(H1Error::UserinfoInTarget);
        }
        let (host, port) = split_authority(target).ok_or(H1Error::InvalidAuthority)?;
        let port = port.ok_or(H1Error::ConnectWithoutPort)?;
        return Ok(Target::Authority {
            host: ascii_string(host),
            port,
        });
    }
    if target == b"*" {
        return if method == "OPTIONS" {
            Ok(Target::Asterisk)
        } else {
            Err(H1Error::AsteriskOutsideOptions)
        };
    }
    if target.starts_with(b"/") {
        // `//host/path` reads as a scheme-relative URL to many URL parsers.
        if target.starts_with(b"//") {
            return Err(H1Error::InvalidTarget);
        }
        return Ok(Target::Origin(ascii_string(target)));
    }
    parse_absolute_form(target)
}

fn parse_absolute_form(target: &[u8]) -> Result<Target, H1Error> {
    let Some(colon) = target.iter().position(|&b| b == b':') else {
        return Err(H1Error::InvalidTarget);
    };
    let scheme = target.get(..colon).unwrap_or_default();
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    let Some(after_scheme) = target
        .get(colon.saturating_add(1)..)
        .and_then(|rest| rest.strip_prefix(b"//"))
    else {
        return Err(H1Error::InvalidTarget);
    };
    if !scheme_ok {
        return Err(H1Error::InvalidTarget);
    }
    let authority_end = after_scheme
        .iter()
        .position(|&b| b == b'/' || b == b'?')
        .unwrap_or(after_scheme.len());
    let authority = after_scheme.get(..authority_end).unwrap_or_default();
    let path_and_query = after_scheme.get(authority_end..).unwrap_or_default();
    if authority.contains(&b'@') {
        return Err(H1Error::UserinfoInTarget);
    }
    split_authority(authority).ok_or(H1Error::InvalidAuthority)?;
    // Forwarded as the origin-form target: `//host/path` would read as scheme-relative
    // there, as it does in origin form.
    if path_and_query.starts_with(b"//") {
        return Err(H1Error::InvalidTarget);
    }
    let path_and_query = match path_and_query.first() {
        None => "/".to_owned(),
        Some(b'?') => format!("/{}", ascii_string(path_and_query)),
        Some(_) => ascii_string(path_and_query),
    };
    Ok(Target::Absolute {
        scheme: ascii_string(scheme).to_ascii_lowercase(),
        authority: ascii_string(authority),
        path_and_query,
    })
}

struct StatusLine {
    version: Version,
    status: u16,
    reason: String,
}

fn parse_status_line(line: &[u8]) -> Result<StatusLine, H1Error> {
    let Some(space) = line.iter().position(|&b| b == b' ') else {
        return Err(H1Error::MalformedStatusLine);
    };
    let version = parse_version(line.get(..space).unwrap_or_default())?;
    let rest = line.get(space.saturating_add(1)..).unwrap_or_default();
    let (code, reason) = match rest {
        [a, b, c] => ([*a, *b, *c], &[][..]),
        [a, b, c, b' ', reason @ ..] => ([*a, *b, *c], reason),
        _ => return Err(H1Error::MalformedStatusLine),
    };
    let mut status = 0u16;
    for digit in code {
        if !digit.is_ascii_digit() {
            return Err(H1Error::MalformedStatusLine);
        }
        status = status
            .saturating_mul(10)
            .saturating_add(u16::from(digit.saturating_sub(b'0')));
    }
    if !(100..600).contains(&status) {
        return Err(H1Error::InvalidStatus);
    }
    if !reason.iter().copied().all(is_field_value_byte) {
        return Err(H1Error::InvalidReason);
    }
    Ok(StatusLine {
        version,
        status,
        reason: String::from_utf8_lossy(reason).into_owned(),
    })
}

// ----------------------------------------------------------------------------------------
// Header semantics

/// The framing, routing and connection headers of a head.
struct FieldSummary<'a> {
    hosts: Vec<&'a [u8]>,
    content_lengths: Vec<&'a [u8]>,
    transfer_encodings: Vec<&'a [u8]>,
    expects: Vec<&'a [u8]>,
    /// Connection options (tokens; compare them case-insensitively).
    connection: Vec<&'a [u8]>,
}

impl<'a> FieldSummary<'a> {
    fn of(fields: &[RawField<'a>]) -> Result<Self, H1Error> {
        let mut summary = Self {
            hosts: Vec::new(),
            content_lengths: Vec::new(),
            transfer_encodings: Vec::new(),
            expects: Vec::new(),
            connection: Vec::new(),
        };
        for field in fields {
            if field.is("host") {
                summary.hosts.push(field.value);
            } else if field.is("content-length") {
                summary.content_lengths.push(field.value);
            } else if field.is("transfer-encoding") {
                summary.transfer_encodings.push(field.value);
            } else if field.is("expect") {
                summary.expects.push(field.value);
            } else if field.is("connection") {
                for option in field.value.split(|&b| b == b',') {
                    let option = trim_ows(option);
                    if option.is_empty() {
                        continue;
                    }
                    if !is_token(option) {
                        return Err(H1Error::InvalidConnection);
                    }
                    summary.connection.push(option);
                }
            }
        }
        Ok(summary)
    }
}

/// The framing the headers declare: `None` when there is neither Content-Length nor
/// Transfer-Encoding. `request` refuses equal duplicate Content-Length lines too.
fn body_framing(
    version: Version,
    fields: &FieldSummary<'_>,
    request: bool,
) -> Result<Option<Framing>, H1Error> {
    match (
        fields.transfer_encodings.as_slice(),
        fields.content_lengths.as_slice(),
    ) {
        ([], []) => Ok(None),
        ([_, ..], [_, ..]) => Err(H1Error::ContentLengthAndTransferEncoding),
        ([_, ..], []) if version == Version::Http10 => Err(H1Error::TransferEncodingHttp10),
        ([coding], []) => {
            if coding.eq_ignore_ascii_case(b"chunked") {
                Ok(Some(Framing::Chunked))
            } else {
                Err(H1Error::UnsupportedTransferEncoding)
            }
        }
        ([_, _, ..], []) => Err(H1Error::DuplicateTransferEncoding),
        ([], [first, others @ ..]) => {
            let length = parse_content_length(first)?;
            for other in others {
                if parse_content_length(other)? != length {
                    return Err(H1Error::ConflictingContentLength);
                }
            }
            if request && !others.is_empty() {
                return Err(H1Error::DuplicateContentLength);
            }
            Ok(Some(Framing::Length(length)))
        }
    }
}

fn parse_content_length(value: &[u8]) -> Result<u64, H1Error> {
    if value.contains(&b',') {
        return Err(H1Error::ContentLengthList);
    }
    if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
        return Err(H1Error::InvalidContentLength);
    }
    if value.len() > MAX_CONTENT_LENGTH_DIGITS {
        return Err(H1Error::ContentLengthTooLarge);
    }
    let mut length = 0u64;
    for digit in value {
        length = length
            .checked_mul(10)
            .and_then(|l| l.checked_add(u64::from(digit.saturating_sub(b'0'))))
            .ok_or(H1Error::ContentLengthTooLarge)?;
    }
    Ok(length)
}

/// HTTP/1.1 stays open unless `close` is listed; HTTP/1.0 only when `keep-alive` is listed
/// and `close` is not.
fn connection_keep_alive(version: Version, options: &[&[u8]]) -> bool {
    let listed = |name: &[u8]| options.iter().any(|o| o.eq_ignore_ascii_case(name));
    if listed(b"close") {
        return false;
    }
    match version {
        Version::Http11 => true,
        Version::Http10 => listed(b"keep-alive"),
    }
}

/// A Host value is empty or `host[:port]`.
fn check_host(value: &[u8]) -> Result<(), H1Error> {
    if value.is_empty() || split_authority(value).is_some() {
        Ok(())
    } else {
        Err(H1Error::InvalidHost)
    }
}

/// Splits `host[:port]`: a non-empty name of `[A-Za-z0-9._~-]` or a bracketed IPv6 literal
/// (no zone), then an optional port 1–65535 without leading zeros. `None` if malformed.
fn split_authority(authority: &[u8]) -> Option<(&[u8], Option<u16>)> {
    let (host, rest) = if let Some(bracketed) = authority.strip_prefix(b"[") {
        let close = bracketed.iter().position(|&b| b == b']')?;
        let literal = std::str::from_utf8(bracketed.get(..close)?).ok()?;
        literal.parse::<Ipv6Addr>().ok()?;
        let host_len = close.checked_add(2)?;
        (authority.get(..host_len)?, authority.get(host_len..)?)
    } else {
        let end = authority
            .iter()
            .position(|&b| b == b':')
            .unwrap_or(authority.len());
        let host = authority.get(..end)?;
        let host_ok = !host.is_empty()
            && host
                .iter()
                .all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'~' | b'-'));
        if !host_ok {
            return None;
        }
        (host, authority.get(end..)?)
    };
    if rest.is_empty() {
        return Some((host, None));
    }
    let digits = rest.strip_prefix(b":")?;
    if digits.is_empty()
        || digits.len() > 5
        || digits.first() == Some(&b'0')
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    let port = std::str::from_utf8(digits).ok()?.parse::<u16>().ok()?;
    Some((host, Some(port)))
}

// ----------------------------------------------------------------------------------------
// Writing

fn check_headers_for_writing(headers: &[Header]) -> Result<(), H1Error> {
    for header in headers {
        if !is_token(header.name.as_bytes()) {
            return Err(H1Error::InvalidHeaderName);
        }
        if !header.value.iter().copied().all(is_field_value_byte) {
            return Err(H1Error::InvalidHeaderValue {
                name: name_for_error(header.name.as_bytes()),
            });
        }
    }
    Ok(())
}

fn write_header_lines(headers: &[Header], out: &mut Vec<u8>) {
    for header in headers {
        out.extend_from_slice(header.name.as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(&header.value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

// ----------------------------------------------------------------------------------------
// Bytes

fn find_header<'h>(headers: &'h [Header], name: &str) -> Option<&'h [u8]> {
    headers
        .iter()
        .find(|h| h.is(name))
        .map(|h| h.value.as_slice())
}

/// `tchar` of RFC 9110 §5.6.2.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric()
        || matches!(
            b,
            b'!' | b'#'
                | b'$'
                | b'%'
                | b'&'
                | b'\''
                | b'*'
                | b'+'
                | b'-'
                | b'.'
                | b'^'
                | b'_'
                | b'`'
                | b'|'
                | b'~'
        )
}

fn is_token(bytes: &[u8]) -> bool {
    !bytes.is_empty() && bytes.iter().copied().all(is_tchar)
}

/// HTAB, SP, visible ASCII and obs-text: every byte but the other controls and DEL.
fn is_field_value_byte(b: u8) -> bool {
    b == b'\t' || (b' '..=b'~').contains(&b) || b >= 0x80
}

/// Visible ASCII except `\` (a path separator to WHATWG URL parsers) and `#` (a fragment
/// never belongs in a request).
fn is_target_byte(b: u8) -> bool {
    (b'!'..=b'~').contains(&b) && b != b'\\' && b != b'#'
}

/// Every `%` is followed by two hex digits.
fn percent_escapes_ok(target: &[u8]) -> bool {
    let mut bytes = target.iter();
    while let Some(&b) = bytes.next() {
        if b == b'%' {
            let escaped = (bytes.next(), bytes.next());
            if !matches!(escaped, (Some(h), Some(l)) if h.is_ascii_hexdigit() && l.is_ascii_hexdigit())
            {
                return false;
            }
        }
    }
    true
}

/// The value of one hexadecimal digit.
pub(crate) fn hex_value(b: u8) -> Option<u8> {
    char::from(b)
        .to_digit(16)
        .and_then(|d| u8::try_from(d).ok())
}

fn trim_ows(mut bytes: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = bytes {
        bytes = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = bytes {
        bytes = rest;
    }
    bytes
}

/// Bytes as a string, one char per byte (exact for the ASCII this module validates).
fn ascii_string(bytes: &[u8]) -> String {
    bytes.iter().copied().map(char::from).collect()
}

fn name_for_error(name: &[u8]) -> String {
    ascii_string(name.get(..MAX_NAME_IN_ERROR).unwrap_or(name))
        .chars()
        .map(|c| if c.is_ascii_graphic() { c } else { '?' })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::panic, reason = "tests")]
    use super::*;

    #[test]
    fn authority_forms() {
        assert_eq!(
            split_authority(b"example.com:443"),
            Some((&b"example.com"[..], Some(443)))
        );
        assert_eq!(split_authority(b"[::1]"), Some((&b"[::1]"[..], None)));
        assert_eq!(
            split_authority(b"[::1]:8080").map(|(_, p)| p),
            Some(Some(8080))
        );
        for bad in [
            &b""[..],
            b":80",
            b"a:",
            b"a:0",
            b"a:080",
            b"a:65536",
            b"a:1:2",
            b"[::1",
            b"[::1%25en0]",
            b"[127.0.0.1]",
            b"a b",
            b"a@b",
            b"a\\b",
            b"{a}",
            b"%65vil.com",
        ] {
            assert_eq!(split_authority(bad), None, "{}", bad.escape_ascii());
        }
    }

    #[test]
    fn ows_trim_keeps_inner_bytes() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
    }

    #[test]
    fn percent_escapes() {
        assert!(percent_escapes_ok(b"/a%20b"));
        assert!(!percent_escapes_ok(b"/a%2"));
        assert!(!percent_escapes_ok(b"/a%zz"));
    }

    fn head(raw: &str) -> RequestHead {
        match parse_request_head(raw.as_bytes(), &Limits::default()) {
            Ok(Parsed::Complete { head, .. }) => head,
            other => panic!("{raw:?}: {other:?}"),
        }
    }

    #[test]
    fn only_a_plain_websocket_upgrade_is_one() {
        let ok = "GET /chat HTTP/1.1\r\nHost: a\r\nConnection: keep-alive, Upgrade\r\nUpgrade: WebSocket\r\n\r\n";
        assert!(is_websocket_upgrade(&head(ok)));
        for not in [
            // another protocol: h2c would take later requests past the policy
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n",
            // a list, or two fields
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\nUpgrade: h2c\r\n\r\n",
            // Connection does not name it
            "GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nConnection: upgraded\r\nUpgrade: websocket\r\n\r\n",
            // not a bodiless GET on HTTP/1.1
            "POST / HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
            "GET / HTTP/1.0\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n",
        ] {
            assert!(!is_websocket_upgrade(&head(not)), "{not:?}");
        }
    }
}

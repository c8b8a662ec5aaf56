//! Request-smuggling and parser-differential corpus for the strict HTTP/1.1 codec: raw
//! request bytes and the exact outcome each must get.
#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    reason = "tests"
)]

use capgate_gateway::h1::{
    ChunkedDecoder, Framing, H1Error, Limits, Parsed, RequestHead, Target, parse_request_head,
};

/// What a case must produce.
#[derive(Debug)]
enum Outcome {
    /// The head is refused with this error.
    Refused(H1Error),
    /// The head parses with this framing and `consumed` ends at the first empty line.
    Head(Framing),
    /// As `Head`, with this target.
    HeadWithTarget(Framing, Target),
    /// The head parses as chunked and the body is refused with this error (after the whole
    /// buffer, at end of connection, if the decoder still waits for bytes).
    BodyRefused(H1Error),
    /// The head parses as chunked and the body decodes to this payload, ending exactly at
    /// the end of the buffer.
    Body(&'static [u8]),
    /// More bytes are needed.
    Partial,
}

struct Case {
    name: &'static str,
    bytes: Vec<u8>,
    outcome: Outcome,
}

fn case(name: &'static str, bytes: &[u8], outcome: Outcome) -> Case {
    Case {
        name,
        bytes: bytes.to_vec(),
        outcome,
    }
}

use Outcome::{Body, BodyRefused, Head, HeadWithTarget, Partial, Refused};

fn corpus() -> Vec<Case> {
    let mut cases = vec![
        // --- Content-Length with Transfer-Encoding -------------------------------------
        case(
            "cl_then_te",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            Refused(H1Error::ContentLengthAndTransferEncoding),
        ),
        case(
            "te_then_cl",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 5\r\n\r\n",
            Refused(H1Error::ContentLengthAndTransferEncoding),
        ),
        case(
            "te_identity_then_te_chunked_with_cl",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: identity\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            Refused(H1Error::ContentLengthAndTransferEncoding),
        ),
        case(
            "cl_with_te_on_http10",
            b"POST / HTTP/1.0\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n",
            Refused(H1Error::ContentLengthAndTransferEncoding),
        ),
        // --- Transfer-Encoding values --------------------------------------------------
        case(
            "te_two_lines",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n",
            Refused(H1Error::DuplicateTransferEncoding),
        ),
        case(
            "te_chunked_twice",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
            Refused(H1Error::DuplicateTransferEncoding),
        ),
        case(
            "te_chunked_identity",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked, identity\r\n\r\n",
            Refused(H1Error::UnsupportedTransferEncoding),
        ),
        case(
            "te_gzip_chunked_list",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n",
            Refused(H1Error::UnsupportedTransferEncoding),
        ),
        case(
            "te_xchunked",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n",
            Refused(H1Error::UnsupportedTransferEncoding),
        ),
        case(
            "te_quoted_chunked",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \"chunked\"\r\n\r\n",
            Refused(H1Error::UnsupportedTransferEncoding),
        ),
        case(
            "te_empty",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n\r\n",
            Refused(H1Error::UnsupportedTransferEncoding),
        ),
        case(
            "te_leading_space",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:  chunked\r\n\r\n0\r\n\r\n",
            Body(b""),
        ),
        case(
            "te_no_space",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:chunked\r\n\r\n0\r\n\r\n",
            Body(b""),
        ),
        case(
            "te_tab_value",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\tchunked\r\n\r\n0\r\n\r\n",
            Body(b""),
        ),
        case(
            "te_trailing_whitespace",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked \t\r\n\r\n0\r\n\r\n",
            Body(b""),
        ),
        case(
            "te_uppercase",
            b"POST / HTTP/1.1\r\nHost: a\r\nTRANSFER-ENCODING: CHUNKED\r\n\r\n0\r\n\r\n",
            Body(b""),
        ),
        case(
            "te_vertical_tab_value",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: \x0bchunked\r\n\r\n",
            Refused(H1Error::InvalidHeaderValue {
                name: "Transfer-Encoding".into(),
            }),
        ),
        case(
            "te_space_before_colon",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding : chunked\r\n\r\n",
            Refused(H1Error::WhitespaceBeforeColon),
        ),
        case(
            "te_tab_before_colon",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding\t: chunked\r\n\r\n",
            Refused(H1Error::WhitespaceBeforeColon),
        ),
        case(
            "te_on_http10",
            b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n",
            Refused(H1Error::TransferEncodingHttp10),
        ),
        // --- Content-Length values -----------------------------------------------------
        case(
            "cl_duplicate_same",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\nhello",
            Refused(H1Error::DuplicateContentLength),
        ),
        case(
            "cl_duplicate_different",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\nhello!",
            Refused(H1Error::ConflictingContentLength),
        ),
        case(
            "cl_plus",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +5\r\n\r\nhello",
            Refused(H1Error::InvalidContentLength),
        ),
        case(
            "cl_minus",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n",
            Refused(H1Error::InvalidContentLength),
        ),
        case(
            "cl_hex",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 0x10\r\n\r\n",
            Refused(H1Error::InvalidContentLength),
        ),
        case(
            "cl_inner_space",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 1 0\r\n\r\n",
            Refused(H1Error::InvalidContentLength),
        ),
        case(
            "cl_empty",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n",
            Refused(H1Error::InvalidContentLength),
        ),
        case(
            "cl_list",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5, 5\r\n\r\nhello",
            Refused(H1Error::ContentLengthList),
        ),
        case(
            "cl_huge",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n",
            Refused(H1Error::ContentLengthTooLarge),
        ),
        case(
            "cl_twenty_zeros",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 00000000000000000005\r\n\r\n",
            Refused(H1Error::ContentLengthTooLarge),
        ),
        case(
            "cl_nineteen_digits",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 9999999999999999999\r\n\r\n",
            Head(Framing::Length(9_999_999_999_999_999_999)),
        ),
        case(
            "cl_with_body_bytes",
            b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhello",
            Head(Framing::Length(5)),
        ),
        // --- Line structure ------------------------------------------------------------
        case(
            "obs_fold_continuation",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\r\n c\r\n\r\n",
            Refused(H1Error::ObsoleteLineFolding),
        ),
        case(
            "obs_fold_te_continuation",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding:\r\n chunked\r\n\r\n",
            Refused(H1Error::ObsoleteLineFolding),
        ),
        case(
            "leading_space_before_first_header",
            b"GET / HTTP/1.1\r\n Host: a\r\n\r\n",
            Refused(H1Error::ObsoleteLineFolding),
        ),
        case(
            "leading_tab_before_first_header",
            b"GET / HTTP/1.1\r\n\tHost: a\r\n\r\n",
            Refused(H1Error::ObsoleteLineFolding),
        ),
        case(
            "bare_lf_request_line",
            b"GET / HTTP/1.1\nHost: a\r\n\r\n",
            Refused(H1Error::BareLf),
        ),
        case(
            "bare_lf_header",
            b"GET / HTTP/1.1\r\nHost: a\nX: y\r\n\r\n",
            Refused(H1Error::BareLf),
        ),
        case(
            "bare_lf_terminator",
            b"GET / HTTP/1.1\r\nHost: a\r\n\n",
            Refused(H1Error::BareLf),
        ),
        case(
            "bare_lf_everywhere",
            b"GET / HTTP/1.1\nHost: foo.bar\n\n",
            Refused(H1Error::BareLf),
        ),
        case(
            "bare_lf_before_te_hidden_from_crlf_parsers",
            b"POST / HTTP/1.1\r\nHost: a\r\nX: y\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n",
            Refused(H1Error::BareLf),
        ),
        case(
            "bare_cr_in_header_value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: a\rb\r\n\r\n",
            Refused(H1Error::BareCr),
        ),
        case(
            "bare_cr_as_line_end",
            b"GET / HTTP/1.1\r\nHost: a\rX: b\r\n\r\n",
            Refused(H1Error::BareCr),
        ),
        case(
            "bare_cr_in_partial_line",
            b"GET / HTTP/1.1\r\nHost: a\rX",
            Refused(H1Error::BareCr),
        ),
        case(
            "leading_empty_line",
            b"\r\nGET / HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::LeadingEmptyLine),
        ),
        // --- Header bytes --------------------------------------------------------------
        case(
            "nul_in_header_value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x00c\r\n\r\n",
            Refused(H1Error::InvalidHeaderValue { name: "X-A".into() }),
        ),
        case(
            "del_in_header_value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: b\x7fc\r\n\r\n",
            Refused(H1Error::InvalidHeaderValue { name: "X-A".into() }),
        ),
        case(
            "obs_text_in_header_value",
            b"GET / HTTP/1.1\r\nHost: a\r\nX-A: caf\xc3\xa9\r\n\r\n",
            Head(Framing::None),
        ),
        case(
            "space_in_header_name",
            b"GET / HTTP/1.1\r\nHost: a\r\nX A: b\r\n\r\n",
            Refused(H1Error::InvalidHeaderName),
        ),
        case(
            "empty_header_name",
            b"GET / HTTP/1.1\r\nHost: a\r\n: b\r\n\r\n",
            Refused(H1Error::InvalidHeaderName),
        ),
        case(
            "header_without_colon",
            b"GET / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding chunked\r\n\r\n",
            Refused(H1Error::MissingColon),
        ),
        // --- Host ----------------------------------------------------------------------
        case(
            "missing_host_http11",
            b"GET / HTTP/1.1\r\n\r\n",
            Refused(H1Error::MissingHost),
        ),
        case(
            "missing_host_http10",
            b"GET / HTTP/1.0\r\n\r\n",
            Head(Framing::None),
        ),
        case(
            "two_hosts",
            b"GET / HTTP/1.1\r\nHost: a.com\r\nHost: b.com\r\n\r\n",
            Refused(H1Error::DuplicateHost),
        ),
        case(
            "two_hosts_same",
            b"GET / HTTP/1.1\r\nHost: a.com\r\nhost: a.com\r\n\r\n",
            Refused(H1Error::DuplicateHost),
        ),
        case(
            "host_with_space",
            b"GET / HTTP/1.1\r\nHost: a.com b.com\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_with_braces",
            b"GET / HTTP/1.1\r\nHost: {a}.com\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_with_userinfo",
            b"GET / HTTP/1.1\r\nHost: allowed.com@evil.com\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_with_backslash",
            b"GET / HTTP/1.1\r\nHost: evil.com\\@allowed.com\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_percent_encoded",
            b"GET / HTTP/1.1\r\nHost: %65vil.com\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_with_high_byte",
            b"GET / HTTP/1.1\r\nHost: \xef\xbd\x81llowed.com\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_ipv6_with_port",
            b"GET / HTTP/1.1\r\nHost: [::1]:8080\r\n\r\n",
            Head(Framing::None),
        ),
        case(
            "host_ipv6_zone",
            b"GET / HTTP/1.1\r\nHost: [fe80::1%25en0]:80\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        case(
            "host_port_zero",
            b"GET / HTTP/1.1\r\nHost: a.com:0\r\n\r\n",
            Refused(H1Error::InvalidHost),
        ),
        // --- Targets -------------------------------------------------------------------
        case(
            "connect_without_port",
            b"CONNECT example.com HTTP/1.1\r\nHost: example.com\r\n\r\n",
            Refused(H1Error::ConnectWithoutPort),
        ),
        case(
            "connect_with_path",
            b"CONNECT example.com:443/x HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            Refused(H1Error::ConnectTargetNotAuthority),
        ),
        case(
            "connect_origin_form",
            b"CONNECT / HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            Refused(H1Error::ConnectTargetNotAuthority),
        ),
        case(
            "connect_absolute_form",
            b"CONNECT https://example.com:443/ HTTP/1.1\r\nHost: example.com:443\r\n\r\n",
            Refused(H1Error::ConnectTargetNotAuthority),
        ),
        case(
            "connect_userinfo",
            b"CONNECT user@example.com:443 HTTP/1.1\r\n\r\n",
            Refused(H1Error::UserinfoInTarget),
        ),
        case(
            "connect_port_out_of_range",
            b"CONNECT example.com:65536 HTTP/1.1\r\n\r\n",
            Refused(H1Error::InvalidAuthority),
        ),
        case(
            "connect_ipv6",
            b"CONNECT [2001:db8::1]:443 HTTP/1.1\r\nHost: [2001:db8::1]:443\r\n\r\n",
            HeadWithTarget(
                Framing::None,
                Target::Authority {
                    host: "[2001:db8::1]".into(),
                    port: 443,
                },
            ),
        ),
        case(
            "connect_without_host_header",
            b"CONNECT example.com:443 HTTP/1.1\r\n\r\n",
            HeadWithTarget(
                Framing::None,
                Target::Authority {
                    host: "example.com".into(),
                    port: 443,
                },
            ),
        ),
        case(
            "authority_form_on_get",
            b"GET example.com:443 HTTP/1.1\r\nHost: example.com\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "absolute_form_userinfo",
            b"GET http://allowed.com@evil.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n",
            Refused(H1Error::UserinfoInTarget),
        ),
        case(
            "absolute_form_encoded_userinfo",
            b"GET http://allowed.com%2F@evil.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n",
            Refused(H1Error::UserinfoInTarget),
        ),
        case(
            "absolute_form_backslash",
            b"GET http://evil.com\\@allowed.com/ HTTP/1.1\r\nHost: allowed.com\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "absolute_form_percent_host",
            b"GET http://%65vil.com/ HTTP/1.1\r\nHost: evil.com\r\n\r\n",
            Refused(H1Error::InvalidAuthority),
        ),
        case(
            "absolute_form_empty_host",
            b"GET http:///x HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidAuthority),
        ),
        case(
            "absolute_form_host_header_differs",
            b"GET HTTP://Allowed.com:8080?q=1 HTTP/1.1\r\nHost: evil.com\r\n\r\n",
            HeadWithTarget(
                Framing::None,
                Target::Absolute {
                    scheme: "http".into(),
                    authority: "Allowed.com:8080".into(),
                    path_and_query: "/?q=1".into(),
                },
            ),
        ),
        case(
            "origin_form_scheme_relative",
            b"GET //evil.com/x HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "absolute_form_scheme_relative_path",
            b"GET http://allowed.com//evil.com/x HTTP/1.1\r\nHost: allowed.com\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "absolute_form_single_slash_path",
            b"GET http://allowed.com/evil.com//x HTTP/1.1\r\nHost: allowed.com\r\n\r\n",
            HeadWithTarget(
                Framing::None,
                Target::Absolute {
                    scheme: "http".into(),
                    authority: "allowed.com".into(),
                    path_and_query: "/evil.com//x".into(),
                },
            ),
        ),
        case(
            "fragment_in_target",
            b"GET /a#b HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "nul_in_target",
            b"GET /a\x00b HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "high_byte_in_target",
            b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "bad_percent_escape_in_target",
            b"GET /a%2 HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidTarget),
        ),
        case(
            "asterisk_on_get",
            b"GET * HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::AsteriskOutsideOptions),
        ),
        case(
            "asterisk_on_options",
            b"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
            HeadWithTarget(Framing::None, Target::Asterisk),
        ),
        // --- Request line --------------------------------------------------------------
        case(
            "request_line_two_spaces",
            b"GET  / HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::MalformedRequestLine),
        ),
        case(
            "request_line_trailing_space",
            b"GET / HTTP/1.1 \r\nHost: a\r\n\r\n",
            Refused(H1Error::MalformedRequestLine),
        ),
        case(
            "request_line_tab_separator",
            b"GET\t/ HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::MalformedRequestLine),
        ),
        case(
            "request_line_space_in_target",
            b"GET /a b HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::MalformedRequestLine),
        ),
        case(
            "method_not_token",
            b"G(T / HTTP/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::InvalidMethod),
        ),
        case(
            "lowercase_version",
            b"GET / http/1.1\r\nHost: a\r\n\r\n",
            Refused(H1Error::MalformedVersion),
        ),
        case(
            "http2_version",
            b"GET / HTTP/2.0\r\nHost: a\r\n\r\n",
            Refused(H1Error::UnsupportedVersion),
        ),
        case(
            "http12_version",
            b"GET / HTTP/1.2\r\nHost: a\r\n\r\n",
            Refused(H1Error::UnsupportedVersion),
        ),
        case(
            "expect_other",
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 200-ok\r\nContent-Length: 0\r\n\r\n",
            Refused(H1Error::UnsupportedExpectation),
        ),
        case(
            "expect_continue",
            b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 0\r\n\r\n",
            Head(Framing::Length(0)),
        ),
        case(
            "connection_not_token",
            b"GET / HTTP/1.1\r\nHost: a\r\nConnection: close, x y\r\n\r\n",
            Refused(H1Error::InvalidConnection),
        ),
        // --- Chunked bodies ------------------------------------------------------------
        case(
            "chunked_ok_with_extension_and_trailer",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;name=\"v\"\r\nhello\r\n1\r\n!\r\n0\r\nX-Sum: 1\r\n\r\n",
            Body(b"hello!"),
        ),
        case(
            "chunk_size_bare_lf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::BareLf),
        ),
        case(
            "chunk_extension_bare_lf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::BareLf),
        ),
        case(
            "chunk_size_bare_cr",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\rhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::BareCr),
        ),
        case(
            "chunk_extension_nul",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5;a\x00\r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::InvalidChunkExtension),
        ),
        case(
            "chunk_size_overflow",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n10000000000000005\r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::ChunkSizeOverflow),
        ),
        case(
            "chunk_size_hex_prefix",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0x5\r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::InvalidChunkSize),
        ),
        case(
            "chunk_size_signed",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::InvalidChunkSize),
        ),
        case(
            "chunk_size_trailing_space",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5 \r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::InvalidChunkSize),
        ),
        case(
            "chunk_size_missing",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n;ext\r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::InvalidChunkSize),
        ),
        case(
            "chunk_data_without_crlf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhelloX\r\n0\r\n\r\n",
            BodyRefused(H1Error::MissingChunkCrlf),
        ),
        case(
            "chunk_data_bare_lf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n",
            BodyRefused(H1Error::MissingChunkCrlf),
        ),
        case(
            "chunk_data_longer_than_size",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhello\r\n0\r\n\r\n",
            BodyRefused(H1Error::MissingChunkCrlf),
        ),
        case(
            "last_chunk_missing",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n",
            BodyRefused(H1Error::IncompleteChunkedBody),
        ),
        case(
            "last_chunk_replaced_by_empty_line",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n\r\n",
            BodyRefused(H1Error::InvalidChunkSize),
        ),
        case(
            "trailer_section_missing",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n",
            BodyRefused(H1Error::IncompleteChunkedBody),
        ),
        case(
            "trailer_content_length",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\nContent-Length: 5\r\n\r\n",
            BodyRefused(H1Error::ForbiddenTrailer {
                name: "content-length".into(),
            }),
        ),
        case(
            "trailer_transfer_encoding",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nTRANSFER-ENCODING: chunked\r\n\r\n",
            BodyRefused(H1Error::ForbiddenTrailer {
                name: "transfer-encoding".into(),
            }),
        ),
        case(
            "trailer_host",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nHost: evil.com\r\n\r\n",
            BodyRefused(H1Error::ForbiddenTrailer {
                name: "host".into(),
            }),
        ),
        case(
            "trailer_obs_fold",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\r\n b\r\n\r\n",
            BodyRefused(H1Error::ObsoleteLineFolding),
        ),
        case(
            "trailer_bare_lf",
            b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\nX: a\n\r\n",
            BodyRefused(H1Error::BareLf),
        ),
        // --- Partial heads -------------------------------------------------------------
        case("partial_request_line", b"GET / HTTP/1.1\r", Partial),
        case(
            "partial_headers",
            b"GET / HTTP/1.1\r\nHost: a\r\nX: y\r\n\r",
            Partial,
        ),
    ];

    // --- Limits --------------------------------------------------------------------------
    let limits = Limits::default();
    let mut oversize = b"GET / HTTP/1.1\r\nHost: a\r\nX-Big: ".to_vec();
    oversize.resize(limits.max_head_bytes + 10, b'a');
    oversize.extend_from_slice(b"\r\n\r\n");
    cases.push(Case {
        name: "oversize_head",
        bytes: oversize,
        outcome: Refused(H1Error::HeadTooLarge {
            limit: limits.max_head_bytes,
        }),
    });
    let mut unterminated = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    while unterminated.len() < limits.max_head_bytes {
        unterminated.extend_from_slice(b"X-A: b\r\n");
    }
    unterminated.truncate(limits.max_head_bytes);
    cases.push(Case {
        name: "head_never_terminated",
        bytes: unterminated,
        outcome: Refused(H1Error::TooManyHeaders {
            limit: limits.max_headers,
        }),
    });
    let mut many = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 0..limits.max_headers {
        many.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    many.extend_from_slice(b"\r\n");
    cases.push(Case {
        name: "one_hundred_and_one_headers",
        bytes: many,
        outcome: Refused(H1Error::TooManyHeaders {
            limit: limits.max_headers,
        }),
    });
    let mut exactly = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 1..limits.max_headers {
        exactly.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    exactly.extend_from_slice(b"\r\n");
    cases.push(Case {
        name: "one_hundred_headers",
        bytes: exactly,
        outcome: Head(Framing::None),
    });
    let mut long_target = b"GET /".to_vec();
    long_target.resize("GET ".len() + limits.max_target_bytes + 1, b'a');
    long_target.extend_from_slice(b" HTTP/1.1\r\nHost: a\r\n\r\n");
    cases.push(Case {
        name: "target_too_long",
        bytes: long_target,
        outcome: Refused(H1Error::TargetTooLong {
            limit: limits.max_target_bytes,
        }),
    });
    let mut chunk_line =
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n1;".to_vec();
    chunk_line.resize(chunk_line.len() + limits.max_chunk_line, b'e');
    chunk_line.extend_from_slice(b"\r\na\r\n0\r\n\r\n");
    cases.push(Case {
        name: "chunk_extension_too_long",
        bytes: chunk_line,
        outcome: BodyRefused(H1Error::ChunkLineTooLong {
            limit: limits.max_chunk_line,
        }),
    });
    let mut trailer =
        b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n".to_vec();
    for i in 0..2000 {
        trailer.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    trailer.extend_from_slice(b"\r\n");
    cases.push(Case {
        name: "trailer_too_large",
        bytes: trailer,
        outcome: BodyRefused(H1Error::TrailerTooLarge {
            limit: limits.max_trailer_bytes,
        }),
    });
    cases
}

fn head_end(bytes: &[u8]) -> usize {
    bytes
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| i + 4)
        .expect("a well-formed head ends in an empty line")
}

fn parse(bytes: &[u8]) -> Result<Parsed<RequestHead>, H1Error> {
    parse_request_head(bytes, &Limits::default())
}

fn complete(name: &str, bytes: &[u8]) -> (RequestHead, usize) {
    match parse(bytes) {
        Ok(Parsed::Complete { head, consumed }) => (head, consumed),
        other => panic!("{name}: expected a complete head, got {other:?}"),
    }
}

/// Decodes the whole of `body`, then reports end of connection if the body is not over.
fn decode_all(body: &[u8]) -> Result<(Vec<u8>, usize), H1Error> {
    let mut decoder = ChunkedDecoder::new(&Limits::default());
    let mut payload = Vec::new();
    let (consumed, finished) = decoder.decode(body, &mut payload)?;
    if !finished {
        decoder.finish()?;
    }
    Ok((payload, consumed))
}

fn check(case: &Case) {
    let name = case.name;
    let bytes = case.bytes.as_slice();
    match &case.outcome {
        Refused(expected) => match parse(bytes) {
            Err(error) => assert_eq!(&error, expected, "{name}"),
            other => panic!("{name}: expected {expected:?}, got {other:?}"),
        },
        Partial => assert_eq!(parse(bytes), Ok(Parsed::Partial), "{name}"),
        Head(framing) => {
            let (head, consumed) = complete(name, bytes);
            assert_eq!(&head.framing, framing, "{name}");
            assert_eq!(consumed, head_end(bytes), "{name}");
        }
        HeadWithTarget(framing, target) => {
            let (head, consumed) = complete(name, bytes);
            assert_eq!(&head.framing, framing, "{name}");
            assert_eq!(&head.target, target, "{name}");
            assert_eq!(consumed, head_end(bytes), "{name}");
        }
        BodyRefused(expected) => {
            let (head, consumed) = complete(name, bytes);
            assert_eq!(head.framing, Framing::Chunked, "{name}");
            let body = bytes.get(consumed..).unwrap();
            match decode_all(body) {
                Err(error) => assert_eq!(&error, expected, "{name}"),
                Ok(decoded) => panic!("{name}: expected {expected:?}, decoded {decoded:?}"),
            }
        }
        Body(payload) => {
            let (head, consumed) = complete(name, bytes);
            assert_eq!(head.framing, Framing::Chunked, "{name}");
            let body = bytes.get(consumed..).unwrap();
            let (decoded, body_consumed) =
                decode_all(body).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(decoded.as_slice(), *payload, "{name}");
            assert_eq!(body_consumed, body.len(), "{name}");
        }
    }
}

#[test]
fn corpus_outcomes() {
    let cases = corpus();
    assert!(cases.len() >= 40, "corpus has {} cases", cases.len());
    let mut names: Vec<_> = cases.iter().map(|c| c.name).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), cases.len(), "case names are unique");
    for case in &cases {
        check(case);
    }
}

#[test]
fn corpus_outcomes_hold_at_every_split() {
    // A head must not change meaning when it arrives in pieces: every prefix of an accepted
    // head is Partial, and every prefix of a refused one is Partial or the same refusal.
    for case in corpus().into_iter().filter(|c| c.bytes.len() <= 4096) {
        let whole = parse(&case.bytes);
        let end = match &whole {
            Ok(Parsed::Complete { consumed, .. }) => *consumed,
            _ => case.bytes.len(),
        };
        for cut in 0..end {
            let prefix = parse(case.bytes.get(..cut).unwrap());
            match (&whole, &prefix) {
                (_, Ok(Parsed::Partial)) => {}
                (Err(expected), Err(got)) => {
                    assert_eq!(got, expected, "{}: prefix of {cut} bytes", case.name);
                }
                _ => panic!(
                    "{}: prefix of {cut} bytes gave {prefix:?}, whole gave {whole:?}",
                    case.name
                ),
            }
        }
    }
}

#[test]
fn refusal_statuses() {
    let limits = Limits::default();
    assert_eq!(
        H1Error::HeadTooLarge {
            limit: limits.max_head_bytes
        }
        .status(),
        431
    );
    assert_eq!(
        H1Error::TooManyHeaders {
            limit: limits.max_headers
        }
        .status(),
        431
    );
    assert_eq!(H1Error::UnsupportedVersion.status(), 505);
    assert_eq!(H1Error::UnsupportedTransferEncoding.status(), 501);
    assert_eq!(H1Error::UnsupportedExpectation.status(), 417);
    assert_eq!(
        H1Error::TargetTooLong {
            limit: limits.max_target_bytes
        }
        .status(),
        414
    );
    assert_eq!(H1Error::ContentLengthAndTransferEncoding.status(), 400);
    assert_eq!(H1Error::MalformedVersion.status(), 400);
    assert_eq!(H1Error::BareLf.to_string(), "bare LF line ending");
    assert_eq!(
        H1Error::ContentLengthAndTransferEncoding.to_string(),
        "both Content-Length and Transfer-Encoding"
    );
}

#[test]
fn absolute_form_reports_target_and_host_header() {
    let bytes = b"GET http://allowed.com/x HTTP/1.1\r\nHost: evil.com\r\n\r\n";
    let (head, _) = complete("absolute", bytes);
    assert_eq!(
        head.target,
        Target::Absolute {
            scheme: "http".into(),
            authority: "allowed.com".into(),
            path_and_query: "/x".into(),
        }
    );
    assert_eq!(head.host(), Some("evil.com"));
}

#[test]
fn pipelined_requests_consume_exactly_the_first() {
    let first = b"GET /one HTTP/1.1\r\nHost: a\r\n\r\n";
    let second = b"GET /two HTTP/1.1\r\nHost: a\r\n\r\n";
    let buf = [&first[..], &second[..]].concat();
    let (head, consumed) = complete("first", &buf);
    assert_eq!(head.target, Target::Origin("/one".into()));
    assert_eq!(consumed, first.len());
    let (head, consumed) = complete("second", buf.get(consumed..).unwrap());
    assert_eq!(head.target, Target::Origin("/two".into()));
    assert_eq!(consumed, second.len());
}

#[test]
fn pipelined_after_content_length_body() {
    let buf = b"POST /one HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\r\nhelloGET /two HTTP/1.1\r\nHost: a\r\n\r\n";
    let (head, consumed) = complete("first", buf);
    let Framing::Length(length) = head.framing else {
        panic!("expected a length, got {:?}", head.framing);
    };
    let next = consumed + usize::try_from(length).unwrap();
    assert_eq!(buf.get(consumed..next).unwrap(), b"hello");
    let (head, _) = complete("second", buf.get(next..).unwrap());
    assert_eq!(head.target, Target::Origin("/two".into()));
}

#[test]
fn pipelined_after_chunked_body() {
    let buf = b"POST /one HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\nGET /two HTTP/1.1\r\nHost: a\r\n\r\n";
    let (head, consumed) = complete("first", buf);
    assert_eq!(head.framing, Framing::Chunked);
    let mut decoder = ChunkedDecoder::new(&Limits::default());
    let mut payload = Vec::new();
    let body = buf.get(consumed..).unwrap();
    let (body_consumed, finished) = decoder.decode(body, &mut payload).unwrap();
    assert!(finished);
    assert_eq!(payload, b"hello");
    let (head, _) = complete("second", body.get(body_consumed..).unwrap());
    assert_eq!(head.target, Target::Origin("/two".into()));
}

#[test]
fn smuggled_request_in_te_cl_body_is_never_parsed() {
    // The classic CL.TE attack: a front end using Content-Length would forward "0\r\n\r\n"
    // plus the smuggled request as the body. We refuse the head outright.
    let buf = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 44\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /admin HTTP/1.1\r\nHost: a\r\n\r\n";
    assert_eq!(parse(buf), Err(H1Error::ContentLengthAndTransferEncoding));
}

#[test]
fn decoder_stays_failed() {
    let mut decoder = ChunkedDecoder::new(&Limits::default());
    let mut out = Vec::new();
    assert_eq!(decoder.decode(b"5\nhello", &mut out), Err(H1Error::BareLf));
    assert_eq!(decoder.decode(b"0\r\n\r\n", &mut out), Err(H1Error::BareLf));
    assert_eq!(decoder.finish(), Err(H1Error::BareLf));
}

//! Every way the gateway answers instead of the upstream, in one place: policy refusals
//! (403), malformed requests (400 and friends), limits, and upstream failures (502/504).
//! A refusal is never a dropped connection without a reason.

use std::fmt::Write as _;

use capgate_policy::{Reason, Verdict};

/// The header naming the reason code of a refusal.
pub const REASON_HEADER: &str = "X-Capgate-Reason";

/// A complete `text/plain` HTTP/1.1 response. `close` adds `Connection: close`.
/// 502 for an upstream response head capgate cannot re-serialize; the connection closes.
pub fn unrelayable() -> Vec<u8> {
    plain(
        502,
        Reason::InvalidTarget,
        "capgate: the upstream's response cannot be relayed\n",
        true,
    )
}

pub fn plain(status: u16, reason: Reason, body: &str, close: bool) -> Vec<u8> {
    let mut out = String::with_capacity(256 + body.len());
    let _ = write!(
        out,
        "HTTP/1.1 {status} {}\r\nContent-Type: text/plain; charset=utf-8\r\n{REASON_HEADER}: {}\r\nContent-Length: {}\r\n",
        status_text(status),
        reason.code(),
        body.len()
    );
    if close {
        out.push_str("Connection: close\r\n");
    }
    out.push_str("\r\n");
    out.push_str(body);
    out.into_bytes()
}

/// The 403 for a policy decision: what was refused, why, and which rule decided.
pub fn refusal(verdict: &Verdict, sandbox: &str, what: &str, close: bool) -> Vec<u8> {
    plain(
        403,
        verdict.reason,
        &refusal_body(verdict, sandbox, what),
        close,
    )
}

/// The text of a refusal, the same over HTTP/1.1 and HTTP/2.
pub fn refusal_body(verdict: &Verdict, sandbox: &str, what: &str) -> String {
    let mut body = format!(
        "capgate refused {what}\nreason: {}\n",
        verdict.reason.code()
    );
    match &verdict.rule {
        Some(rule) => {
            let source = serde_json::to_value(rule.source)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = writeln!(body, "rule: {} ({source}, id {})", rule.name, rule.id);
        }
        None if verdict.reason == Reason::NoMatchingAllow => {
            body.push_str("rule: none: nothing allows this host (default deny)\n");
        }
        None => {}
    }
    let _ = writeln!(body, "detail: {}", verdict.message);
    let _ = writeln!(body, "sandbox: {sandbox}");
    body.push_str("see: capgate policy log; capgate policy check network HOST\n");
    body
}

pub fn status_text(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        403 => "Forbidden",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        414 => "URI Too Long",
        417 => "Expectation Failed",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "Error",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use capgate_policy::{Decision, DenyKind, RuleRef, Source};

    #[test]
    fn refusals_name_the_reason_and_rule() {
        let v = Verdict {
            decision: Decision::Deny,
            deny_kind: Some(DenyKind::Explicit),
            reason: Reason::DeniedByRule,
            rule: Some(RuleRef {
                id: "r-1".into(),
                name: "kit:s:deny".into(),
                source: Source::Kit,
            }),
            message: "`x.example:443` is denied by rule `kit:s:deny` (kit)".into(),
            inspect: false,
        };
        let text =
            String::from_utf8(refusal(&v, "s", "CONNECT x.example:443", true)).unwrap_or_default();
        assert!(text.starts_with("HTTP/1.1 403 Forbidden\r\n"));
        assert!(text.contains("X-Capgate-Reason: denied_by_rule\r\n"));
        assert!(text.contains("rule: kit:s:deny (kit, id r-1)"));
        let body = text.split("\r\n\r\n").nth(1).unwrap_or_default();
        assert!(text.contains(&format!("Content-Length: {}\r\n", body.len())));
    }
}

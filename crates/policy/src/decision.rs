//! Decisions are data: a verdict carries its reason code, the deciding rule and a sentence
//! for people. The same value feeds the 403 body, the `X-Capgate-Reason` header, the audit
//! log and `capgate policy check --json`.

use std::fmt;
use std::net::IpAddr;

use serde::{Deserialize, Serialize};

use crate::rule::{Decision, Method, Phase, Protocol, Source};

/// Why a verdict is what it is. The codes are stable: scripts and the audit log rely on
/// them. Every code is documented in `docs/reasons.md`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// An allow rule matched and no deny rule did.
    AllowedByRule,
    /// A deny rule matched (deny wins over every allow, in every scope).
    DeniedByRule,
    /// No rule allows the host (default deny).
    NoMatchingAllow,
    /// The host is granted only for some HTTP requests, and this request is not one of them.
    HttpNotAllowed,
    /// The host is granted only for some HTTP requests, and this traffic cannot be inspected
    /// (an opaque tunnel or a non-HTTP protocol).
    InspectionRequired,
    /// The request path is ambiguous (an encoded `/` or `.` that would change its meaning),
    /// so a bounded rule cannot judge it.
    AmbiguousPath,
    /// The target is not a host name, IP address or URL capgate can judge.
    InvalidTarget,
    /// The address the name resolved to (or the literal) is private, loopback, link-local,
    /// metadata or otherwise blocked.
    BlockedAddress,
    /// A credential sentinel was sent somewhere its credential is not injected.
    CredentialExfiltration,
    /// A gateway limit was exceeded (header size, timeouts, connections).
    LimitExceeded,
    /// The request could not be parsed unambiguously.
    MalformedRequest,
    /// Deciding failed; failing closed.
    InternalError,
    /// The client ended the TLS handshake with the certificate capgate made for the host:
    /// it does not trust capgate's CA, so nothing could be sent.
    CaNotTrusted,
    /// A program the sandbox's exec allowlist does not grant was executed (the kernel
    /// refused it with EACCES).
    ExecNotGranted,
}

impl Reason {
    pub const ALL: [Reason; 14] = [
        Reason::AllowedByRule,
        Reason::DeniedByRule,
        Reason::NoMatchingAllow,
        Reason::HttpNotAllowed,
        Reason::InspectionRequired,
        Reason::AmbiguousPath,
        Reason::InvalidTarget,
        Reason::BlockedAddress,
        Reason::CredentialExfiltration,
        Reason::LimitExceeded,
        Reason::MalformedRequest,
        Reason::InternalError,
        Reason::CaNotTrusted,
        Reason::ExecNotGranted,
    ];

    /// The stable snake_case code.
    pub fn code(self) -> &'static str {
        match self {
            Reason::AllowedByRule => "allowed_by_rule",
            Reason::DeniedByRule => "denied_by_rule",
            Reason::NoMatchingAllow => "no_matching_allow",
            Reason::HttpNotAllowed => "http_not_allowed",
            Reason::InspectionRequired => "inspection_required",
            Reason::AmbiguousPath => "ambiguous_path",
            Reason::InvalidTarget => "invalid_target",
            Reason::BlockedAddress => "blocked_address",
            Reason::CredentialExfiltration => "credential_exfiltration",
            Reason::LimitExceeded => "limit_exceeded",
            Reason::MalformedRequest => "malformed_request",
            Reason::InternalError => "internal_error",
            Reason::CaNotTrusted => "ca_not_trusted",
            Reason::ExecNotGranted => "exec_not_granted",
        }
    }

    pub fn parse(code: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.code() == code)
    }
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.code())
    }
}

/// Whether a denial came from a deny rule or from nothing allowing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DenyKind {
    Explicit,
    Implicit,
}

/// The rule that decided, as shown to people and recorded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RuleRef {
    pub id: String,
    pub name: String,
    pub source: Source,
}

/// The answer to one query.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Verdict {
    pub decision: Decision,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deny_kind: Option<DenyKind>,
    pub reason: Reason,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rule: Option<RuleRef>,
    /// A sentence for people, e.g. "`api.example.com` is denied by rule `kit:m1:deny` (kit)".
    pub message: String,
    /// For a connection-level query that is allowed: the host is granted only for some HTTP
    /// requests, so the traffic must be inspected (TLS intercepted) and each request judged.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inspect: bool,
}

impl Verdict {
    pub fn is_allowed(&self) -> bool {
        self.decision == Decision::Allow
    }

    /// A denial with no rule behind it (failing closed).
    pub fn refused(reason: Reason, message: impl Into<String>) -> Verdict {
        Verdict {
            decision: Decision::Deny,
            deny_kind: Some(DenyKind::Implicit),
            reason,
            rule: None,
            message: message.into(),
            inspect: false,
        }
    }
}

/// What is being asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A host name, already normalized (see `pattern::normalize_host`).
    Host(String),
    Ip(IpAddr),
}

/// One HTTP request on an inspected connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpRequest {
    pub method: Method,
    /// The request path as sent (no query string); the matcher normalizes it.
    pub path: String,
}

/// A question to the decision function: may this sandbox, in this phase, reach this target
/// (and, on an inspected connection, make this HTTP request)?
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub sandbox: Option<String>,
    pub phase: Phase,
    pub target: Target,
    pub port: u16,
    pub protocol: Protocol,
    /// `None` asks about the connection; `Some` about one request on it.
    pub http: Option<HttpRequest>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_code_is_stable_and_documented() {
        let doc = include_str!("../../../docs/reasons.md");
        for r in Reason::ALL {
            assert_eq!(Reason::parse(r.code()), Some(r));
            assert!(
                doc.contains(&format!("| `{}` |", r.code())),
                "docs/reasons.md lacks `{}`",
                r.code()
            );
            // Serialized, a reason is its code.
            assert_eq!(
                serde_json::to_value(r).ok(),
                Some(serde_json::Value::String(r.code().to_owned()))
            );
        }
        assert_eq!(
            doc.matches("\n| `").count(),
            Reason::ALL.len(),
            "every documented code exists"
        );
    }
}

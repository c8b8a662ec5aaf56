//! The rule model: what a rule says, who made it, and where it applies.

use std::fmt;

use serde::{Deserialize, Serialize};

pub use capgate_spec::caps::Phase;
pub use capgate_spec::caps::network::Method;

/// Where a rule applies.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    /// Every sandbox.
    Global,
    /// One sandbox, by name.
    Sandbox(String),
}

impl Scope {
    /// `global` or `sandbox:NAME`.
    pub fn parse(s: &str) -> Option<Scope> {
        match s {
            "global" => Some(Scope::Global),
            _ => s
                .strip_prefix("sandbox:")
                .filter(|n| !n.is_empty())
                .map(|n| Scope::Sandbox(n.to_owned())),
        }
    }

    /// Whether a rule of this scope applies to a request from `sandbox`.
    pub fn applies_to(&self, sandbox: Option<&str>) -> bool {
        match self {
            Scope::Global => true,
            Scope::Sandbox(name) => sandbox == Some(name.as_str()),
        }
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scope::Global => f.write_str("global"),
            Scope::Sandbox(n) => write!(f, "sandbox:{n}"),
        }
    }
}

impl Serialize for Scope {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Scope {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Scope::parse(&s).ok_or_else(|| {
            serde::de::Error::custom(format!("scope `{s}` is not `global` or `sandbox:NAME`"))
        })
    }
}

/// What kind of resource a rule governs. Only the network is governed by rules today;
/// filesystem grants are enforced by the sandbox from the kit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ResourceType {
    Network,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Decision {
    Allow,
    Deny,
}

/// Which traffic a rule covers: a transport, or (for the egress triples of packs) one
/// protocol carried over TCP. In a query it says what the gateway is carrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    /// Every TCP stream, HTTP and HTTPS included.
    Tcp,
    Udp,
    /// Both TCP and UDP.
    Any,
    /// Cleartext HTTP requests (absolute-form through the proxy).
    Http,
    /// TLS: a tunnel whose first bytes are a TLS ClientHello naming the host, or the HTTP
    /// requests inside an intercepted one.
    Https,
}

impl Protocol {
    pub const ALL: [Protocol; 5] = [
        Protocol::Tcp,
        Protocol::Udp,
        Protocol::Any,
        Protocol::Http,
        Protocol::Https,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Tcp => "tcp",
            Protocol::Udp => "udp",
            Protocol::Any => "any",
            Protocol::Http => "http",
            Protocol::Https => "https",
        }
    }

    pub fn parse(s: &str) -> Option<Protocol> {
        Protocol::ALL.into_iter().find(|p| p.as_str() == s)
    }

    /// Whether traffic of this protocol is carried over TCP (and so can be inspected).
    pub fn is_over_tcp(self) -> bool {
        matches!(self, Protocol::Tcp | Protocol::Http | Protocol::Https)
    }

    /// Whether a rule for `self` covers traffic the gateway carries as `carried`: `any`
    /// covers all, `tcp` covers HTTP and HTTPS too, `http` and `https` only themselves.
    pub fn covers(self, carried: Protocol) -> bool {
        self == Protocol::Any
            || self == carried
            || (self == Protocol::Tcp && matches!(carried, Protocol::Http | Protocol::Https))
    }
}

impl fmt::Display for Protocol {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who made a rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// Provisioned from a kit's grants when the sandbox was created.
    Kit,
    /// Added by the user with `capgate policy allow|deny`.
    User,
    /// Part of a preset (`capgate policy init`).
    Default,
}

/// How a rule came to exist.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CreatedVia {
    Provisioned,
    Added,
    Default,
}

/// One rule. A rule with `methods` or `paths` is *bounded*: it speaks only about HTTP
/// requests to its hosts, never about other traffic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rule {
    pub id: String,
    pub name: String,
    pub scope: Scope,
    pub resource_type: ResourceType,
    pub decision: Decision,
    /// Host patterns (`example.com`, `*.example.com`, `**.example.com`, `*`, `**`, each
    /// optionally `:port`), IP literals (`[::1]:443` for IPv6 with a port) and CIDRs.
    pub resources: Vec<String>,
    /// HTTP methods (`ANY` for every method); `None` means the rule is not about methods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub methods: Option<Vec<Method>>,
    /// HTTP path globs (`/repos/**`; `*` stays within one segment).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<String>>,
    pub protocol: Protocol,
    /// The grant phase the rule applies in; `None` for both.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    pub source: Source,
    pub created_via: CreatedVia,
    pub editable: bool,
    pub active: bool,
    /// RFC 3339 UTC.
    pub created_at: String,
}

impl Rule {
    /// States methods or paths.
    pub fn is_bounded(&self) -> bool {
        self.methods.is_some() || self.paths.is_some()
    }
}

//! Host patterns of network rules, and the targets they are matched against.
//!
//! Names are compared in one canonical form on both sides: lowercase ASCII, IDNA (UTS #46)
//! labels in punycode, no trailing dot. A rule's host part and a query's target go through
//! the same [`normalize_host`], so `Bücher.Example.` and `xn--bcher-kva.example` are one
//! host.
//!
//! Resource forms (see `reference/sbx-runtime.md` §1.4):
//!
//! | written                       | covers                                               |
//! |-------------------------------|------------------------------------------------------|
//! | `example.com`                 | that host, any port                                  |
//! | `example.com:443`             | that host, port 443                                  |
//! | `example.com:*`               | that host, any port                                  |
//! | `*.example.com`               | a host exactly one label below `example.com`         |
//! | `**.example.com`              | a host one or more labels below (not `example.com`)  |
//! | `*`, `**`                     | every host name and every address                    |
//! | `10.0.0.1`, `10.0.0.1:22`     | that IPv4 address                                    |
//! | `[2001:db8::1]`, `[…]:443`    | that IPv6 address                                    |
//! | `2001:db8::1`                 | that IPv6 address, any port (a bare IPv6 takes none) |
//! | `10.0.0.0/8`, `[2001:db8::/32]:443` | a network                                      |
//!
//! Name patterns match host names only; address patterns match addresses only; `*` and
//! `**` match both.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use idna::uts46::{AsciiDenyList, DnsLength, Hyphens, Uts46};
use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::decision::Target;

/// Longest input looked at; anything longer is refused before IDNA processing.
const MAX_INPUT: usize = 1024;
/// Longest host name in its ASCII form (RFC 1035, without the root dot).
const MAX_NAME: usize = 253;
/// Longest label in its ASCII form (RFC 1035).
const MAX_LABEL: usize = 63;

/// Why a host name, pattern or target was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    #[error("the host is empty")]
    Empty,
    #[error("`{start}…` is longer than {MAX_INPUT} bytes")]
    TooLong { start: String },
    #[error("`{host}` is not a valid host name: {problem}")]
    InvalidHost { host: String, problem: HostProblem },
    #[error("`{input}` has an invalid port (expected 1 to 65535, or `*` in a rule)")]
    InvalidPort { input: String },
    #[error("`{input}` is not a valid IP address or network")]
    InvalidAddress { input: String },
    #[error(
        "`{input}`: a wildcard stands alone (`*`, `**`) or as the whole first label (`*.example.com`, `**.example.com`)"
    )]
    MisplacedWildcard { input: String },
    #[error("`{input}`: scheme `{scheme}` has no default port, so the URL must name one")]
    MissingPort { input: String, scheme: String },
    #[error("`{input}` carries user information; give the host alone")]
    UserInfo { input: String },
    #[error("`{input}` is not a host, address or URL")]
    InvalidTarget { input: String },
}

/// What is wrong with a host name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostProblem {
    #[error("it has an empty label")]
    EmptyLabel,
    #[error("a label is longer than {MAX_LABEL} bytes")]
    LabelTooLong,
    #[error("it is longer than {MAX_NAME} bytes")]
    NameTooLong,
    #[error("it contains `{0}`")]
    ForbiddenCharacter(char),
    #[error("it is not a valid internationalized name")]
    Idna,
    #[error("its last label is a number, so it reads as an address")]
    NumericLastLabel,
}

fn too_long(input: &str) -> PatternError {
    PatternError::TooLong {
        start: input.chars().take(32).collect(),
    }
}

/// The canonical form of a host name: lowercase ASCII, IDNA labels as punycode, one
/// trailing dot removed. Refuses empty labels, spaces and every character that has no
/// place in a DNS name (`*`, `/`, `:`, `@`, …), overlong names and labels, and names whose
/// last label is a number (`127.1`, `0x7f.1`), which resolvers read as addresses.
pub fn normalize_host(input: &str) -> Result<String, PatternError> {
    if input.is_empty() {
        return Err(PatternError::Empty);
    }
    if input.len() > MAX_INPUT {
        return Err(too_long(input));
    }
    let invalid = |problem| PatternError::InvalidHost {
        host: input.to_owned(),
        problem,
    };
    // ASCII outside letters, digits, `-`, `_` and `.` has no place in a name, and UTS #46
    // maps none of it: name it rather than report an IDNA failure.
    if let Some(c) = input
        .chars()
        .find(|c| c.is_ascii() && !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')))
    {
        return Err(invalid(HostProblem::ForbiddenCharacter(c)));
    }
    let ascii = Uts46::new()
        .to_ascii(
            input.as_bytes(),
            AsciiDenyList::URL,
            Hyphens::Allow,
            DnsLength::Ignore,
        )
        .map_err(|_| invalid(HostProblem::Idna))?;
    let name = ascii.strip_suffix('.').unwrap_or(&ascii);
    check_name(name).map_err(invalid)?;
    Ok(name.to_owned())
}

/// Checks a name that is already ASCII.
fn check_name(name: &str) -> Result<(), HostProblem> {
    if name.len() > MAX_NAME {
        return Err(HostProblem::NameTooLong);
    }
    let mut last = "";
    for label in name.split('.') {
        if label.is_empty() {
            return Err(HostProblem::EmptyLabel);
        }
        if label.len() > MAX_LABEL {
            return Err(HostProblem::LabelTooLong);
        }
        if let Some(c) = label.chars().find(|c| !is_name_char(*c)) {
            return Err(HostProblem::ForbiddenCharacter(c));
        }
        last = label;
    }
    if reads_as_number(last) {
        return Err(HostProblem::NumericLastLabel);
    }
    Ok(())
}

fn is_name_char(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_'
}

/// The WHATWG "ends in a number" test for the last label: decimal, or `0x` and hex.
fn reads_as_number(label: &str) -> bool {
    if let Some(hex) = label.strip_prefix("0x") {
        return hex.bytes().all(|b| b.is_ascii_hexdigit());
    }
    !label.is_empty() && label.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `host` is already in the form [`normalize_host`] gives, judged without IDNA
/// processing (labels starting `xn--` need it, so they are never judged canonical here).
/// When this is true, `normalize_host(host) == Ok(host)`.
pub(crate) fn is_canonical_host(host: &str) -> bool {
    let bytes = host.as_bytes();
    if bytes.is_empty() || bytes.len() > MAX_NAME {
        return false;
    }
    let mut last: &[u8] = &[];
    for label in bytes.split(|&b| b == b'.') {
        if label.is_empty()
            || label.len() > MAX_LABEL
            || label.starts_with(b"xn--")
            || !label.iter().all(|&b| is_name_char(char::from(b)))
        {
            return false;
        }
        last = label;
    }
    // `last` holds name characters only, so it is ASCII.
    !reads_as_number(std::str::from_utf8(last).unwrap_or("0"))
}

/// Which ports a pattern covers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PortSpec {
    /// No port, or `:*`.
    Any,
    Exact(u16),
}

impl PortSpec {
    pub fn matches(self, port: u16) -> bool {
        match self {
            PortSpec::Any => true,
            PortSpec::Exact(p) => p == port,
        }
    }
}

/// The host part of a pattern.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostForm {
    /// `example.com`: that host only.
    Exact(String),
    /// `*.example.com`: a host exactly one label below the suffix.
    OneLabelBelow(String),
    /// `**.example.com`: a host one or more labels below the suffix (not the suffix).
    AnyDepthBelow(String),
    /// `*` or `**`: every host name and every address.
    Everything,
    /// An address (as a `/32` or `/128`) or a network; matches addresses only.
    Network(IpNet),
}

/// One resource of a rule, parsed: which hosts or addresses, on which ports.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPattern {
    pub host: HostForm,
    pub port: PortSpec,
}

impl HostPattern {
    /// Parses a rule resource (see the module documentation for the forms).
    pub fn parse(input: &str) -> Result<HostPattern, PatternError> {
        if input.is_empty() {
            return Err(PatternError::Empty);
        }
        if input.len() > MAX_INPUT {
            return Err(too_long(input));
        }
        let invalid_address = || PatternError::InvalidAddress {
            input: input.to_owned(),
        };
        if let Some(inner) = input.strip_prefix('[') {
            let (inside, after) = inner.split_once(']').ok_or_else(invalid_address)?;
            let net = if inside.contains('/') {
                inside.parse::<Ipv6Net>().map_err(|_| invalid_address())?
            } else {
                let ip = inside.parse::<Ipv6Addr>().map_err(|_| invalid_address())?;
                Ipv6Net::from(ip)
            };
            let port = match after {
                "" => PortSpec::Any,
                _ => {
                    let p = after.strip_prefix(':').ok_or_else(invalid_address)?;
                    parse_rule_port(p, input)?
                }
            };
            return Ok(HostPattern {
                host: HostForm::Network(canonical_net(IpNet::V6(net))),
                port,
            });
        }
        // A bare address or network, IPv6 included (which can never carry a port).
        if let Ok(ip) = input.parse::<IpAddr>() {
            return Ok(HostPattern {
                host: HostForm::Network(canonical_net(IpNet::from(ip))),
                port: PortSpec::Any,
            });
        }
        if let Ok(net) = input.parse::<IpNet>() {
            return Ok(HostPattern {
                host: HostForm::Network(canonical_net(net)),
                port: PortSpec::Any,
            });
        }
        let (host, port) = match input.split_once(':') {
            None => (input, PortSpec::Any),
            Some((host, port)) => {
                if port.contains(':') {
                    // Several colons: an IPv6 address that failed to parse, or garbage.
                    return Err(invalid_address());
                }
                (host, parse_rule_port(port, input)?)
            }
        };
        let host = parse_host_form(host, input)?;
        Ok(HostPattern { host, port })
    }

    /// Whether the pattern covers `target` on `port`. `target` must be normalized (as
    /// [`parse_target`] and [`normalize_host`] give it).
    pub fn matches(&self, target: &Target, port: u16) -> bool {
        self.port.matches(port) && self.covers(target)
    }

    /// Whether the host part covers `target`, whatever the port.
    pub fn covers(&self, target: &Target) -> bool {
        match (&self.host, target) {
            (HostForm::Everything, _) => true,
            (HostForm::Exact(h), Target::Host(t)) => h == t,
            (HostForm::OneLabelBelow(suffix), Target::Host(t)) => {
                below(t, suffix).is_some_and(|label| !label.contains('.'))
            }
            (HostForm::AnyDepthBelow(suffix), Target::Host(t)) => below(t, suffix).is_some(),
            (HostForm::Network(net), Target::Ip(ip)) => net.contains(&ip.to_canonical()),
            (
                HostForm::Exact(_) | HostForm::OneLabelBelow(_) | HostForm::AnyDepthBelow(_),
                Target::Ip(_),
            )
            | (HostForm::Network(_), Target::Host(_)) => false,
        }
    }
}

/// The part of `host` before `.suffix`, when it is non-empty.
fn below<'a>(host: &'a str, suffix: &str) -> Option<&'a str> {
    host.strip_suffix(suffix)?
        .strip_suffix('.')
        .filter(|rest| !rest.is_empty())
}

/// IPv4-mapped IPv6 addresses and networks (`::ffff:10.0.0.0/104`) become IPv4, so that
/// they meet targets, which are canonicalized the same way.
fn canonical_net(net: IpNet) -> IpNet {
    let net = net.trunc();
    if let IpNet::V6(v6) = net
        && let IpAddr::V4(v4) = IpAddr::V6(v6.network()).to_canonical()
        && v6.prefix_len() >= 96
        && let Ok(v4net) = Ipv4Net::new(v4, v6.prefix_len() - 96)
    {
        return IpNet::V4(v4net);
    }
    net
}

fn parse_host_form(host: &str, input: &str) -> Result<HostForm, PatternError> {
    match host {
        "*" | "**" => return Ok(HostForm::Everything),
        "" => return Err(PatternError::Empty),
        _ => {}
    }
    if let Some(suffix) = host.strip_prefix("**.") {
        return Ok(HostForm::AnyDepthBelow(normalize_pattern_name(
            suffix, input,
        )?));
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        return Ok(HostForm::OneLabelBelow(normalize_pattern_name(
            suffix, input,
        )?));
    }
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok(HostForm::Network(IpNet::from(IpAddr::V4(ip))));
    }
    if let Ok(net) = host.parse::<Ipv4Net>() {
        return Ok(HostForm::Network(canonical_net(IpNet::V4(net))));
    }
    Ok(HostForm::Exact(normalize_pattern_name(host, input)?))
}

fn normalize_pattern_name(name: &str, input: &str) -> Result<String, PatternError> {
    if name.contains('*') {
        return Err(PatternError::MisplacedWildcard {
            input: input.to_owned(),
        });
    }
    normalize_host(name)
}

/// A rule port: `*` or 1..=65535.
fn parse_rule_port(port: &str, input: &str) -> Result<PortSpec, PatternError> {
    if port == "*" {
        return Ok(PortSpec::Any);
    }
    parse_port(port, input).map(PortSpec::Exact)
}

/// A port number 1..=65535, digits only.
fn parse_port(port: &str, input: &str) -> Result<u16, PatternError> {
    let invalid = || PatternError::InvalidPort {
        input: input.to_owned(),
    };
    if port.is_empty() || port.len() > 5 || !port.bytes().all(|b| b.is_ascii_digit()) {
        return Err(invalid());
    }
    match port.parse::<u16>() {
        Ok(p) if p != 0 => Ok(p),
        _ => Err(invalid()),
    }
}

impl fmt::Display for HostPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let bracket =
            matches!(self.host, HostForm::Network(IpNet::V6(_))) && self.port != PortSpec::Any;
        if bracket {
            f.write_str("[")?;
        }
        match &self.host {
            HostForm::Exact(h) => f.write_str(h)?,
            HostForm::OneLabelBelow(s) => write!(f, "*.{s}")?,
            HostForm::AnyDepthBelow(s) => write!(f, "**.{s}")?,
            HostForm::Everything => f.write_str("**")?,
            HostForm::Network(net) if net.prefix_len() == net.max_prefix_len() => {
                write!(f, "{}", net.addr())?
            }
            HostForm::Network(net) => write!(f, "{net}")?,
        }
        if bracket {
            f.write_str("]")?;
        }
        match self.port {
            PortSpec::Any => Ok(()),
            PortSpec::Exact(p) => write!(f, ":{p}"),
        }
    }
}

/// Parses what `capgate policy check` is asked about: `host`, `host:port`, an IPv4
/// address (optionally with `:port`), `[v6]`, `[v6]:port`, a bare IPv6 address, or a URL.
/// A URL's port defaults to 80 for `http` and 443 for `https`; other schemes must name
/// one. Without a URL or a port, the port is 443 (as `sbx policy check` assumes).
pub fn parse_target(input: &str) -> Result<(Target, u16), PatternError> {
    if input.is_empty() {
        return Err(PatternError::Empty);
    }
    if input.len() > MAX_INPUT {
        return Err(too_long(input));
    }
    let Some((scheme, rest)) = input.split_once("://") else {
        let (target, port) = parse_authority(input, input)?;
        return Ok((target, port.unwrap_or(443)));
    };
    let scheme_ok = scheme
        .bytes()
        .next()
        .is_some_and(|b| b.is_ascii_alphabetic())
        && scheme
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if !scheme_ok {
        return Err(PatternError::InvalidTarget {
            input: input.to_owned(),
        });
    }
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    if authority.contains('@') {
        return Err(PatternError::UserInfo {
            input: input.to_owned(),
        });
    }
    let (target, port) = parse_authority(authority, input)?;
    let scheme = scheme.to_ascii_lowercase();
    let default = match scheme.as_str() {
        "http" => Some(80),
        "https" => Some(443),
        _ => None,
    };
    match port.or(default) {
        Some(port) => Ok((target, port)),
        None => Err(PatternError::MissingPort {
            input: input.to_owned(),
            scheme,
        }),
    }
}

/// `host`, `host:port`, `v4`, `v4:port`, `[v6]`, `[v6]:port` or bare `v6`.
fn parse_authority(authority: &str, input: &str) -> Result<(Target, Option<u16>), PatternError> {
    let invalid = || PatternError::InvalidTarget {
        input: input.to_owned(),
    };
    if authority.is_empty() {
        return Err(PatternError::Empty);
    }
    if let Some(inner) = authority.strip_prefix('[') {
        let (inside, after) = inner.split_once(']').ok_or_else(invalid)?;
        let ip = inside.parse::<Ipv6Addr>().map_err(|_| invalid())?;
        let port = match after {
            "" => None,
            _ => Some(parse_port(
                after.strip_prefix(':').ok_or_else(invalid)?,
                input,
            )?),
        };
        return Ok((Target::Ip(IpAddr::V6(ip).to_canonical()), port));
    }
    if let Ok(ip) = authority.parse::<IpAddr>() {
        return Ok((Target::Ip(ip.to_canonical()), None));
    }
    let (host, port) = match authority.split_once(':') {
        None => (authority, None),
        Some((_, port)) if port.contains(':') => return Err(invalid()),
        Some((host, port)) => (host, Some(parse_port(port, input)?)),
    };
    if let Ok(ip) = host.parse::<Ipv4Addr>() {
        return Ok((Target::Ip(IpAddr::V4(ip)), port));
    }
    Ok((Target::Host(normalize_host(host)?), port))
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

    fn host(s: &str) -> Target {
        Target::Host(s.to_owned())
    }

    fn ip(s: &str) -> Target {
        Target::Ip(s.parse().unwrap())
    }

    #[test]
    fn normalizes_case_trailing_dot_and_idna() {
        assert_eq!(
            normalize_host("API.Example.COM.").unwrap(),
            "api.example.com"
        );
        assert_eq!(
            normalize_host("bücher.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            normalize_host("BÜCHER.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            normalize_host("xn--bcher-kva.example").unwrap(),
            "xn--bcher-kva.example"
        );
        assert_eq!(
            normalize_host("_dmarc.example.com").unwrap(),
            "_dmarc.example.com"
        );
        // The ideographic full stop is a dot under UTS #46.
        assert_eq!(normalize_host("example\u{3002}com").unwrap(), "example.com");
    }

    #[test]
    fn refuses_bad_names() {
        for bad in [
            "",
            ".",
            "a..b",
            ".a",
            "a.b..",
            "a b",
            "a*b",
            "a/b",
            "a:b",
            "a@b",
            "127.1",
            "10.0.0.1",
            "a.0x7f",
            "a.123",
            &"a".repeat(64),
            &format!("{}.com", ["a"; 130].join(".")),
            "xn--a.example",
        ] {
            assert!(normalize_host(bad).is_err(), "{bad:?} should be refused");
        }
        assert!(normalize_host(&"a".repeat(2000)).is_err());
    }

    #[test]
    fn error_messages_name_the_input() {
        let e = normalize_host("a b").unwrap_err().to_string();
        assert_eq!(e, "`a b` is not a valid host name: it contains ` `");
        let e = normalize_host("xn--a.example").unwrap_err().to_string();
        assert!(e.contains("internationalized"), "{e}");
        let e = normalize_host("a.123").unwrap_err().to_string();
        assert!(e.contains("reads as an address"), "{e}");
    }

    #[test]
    fn canonical_fast_check_agrees_with_normalize() {
        for s in [
            "a.b",
            "example.com",
            "a-b_c.d",
            "A.b",
            "a.b.",
            "xn--bcher-kva.example",
            "a.1",
            "1.a",
            "a..b",
            "",
            "localhost",
        ] {
            if is_canonical_host(s) {
                assert_eq!(normalize_host(s).as_deref(), Ok(s), "{s}");
            }
        }
        assert!(is_canonical_host("api.example.com"));
        assert!(!is_canonical_host("API.example.com"));
        assert!(!is_canonical_host("xn--bcher-kva.example"));
    }

    #[test]
    fn parses_pattern_forms() {
        let p = HostPattern::parse("Example.COM.").unwrap();
        assert_eq!(p.host, HostForm::Exact("example.com".into()));
        assert_eq!(p.port, PortSpec::Any);
        let p = HostPattern::parse("example.com:443").unwrap();
        assert_eq!(p.port, PortSpec::Exact(443));
        let p = HostPattern::parse("example.com:*").unwrap();
        assert_eq!(p.port, PortSpec::Any);
        assert_eq!(
            HostPattern::parse("*.Bücher.example").unwrap().host,
            HostForm::OneLabelBelow("xn--bcher-kva.example".into())
        );
        assert_eq!(
            HostPattern::parse("**.example.com:8443").unwrap(),
            HostPattern {
                host: HostForm::AnyDepthBelow("example.com".into()),
                port: PortSpec::Exact(8443)
            }
        );
        assert_eq!(HostPattern::parse("*").unwrap().host, HostForm::Everything);
        assert_eq!(
            HostPattern::parse("**:443").unwrap().port,
            PortSpec::Exact(443)
        );
        assert_eq!(
            HostPattern::parse("10.0.0.1:22").unwrap().host,
            HostForm::Network("10.0.0.1/32".parse().unwrap())
        );
        assert_eq!(
            HostPattern::parse("[2001:DB8::1]:443").unwrap(),
            HostPattern {
                host: HostForm::Network("2001:db8::1/128".parse().unwrap()),
                port: PortSpec::Exact(443)
            }
        );
        assert_eq!(
            HostPattern::parse("2001:db8::1").unwrap().host,
            HostForm::Network("2001:db8::1/128".parse().unwrap())
        );
        assert_eq!(
            HostPattern::parse("10.1.2.3/8").unwrap().host,
            HostForm::Network("10.0.0.0/8".parse().unwrap())
        );
        assert_eq!(
            HostPattern::parse("[2001:db8::/32]:443").unwrap().host,
            HostForm::Network("2001:db8::/32".parse().unwrap())
        );
        assert_eq!(
            HostPattern::parse("[::ffff:10.0.0.0]").unwrap().host,
            HostForm::Network("10.0.0.0/32".parse().unwrap())
        );
        assert_eq!(
            HostPattern::parse("::ffff:10.0.0.0/104").unwrap().host,
            HostForm::Network("10.0.0.0/8".parse().unwrap())
        );
    }

    #[test]
    fn refuses_bad_patterns() {
        for bad in [
            "",
            "example.com:",
            "example.com:0",
            "example.com:65536",
            "example.com:+1",
            "example.com:http",
            "a*.example.com",
            "*example.com",
            "api.*.example.com",
            "***.example.com",
            "*.",
            "**.",
            "*.*.example.com",
            "[2001:db8::1",
            "[2001:db8::1]443",
            "[10.0.0.1]",
            "2001:db8::1:443:",
            "10.0.0.0/33",
            "example.com/8",
            "exa mple.com",
            "a:b:c",
        ] {
            assert!(
                HostPattern::parse(bad).is_err(),
                "{bad:?} should be refused"
            );
        }
    }

    #[test]
    fn patterns_match_targets() {
        let one = HostPattern::parse("*.example.com").unwrap();
        assert!(one.matches(&host("a.example.com"), 1));
        assert!(!one.matches(&host("a.b.example.com"), 1));
        assert!(!one.matches(&host("example.com"), 1));
        assert!(!one.matches(&host("aexample.com"), 1));
        let deep = HostPattern::parse("**.example.com").unwrap();
        assert!(deep.matches(&host("a.b.example.com"), 1));
        assert!(!deep.matches(&host("example.com"), 1));
        assert!(!deep.matches(&host("badexample.com"), 1));
        let all = HostPattern::parse("*").unwrap();
        assert!(all.matches(&ip("::1"), 5));
        let net = HostPattern::parse("10.0.0.0/8:22").unwrap();
        assert!(net.matches(&ip("10.9.9.9"), 22));
        assert!(net.matches(&ip("::ffff:10.9.9.9"), 22));
        assert!(!net.matches(&ip("10.9.9.9"), 23));
        assert!(!net.matches(&host("ten.example"), 22));
        assert!(
            !HostPattern::parse("example.com")
                .unwrap()
                .matches(&ip("10.0.0.1"), 1)
        );
    }

    #[test]
    fn displays_canonical_forms() {
        for (written, shown) in [
            ("Example.com", "example.com"),
            ("example.com:*", "example.com"),
            ("*.example.com:443", "*.example.com:443"),
            ("**.example.com", "**.example.com"),
            ("*", "**"),
            ("10.0.0.1:22", "10.0.0.1:22"),
            ("[2001:db8::1]:443", "[2001:db8::1]:443"),
            ("2001:db8::1", "2001:db8::1"),
            ("10.0.0.0/8", "10.0.0.0/8"),
        ] {
            assert_eq!(HostPattern::parse(written).unwrap().to_string(), shown);
        }
    }

    #[test]
    fn parses_targets() {
        assert_eq!(
            parse_target("Example.com").unwrap(),
            (host("example.com"), 443)
        );
        assert_eq!(
            parse_target("example.com:22").unwrap(),
            (host("example.com"), 22)
        );
        assert_eq!(parse_target("10.0.0.1").unwrap(), (ip("10.0.0.1"), 443));
        assert_eq!(
            parse_target("10.0.0.1:8080").unwrap(),
            (ip("10.0.0.1"), 8080)
        );
        assert_eq!(parse_target("[::1]:80").unwrap(), (ip("::1"), 80));
        assert_eq!(parse_target("[::1]").unwrap(), (ip("::1"), 443));
        assert_eq!(
            parse_target("2001:db8::1").unwrap(),
            (ip("2001:db8::1"), 443)
        );
        assert_eq!(
            parse_target("[::ffff:10.0.0.1]").unwrap(),
            (ip("10.0.0.1"), 443)
        );
        assert_eq!(
            parse_target("http://Bücher.example/x?y").unwrap(),
            (host("xn--bcher-kva.example"), 80)
        );
        assert_eq!(
            parse_target("https://example.com").unwrap(),
            (host("example.com"), 443)
        );
        assert_eq!(
            parse_target("HTTPS://example.com:8443/").unwrap(),
            (host("example.com"), 8443)
        );
        assert_eq!(
            parse_target("ssh://example.com:22").unwrap(),
            (host("example.com"), 22)
        );
        assert_eq!(
            parse_target("http://[2001:db8::1]/").unwrap(),
            (ip("2001:db8::1"), 80)
        );
        assert!(matches!(
            parse_target("ssh://example.com"),
            Err(PatternError::MissingPort { .. })
        ));
        assert!(matches!(
            parse_target("http://u@example.com"),
            Err(PatternError::UserInfo { .. })
        ));
        for bad in [
            "",
            "example.com:0",
            "example.com:*",
            "a:b:c",
            "http://",
            "1http://x",
            "[::1]x",
            "*.example.com",
        ] {
            assert!(parse_target(bad).is_err(), "{bad:?} should be refused");
        }
    }
}
